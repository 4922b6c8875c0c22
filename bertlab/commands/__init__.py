"""The commands of `python -m bertlab` that are more than a few lines: one module each, its
flags and its run together (`bertlab.cli` assembles the parser and runs the rest)."""
