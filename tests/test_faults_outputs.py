"""Outputs never overwrite inputs: every command that writes checks its output path first
(`bertlab.engine.outputs.check_output`), writes by atomic replace, and names the user's path.

The matrix runs the real CLI in-process; each row checks the one `error:` line and that nothing
under the test's folder changed. The kill tests run the real CLI in a subprocess.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
import torch
from faultlib import TINY, assert_one_clear_error, assert_unchanged, corpus_folder, expand, snapshot

from bertlab.atomic import atomic_write_json
from bertlab.cli import main
from bertlab.engine.checkpoint import latest_checkpoint
from bertlab.engine.folders import FolderLock, sweep_dead_writers
from bertlab.hf import load_hf
from bertlab.readers import load_corpus
from bertlab.train import TrainConfig

LONG = "n" * 300  # one name longer than the 255 bytes a file system takes
LEGAL = "r" * 250  # a legal name, too long only for a staging name built by appending to it
# A finetune that is quick, even when it is wrongly accepted.
QUICK = "--methods tf-idf --device cpu"

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, str]:
    """Return the paths the rows refer to: a corpus, a run, its checkpoint, shards, an export,
    a task of rows, a link to it and the results of an earlier finetune."""
    root = tmp_path_factory.mktemp("outputs")
    docs = load_corpus("bbc")
    corpus = corpus_folder(root / "corpus")
    run, shards, hf = root / "run", root / "shards", root / "hf"
    assert main(["pretrain", "--corpus", str(corpus), "--out", str(run), *TINY]) == 0
    assert main(["prepare", "--corpus", str(corpus), "--out", str(shards), "--vocab-size", "300",
                 "--max-seq-len", "64"]) == 0
    assert main(["export-hf", str(run), str(hf)]) == 0
    rows = root / "rows.jsonl"
    chosen = ([d for d in docs if d.label == "sport"][:30]
              + [d for d in docs if d.label == "tech"][:30])
    rows.write_text("".join(json.dumps({"text": d.text, "label": d.label}) + "\n"
                            for d in chosen), encoding="utf-8")
    (root / "link.jsonl").symlink_to(rows)
    assert main(["finetune", str(run), "--task", str(rows), *QUICK.split(), "--json",
                 str(root / "results.json")]) == 0
    return {"root": str(root), "corpus": str(corpus), "run": str(run), "shards": str(shards),
            "hf": str(hf), "ckpt": str(latest_checkpoint(run)), "rows": str(rows),
            "link": str(root / "link.jsonl"), "long": LONG}


ROWS = [
    # finetune --json: the task, the model and bertlab's folders are inputs, never outputs
    ("json-is-the-task-file", "finetune {run} --task {rows} QUICK --json {rows}",
     ["--json {rows}", "same file as --task {rows}", "another path"]),
    ("json-is-a-link-to-the-task", "finetune {run} --task {rows} QUICK --json {link}",
     ["--json {link}", "--task {rows}", "through a link"]),
    ("json-over-the-runs-tokenizer", "finetune {run} --task {rows} QUICK --json {run}/tokenizer.json",
     ["--json {run}/tokenizer.json", "inside the run folder {run}", "outside that folder"]),
    ("json-over-a-checkpoints-weights",
     "finetune {run} --task {rows} QUICK --json {ckpt}/model.safetensors",
     ["--json {ckpt}/model.safetensors", "inside the checkpoint {ckpt}"]),
    ("json-into-an-export", "finetune {run} --task {rows} QUICK --json {hf}/results.json",
     ["--json {hf}/results.json", "inside the Hugging Face export {hf}"]),
    ("json-name-too-long", "finetune {run} --task {rows} QUICK --json {root}/{long}.json",
     ["--json {root}/{long}.json", "305 bytes long", "choose a shorter name"]),
    # prepare --out, pretrain --out, export-hf OUT: the same guard
    ("prepare-out-is-the-corpus", "prepare --corpus {corpus} --out {corpus}",
     ["--out {corpus}", "same folder", "as --corpus {corpus}"]),
    ("prepare-out-is-the-rows-file", "prepare --corpus {rows} --out {rows}",
     ["--out {rows}", "same file as --corpus {rows}"]),
    ("prepare-out-inside-a-run", "prepare --corpus {corpus} --out {run}/shards",
     ["--out {run}/shards", "inside the run folder {run}"]),
    ("prepare-out-name-too-long", "prepare --corpus {corpus} --out {root}/{long}",
     ["--out {root}/{long}", "300 bytes long"]),
    ("pretrain-out-inside-shards", "pretrain --corpus {corpus} --out {shards}/run TINY",
     ["--out {shards}/run", "inside the shard folder {shards}"]),
    ("pretrain-out-inside-a-checkpoint", "pretrain --corpus {corpus} --out {ckpt}/run TINY",
     ["--out {ckpt}/run", "inside the checkpoint {ckpt}"]),
    ("export-into-an-export", "export-hf {run} {hf}/inner",
     ["out_dir {hf}/inner", "inside the Hugging Face export {hf}"]),
    # round 5: the guard walks every folder up, and refuses an empty path (an unset variable)
    ("prepare-out-four-deep-in-a-checkpoint", "prepare --corpus {corpus} --out {ckpt}/a/b/c/d",
     ["--out {ckpt}/a/b/c/d", "inside the checkpoint {ckpt}"]),
    ("pretrain-out-five-deep-in-a-run", "pretrain --corpus {corpus} --out {run}/x/a/b/c/d TINY",
     ["--out {run}/x/a/b/c/d", "inside the run folder {run}"]),
    ("demo-out-four-deep-in-shards", "demo --out {shards}/train/a/b/c",
     ["--out {shards}/train/a/b/c", "inside the shard folder {shards}"]),
    ("pretrain-out-empty", "pretrain --corpus {corpus} --out '' TINY",
     ["--out ''", "is empty", "unset shell variable"]),
    ("prepare-corpus-empty", "prepare --corpus '' --out {root}/new",
     ["--corpus ''", "is empty"]),
    ("json-empty", "finetune {run} --task {rows} QUICK --json ''", ["--json ''", "is empty"]),
    ("tensorboard-is-the-corpus", "pretrain --corpus {corpus} --out {root}/new TINY --tensorboard {corpus}",
     ["--tensorboard {corpus}", "same folder", "as --corpus {corpus}"]),
    ("tensorboard-inside-an-export", "pretrain --corpus {corpus} --out {root}/new TINY --tensorboard {hf}/tb",
     ["--tensorboard {hf}/tb", "inside the Hugging Face export {hf}"]),
]


@pytest.mark.parametrize("command, fragments", [pytest.param(c, f, id=i) for i, c, f in ROWS])
def test_an_output_that_is_an_input_or_inside_an_artefact_is_refused(world, capsys, command,
                                                                      fragments):
    argv = expand(command.replace("QUICK", QUICK), world)
    before = snapshot(world["root"])
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert_one_clear_error(captured.err, [f.format(**world) for f in fragments])
    assert ".tmp" not in captured.err  # never the hidden staging name
    assert "test split" not in captured.out  # refused before any work
    assert_unchanged(before, snapshot(world["root"]))


@pytest.fixture
def unwritable(monkeypatch, tmp_path) -> Path:
    """Return a folder whose files cannot be created, as the kernel answers a non-root user in
    a folder without write permission. Tests may run as root, whom permission bits do not
    stop, and a read-only mount needs privileges: so creating a file there (tempfile.mkstemp,
    the one call both the output check's probe and the atomic writer make) fails with EACCES."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    real = tempfile.mkstemp

    def refused(suffix=None, prefix=None, dir=None, text=False):  # noqa: A002
        if dir is not None and Path(dir).resolve() == folder.resolve():
            raise PermissionError(13, "Permission denied",
                                  os.path.join(dir, f"{prefix or 'tmp'}x1y2z3{suffix or ''}"))
        return real(suffix, prefix, dir, text)

    monkeypatch.setattr(tempfile, "mkstemp", refused)
    return folder


def test_json_into_a_folder_that_cannot_be_written_is_refused_before_the_work(world, capsys,
                                                                              unwritable):
    target = unwritable / "results.json"
    before = snapshot(world["root"], unwritable)
    code = main(["finetune", world["run"], "--task", world["rows"], *QUICK.split(), "--json",
                 str(target)])
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert_one_clear_error(captured.err, [f"--json {target}", "cannot be written",
                                          "Permission denied"])
    assert ".tmp" not in captured.err
    assert "test split" not in captured.out  # nothing was trained and thrown away
    assert_unchanged(before, snapshot(world["root"], unwritable))


@pytest.mark.skipif(os.geteuid() == 0, reason="permission bits do not stop root")
def test_json_into_a_folder_without_write_permission_is_refused(world, capsys, tmp_path):
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        code = main(["finetune", world["run"], "--task", world["rows"], *QUICK.split(),
                     "--json", str(folder / "results.json")])
    finally:
        folder.chmod(0o755)
    captured = capsys.readouterr()
    assert code == 2
    assert_one_clear_error(captured.err, [f"--json {folder}/results.json", "cannot be written"])
    assert "test split" not in captured.out


def test_an_atomic_write_that_fails_names_your_file_not_its_temporary_one(unwritable):
    target = unwritable / "results.json"
    with pytest.raises(PermissionError) as caught:
        atomic_write_json(target, {"a": 1})
    assert caught.value.filename == str(target)
    assert list(unwritable.iterdir()) == []


def test_a_legal_250_character_out_is_written(world, tmp_path, capsys):
    shards, hf = tmp_path / LEGAL, tmp_path / ("h" * 250)
    assert main(["prepare", "--corpus", world["corpus"], "--out", str(shards), "--vocab-size",
                 "300", "--max-seq-len", "64"]) == 0, capsys.readouterr().err
    assert (shards / "train" / "meta.json").is_file()
    assert main(["export-hf", world["run"], str(hf)]) == 0, capsys.readouterr().err
    # What a killed writer of that export left is still found by its shortened name, and swept.
    from bertlab.atomic import staging_stem
    from bertlab.engine.folders import _owner

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = _owner().split("-")[0]
    stale = tmp_path / f".{staging_stem(hf.name)}.{host}-{dead.pid}.1a2b3c4d.tmp"
    stale.mkdir()
    assert main(["export-hf", world["run"], str(hf), "--overwrite"]) == 0
    assert load_hf(hf).config.vocab_size == 300
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([LEGAL, "h" * 250])


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]], ids=["plain", "overwrite"])
def test_an_export_into_a_folder_holding_only_your_readme_keeps_it(world, tmp_path, capsys,
                                                                   overwrite):
    out = tmp_path / "my-model"
    out.mkdir()
    (out / "README.md").write_text("# My model\n\nNotes of mine.\n", encoding="utf-8")
    readme = snapshot(out / "README.md")
    assert main(["export-hf", world["run"], str(out), *overwrite]) == 0, capsys.readouterr().err
    assert "your README.md there is kept" in capsys.readouterr().out
    assert snapshot(out / "README.md") == readme
    assert load_hf(out).config.vocab_size == 300


