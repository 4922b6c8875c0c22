"""Re-execute notebooks in place, top to bottom, so their stored outputs are fresh for nbval.

Usage: python tools/run_notebooks.py notebooks/01_corpus_and_tokenizer.ipynb [...]

Each notebook runs in its own kernel from the current environment, with the notebooks/ folder as
working directory. It is saved with its widget state (so JupyterLab draws the widgets of a
freshly opened notebook before anything runs) and without per-cell timing metadata (which
changes on every run). How long each notebook took, with the load average before and after, the
number of cores, the CPU and whether it has native bf16 matmuls, goes into notebooks/run_times.json: the stored outputs' times are only
comparable with a machine that was not busy.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from bertlab.course.doctor import load_average
from bertlab.course.traces import machine
from bertlab.precision import cpu_has_native_bf16

RUN_TIMES = Path(__file__).resolve().parent.parent / "notebooks" / "run_times.json"


def run(path: Path, timeout: int = 900) -> float:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        record_timing=False,
        store_widget_state=True,  # saved in nb.metadata.widgets: JupyterLab draws it on open
    )
    start = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - start
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    nbformat.write(nb, path)
    return elapsed


def record(name: str, seconds: float, load_before: float | None) -> None:
    """Write one notebook's run time, with the load it ran under, into run_times.json."""
    times = json.loads(RUN_TIMES.read_text()) if RUN_TIMES.exists() else {}
    times[name] = {"seconds": round(seconds, 1), "load_average_before": load_before,
                   "load_average_after": load_average(), "cpus": os.cpu_count(),
                   "cpu": machine()["cpu"], "native_bf16": cpu_has_native_bf16(),
                   "date": time.strftime("%Y-%m-%d")}
    RUN_TIMES.write_text(json.dumps(dict(sorted(times.items())), indent=1) + "\n")


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    for name in argv:
        path = Path(name)
        before = load_average()
        seconds = run(path)
        record(path.name, seconds, before)
        print(f"{path}: executed in {seconds:.0f} s (load average {before} before, "
              f"{load_average()} after, {os.cpu_count()} cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
