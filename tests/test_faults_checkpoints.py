"""A model travels with its own tokenizer, and a checkpoint that cannot be verified is never
loaded as if it could (nothing lost, round 5).

Every command that loads a run's checkpoint with the run's tokenizer.json (export-hf, fill-mask,
finetune, `bl.load_model`) compares the tokenizer's vocabulary with the digest the checkpoint
recorded; a checkpoint whose digests.json covers no file (or not every file), and a stray or
empty step-N folder, count as corrupt, so the readers fall back to an older one with a warning;
when every checkpoint fails, the message says there is none to fall back to. Each row runs the
real CLI in-process and hashes the folders before and after.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from faultlib import (
    SMALL,
    assert_one_clear_error,
    assert_unchanged,
    corpus_folder,
    expand,
    snapshot,
)

from bertlab.cli import main
from bertlab.engine.checkpoint import CorruptCheckpoint
from bertlab.loading import list_checkpoints, load_run

pytestmark = pytest.mark.usefixtures("one_thread")

QUICK = "--methods tf-idf --device cpu"  # a finetune that is quick even when wrongly accepted


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, str]:
    """A run with two checkpoints (steps 2 and 4), a task of rows, and copies of the run: with
    a tokenizer whose ids are swapped (same size), with its newest checkpoint's digests.json
    emptied and a byte of its weights flipped, with an empty step folder newer than both, and
    with every checkpoint damaged."""
    root = tmp_path_factory.mktemp("checkpoints")
    corpus = corpus_folder(root / "corpus", 24)
    run = root / "run"
    assert main(["pretrain", "--corpus", str(corpus), "--out", str(run), *SMALL, "--max-steps",
                 "4", "--checkpoint-interval", "2"]) == 0
    assert [p.name for p in list_checkpoints(run)] == ["step-00000002", "step-00000004"]
    rows = root / "rows.jsonl"
    rows.write_text("".join(json.dumps({"text": f"story {i} about {t}", "label": t}) + "\n"
                            for i in range(12) for t in ("sport", "tech")), encoding="utf-8")
    paths = {"root": root, "corpus": corpus, "run": run, "rows": rows}
    for name in ("swapped", "no_digests", "stray", "all_corrupt"):
        paths[name] = root / f"run-{name}"
        shutil.copytree(run, paths[name])
    tok = json.loads((run / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = tok["model"]["vocab"]
    a, b = "the", next(w for w in vocab if w.isalpha() and w != "the")
    vocab[a], vocab[b] = vocab[b], vocab[a]  # same size, another word for two ids
    (paths["swapped"] / "tokenizer.json").write_text(json.dumps(tok), encoding="utf-8")
    newest = paths["no_digests"] / "checkpoints" / "step-00000004"
    (newest / "digests.json").write_text("{}", encoding="utf-8")
    _flip_a_byte(newest / "model.safetensors")
    (paths["stray"] / "checkpoints" / "step-00000006").mkdir()
    for step in list_checkpoints(paths["all_corrupt"]):
        _flip_a_byte(step / "model.safetensors")
    return {k: str(v) for k, v in paths.items()}


SWAPPED = [
    ("export-hf", "export-hf {swapped} {root}/export"),
    ("fill-mask", "fill-mask {swapped} 'the [MASK] rose'"),
    ("finetune", "finetune {swapped} --task {rows} QUICK"),
]


@pytest.mark.parametrize("command", [pytest.param(c, id=i) for i, c in SWAPPED])
def test_a_swapped_tokenizer_of_the_same_size_is_refused_by_every_command(world, capsys,
                                                                        command):
    before = snapshot(world["root"])
    code = main(expand(command.replace("QUICK", QUICK), world))
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert_one_clear_error(captured.err, [f"{world['swapped']}/tokenizer.json",
                                          "not the tokenizer this run trained with",
                                          "put back the run's own tokenizer.json"])
    assert_unchanged(before, snapshot(world["root"]))


def test_the_library_loader_refuses_a_swapped_tokenizer_too(world):
    with pytest.raises(ValueError, match="not the tokenizer this run trained with"):
        load_run(world["swapped"])


def test_a_checkpoint_whose_digests_cover_nothing_is_corrupt_and_skipped(world):
    with pytest.warns(UserWarning, match=r"step-00000004 is corrupt: digests.json lists no digest .* "
                                         r"Using step-00000002 instead"):
        model, _ = load_run(world["no_digests"])
    assert model is not None


def test_an_empty_step_folder_does_not_block_the_fallback(world, capsys):
    with pytest.warns(UserWarning, match=r"step-00000006 is corrupt: it holds neither digests.json "
                                         r"nor state.json .* Using step-00000004 instead"):
        load_run(world["stray"])
    assert main(["fill-mask", world["stray"], "the [MASK] rose"]) == 0, capsys.readouterr().err


def test_when_every_checkpoint_is_corrupt_the_message_offers_no_older_one(world, capsys):
    with pytest.raises(CorruptCheckpoint) as caught:
        load_run(world["all_corrupt"])
    message = str(caught.value)
    assert "every checkpoint of" in message and "none to fall back to" in message
    assert "use an older checkpoint" not in message
    before = snapshot(world["root"])
    assert main(["export-hf", world["all_corrupt"], str(Path(world["root"]) / "x")]) == 2
    assert_one_clear_error(capsys.readouterr().err, ["every checkpoint of", "train again"])
    assert_unchanged(before, snapshot(world["root"]))