# ---------------------------------------------------------------------------------------------
# kill -9 and SIGTERM while finetune trains, with an earlier --json in place

# The real CLI, which says when its first method starts training (stdout is a pipe).
_SAYS_WHEN_IT_TRAINS = """
import sys
import bertlab.finetune as finetune
train = finetune.finetune_classifier
def told(*args, **kwargs):
    print("training", flush=True)
    return train(*args, **kwargs)
finetune.finetune_classifier = told
from bertlab.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
def test_a_kill_during_finetune_keeps_the_old_results_and_the_rerun_works(world, tmp_path, sig):
    results = tmp_path / "results.json"
    results.write_bytes(Path(world["root"], "results.json").read_bytes())
    argv = ["finetune", world["run"], "--task", world["rows"], "--methods", "fine-tuned",
            "--epochs", "2", "--batch-size", "8", "--max-seq-len", "64", "--device", "cpu",
            "--json", str(results)]
    before = snapshot(world["root"], tmp_path)
    process = subprocess.Popen([sys.executable, "-c", _SAYS_WHEN_IT_TRAINS, *argv],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    said = process.stdout.readline()  # the length line first, then "training"
    if said.startswith("reading the first 64 tokens"):
        said = process.stdout.readline()
    assert said == "training\n", process.stderr.read()
    process.send_signal(sig)
    _, err = process.communicate(timeout=120)
    if sig == signal.SIGTERM:
        assert process.returncode == 143, err
        assert "stopped by SIGTERM" in err and "Traceback" not in err
    else:
        assert process.returncode == -signal.SIGKILL
    assert_unchanged(before, snapshot(world["root"], tmp_path))  # no half file, no leftover
    done = subprocess.run([sys.executable, "-m", "bertlab", *argv], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    written = json.loads(results.read_text(encoding="utf-8"))
    assert [r["method"] for r in written["results"]] == ["fine-tuned"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


# ---------------------------------------------------------------------------------------------
# Links and devices are never replaced (round 5)


def test_json_through_a_link_writes_the_file_it_leads_to_and_keeps_the_link(world, tmp_path,
                                                                           capsys):
    target = tmp_path / "kept" / "results.json"
    target.parent.mkdir()
    target.write_text('{"old": true}', encoding="utf-8")
    link = tmp_path / "latest.json"
    link.symlink_to(target)
    assert main(["finetune", world["run"], "--task", world["rows"], *QUICK.split(), "--json",
                 str(link)]) == 0, capsys.readouterr().err
    assert link.is_symlink() and link.readlink() == target
    written = json.loads(target.read_text(encoding="utf-8"))
    assert [r["method"] for r in written["results"]] == ["TF-IDF + logistic regression"]
    assert sorted(p.name for p in target.parent.iterdir()) == ["results.json"]  # no temp left


def test_an_atomic_write_through_a_link_replaces_the_target_in_its_own_folder(tmp_path):
    target = tmp_path / "elsewhere" / "notes.json"
    target.parent.mkdir()
    target.write_text("[]", encoding="utf-8")
    link = tmp_path / "notes.json"
    link.symlink_to(target)
    atomic_write_json(link, {"a": 1})
    assert link.is_symlink() and json.loads(target.read_text()) == {"a": 1}


def test_json_to_dev_null_is_refused_before_the_work_and_the_device_stays(world, capsys):
    kind = os.stat("/dev/null").st_mode
    code = main(["finetune", world["run"], "--task", world["rows"], *QUICK.split(), "--json",
                 "/dev/null"])
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert_one_clear_error(captured.err, ["--json /dev/null", "a character device",
                                          "regular file"])
    assert "test split" not in captured.out  # refused before any work
    assert os.stat("/dev/null").st_mode == kind  # still the device it was


def test_json_to_dev_stdout_on_a_pipe_is_refused_and_the_pipe_stays(world):
    done = subprocess.run([sys.executable, "-m", "bertlab", "finetune", world["run"], "--task",
                           world["rows"], *QUICK.split(), "--json", "/dev/stdout"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert_one_clear_error(done.stderr, ["--json /dev/stdout", "FIFO (named pipe)",
                                         "through a link", "regular file"])
    assert "test split" not in done.stdout


def test_json_to_a_fifo_is_refused_and_the_fifo_stays(world, capsys, tmp_path):
    fifo = tmp_path / "results.fifo"
    os.mkfifo(fifo)
    code = main(["finetune", world["run"], "--task", world["rows"], *QUICK.split(), "--json",
                 str(fifo)])
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert_one_clear_error(captured.err, [f"--json {fifo}", "FIFO", "regular file"])
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and os.listdir(tmp_path) == ["results.fifo"]


def test_the_atomic_writer_never_replaces_a_device(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="pipe.*FIFO.*regular file"):
        atomic_write_json(fifo, {"a": 1})
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and os.listdir(tmp_path) == ["pipe"]


# ---------------------------------------------------------------------------------------------
# export-hf killed between its two renames: the next export never deletes your files

# The real CLI, killed (SIGKILL, by itself) right after it moved the old export aside and before
# it moved the new one into place: the one moment the export folder is missing.
_KILLED_BETWEEN_RENAMES = """
import os, signal, sys
import bertlab.engine.folders as files
real = files.os.replace
def replace(src, dst):
    real(src, dst)
    if str(dst).endswith(".old"):
        os.kill(os.getpid(), signal.SIGKILL)
