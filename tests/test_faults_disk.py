"""Faults of the disk and of the writers beside a run: a full disk that numpy reports as a short
write, TensorBoard event folders (shared by two runs, filled up, killed mid-write), the doctor's
cache line, and `benchmarks/twins.py score` on a broken record, a small corpus and a kill.

Each row runs the real CLI (in-process or as a process) or the real API, checks the one `error:`
line, and checks that nothing on disk changed where the command refused.
"""

from __future__ import annotations

import errno
import io
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest
from faultlib import (
    SMALL,
    TINY,
    assert_one_clear_error,
    assert_unchanged,
    corpus_folder,
    private_tmpfs_works,
    snapshot,
)

import bertlab
from bertlab.cli import main
from bertlab.loading import list_checkpoints, load_run
from bertlab.readers import load_corpus

REPO = Path(bertlab.__file__).resolve().parents[1]  # the checkout whose code is under test
TWINS = REPO / "benchmarks" / "twins.py"
# A run as a process: a line per step, a checkpoint every 2 steps.
PROCESS = [*SMALL, "--threads", "1", "--log-interval", "1", "--eval-interval", "1000",
           "--checkpoint-interval", "2", "--keep-checkpoints", "3"]
needs_tensorboard = pytest.mark.skipif(find_spec("tensorboard") is None,
                                       reason="needs the tensorboard package")

pytestmark = pytest.mark.usefixtures("one_thread")


needs_tmpfs = pytest.mark.skipif(private_tmpfs_works() is not None,
                                 reason=str(private_tmpfs_works()))


def _in_private_tmpfs(script: str, tmp_path: Path, timeout: int = 300) -> str:
    """Return the output of a bash `script` run in a private mount namespace (only its
    processes see the small tmpfs it mounts)."""
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c",
                           "set -u\n" + script], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)
    (tmp_path / "report.txt").write_text(done.stdout + done.stderr)
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    """A corpus folder and a run trained with TensorBoard event files."""
    root = tmp_path_factory.mktemp("disk")
    corpus = corpus_folder(root / "corpus")
    paths = {"root": root, "corpus": corpus, "run": root / "run", "tb": root / "tb" / "run"}
    if find_spec("tensorboard") is not None:
        assert main(["pretrain", "--corpus", str(corpus), "--out", str(paths["run"]),
                     "--tensorboard", str(paths["tb"]), *TINY]) == 0
    return paths


# ---------------------------------------------------------------------------------------------
# A full disk that numpy reports as "N requested and M written", with no errno


def test_a_short_write_in_prepare_is_a_full_disk_naming_the_folder(world, tmp_path, capsys,
                                                                   monkeypatch):
    import bertlab.engine.shards as shards_mod

    def short_write(path, array, *args, **kwargs):  # what np.save raises on a full disk
        raise OSError(f"{array.nbytes} requested and {array.nbytes // 2} written")

    monkeypatch.setattr(shards_mod.np, "save", short_write)
    out = tmp_path / "shards"
    before = snapshot(tmp_path, world["corpus"])
    code = main(["prepare", "--corpus", str(world["corpus"]), "--out", str(out),
                 "--vocab-size", "300", "--max-seq-len", "64"])
    assert code == 1
    assert_one_clear_error(capsys.readouterr().err, [
        "no space left on the device while writing folder", str(out), "unchanged", "free some"])
    assert_unchanged(before, snapshot(tmp_path, world["corpus"]))


