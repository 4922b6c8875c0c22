"""tools/gpu_session.py walked on the CPU: every phase's command runs, what comes back from the
GPU machine fits its limits (at most 8 files in $OUT, each under 16 MiB, plain names), and
`receive` turns it into what benchmarks/twins.py score reads, refusing a CPU walk as a GPU
result."""

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
    runs, results = tmp_path / "runs" / "twins-gpu", tmp_path / "results"
    refused = session("receive", "--from", str(out), "--runs", str(runs), "--results",
                      str(results), code=2)
    assert "came from a CPU walk" in refused.stdout and not runs.exists() and not results.exists()
    # The same files as a GPU would send them (the device names relabelled, in this test only):
    # the runs land where score reads them and the throughput record beside the results.
    gpu = relabelled(out, tmp_path / "came-back", "NVIDIA H200 (relabelled CPU walk, test only)")
    done = session("receive", "--from", str(gpu), "--runs", str(runs), "--results", str(results))
    assert "phases: 1 base done" in done.stdout and "next: python benchmarks/twins.py score" \
        in done.stdout
    assert (results / "gpu_throughput.json").read_bytes() == \
        (gpu / "gpu_throughput.json").read_bytes()
    assert sorted(p.name for p in runs.iterdir() if (p / "summary.json").is_file()) == [
        "mlm+nsp-seed0", "mlm-seed0"]
    assert not (runs / "mlm-seed0" / "checkpoints").exists()  # the optimizer stays on the GPU
    again = session("receive", "--from", str(gpu), "--runs", str(runs), "--results",
                    str(results), code=2)
    assert "already holds runs" in again.stdout
    scored = subprocess.run([sys.executable, "benchmarks/twins.py", "score", "--device", "cuda",
                             "--runs", str(runs), "--finetune-seeds", "1", "--label-budgets", "8",
                             "--threads", "2", "--task-docs", "300",
                             "--record", str(results / "twins-gpu.json"),
                             "--models", str(tmp_path / "models"), "--ship", "gpu-mini=mlm+nsp"],
                            cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert scored.returncode == 0, scored.stdout[-2000:] + scored.stderr[-2000:]
    record = json.loads((results / "twins-gpu.json").read_text())
    assert {r["arm"] for r in record["runs"]} == {"mlm+nsp", "mlm"}
    manifest = json.loads((tmp_path / "models" / "gpu-mini" / "MANIFEST.json").read_text())
    assert "trace" not in manifest and manifest["device"].startswith("NVIDIA H200")
    preset = manifest["command"].split()[manifest["command"].split().index("--preset") + 1]
    assert manifest["what"].startswith(f"a {preset} BERT pretrained by bertlab on the prepared "
                                       f"shards ")  # the walk's preset (tiny), its shards named
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


# ---------------------------------------------------------------------------------------------
# receive, on small fake files: everything is checked before anything is written

RECORD = {"device": "NVIDIA H200", "torch": "2.5", "compile": True, "matmul_peak_tflops": 700.0,
          "rows": [{"preset": "base", "seq_len": 128, "batch": "full", "batch_size": 256,
                    "tokens_per_s": 1e6, "mfu": 0.4, "mfu_measured_peak": 0.5}]}


def _archive(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _run(name: str) -> dict[str, bytes]:
    return {f"{name}/summary.json": json.dumps({"device": "NVIDIA H200"}).encode(),
            f"{name}/model/model.safetensors": b"weights"}


@pytest.fixture
def came_back(tmp_path) -> Path:
    return came_back_folder(tmp_path)


def came_back_folder(tmp_path: Path) -> Path:
    """Return what a full call sent back: a record, two run archives and the logs."""
    folder = tmp_path / "came-back"
    folder.mkdir()
    (folder / "gpu_throughput.json").write_text(json.dumps(RECORD))
    _archive(folder / "mlm-seed0.tgz", _run("mlm-seed0"))
    _archive(folder / "mlm-nsp-seed0.tgz", _run("mlm+nsp-seed0"))
    _archive(folder / "twins-logs.tgz", {"train.json": b"{}", "twins.log": b"log\n"})
    return folder


def _receive(came_back: Path, tmp_path: Path) -> tuple[int, Path, Path]:
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import gpu_session
    finally:
        sys.path.remove(str(ROOT / "tools"))
    runs, results = tmp_path / "runs" / "twins-gpu", tmp_path / "results"
    return gpu_session.receive(came_back, runs, results), runs, results


def test_receive_puts_every_run_and_the_record_in_place(came_back, tmp_path, capsys):
    code, runs, results = _receive(came_back, tmp_path)
    assert code == 0, capsys.readouterr().out
    assert sorted(p.name for p in runs.iterdir()) == ["mlm+nsp-seed0", "mlm-seed0", "train.json",
                                                      "twins.log"]
    assert json.loads((results / "gpu_throughput.json").read_text()) == RECORD
    assert [p.name for p in runs.parent.iterdir()] == ["twins-gpu"]  # no staging left behind


def _cut(folder: Path) -> None:
    data = (folder / "mlm-seed0.tgz").read_bytes()
    (folder / "mlm-seed0.tgz").write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("spoil, message", [
    (lambda f: (f / "gpu_throughput.json").write_text(json.dumps({**RECORD, "rows": []})),
     "has no measured rows"),
    (lambda f: (f / "gpu_throughput.json").write_text(json.dumps(
        {k: v for k, v in RECORD.items() if k != "torch"})), "lacks what the notebooks read"),
    (lambda f: (f / "gpu_throughput.json").write_text("[1, 2]"), "holds a JSON list"),
    (lambda f: (f / "gpu_throughput.json").write_text('{"device": '), "is not whole JSON"),
    (_cut, "mlm-seed0.tgz is not a whole .tgz archive"),
    (lambda f: (f / "mlm-seed0.tgz").write_bytes(b"not an archive at all"),
     "is not a whole .tgz archive"),
    (lambda f: _archive(f / "mlm-seed0.tgz", {"mlm-seed0/summary.json": b"{cut"}),
     "mlm-seed0.tgz:mlm-seed0/summary.json is not whole JSON"),
    (lambda f: _archive(f / "mlm-seed0.tgz", {"mlm-seed0/summary.json": b"[]"}),
     "holds a JSON list"),
    (lambda f: _archive(f / "mlm-seed0-copy.tgz", _run("mlm-seed0")),
     "mlm-seed0-copy.tgz and mlm-seed0.tgz both hold 'mlm-seed0'"),
    (lambda f: _archive(f / "other.tgz", {"mlm-seed0": b"a file where a run folder goes"}),
     "both hold 'mlm-seed0'"),
    # A run that never wrote its summary (written last) did not finish; it was taken in.
    (lambda f: _archive(f / "mlm-seed0.tgz", {"mlm-seed0/model/model.safetensors": b"w"}),
     "mlm-seed0.tgz holds run 'mlm-seed0' without its summary.json"),
    # A NaN rate is no measurement; it was taken in and shown as "nan tokens/s".
    (lambda f: (f / "gpu_throughput.json").write_text(json.dumps(
        {**RECORD, "rows": [{**RECORD["rows"][0], "tokens_per_s": float("nan")}]})),
     "row 0 (base @ 128) has tokens_per_s nan: no measurement"),
    # A record that names no device was called "a CPU walk (device 'cpu')".
    (lambda f: (f / "gpu_throughput.json").write_text(json.dumps(
        {k: v for k, v in RECORD.items() if k != "device"})), "gpu_throughput.json name(s) no "
                                                               "device"),
])
def test_receive_refuses_what_is_not_whole_and_writes_nothing(came_back, tmp_path, capsys, spoil,
                                                              message):
    spoil(came_back)
    code, runs, results = _receive(came_back, tmp_path)
    out = capsys.readouterr().out
    assert code == 2 and message in out and "nothing was written" in out, out
    assert "Traceback" not in out
    assert not runs.parent.exists() and not results.exists()
    # The refusal left nothing that blocks the next receive, once the files are whole.
    shutil.rmtree(came_back)
    code, runs, _ = _receive(_whole(came_back), tmp_path)
    assert code == 0 and (runs / "mlm-seed0" / "summary.json").is_file()


def _whole(folder: Path) -> Path:
    folder.mkdir()
    (folder / "gpu_throughput.json").write_text(json.dumps(RECORD))
    _archive(folder / "mlm-seed0.tgz", _run("mlm-seed0"))
    return folder
