"""The one constant that masking, the data, the model and the metrics share: `IGNORE_INDEX`.

A label of -100 marks a position (or a pair) that is not predicted and adds nothing to the loss:
PyTorch's cross-entropy skips it by default (`ignore_index=-100`), and `transformers` uses the
same value. It lives here, below both the masking that writes it and the model that reads it,
so that each imports it from one place.

Taught in notebooks/02_masked_lm.ipynb
"""

IGNORE_INDEX = -100  # the label of a position that is not predicted (cross-entropy's default)