@needs_tmpfs
def test_prepare_onto_a_small_disk_names_the_folder_and_leaves_nothing(world, tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    command = shlex.join([sys.executable, "-m", "bertlab", "prepare", "--corpus",
                          str(world["corpus"]), "--out", f"{disk}/shards", "--vocab-size", "300",
                          "--max-seq-len", "64"])
    out = _in_private_tmpfs(f"""
mount -t tmpfs -o size=16k tmpfs {disk}
{command} > /dev/null 2> {tmp_path}/err.txt; echo "code=$?"
echo "left: $(ls -A {disk})"
""", tmp_path)
    assert "code=1" in out, out
    err = (tmp_path / "err.txt").read_text()
    assert_one_clear_error(err, ["no space left on the device while writing folder",
                                 f"{disk}/shards", "nothing of it was kept"])
    assert "requested and" not in err
    assert "left: \n" in out  # no staging folder, no half of a shard


# ---------------------------------------------------------------------------------------------
# One TensorBoard folder per run


@needs_tensorboard
def test_a_second_run_into_another_runs_tensorboard_folder_is_refused(world, tmp_path, capsys):
    before = snapshot(world["tb"], tmp_path)
    code = main(["pretrain", "--corpus", str(world["corpus"]), "--out", str(tmp_path / "b"),
                 "--tensorboard", str(world["tb"]), *TINY])
    assert code == 2
    assert_one_clear_error(capsys.readouterr().err, [
        f"--tensorboard {world['tb']}", f"event files of the run in {world['run']}",
        "give each run its own folder", "nothing was written"])
    assert_unchanged(before, snapshot(world["tb"], tmp_path))


@needs_tensorboard
def test_the_api_refuses_another_writers_event_files_before_writing(world, tmp_path):
    from bertlab.data import LoaderOptions, pretraining_loader
    from bertlab.model import BertConfig, BertForPreTraining
    from bertlab.pretraining import pretrain
    from bertlab.train import TrainConfig

    _, tok = load_run(world["run"])
    tb = tmp_path / "tb"
    tb.mkdir()
    shutil.copy(next(world["tb"].glob("events.out.tfevents.*")), tb)  # no marker: not bertlab's
    docs = load_corpus(str(world["corpus"]))
    loader = pretraining_loader(docs, tok, split=None, options=LoaderOptions(max_seq_len=64,
                                                                             batch_size=8))
    before = snapshot(tmp_path)
    fresh = BertForPreTraining(BertConfig.preset("tiny", vocab_size=tok.get_vocab_size()))
    with pytest.raises(ValueError, match=rf"tensorboard_dir {tb}: holds the TensorBoard event "
                                       rf"files of another writer .*give each run its own"):
        pretrain(fresh, loader, None, TrainConfig(max_steps=1, batch_size=8, progress=False,
                                                  tensorboard_dir=tb),
                 out_dir=tmp_path / "run")
    assert_unchanged(before, snapshot(tmp_path))


@needs_tensorboard
def test_a_tensorboard_path_that_is_a_file_is_refused(world, tmp_path, capsys):
    (tmp_path / "tb").write_text("my notes\n")
    before = snapshot(tmp_path)
    code = main(["pretrain", "--corpus", str(world["corpus"]), "--out", str(tmp_path / "run"),
                 "--tensorboard", str(tmp_path / "tb"), *TINY])
    assert code == 2
    assert_one_clear_error(capsys.readouterr().err, [f"--tensorboard {tmp_path / 'tb'}",
                                                     "is a file", "nothing was written"])
    assert_unchanged(before, snapshot(tmp_path))


def _scalars(folder: Path) -> dict[str, list[int]]:
    """Return each scalar tag's steps as TensorBoard reads the folder."""
    from tensorboard.backend.event_processing import event_accumulator

    events = event_accumulator.EventAccumulator(str(folder))
    events.Reload()
    return {tag: [e.step for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def _start(world: dict[str, Path], out: Path, tb: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "bertlab", "pretrain", "--corpus",
                             str(world["corpus"]), "--out", str(out), "--tensorboard", str(tb),
                             *PROCESS, *extra], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_for_step(process: subprocess.Popen, step: int) -> None:
    for line in process.stdout:
        if line.startswith("step ") and int(line.split()[1]) >= step:
            return
    raise AssertionError(f"the run ended before step {step}: {process.stderr.read()[-2000:]}")


@pytest.mark.slow
@needs_tensorboard
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_a_run_killed_while_writing_events_resumes_into_the_same_folder(world, tmp_path,
                                                                        signum):
    out, tb, steps = tmp_path / "run", tmp_path / "tb", "24"
    first = _start(world, out, tb, "--max-steps", steps)
    _wait_for_step(first, 7)
    first.send_signal(signum)
    _, err = first.communicate(timeout=120)
    if signum == signal.SIGTERM:
        assert first.returncode == 143 and "Traceback" not in err, err
    saved = [p.name for p in list_checkpoints(out)]
    assert saved, err
    for path in list_checkpoints(out):
        load_run(out, checkpoint=path)  # every checkpoint verifies
    assert _scalars(tb)["train/step_loss"][:6] == [1, 2, 3, 4, 5, 6]  # earlier events readable
    marker = json.loads((tb / "bertlab-run.json").read_text())
    assert marker["run"] == str(out)
    resumed = subprocess.run([sys.executable, "-m", "bertlab",
                              "pretrain", "--corpus", str(world["corpus"]), "--out", str(out),
                              "--tensorboard", str(tb), *PROCESS, "--max-steps", steps,
                              "--resume"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert _scalars(tb)["train/step_loss"] == list(range(1, 25))  # each step once


@pytest.mark.slow
@needs_tensorboard
@needs_tmpfs
def test_a_full_disk_under_the_tensorboard_writer_is_one_error_and_the_resume_works(world,
                                                                                  tmp_path):
    disk, out = tmp_path / "disk", tmp_path / "run"
    disk.mkdir()
    command = shlex.join([sys.executable, "-m", "bertlab", "pretrain", "--corpus",
                          str(world["corpus"]), "--out", str(out), "--tensorboard",
                          f"{disk}/tb", *PROCESS])
    report = _in_private_tmpfs(f"""
mount -t tmpfs -o size=1m tmpfs {disk}
{command} --max-steps 4 > /dev/null 2>&1; echo "first=$?"
{sys.executable} -c "
import itertools
with open('{disk}/filler', 'wb', buffering=0) as f:
    for _ in itertools.count():
        f.write(b'x' * 4096)
" 2> /dev/null
{command} --max-steps 8 --resume > /dev/null 2> {tmp_path}/err.txt; echo "second=$?"
echo "kept: $(ls -A {out}/checkpoints | tr '\n' ' ')"
rm {disk}/filler
{command} --max-steps 8 --resume > /dev/null 2> {tmp_path}/err3.txt; echo "third=$?"
{sys.executable} -c "
from tensorboard.backend.event_processing import event_accumulator as ea
e = ea.EventAccumulator('{disk}/tb'); e.Reload()
print('steps', [s.step for s in e.Scalars('val/mask_accuracy')])"
""", tmp_path)
    assert "first=0" in report and "second=1" in report, report
    err = (tmp_path / "err.txt").read_text()
    assert_one_clear_error(err, ["no space left on the device while writing the TensorBoard "
                                 f"event files in {disk}/tb", "event files written before are "
                                 "kept", str(out / "checkpoints" / "step-00000004"),
                                 "--resume"])
    assert "Exception in thread" not in err
    assert "kept: step-00000002 step-00000004 \n" in report  # as they were, and nothing more
    assert "third=0" in report, (tmp_path / "err3.txt").read_text()  # the advice, followed
    assert "steps [0, 4, 8]" in report  # each evaluation once, none lost


# ---------------------------------------------------------------------------------------------
# The doctor's cache line


@pytest.mark.parametrize("kind", ["file", "read-only"])
def test_the_doctor_fails_a_cache_it_cannot_write(tmp_path, monkeypatch, kind):
    from bertlab.course.doctor import default_checks, run_doctor

    cache = tmp_path / "cache"
    if kind == "file":
        cache.write_text("not a folder\n")
    else:
        cache.mkdir()
        real = os.access  # the tests run as root, whom permissions never stop: ask as a user
        monkeypatch.setattr(os, "access", lambda path, mode, **kw: False if Path(path) in (
            cache, cache / "tokenizers") and mode & os.W_OK else real(path, mode, **kw))
    monkeypatch.setenv("BERTLAB_CACHE", str(cache))
    before = snapshot(tmp_path)
    out = io.StringIO()
    checks = [(name, check) for name, check in default_checks(1.0) if name in ("disk", "cache")]
    assert run_doctor(checks=checks, file=out) == 1
    lines = out.getvalue().splitlines()
    failed = [line for line in lines if line.split()[:1] == ["FAIL"]]
    assert len(failed) == 1 and f"BERTLAB_CACHE={cache}" in failed[0], lines
    assert ("is a file, not a folder" if kind == "file" else "is read-only") in failed[0]
    assert "fix: set BERTLAB_CACHE to a folder you may write" in failed[0]
    assert "not ready" in lines[-1]
    assert_unchanged(before, snapshot(tmp_path))


# ---------------------------------------------------------------------------------------------
# twins.py score: a record it cannot read, a run on a small corpus, a kill mid-scoring


def _twins(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TWINS), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("content, problem", [
    ('{"runs": [{"arm": "mlm", "seed": 0, "at": {"64"', "is not complete JSON"),
    ('[{"arm": "mlm", "seed": 0}]', "is a JSON list without a list of scored runs"),
    ("", "is empty"),
], ids=["cut", "list", "empty"])
def test_twins_score_refuses_a_record_that_is_not_one(tmp_path, content, problem):
    record, runs = tmp_path / "twins-cpu.json", tmp_path / "runs"
    record.write_text(content)
    runs.mkdir()
    before = snapshot(tmp_path)
    done = _twins("score", "--runs", str(runs), "--record", str(record))
    assert done.returncode == 2, done.stderr
    assert_one_clear_error(done.stderr, [f"--record {record}", problem,
                                         "pass another --record" if content else "delete it"])
    assert_unchanged(before, snapshot(tmp_path))


TWINS_TRAIN = ["train", "--recipe", "bert", "--steps", "2", "--batch-size", "8",
               "--eval-interval", "2", "--eval-batches", "1", "--threads", "1",
               "--checkpoint-interval", "2", "--arms", "mlm", "--jobs", "2"]
TWINS_SCORE = ["score", "--finetune-seeds", "1", "--label-budgets", "8", "--threads", "1",
               "--task-docs", "100"]


@pytest.fixture(scope="module")
def small_twins(tmp_path_factory) -> dict[str, Path]:
    """Two twins runs (MLM, seeds 0 and 1) trained on a small corpus of one's own."""
    root = tmp_path_factory.mktemp("twins")
    corpus = root / "corpus"
    corpus.mkdir()
    for i, doc in enumerate(load_corpus("bbc")[:80]):
        (corpus / f"doc{i:02d}.txt").write_text(doc.text, encoding="utf-8")
    done = _twins(*TWINS_TRAIN, "--seeds", "0", "1", "--corpus", str(corpus), "--runs",
                  str(root / "runs"))
    assert done.returncode == 0, done.stdout + done.stderr
    return {"root": root, "runs": root / "runs"}


def _score_until(args: list[str], text: str, signum: int) -> tuple[int, str]:
    process = subprocess.Popen([sys.executable, str(TWINS), *args], cwd=REPO, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen = []
    for line in process.stdout:
        seen.append(line)
        if line.startswith(text):
            process.send_signal(signum)
            break
    _, err = process.communicate(timeout=120)
    assert any(line.startswith(text) for line in seen), "".join(seen) + err[-2000:]
    return process.returncode, "".join(seen)


@pytest.mark.slow
def test_twins_score_on_a_small_corpus_skips_the_cloze_and_survives_kills(small_twins,
                                                                          tmp_path):
    record = tmp_path / "twins-cpu.json"
    score = [*TWINS_SCORE, "--runs", str(small_twins["runs"]), "--record", str(record)]
    # Killed while the second run is scored (the first is in the record): kill -9, then SIGTERM.
    code, said = _score_until(score, "mlm-seed1: cloze skipped", signal.SIGKILL)
    assert code == -signal.SIGKILL and "mlm-seed0: [MASK]" in said, said
    first = record.read_bytes()
    assert [r["seed"] for r in json.loads(first)["runs"]] == [0]
    assert sorted(p.name for p in tmp_path.iterdir()) == [record.name]  # no half-written copy
    code, _ = _score_until(score, "mlm-seed1: cloze skipped", signal.SIGTERM)
    assert code == -signal.SIGTERM and record.read_bytes() == first
    done = _twins(*score)  # the same command again finishes the record
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    data = json.loads(record.read_text())
    assert [r["seed"] for r in data["runs"]] == [0, 1]
    assert data["runs"][0] == json.loads(first)["runs"][0]  # the run scored before is kept
    for run in data["runs"]:  # the course's cloze words are not tokens of this vocabulary
        assert run["cloze"]["top1"] is None and "is a single token" in run["cloze"]["skipped"]
        assert 0 <= run["cls_probe_all_labels"]["pooled"]["accuracy"] <= 1  # the rest scored
    assert "cloze_top1" not in data["summary"]["per_arm"]["mlm"]
    assert "mask_accuracy_64" in data["summary"]["per_arm"]["mlm"]
    assert np.isfinite(data["summary"]["per_arm"]["mlm"]["cls_probe_pooled"]["mean"])


def test_a_full_disk_at_the_lock_names_the_lock_file_and_holds_nothing(tmp_path, monkeypatch):
    # The lock's own line (who holds the folder) is the first write of a run; a full disk there
    # was "[Errno 28] No space left on device", naming no file.
    from bertlab.engine import folders

    take = folders.FolderLock._take

    class Full:
        def __init__(self, handle):
            self.handle = handle

        def __getattr__(self, name):
            return getattr(self.handle, name)

        def write(self, text):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(folders.FolderLock, "_take", lambda self: Full(take(self)))
    with pytest.raises(OSError) as caught, folders.FolderLock(tmp_path / "run"):
        pass
    assert caught.value.errno == errno.ENOSPC
    assert caught.value.filename == str(tmp_path / "run" / ".lock")
    monkeypatch.undo()
    with folders.FolderLock(tmp_path / "run"):  # nothing was left held: it is taken again
        assert folders.lock_holder(tmp_path / "run") is None