files.os.replace = replace
from bertlab.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture
def killed_export(world, tmp_path) -> Path:
    """Return an export folder holding your notes.txt and README.md, after an `export-hf
    --overwrite` into it was killed between its two renames (the folder is missing then)."""
    out = tmp_path / "my-model"
    assert main(["export-hf", world["run"], str(out)]) == 0
    (out / "notes.txt").write_text("what I tried\n", encoding="utf-8")
    (out / "README.md").write_text("# My model\n\nmy own words\n", encoding="utf-8")
    killed = subprocess.run([sys.executable, "-c", _KILLED_BETWEEN_RENAMES, "export-hf",
                             world["run"], str(out), "--overwrite"], capture_output=True,
                            text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not out.exists()  # killed at the one moment it is missing
    return out


def test_after_a_kill_between_renames_a_plain_export_restores_and_refuses(world, killed_export,
                                                                         capsys):
    out = killed_export
    code = main(["export-hf", world["run"], str(out)])
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert_one_clear_error(captured.err, [str(out), "already holds a Hugging Face export",
                                          "--overwrite"])
    assert (out / "notes.txt").read_text() == "what I tried\n"
    assert (out / "README.md").read_text() == "# My model\n\nmy own words\n"
    assert load_hf(out).config.vocab_size == 300
    assert sorted(p.name for p in out.parent.iterdir()) == ["my-model"]  # nothing hidden left


def test_after_a_kill_between_renames_an_overwrite_keeps_your_files(world, killed_export,
                                                                    capsys):
    out = killed_export
    assert main(["export-hf", world["run"], str(out), "--overwrite"]) == 0, \
        capsys.readouterr().err
    assert (out / "notes.txt").read_text() == "what I tried\n"
    assert (out / "README.md").read_text() == "# My model\n\nmy own words\n"
    assert sorted(p.name for p in out.parent.iterdir()) == ["my-model"]


def test_a_set_aside_folder_is_kept_visible_when_its_place_was_taken_since(killed_export):
    out = killed_export
    out.mkdir()  # somebody made the folder again before the next export
    (out / "draft.txt").write_text("new\n", encoding="utf-8")
    with pytest.warns(UserWarning, match="kept as .*my-model.recovered"):
        sweep_dead_writers(out)
    kept = out.parent / "my-model.recovered"
    assert (kept / "notes.txt").read_text() == "what I tried\n"
    assert (kept / "config.json").is_file() and (out / "draft.txt").is_file()
    assert sorted(p.name for p in out.parent.iterdir()) == ["my-model", "my-model.recovered"]


def test_a_library_write_that_finds_its_folder_restored_writes_nothing(killed_export):
    from bertlab.engine.folders import atomic_write_folder

    out = killed_export
    with pytest.raises(ValueError, match="previous content is back in place"):
        atomic_write_folder(out, lambda folder: (folder / "x").write_text("x"))
    assert (out / "notes.txt").is_file() and not (out / "x").exists()


# ---------------------------------------------------------------------------------------------
# The library's writers pass the same guard (round 5)


def _tiny_run(world, out, **train):
    from bertlab.data import pretraining_loader
    from bertlab.model import BertConfig, BertForPreTraining
    from bertlab.pretraining import pretrain
    from bertlab.readers import load_corpus
    from bertlab.recipes import recipe
    from bertlab.tokenizer import load_tokenizer

    tok = load_tokenizer(Path(world["run"]) / "tokenizer.json")
    docs = load_corpus(world["corpus"])
    loader = pretraining_loader(docs, tok, split="train", seed=0,
                                options=recipe("course").loader_options())
    model = BertForPreTraining(BertConfig.preset("tiny", vocab_size=tok.get_vocab_size(),
                                                 hidden_size=32, intermediate_size=64),
                               generator=torch.Generator().manual_seed(0))
    config = TrainConfig(max_steps=2, batch_size=16, eval_interval=None, progress=False,
                         log_interval=0, device="cpu", **train)
    return pretrain(model, loader, None, config, out_dir=out)


@pytest.mark.parametrize("where, fragments", [
    ("{ckpt}/a/b/c", ["out_dir {ckpt}/a/b/c", "inside the checkpoint {ckpt}"]),
    ("", ["out_dir ''", "is empty"]),
], ids=["deep-inside-a-checkpoint", "empty"])
def test_the_librarys_pretrain_passes_the_output_guard(world, where, fragments):
    before = snapshot(world["root"])
    with pytest.raises(ValueError) as refused:
        _tiny_run(world, where.format(**world))
    for fragment in fragments:
        assert fragment.format(**world) in str(refused.value)
    assert_unchanged(before, snapshot(world["root"]))


def test_the_librarys_event_folder_may_not_lie_inside_an_export(world, tmp_path):
    before = snapshot(world["root"])
    with pytest.raises(ValueError, match=r"tensorboard_dir \(--tensorboard\) .*/tb: lies inside"):
        _tiny_run(world, tmp_path / "run", tensorboard_dir=str(Path(world["hf"]) / "tb"))
    assert_unchanged(before, snapshot(world["root"]))
    assert not (tmp_path / "run").exists()


def test_two_threads_pretraining_into_one_folder_the_second_is_refused(world, tmp_path):
    out, errors = tmp_path / "run", []
    held, release = threading.Event(), threading.Event()

    def first():
        with FolderLock(out):
            held.set()
            release.wait(60)

    holder = threading.Thread(target=first)
    holder.start()
    held.wait(60)
    try:
        _tiny_run(world, out)
    except ValueError as e:
        errors.append(str(e))
    finally:
        release.set()
        holder.join()
    assert len(errors) == 1 and "in use by another thread of this process" in errors[0]
    assert not (out / "checkpoints").exists()


def test_finetune_json_into_a_new_folder_is_made_and_threads_are_taken(world, tmp_path, capsys):
    target = tmp_path / "results" / "2026" / "x.json"
    assert main(["finetune", world["run"], "--task", world["rows"], *QUICK.split(), "--threads",
                 "1", "--json", str(target)]) == 0, capsys.readouterr().err
    assert json.loads(target.read_text(encoding="utf-8"))["results"]
    assert main(["finetune", world["run"], "--task", world["rows"], *QUICK.split(), "--threads",
                 "0"]) == 2
    assert_one_clear_error(capsys.readouterr().err, ["--threads 0"])
