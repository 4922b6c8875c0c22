"""Validate everything, then write: `tools/gpu_session.py receive` and `export-hf`.

`receive` checks what came back AND where it goes before it unpacks anything; a failure or a
stop while it writes leaves the runs folder and the record as they were, and the same receive,
run again, works (also after kill -9). `export-hf` and `fill-mask` beside a run that checkpoints
every step read the newest checkpoint left, the weights and the model card from the same one,
when the run rotates checkpoints away under them (simulated at the exact moment by wrapping
the reader).
"""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from faultlib import SMALL, assert_unchanged, snapshot
from test_gpu_session import RECORD, came_back_folder

import bertlab
from bertlab.cli import main
from bertlab.engine import checkpoint as ck
from bertlab.hf import load_hf

# The tools folder beside the bertlab that is imported (the old code's, under PYTHONPATH).
TOOLS = Path(bertlab.__file__).resolve().parents[1] / "tools"

pytestmark = pytest.mark.usefixtures("one_thread")
NEWEST = "step-00000004"  # what a run still writing saves while export-hf or fill-mask reads


def _gpu_session():
    spec = importlib.util.spec_from_file_location("gpu_session_under_test",
                                                  TOOLS / "gpu_session.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def came_back(tmp_path) -> Path:
    return came_back_folder(tmp_path)


def _receive(came_back: Path, runs: Path, results: Path, capsys) -> tuple[int, str]:
    code = _gpu_session().receive(came_back, runs, results)
    return code, capsys.readouterr().out


def _received(runs: Path, results: Path) -> None:
    """Assert that everything came in, whole, and that no staging folder is left beside."""
    assert sorted(p.name for p in runs.iterdir()) == ["mlm+nsp-seed0", "mlm-seed0",
                                                      "train.json", "twins.log"]
    assert (runs / "mlm-seed0" / "model" / "model.safetensors").read_bytes() == b"weights"
    assert json.loads((results / "gpu_throughput.json").read_text()) == RECORD
    assert not [p for p in runs.parent.iterdir() if p.name.startswith(".")]


# ---------------------------------------------------------------------------------------------
# Every output is checked before anything is unpacked


def _file(tmp_path: Path) -> Path:
    (tmp_path / "notes.txt").write_text("my notes\n")
    return tmp_path / "notes.txt"


@pytest.mark.parametrize("where, message", [
    (lambda t, c: (t / "runs", _file(t)), "--results {results} is a file, not a folder"),
    (lambda t, c: (_file(t) / "runs", t / "results"), "is a file, not a folder; choose a path "
                                                      "under a folder"),
    (lambda t, c: (t / "runs", c), "--results {results}: is the same folder"),
    (lambda t, c: (c, t / "results"), "--runs {runs}: is the same folder"),
    (lambda t, c: (t / "runs", t / "runs" / "results"), "lies in --runs"),
], ids=["results-is-a-file", "runs-under-a-file", "results-is-the-input", "runs-is-the-input",
        "results-inside-runs"])
def test_receive_checks_where_it_writes_before_it_unpacks(came_back, tmp_path, capsys, where,
                                                          message):
    runs, results = where(tmp_path, came_back)
    before = snapshot(tmp_path)
    code, out = _receive(came_back, runs, results, capsys)
    assert code == 2 and "nothing was written" in out and "Traceback" not in out, out
    assert message.format(runs=runs, results=results) in out, out
    assert_unchanged(before, snapshot(tmp_path))
    # The advice works: other folders, and everything comes in.
    code, out = _receive(came_back, tmp_path / "new" / "runs", tmp_path / "new" / "results",
                         capsys)
    assert code == 0, out
    _received(tmp_path / "new" / "runs", tmp_path / "new" / "results")


def test_receive_refuses_a_folder_where_the_record_goes(came_back, tmp_path, capsys):
    results = tmp_path / "results"
    (results / "gpu_throughput.json").mkdir(parents=True)
    before = snapshot(tmp_path)
    code, out = _receive(came_back, tmp_path / "runs", results, capsys)
    assert code == 2 and f"{results / 'gpu_throughput.json'} is a folder" in out, out
    assert_unchanged(before, snapshot(tmp_path))


def test_receive_through_a_dangling_link_puts_the_runs_where_it_leads(came_back, tmp_path,
                                                                      capsys):
    link = tmp_path / "runs"
    link.symlink_to(tmp_path / "elsewhere" / "twins-gpu")  # made by the receive
    code, out = _receive(came_back, link, tmp_path / "results", capsys)
    assert code == 0 and "Traceback" not in out, out
    assert link.is_symlink()  # still the user's link
    _received(tmp_path / "elsewhere" / "twins-gpu", tmp_path / "results")


def test_receive_refuses_a_link_that_leads_under_a_file(came_back, tmp_path, capsys):
    link = tmp_path / "runs"
    link.symlink_to(_file(tmp_path) / "twins-gpu")
    before = snapshot(tmp_path)
    code, out = _receive(came_back, link, tmp_path / "results", capsys)
    assert code == 2 and f"--runs {link} ->" in out and "notes.txt is a file" in out, out
    assert_unchanged(before, snapshot(tmp_path))


# ---------------------------------------------------------------------------------------------
# A failure or a stop while writing: nothing half-received, and the same receive works again


def test_a_failure_after_unpacking_leaves_nothing_half_received(came_back, tmp_path, capsys,
                                                                monkeypatch):
    from bertlab import atomic as files
    runs, results = tmp_path / "runs", tmp_path / "results"
    results.mkdir()
    (results / "gpu_throughput.json").write_text('{"device": "an earlier record"}')
    before = snapshot(tmp_path)
    real = files.atomic_write_bytes

    def full(path, data):  # the disk fills up as the record is written, after the unpacking
        raise OSError(errno.ENOSPC, "No space left on device", str(path))
    monkeypatch.setattr(files, "atomic_write_bytes", full)
    code, out = _receive(came_back, runs, results, capsys)
    assert code == 1 and "no space left" in out.lower() and "Traceback" not in out, out
    assert "nothing was received" in out and "run the same receive again" in out, out
    assert_unchanged(before, snapshot(tmp_path))
    monkeypatch.setattr(files, "atomic_write_bytes", real)
    code, out = _receive(came_back, runs, results, capsys)
    assert code == 0, out
    _received(runs, results)


# The real tool in a subprocess, stopped by `sig` at a chosen moment: after the first archive
# was unpacked, or after the record was written (the runs not yet in place).
_STOPPED = """
import os, signal, sys, tarfile
sys.path.insert(0, sys.argv[1])
import gpu_session
from bertlab import atomic as files
sig, when = int(sys.argv[2]), sys.argv[3]
if when == "unpacking":
    real = tarfile.TarFile.extractall
    def extractall(self, *args, **kwargs):
        real(self, *args, **kwargs)
        os.kill(os.getpid(), sig)
    tarfile.TarFile.extractall = extractall
else:
    write = files.atomic_write_bytes
    def atomic_write_bytes(path, data):
        write(path, data)
        files.atomic_write_bytes = write
        os.kill(os.getpid(), sig)
    files.atomic_write_bytes = atomic_write_bytes
sys.exit(gpu_session.main(sys.argv[4:]))
"""


@pytest.mark.parametrize("when", ["unpacking", "record-written"])
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
def test_a_kill_during_receive_keeps_every_earlier_file_and_the_retry_works(came_back, tmp_path,
                                                                            sig, when):
    runs, results = tmp_path / "runs" / "twins-gpu", tmp_path / "results"
    results.mkdir()
    (results / "other.json").write_text("{}")  # a file of the user's beside the record
    args = ["receive", "--from", str(came_back), "--runs", str(runs), "--results", str(results)]
    before = snapshot(tmp_path)
    done = subprocess.run([sys.executable, "-c", _STOPPED, str(TOOLS), str(int(sig)), when,
                           *args], capture_output=True, text=True, timeout=120)
    if sig == signal.SIGTERM:  # stopped cleanly: nothing of it is left
        assert done.returncode == 143, done.stdout + done.stderr
        assert "stopped by SIGTERM" in done.stdout and "run the same receive again" in \
            done.stdout and "Traceback" not in done.stderr, done.stdout + done.stderr
        assert_unchanged(before, snapshot(tmp_path))
    else:
        assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr
        assert not runs.exists()  # the runs appear whole or not at all
        assert (results / "other.json").read_text() == "{}"
    again = subprocess.run([sys.executable, str(TOOLS / "gpu_session.py"), *args],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    _received(runs, results)  # and the dead one's staging folder was swept
    assert sorted(p.name for p in results.iterdir()) == ["gpu_throughput.json", "other.json"]


# ---------------------------------------------------------------------------------------------
# export-hf and fill-mask beside a run that checkpoints every step


@pytest.fixture(scope="module")
def rotating(tmp_path_factory) -> Path:
    """A run with checkpoints at steps 2 and 3, and step 4 kept aside: what the run, still
    writing, saves while a reader reads (`_rotate` puts it in and deletes the older ones).
    (Steps 5 and 6 only make the learning rate at step 4 non-zero, so its weights differ.)"""
    root = tmp_path_factory.mktemp("rotating")
    run = root / "run"
    assert main(["pretrain", "--corpus", "bbc", "--out", str(run), "--max-steps", "6",
                 "--checkpoint-interval", "1", "--keep-checkpoints", "6", *SMALL]) == 0
    os.replace(run / "checkpoints" / NEWEST, root / NEWEST)
    for step in (1, 5, 6):
        shutil.rmtree(run / "checkpoints" / f"step-{step:08d}")
    return root


def _copy(rotating: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(rotating / "run", run)
    shutil.copytree(rotating / NEWEST, tmp_path / NEWEST)
    return run


def _rotate(run: Path, in_place: bool = False) -> None:
    """Do what the running run does: save step 4, then delete the older checkpoints (in place,
    file by file, as an older bertlab did: the folder vanishes a moment later)."""
    os.replace(run.parent / NEWEST, run / "checkpoints" / NEWEST)
    for old in ("step-00000002", "step-00000003"):
        folder = run / "checkpoints" / old
        if in_place:
            (folder / "model.safetensors").unlink()
            threading.Timer(0.05, shutil.rmtree, [folder]).start()
        else:
            shutil.rmtree(folder)


def _weights(run_or_export: Path) -> torch.Tensor:
    if (run_or_export / "config.json").is_file():
        return load_hf(run_or_export).bert.embeddings.word_embeddings.weight
    model = ck.BertForPreTraining(ck.BertConfig.from_dict(
        ck.read_checkpoint_state(run_or_export)["model_config"]))
    ck.load_checkpoint(run_or_export, model)
    return model.bert.embeddings.word_embeddings.weight


def _rotating_at(monkeypatch, target: str, run: Path, call: int = 1, **how) -> list:
    """Make the run rotate at the `call`-th call of checkpoint.`target` (after the weights
    were read, for _load_run_model); return a list that is non-empty once it has."""
    real, calls, done = getattr(ck, target), [], []

    def wrapped(*args, **kwargs):
        calls.append(args)
        result = real(*args, **kwargs) if target == "_load_run_model" else None
        if len(calls) == call:
            done.append(_rotate(run, **how))
        return result if target == "_load_run_model" else real(*args, **kwargs)
    monkeypatch.setattr(ck, target, wrapped)
    return done


@pytest.mark.parametrize("target, call, how", [
    ("verify_checkpoint", 1, {}),
    ("verify_checkpoint", 1, {"in_place": True}),
    ("_load_run_model", 1, {}),
    ("verify_checkpoint", 2, {}),
], ids=["every-listed-one-rotated-away", "deleted-in-place-while-read",
        "rotated-after-the-weights-were-read", "rotated-before-a-second-lookup-for-the-card"])
def test_export_hf_beside_a_rotating_run_exports_the_newest_left_with_its_own_card(
        rotating, tmp_path, capsys, monkeypatch, target, call, how):
    run = _copy(rotating, tmp_path)
    rotated = _rotating_at(monkeypatch, target, run, call, **how)
    code = main(["export-hf", str(run), str(tmp_path / "export")])
    monkeypatch.undo()  # the checks below read checkpoints too
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "corrupt" not in captured.err and "Traceback" not in captured.err, captured.err
    # The card and the weights come from one checkpoint: the newest left once the run rotated.
    step = 4 if rotated else 3
    card = (tmp_path / "export" / "README.md").read_text()
    assert f"- Steps: {step} optimizer steps" in card, card
    assert torch.equal(_weights(tmp_path / "export"),
                       _weights(run / "checkpoints" / f"step-{step:08d}"))


@pytest.mark.parametrize("in_place", [False, True], ids=["rotated-away", "deleted-in-place"])
def test_fill_mask_beside_a_rotating_run_reads_the_newest_left(rotating, tmp_path, capsys,
                                                               monkeypatch, in_place):
    run = _copy(rotating, tmp_path)
    _rotating_at(monkeypatch, "verify_checkpoint", run, in_place=in_place)
    code = main(["fill-mask", str(run), "the [MASK] rose"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "[MASK] #1:" in captured.out
    assert "corrupt" not in captured.err and "no checkpoint" not in captured.err, captured.err


def test_a_checkpoint_removal_cut_short_is_swept_by_the_next_one(tmp_path):
    """kill -9 between the rename and the delete leaves a hidden folder; the lock holder's next
    rotation removes it, and never touches a real checkpoint."""
    checkpoints = tmp_path / "checkpoints"
    for name in ("step-00000002", "step-00000004", "step-00000006"):
        (checkpoints / name).mkdir(parents=True)
        (checkpoints / name / "state.json").write_text("{}")
    left = checkpoints / ".step-00000000.12345.removed.tmp"  # a dead writer's
    left.mkdir()
    (left / "model.safetensors").write_bytes(b"half deleted")
    ck.remove_checkpoint(checkpoints / "step-00000002")
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-00000004", "step-00000006"]
