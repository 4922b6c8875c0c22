"""TensorBoard event files (`TrainConfig.tensorboard_dir`): read back, once per step across an
exact resume, and refused with the install line when the package is missing."""

from __future__ import annotations

import shutil
import sys

import pytest

from bertlab.cli import build_parser, main
from bertlab.config import TensorBoardMissingError
from bertlab.data import LoaderOptions, pretraining_loader
from bertlab.engine.eventlog import scalar_tag
from bertlab.pairs import create_nsp_examples
from bertlab.pretraining import pretrain
from bertlab.readers import load_corpus
from bertlab.tokenizer import train_tokenizer
from bertlab.train import TrainConfig
from tests.test_train import InterruptAt, make_model

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

pytestmark = pytest.mark.usefixtures("one_thread")
# Row keys whose value differs between two runs of the same settings: the timings.
TIMINGS = ("elapsed_s", "tokens_per_s")


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(load_corpus("bbc")[:200], vocab_size=500)


@pytest.fixture(scope="module")
def examples(tok):
    return create_nsp_examples(load_corpus("bbc")[:40], tok, max_seq_len=64, seed=0)


def _loaders(examples, tok):
    train = pretraining_loader(examples[:40], tok, split=None, seed=0,
                               options=LoaderOptions(batch_size=8))
    val = pretraining_loader(examples[:48], tok, split=None,
                             options=LoaderOptions(batch_size=8, shuffle=False,
                                                   mask_schedule="static"))
    return train, val


def _scalars(folder) -> dict[str, list[tuple[int, float]]]:
    """Return each scalar tag's (step, value) pairs as TensorBoard reads the folder."""
    events = event_accumulator.EventAccumulator(str(folder))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


@pytest.mark.parametrize("killed", [False, True], ids=["ctrl-c", "killed-after-checkpoint"])
def test_events_hold_each_step_once_and_equal_an_uninterrupted_run(tok, examples, tmp_path,
                                                                   killed):
    # 6 steps, a row every 2 and a checkpoint every 4; Ctrl-C arrives in step 6. "killed": the
    # Ctrl-C checkpoint is lost too (as after kill -9), so the resume starts at step 4 and makes
    # step 5 again, whose step loss the first sitting had already written.
    def config(name: str) -> TrainConfig:
        return TrainConfig(max_steps=6, batch_size=8, lr=3e-3, eval_interval=2, eval_batches=3,
                           checkpoint_interval=4, progress=False, log_interval=1,
                           tensorboard_dir=str(tmp_path / "tb" / name))

    full = pretrain(make_model(tok), *_loaders(examples, tok), config("full"),
                    out_dir=tmp_path / "full")
    train, val = _loaders(examples, tok)
    with pytest.raises(KeyboardInterrupt):
        pretrain(make_model(tok), InterruptAt(train, 6), val, config("cut"), out_dir=tmp_path / "cut")
    if killed:
        shutil.rmtree(tmp_path / "cut" / "checkpoints" / "step-00000005")
    resumed = pretrain(make_model(tok, seed=123), *_loaders(examples, tok), config("cut"),
                       out_dir=tmp_path / "cut", resume=True)
    assert resumed.first_step == (4 if killed else 5)
    assert len(list((tmp_path / "tb" / "cut").glob("events.out.tfevents.*"))) == 2  # 2 sittings

    cut, uncut = _scalars(tmp_path / "tb" / "cut"), _scalars(tmp_path / "tb" / "full")
    assert set(cut) == set(uncut)
    assert {"train/loss", "train/lr", "train/tokens_per_s", "train/step_loss",
            "val/mlm_loss", "val/mask_accuracy", "val/mask_unigram_accuracy"} <= set(cut)
    for tag, points in cut.items():
        assert [s for s, _ in points] == [s for s, _ in uncut[tag]], tag  # each step once
    assert [s for s, _ in cut["train/step_loss"]] == [1, 2, 3, 4, 5, 6]
    assert [s for s, _ in cut["val/mask_accuracy"]] == [0, 2, 4, 6]
    for row in full.history:  # the values are the uninterrupted run's history, tag by tag
        for key, value in row.items():
            if key not in ("step", *TIMINGS) and value is not None:
                tag = scalar_tag(key)
                assert dict(cut[tag])[row["step"]] == pytest.approx(value, rel=1e-5), tag
    assert [v for _, v in cut["train/step_loss"]] == pytest.approx(full.step_losses, rel=1e-5)


def test_scalar_tags_group_rows_by_what_they_measure():
    labels = ("", "64")
    assert scalar_tag("train_loss", labels) == "train/loss"
    assert scalar_tag("lr", labels) == "train/lr"
    assert scalar_tag("tokens_per_s", labels) == "train/tokens_per_s"
    assert scalar_tag("val_mask_unigram_accuracy", labels) == "val/mask_unigram_accuracy"
    assert scalar_tag("val_64_mask_accuracy", labels) == "val_64/mask_accuracy"


def test_pretrain_flag_tensorboard_sets_the_folder():
    args = build_parser().parse_args(["pretrain", "--out", "run", "--tensorboard", "tb/run"])
    assert args.tensorboard_dir == "tb/run"


def test_missing_tensorboard_is_refused_before_anything_is_written(tmp_path, monkeypatch,
                                                                    capsys):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if it were not installed
    with pytest.raises(TensorBoardMissingError, match=r"TrainConfig\.tensorboard_dir .*tensorboard "
                                                      r"package is not installed; install it "
                                                      r"with pip install 'bertlab\[tensorboard\]'"):
        TrainConfig(tensorboard_dir=tmp_path / "tb")
    with pytest.raises(ImportError):  # also what code catching ImportError expects
        TrainConfig(tensorboard_dir=tmp_path / "tb")
    code = main(["pretrain", "--out", str(tmp_path / "run"), "--tensorboard",
                 str(tmp_path / "tb"), "--max-steps", "2"])
    assert code == 2
    assert "pip install 'bertlab[tensorboard]'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists() and not (tmp_path / "tb").exists()
    assert TrainConfig().tensorboard_dir is None  # off by default: no import needed
