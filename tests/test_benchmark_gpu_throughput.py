"""benchmarks/gpu_throughput.py on the CPU: the GPU benchmark's code path, compiled, as a smoke run.

A GPU is lent only now and then, so the script must work before one is there: `--device cpu`
runs the same steps (torch.compile with inductor, the fixed-capacity MLM head, the optimizer),
and its record goes to a temporary folder, never over benchmarks/results/gpu_throughput.json.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_throughput.py"


@pytest.mark.slow
def test_a_cpu_smoke_run_compiles_times_and_writes_outside_the_results_folder():
    record = ROOT / "benchmarks" / "results" / "gpu_throughput.json"
    before = record.read_bytes() if record.exists() else None
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--presets", "tiny", "--batch-size", "4",
         "--seq-len", "32", "--vocab-size", "500", "--warmup", "1", "--steps", "2",
         "--no-reference"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    written = Path(re.search(r"^wrote (\S+)$", done.stdout, flags=re.M).group(1))
    assert ROOT / "benchmarks" / "results" not in written.parents
    rows = json.loads(written.read_text())["rows"]
    assert [(r["preset"], r["model"], r["batch"], r["seq_len"]) for r in rows] == [
        ("tiny", "bertlab", 4, 32)]
    assert rows[0]["tokens_per_s"] > 0 and rows[0]["mfu"] is None  # no MFU without a GPU
    assert (record.read_bytes() if record.exists() else None) == before
