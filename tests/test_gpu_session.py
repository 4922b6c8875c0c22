"""tools/gpu_session.py walked on the CPU: every phase's command runs, and what comes back from
the GPU machine fits its limits (at most 8 files in $OUT, each under 16 MiB, plain names)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from bertlab.cli import main as cli

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_session_runs_phase_by_phase_and_packs_what_comes_back(tmp_path):
    data = tmp_path / "data"
    assert cli(["prepare", "--corpus", "bbc", "--out", str(data / "bbc_shards"),
                "--pair-draws", "2"]) == 0
    assert cli(["prepare", "--corpus", "bbc", "--out", str(data / "bbc_shards64"),
                "--max-seq-len", "64", "--tokenizer", str(data / "bbc_shards" / "tokenizer.json")
                ]) == 0
    out = tmp_path / "OUT"
    for call in ("smoke", "full"):
        done = subprocess.run([sys.executable, "tools/gpu_session.py", call, "--device", "cpu",
                               "--data", str(data), "--out", str(out)], cwd=ROOT,
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "phases: 1 base done, 2 twins done, 3 rows done, 4 profile done" in done.stdout
    files = sorted(p for p in out.rglob("*") if p.is_file())
    assert len(files) <= 8 and all(p.parent == out for p in files)
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", p.name) and p.stat().st_size < 16 * 2**20
               for p in files)
    record = json.loads((out / "gpu_throughput.json").read_text())
    assert [r["batch"] for r in record["rows"]] == ["full", "real", "grouped", "real", "full"]
    assert [r["unpad"] for r in record["rows"]] == [False, False, False, True, False]
    assert record["profile"]["top"]
    for name in ("mlm-nsp-seed0", "mlm-seed0"):
        with tarfile.open(out / f"{name}.tgz") as tar:
            names = tar.getnames()
        assert any(n.endswith("summary.json") for n in names)
        assert any(n.endswith("model/model.safetensors") for n in names)
