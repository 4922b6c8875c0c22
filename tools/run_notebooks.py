"""Re-execute notebooks in place, top to bottom, so their stored outputs are fresh for nbval.

Usage: python tools/run_notebooks.py notebooks/01_corpus_and_tokenizer.ipynb [...]

Each notebook runs in its own kernel from the current environment, with the notebooks/ folder as
working directory, and is saved without per-cell timing metadata or widget state (both change on
every run and would make every re-run a diff; widget state is kept while running and removed
before saving).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def run(path: Path, timeout: int = 900) -> float:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        record_timing=False,
        # nbclient's Output-widget capture needs widget state during execution (with False it
        # raises KeyError); the state is dropped below before saving.
        store_widget_state=True,
    )
    start = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - start
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    nbformat.write(nb, path)
    return elapsed


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    for name in argv:
        path = Path(name)
        seconds = run(path)
        print(f"{path}: executed in {seconds:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
