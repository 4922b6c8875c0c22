"""The course's own tools: figures, widgets, the workshop check, the demo, the cloze set and the
ablation grid.

They serve the notebooks and `python -m bertlab demo|doctor`; the library (`bertlab`) never
imports them, so a researcher who reuses bertlab in an experiment gets none of this weight.
Import each from its module: `from bertlab.course.viz import plot_training_curves`.
"""
