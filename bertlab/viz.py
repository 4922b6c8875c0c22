"""Matplotlib figures used by the notebooks. Nothing here runs on import.

Each section belongs to one lesson; functions return the matplotlib Figure they draw.
"""

from __future__ import annotations

import matplotlib.pyplot as plt  # noqa: F401  (used by the sections below)

# --- corpus and tokenizer (notebooks/01_corpus_and_tokenizer.ipynb) ---------------------------

# --- masked LM (notebooks/02_masked_lm.ipynb) ----------------------------------------------------

# --- NSP data (notebooks/03_nsp_data.ipynb) ------------------------------------------------------

# --- encoder (notebooks/04_encoder.ipynb) --------------------------------------------------------

# --- pretraining (notebooks/05_pretraining.ipynb) ------------------------------------------------

# --- [CLS] and downstream (notebooks/06_cls_and_downstream.ipynb) --------------------------------
