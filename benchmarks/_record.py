"""Writing a benchmark's results file: the exact command, its settings and the machine, then
whatever the benchmark measured. Shared by the scripts in this folder (run as
`python benchmarks/NAME.py`, so this module is importable as `_record`)."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from argparse import Namespace
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]


def repo_relative(path: Path) -> str:
    """A path as a record shows it: relative to the repository when inside it, so records do not
    carry the machine's checkout location. Links inside the repository stay as named
    (models/course-tiny, not the bertlab/models/course-tiny it leads to)."""
    absolute = Path(os.path.abspath(path))
    if absolute.is_relative_to(REPO):
        return str(absolute.relative_to(REPO))
    resolved = path.resolve()
    return str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else str(path)


def _setting(value: Any) -> Any:
    """A setting as JSON, a path as `repo_relative` shows it."""
    return repo_relative(value) if isinstance(value, Path) else value


def check_common(threads: int, out: Path, models: Sequence[Path] = ()) -> None:
    """Raise `BadInput` (the scripts print it as one `error:` line, exit 2) for a thread count
    below 1, an --out that is a folder, or a model folder without the MANIFEST.json of a shipped
    model, before any work."""
    from bertlab.errors import BadInput

    if threads < 1:
        raise BadInput(f"--threads {threads}", "must be at least 1", "pass --threads 1 or more")
    if out.is_dir():
        raise BadInput(f"--out {out}", "is a folder", "pass the path of a .json file")
    for folder in models:
        if not (Path(folder) / "MANIFEST.json").is_file():
            raise BadInput(f"--models {folder}", "is no shipped model (no MANIFEST.json there)",
                           "pass folders under models/, e.g. models/course-nsp")


def write_record(script: str, args: Namespace, argv: Sequence[str] | None, out: Path,
                 **measured: Any) -> None:
    """Write `measured` to `out` as JSON, after the command that produced it and the machine."""
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "command": f"python benchmarks/{script} " + " ".join(sys.argv[1:] if argv is None
                                                              else argv),
        "settings": {k: _setting(v) for k, v in vars(args).items()},
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "torch": torch.__version__, "threads": torch.get_num_threads()},
        **measured,
    }
    out.write_text(json.dumps(record, indent=1))
    print(f"written: {out}")


def matmul_peak(dtype: torch.dtype, n: int = 2048, repeats: int = 5,
                device: torch.device | str = "cpu") -> float:
    """Return the FLOP/s of an n x n matmul in `dtype` on `device` (median of `repeats`, after a
    warm-up): the machine's own peak, to set a model's FLOP/s against."""
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    a @ b
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        sync()
        times.append(time.perf_counter() - start)
    return 2 * n**3 / statistics.median(times)
