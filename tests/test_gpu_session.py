"""tools/gpu_session.py walked on the CPU: every phase's command runs, what comes back from the
GPU machine fits its limits (at most 8 files in $OUT, each under 16 MiB, plain names), and
`receive` turns it into what gpu_pretrain.py score reads, refusing a CPU walk as a GPU result."""

from __future__ import annotations

import io
import json
import re
import shutil
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

    # Back on the CPU machine. A CPU walk's files are refused: they are no GPU result.
    runs, results = tmp_path / "runs" / "gpu-twins", tmp_path / "results"
    refused = session("receive", "--from", str(out), "--runs", str(runs), "--results",
                      str(results), code=2)
    assert "came from a CPU walk" in refused.stdout and not runs.exists() and not results.exists()
    # The same files as a GPU would send them (the device names relabelled, in this test only):
    # the runs land where score reads them and the throughput record beside the results.
    gpu = relabelled(out, tmp_path / "came-back", "NVIDIA H200 (relabelled CPU walk, test only)")
    done = session("receive", "--from", str(gpu), "--runs", str(runs), "--results", str(results))
    assert "phases: 1 base done" in done.stdout and "next: python benchmarks/gpu_pretrain.py" \
        in done.stdout
    assert (results / "gpu_throughput.json").read_bytes() == \
        (gpu / "gpu_throughput.json").read_bytes()
    assert sorted(p.name for p in runs.iterdir() if (p / "summary.json").is_file()) == [
        "mlm+nsp-seed0", "mlm-seed0"] and (runs / "train.json").is_file()
    again = session("receive", "--from", str(gpu), "--runs", str(runs), "--results",
                    str(results), code=2)
    assert "already holds runs" in again.stdout
    scored = subprocess.run([sys.executable, "benchmarks/gpu_pretrain.py", "score", "--runs",
                             str(runs), "--shards", str(data / "bbc_shards"), "--finetune-seeds",
                             "1", "--label-budgets", "8", "--threads", "2", "--out",
                             str(results / "gpu_pretrain.json"), "--model-out",
                             str(tmp_path / "gpu-mini")], cwd=ROOT, capture_output=True,
                            text=True, timeout=900)
    assert scored.returncode == 0, scored.stdout[-2000:] + scored.stderr[-2000:]
    record = json.loads((results / "gpu_pretrain.json").read_text())
    assert {r["twin"] for r in record["runs"]} == {"mlm+nsp", "mlm"}
    assert record["device"].startswith("NVIDIA H200 (relabelled")


def session(*args: str, code: int = 0) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "tools/gpu_session.py", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == code, done.stdout[-3000:] + done.stderr[-2000:]
    return done


def relabelled(out: Path, to: Path, device: str) -> Path:
    """Copy $OUT to `to` with every record's and run summary's device set to `device`."""
    shutil.copytree(out, to)
    record = json.loads((to / "gpu_throughput.json").read_text())
    (to / "gpu_throughput.json").write_text(json.dumps({**record, "device": device}))
    for archive in to.glob("*.tgz"):
        with tarfile.open(archive) as tar:
            members = [(m, tar.extractfile(m).read() if m.isfile() else None)
                       for m in tar.getmembers()]
        with tarfile.open(archive, "w:gz") as tar:
            for member, data in members:
                if member.name.endswith("summary.json"):
                    data = json.dumps({**json.loads(data), "device": device}).encode()
                    member.size = len(data)
                tar.addfile(member, None if data is None else io.BytesIO(data))
    return to
