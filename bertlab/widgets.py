"""ipywidgets explorers used by the notebooks. Nothing here runs on import.

Each section belongs to one lesson; functions return a widget to display.
"""

from __future__ import annotations

# --- masked LM (notebooks/02_masked_lm.ipynb) ----------------------------------------------------

# --- NSP data (notebooks/03_nsp_data.ipynb) ------------------------------------------------------

# --- encoder (notebooks/04_encoder.ipynb) --------------------------------------------------------
