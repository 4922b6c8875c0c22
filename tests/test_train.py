"""The pretraining loop: learning, exact resume, atomic checkpoints, NaN stops, bad input."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import shutil

import pytest
import torch

import bertlab.engine.checkpoint as checkpoint_mod
import bertlab.pretraining as pretraining_mod
from bertlab.course.demo import history_table
from bertlab.data import LoaderOptions, pretraining_loader
from bertlab.engine.checkpoint import (
    CorruptCheckpoint,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from bertlab.loading import list_checkpoints, load_run
from bertlab.masking import MaskingConfig
from bertlab.model import BertConfig, BertForPreTraining
from bertlab.pairs import create_nsp_examples
from bertlab.pretraining import (
    PretrainingObjective,
    evaluate,
    fast_inputs,
    fill_mask,
    pretrain,
    pretraining_counts,
    pretraining_loss,
    unigram_baseline,
)
from bertlab.readers import load_corpus
from bertlab.tokenizer import train_tokenizer
from bertlab.train import Objective, TrainConfig, build_optimizer, lr_at, train_loop

VOCAB = 500
SEQ = 64


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(load_corpus("bbc")[:200], vocab_size=VOCAB)


@pytest.fixture(scope="module")
def examples(tok):
    return create_nsp_examples(load_corpus("bbc")[:40], tok, max_seq_len=SEQ, seed=0)


def make_model(tok, dropout: float = 0.1, hidden: int = 32, seed: int = 0) -> BertForPreTraining:
    config = BertConfig.preset("tiny", vocab_size=tok.get_vocab_size(), hidden_size=hidden,
                               num_heads=2, intermediate_size=2 * hidden,
                               max_position_embeddings=SEQ, hidden_dropout=dropout,
                               attention_dropout=dropout)
    return BertForPreTraining(config, generator=torch.Generator().manual_seed(seed))


def loaders(examples, tok, batch_size=8, n_train=None, sampler=None):
    train = pretraining_loader(examples[:n_train] if n_train else examples, tok, split=None,
                               seed=0, options=LoaderOptions(batch_size=batch_size,
                                                             sampler=sampler))
    val = pretraining_loader(examples[:48], tok, split=None,
                             options=LoaderOptions(batch_size=8, shuffle=False,
                                                   mask_schedule="static"))
    return train, val


def quiet(**settings) -> TrainConfig:
    base = dict(batch_size=8, eval_interval=1000, eval_batches=3, checkpoint_interval=None,
                progress=False, log_interval=0)
    return TrainConfig(**{**base, **settings})


class InterruptAt:
    """A loader that raises KeyboardInterrupt when asked for its n-th batch (Ctrl-C stand-in)."""

    def __init__(self, loader, n: int):
        self.loader, self.n, self.served = loader, n, 0
        self.dataset, self.batch_size = loader.dataset, loader.batch_size
        self.seed = getattr(loader, "seed", None)

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def __iter__(self):
        for batch in self.loader:
            self.served += 1
            if self.served == self.n:
                raise KeyboardInterrupt
            yield batch


# ---------------------------------------------------------------------------------------------
# It learns


def test_few_steps_reduce_the_held_out_loss(tok, examples, tmp_path):
    train, val = loaders(examples, tok)
    model = make_model(tok)
    result = pretrain(model, train, val, quiet(max_steps=40, lr=5e-3, eval_interval=20),
                      out_dir=tmp_path / "run")
    first, last = result.history[0], result.history[-1]
    assert [row["step"] for row in result.history] == [0, 20, 40]
    assert first["val_mlm_loss"] == pytest.approx(math.log(VOCAB), abs=0.5)  # uniform guess
    assert last["val_mlm_loss"] < first["val_mlm_loss"] - 0.3
    assert last["val_perplexity"] == pytest.approx(math.exp(last["val_mlm_loss"]))
    assert last["tokens"] == 40 * 8 * SEQ  # every batch is padded to the longest (64) here
    # History on disk, as JSON and CSV, one row per evaluation.
    on_disk = json.loads((tmp_path / "run" / "history.json").read_text())
    assert [row["step"] for row in on_disk] == [0, 20, 40]
    csv_lines = (tmp_path / "run" / "history.csv").read_text().strip().splitlines()
    assert len(csv_lines) == 4 and csv_lines[0].startswith("step,tokens")


def test_mlm_only_loss_ignores_nsp_and_leaves_the_pooler_untrained(tok, examples):
    train, _ = loaders(examples, tok)
    batch = next(iter(train))
    model = make_model(tok, dropout=0.0)
    loss = pretraining_loss(model, batch, pretraining_counts(batch), objectives=("mlm",))
    reference = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                      labels=batch["labels"])
    assert reference.nsp_loss is None
    torch.testing.assert_close(loss, reference.mlm_loss)
    loss.backward()
    assert model.bert.pooler.weight.grad is None and model.nsp.weight.grad is None
    assert model.bert.layers[0].ffn_in.weight.grad is not None


def test_pretrain_without_nsp_and_evaluating_only_at_the_ends(tok, examples):
    train, val = loaders(examples, tok)
    model = make_model(tok)
    nsp_head = model.nsp.weight.detach().clone()
    result = pretrain(model, train, val, quiet(max_steps=12, lr=5e-3, eval_interval=None),
                      objectives=("mlm",))
    assert [row["step"] for row in result.history] == [0, 12]
    assert result.history[-1]["val_mlm_loss"] < result.history[0]["val_mlm_loss"]
    assert torch.equal(model.nsp.weight, nsp_head)  # no gradient, so AdamW left it alone


def test_pretraining_loss_matches_the_models_own_mean_loss(tok, examples):
    train, _ = loaders(examples, tok)
    batch = next(iter(train))
    model = make_model(tok, dropout=0.0)
    ours = pretraining_loss(model, batch, pretraining_counts(batch))
    assert ours.item() == pytest.approx(model(**batch).loss.item(), abs=1e-5)


def test_grad_accumulation_equals_one_big_batch(tok, examples):
    # Losses are sums over the step's targets, so 2 x 4 sequences == 1 x 8 exactly.
    big, _ = loaders(examples, tok, batch_size=8)
    small, _ = loaders(examples, tok, batch_size=4)
    a = pretrain(make_model(tok, dropout=0.0), big, None, quiet(max_steps=5, lr=3e-3))
    b = pretrain(make_model(tok, dropout=0.0), small, None,
                 quiet(max_steps=5, lr=3e-3, grad_accum=2))
    assert a.step_losses == pytest.approx(b.step_losses, abs=1e-5)


def test_lr_schedule_warmup_then_decay():
    config = TrainConfig(max_steps=100, lr=1.0, warmup_fraction=0.1)
    lrs = [lr_at(s, config) for s in range(100)]
    peak = max(range(100), key=lrs.__getitem__)
    assert 8 <= peak <= 10 and lrs[peak] == pytest.approx(1.0, abs=0.05)
    assert all(a < b for a, b in zip(lrs[:peak], lrs[1:peak + 1], strict=True))
    assert all(a >= b for a, b in zip(lrs[peak:], lrs[peak + 1:], strict=False))
    assert lrs[-1] == pytest.approx(0.0, abs=1e-12)
    cosine = TrainConfig(max_steps=100, lr=1.0, warmup_steps=10, schedule="cosine",
                         min_lr_ratio=0.1)
    assert lr_at(0, cosine) == pytest.approx(0.1)
    assert lr_at(99, cosine) == pytest.approx(0.1, abs=1e-6)
    assert lr_at(55, cosine) == pytest.approx(0.1 + 0.9 * 0.5, abs=0.02)  # half way: the middle
    timed = TrainConfig(max_steps=None, max_minutes=1.0, lr=1.0, warmup_fraction=0.0)
    assert lr_at(10_000, timed, elapsed_s=30.0) == pytest.approx(0.5)  # schedule follows time


def test_weight_decay_only_on_matrices(tok):
    model = make_model(tok)
    optimizer = build_optimizer(model, TrainConfig(weight_decay=0.1))
    decayed, plain = optimizer.param_groups
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decayed["params"])
    assert all(p.dim() == 1 for p in plain["params"])  # biases, LayerNorm, MLM output bias
    n_params = len(list(model.parameters()))  # the tied decoder is listed once
    assert len(decayed["params"]) + len(plain["params"]) == n_params


# ---------------------------------------------------------------------------------------------
# Checkpoints and exact resume


def test_resume_after_ctrl_c_equals_an_uninterrupted_run(tok, examples, tmp_path):
    # 40 examples = 5 batches per epoch, so the interruption (in step 7) lands in epoch 1;
    # dropout is on, so the dropout stream must be restored too.
    config = quiet(max_steps=10, lr=3e-3, checkpoint_interval=4, keep_checkpoints=2)
    train, _ = loaders(examples, tok, n_train=40)
    full = pretrain(make_model(tok), train, None, config, out_dir=tmp_path / "full")

    train, _ = loaders(examples, tok, n_train=40)
    with pytest.raises(KeyboardInterrupt):
        pretrain(make_model(tok), InterruptAt(train, 8), None, config, out_dir=tmp_path / "cut")
    saved = [p.name for p in list_checkpoints(tmp_path / "cut")]
    assert saved == ["step-00000004", "step-00000007"]  # the Ctrl-C checkpoint after 7 steps

    train, _ = loaders(examples, tok, n_train=40)
    resumed = pretrain(make_model(tok, seed=123), train, None, config,
                       out_dir=tmp_path / "cut", resume=True)
    assert resumed.first_step == 7
    assert resumed.step_losses == pytest.approx(full.step_losses[7:], abs=1e-6)
    final_a = load_run(tmp_path / "full")[0].state_dict()
    final_b = load_run(tmp_path / "cut")[0].state_dict()
    assert all(torch.allclose(final_a[k], final_b[k], atol=1e-6) for k in final_a)
    assert len(list_checkpoints(tmp_path / "cut")) == 2  # keep_checkpoints


def test_checkpoint_survives_a_crash_mid_write(tok, tmp_path, monkeypatch):
    model = make_model(tok)
    optimizer = build_optimizer(model, TrainConfig())
    run = tmp_path / "run"
    good = save_checkpoint(run / "checkpoints" / "step-00000001", model, optimizer,
                           state={"step": 1})
    real_save_file = checkpoint_mod.save_file

    def crash(tensors, filename, *args, **kwargs):  # write half a file, then die
        real_save_file(tensors, filename, *args, **kwargs)
        with open(filename, "r+b") as f:
            f.truncate(100)
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(checkpoint_mod, "save_file", crash)
    with torch.no_grad():
        model.nsp.bias.add_(1.0)
    with pytest.raises(OSError, match="simulated"):
        save_checkpoint(run / "checkpoints" / "step-00000002", model, optimizer, state={"step": 2})
    with pytest.raises(OSError, match="simulated"):  # overwriting in place keeps the old copy too
        save_checkpoint(good, model, optimizer, state={"step": 1})
    # A process killed mid-write leaves its hidden temporary folder behind; it never counts.
    killed = run / "checkpoints" / ".step-00000003.tmp"
    killed.mkdir()
    (killed / "model.safetensors").write_bytes(b"half a file")
    assert latest_checkpoint(run) == good
    fresh = make_model(tok)
    state = load_checkpoint(good, fresh, build_optimizer(fresh, TrainConfig()))
    assert state["step"] == 1
    assert torch.equal(fresh.nsp.bias, model.nsp.bias - 1.0)  # the weights before the crash

    monkeypatch.setattr(checkpoint_mod, "save_file", real_save_file)
    save_checkpoint(run / "checkpoints" / "step-00000002", model, optimizer, state={"step": 2})
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == ["step-00000001", "step-00000002"]  # the half-written folders are gone


def test_checkpoint_holds_tied_weights_once_and_no_pickles(tok, tmp_path):
    from safetensors import safe_open

    model = make_model(tok)
    path = save_checkpoint(tmp_path / "ck", model, build_optimizer(model, TrainConfig()),
                           state={"step": 0})
    assert sorted(p.name for p in path.iterdir()) == ["digests.json", "model.safetensors",
                                                      "optimizer.safetensors", "state.json"]
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert sum("word_embeddings" in k for k in keys) == 1
    assert len(keys) == len(model.state_dict())


# ---------------------------------------------------------------------------------------------
# Stops and errors


def test_nan_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(tok, examples,
                                                                          tmp_path):
    train, _ = loaders(examples, tok)
    calls = {"n": 0}

    class Poisoned(Objective):  # the 6th batch (step 5) goes bad
        def counts(self, batch):
            return pretraining_counts(batch)

        def loss(self, model, batch, totals):
            calls["n"] += 1
            loss = pretraining_loss(model, batch, totals)
            return loss * float("nan") if calls["n"] == 6 else loss

    model = make_model(tok)
    with pytest.raises(FloatingPointError, match=r"training loss is nan at step 5\b.*step-00000004"):
        train_loop(model, train, quiet(max_steps=10, checkpoint_interval=2), Poisoned(),
                   out_dir=tmp_path / "run")
    assert latest_checkpoint(tmp_path / "run").name == "step-00000004"
    assert all(torch.isfinite(p).all() for p in model.parameters())  # the update was skipped
    load_run(tmp_path / "run")  # and the checkpoint still loads


def test_huge_learning_rate_is_caught(tok, examples):
    train, _ = loaders(examples, tok)
    with pytest.raises(FloatingPointError, match=r"at step \d+"):
        pretrain(make_model(tok), train, None, quiet(max_steps=30, lr=1e30, grad_clip=None,
                                                     warmup_fraction=0.0))


def test_checkpoint_from_another_vocab_size_names_both(tok, tmp_path):
    model = make_model(tok)
    path = save_checkpoint(tmp_path / "ck", model, state={"step": 0})
    other = BertForPreTraining(BertConfig.from_dict({**model.config.to_dict(), "vocab_size": 700}))
    with pytest.raises(ValueError, match=r"vocab_size: checkpoint 500 vs model 700"):
        load_checkpoint(path, other)
    wider = make_model(tok, hidden=64)
    with pytest.raises(ValueError, match=r"hidden_size: checkpoint 32 vs model 64"):
        load_checkpoint(path, wider)


def test_corrupt_checkpoint_is_a_clear_error(tok, tmp_path):
    model = make_model(tok)
    path = save_checkpoint(tmp_path / "ck", model, state={"step": 0})
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="corrupt.*model.safetensors"):
        load_checkpoint(path, make_model(tok))
    (path / "model.safetensors").write_bytes(data)
    (path / "state.json").write_text("{not json")
    with pytest.raises(ValueError, match="corrupt.*state.json"):
        load_checkpoint(path, make_model(tok))
    with pytest.raises(ValueError, match="not a bertlab checkpoint"):
        load_checkpoint(tmp_path, make_model(tok))


def _flip_one_byte(file, offset=-100):
    data = bytearray(file.read_bytes())
    data[offset] ^= 0xFF
    file.write_bytes(bytes(data))


def test_a_flipped_byte_is_named_corrupt_and_load_run_falls_back(tok, examples, tmp_path):
    train, _ = loaders(examples, tok)
    config = quiet(max_steps=4, checkpoint_interval=2, keep_checkpoints=3)
    pretrain(make_model(tok), train, None, config, out_dir=tmp_path / "run")
    older, newest = list_checkpoints(tmp_path / "run")
    _flip_one_byte(newest / "model.safetensors")  # same size, one weight changed
    with pytest.raises(CorruptCheckpoint, match="model.safetensors does not match"):
        load_checkpoint(newest, make_model(tok))
    with pytest.warns(UserWarning, match=r"step-00000004 is corrupt.*Using step-00000002"):
        model, _ = load_run(tmp_path / "run")
    expected = make_model(tok)
    load_checkpoint(older, expected)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 expected.state_dict().values(), strict=True))
    _flip_one_byte(older / "optimizer.safetensors")
    with pytest.raises(CorruptCheckpoint, match="step-00000004"):  # none verifies
        load_run(tmp_path / "run")


@pytest.mark.parametrize("when", ["while it is verified", "after it was verified"])
def test_a_checkpoint_rotated_away_by_a_running_run_is_not_called_corrupt(tok, examples, tmp_path,
                                                                           monkeypatch, when):
    import warnings

    from bertlab.engine import checkpoint as ck

    train, _ = loaders(examples, tok)
    pretrain(make_model(tok), train, None, quiet(max_steps=4, checkpoint_interval=2,
                                                 keep_checkpoints=3), out_dir=tmp_path / "run")
    older, newest = list_checkpoints(tmp_path / "run")
    # A run writing into the folder deletes a checkpoint just as a reader takes it (here the
    # newest, as keep_checkpoints=1 would): the reader takes the newest that is still there.
    target = "verify_checkpoint" if when == "while it is verified" else "_load_run_model"
    real, gone = getattr(ck, target), []

    def rotated(path, *args, **kwargs):
        if not gone:
            gone.append(path)
            shutil.rmtree(path)
        return real(path, *args, **kwargs)
    monkeypatch.setattr(ck, target, rotated)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "corrupt" warning either
        model, _ = load_run(tmp_path / "run")
    assert gone == [newest] and not newest.exists()
    expected = make_model(tok)
    load_checkpoint(older, expected)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 expected.state_dict().values(), strict=True))


def test_resume_skips_a_corrupt_newest_checkpoint_and_moves_it_aside(tok, examples, tmp_path):
    config = quiet(max_steps=6, checkpoint_interval=2, keep_checkpoints=5)
    train, _ = loaders(examples, tok)
    full = pretrain(make_model(tok), train, None, config, out_dir=tmp_path / "full")
    train, _ = loaders(examples, tok)
    pretrain(make_model(tok), train, None, config, out_dir=tmp_path / "run")
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "step-00000006")  # as if stopped at step 4
    _flip_one_byte(tmp_path / "run" / "checkpoints" / "step-00000004" / "state.json", 10)
    train, _ = loaders(examples, tok)
    with pytest.warns(UserWarning) as caught:
        resumed = pretrain(make_model(tok), train, None, config, out_dir=tmp_path / "run",
                           resume=True)
    said = [str(w.message) for w in caught]
    assert any("step-00000004 is corrupt" in m and "Using step-00000002" in m for m in said)
    assert any("moved the corrupt checkpoint step-00000004 aside" in m for m in said)
    assert resumed.first_step == 2
    assert resumed.step_losses == pytest.approx(full.step_losses[2:], abs=1e-6)
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert names == ["corrupt-step-00000004", "step-00000002", "step-00000004", "step-00000006"]


def test_non_finite_weights_are_refused_on_load(tok, tmp_path):
    model = make_model(tok)
    with torch.no_grad():
        model.nsp.weight[0, 0] = float("nan")
    path = save_checkpoint(tmp_path / "ck", model, state={"step": 0})  # digests match: not corrupt
    with pytest.raises(ValueError, match=r"non-finite weights \(NaN or inf in nsp.weight\)"):
        load_checkpoint(path, make_model(tok))


@pytest.mark.parametrize("change, message", [
    ({"batch_size": 4}, "batch_size 8, this resume has 4"),
    ({"seed": 5}, "data seed 0, this resume has 5"),
    ({"n_train": 24}, "number of training examples 40, this resume has 24"),
])
def test_resume_that_would_not_be_exact_is_refused_naming_both_values(tok, examples, tmp_path,
                                                                      change, message):
    train, _ = loaders(examples, tok, n_train=40)
    pretrain(make_model(tok), train, None, quiet(max_steps=2), out_dir=tmp_path / "run")
    before = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    batch = change.get("batch_size", 8)
    train = pretraining_loader(examples[: change.get("n_train", 40)], tok, split=None,
                               seed=change.get("seed", 0), options=LoaderOptions(batch_size=batch))
    with pytest.raises(ValueError, match=message):
        pretrain(make_model(tok), train, None, quiet(max_steps=4, batch_size=batch),
                 out_dir=tmp_path / "run", resume=True)
    after = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    assert after == before


def test_a_second_run_on_a_locked_folder_is_refused(tok, examples, tmp_path):
    import subprocess
    import sys

    train, _ = loaders(examples, tok)
    (tmp_path / "run").mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from bertlab.engine.folders import FolderLock\n"
         f"with FolderLock({str(tmp_path / 'run')!r}):\n print('held', flush=True); "
         "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ValueError, match=rf"in use by process {holder.pid}\b"):
            pretrain(make_model(tok), train, None, quiet(max_steps=1), out_dir=tmp_path / "run")
    finally:
        holder.kill()
        holder.wait()
    assert not (tmp_path / "run" / "checkpoints").exists()
    pretrain(make_model(tok), train, None, quiet(max_steps=1), out_dir=tmp_path / "run")  # free


def test_a_full_disk_during_a_save_names_the_checkpoint_that_survives(tok, tmp_path, monkeypatch):
    model = make_model(tok)
    good = save_checkpoint(tmp_path / "checkpoints" / "step-00000001", model, state={"step": 1})

    def full(*args, **kwargs):
        raise checkpoint_mod.SafetensorError(
            'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: '
            '"No space left on device" })')

    monkeypatch.setattr(checkpoint_mod, "save_file", full)
    with pytest.raises(OSError, match=r"no space left.*step-00000002.*still .*step-00000001"):
        save_checkpoint(tmp_path / "checkpoints" / "step-00000002", model,
                        build_optimizer(model, TrainConfig()), state={"step": 2})
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [good.name]


def test_out_dir_problems(tok, examples, tmp_path):
    train, _ = loaders(examples, tok)
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        pretrain(make_model(tok), train, None, quiet(max_steps=1), out_dir=a_file)
    with pytest.raises(ValueError, match="has no checkpoint to continue"):
        pretrain(make_model(tok), train, None, quiet(max_steps=1), out_dir=tmp_path / "new",
                 resume=True)
    pretrain(make_model(tok), train, None, quiet(max_steps=1), out_dir=tmp_path / "done")
    with pytest.raises(ValueError, match="already holds a pretraining run.*resume=True"):
        pretrain(make_model(tok), train, None, quiet(max_steps=1), out_dir=tmp_path / "done")


def test_loader_batch_must_fit_the_global_batch(tok, examples):
    train, _ = loaders(examples, tok, batch_size=8)
    with pytest.raises(ValueError, match="needs 4 per batch"):
        pretrain(make_model(tok), train, None, quiet(max_steps=1, grad_accum=2))


@pytest.mark.parametrize("settings, message", [
    ({"schedule": "step"}, r"schedule='step' is not one of"),
    ({"precision": "fp8"}, "precision='fp8'"),
    ({"max_steps": None}, "needs a budget"),
    ({"max_steps": 0}, r"TrainConfig.max_steps must be a positive integer"),
    ({"lr": -1.0}, r"lr must be a positive number"),
    ({"batch_size": 10, "grad_accum": 3}, "not divisible by grad_accum=3"),
    ({"warmup_fraction": 1.5}, r"warmup_fraction must be in \[0, 1\)"),
    ({"device": "gpu"}, "device='gpu'"),
    ({"betas": (0.9, 1.5)}, "betas"),
    ({"warmup_steps": 5000, "max_steps": 10}, "never leave warmup"),
    ({"eps": float("inf")}, r"eps must be a positive number, got inf; inf and NaN"),
    ({"lr": float("inf")}, r"lr must be a positive number, got inf"),
    ({"max_minutes": float("inf")},
     r"max_minutes must be a positive number or None, got inf"),
    ({"grad_clip": float("nan")}, r"grad_clip must be a positive number or None, "
                                  r"got nan"),
    ({"weight_decay": float("nan")}, r"weight_decay must be a number >= 0, got nan"),
    ({"weight_decay": float("inf")}, r"weight_decay must be a number >= 0, got inf"),
    ({"weight_decay": -0.1}, r"weight_decay must be a number >= 0, got -0.1"),
    ({"muon_lr": float("inf")}, r"muon_lr must be a positive number, got inf"),
    ({"muon_lr": float("nan")}, r"muon_lr must be a positive number, got nan"),
])
def test_train_config_rejects_bad_settings(settings, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**settings)


# ---------------------------------------------------------------------------------------------
# Using the model


def test_fill_mask_ranks_the_vocabulary_at_each_mask(tok):
    model = make_model(tok)
    guesses = fill_mask(model, tok, "the [MASK] rose after the [MASK] said so", top_k=4)
    assert len(guesses) == 2 and all(len(g) == 4 for g in guesses)
    probs = [p for _, p in guesses[0]]
    assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-6
    # The same numbers by hand: softmax of the MLM logits at the first mask.
    assert model.training  # fill_mask left the mode as it was
    ids = torch.tensor([tok.encode("the [MASK] rose after the [MASK] said so").ids])
    with torch.no_grad():
        logits = model.eval()(ids).mlm_logits[0, 2]  # (1, T, V) -> (V,): position 2
    top = logits.softmax(-1).topk(4)
    assert [t for t, _ in guesses[0]] == [tok.id_to_token(int(i)) for i in top.indices]
    assert probs == pytest.approx(top.values.tolist(), abs=1e-6)
    with pytest.raises(ValueError, match="has no \\[MASK\\]"):
        fill_mask(model, tok, "no mask here")


def test_unigram_baseline_guesses_the_most_frequent_training_target(tok, examples):
    train, val = loaders(examples, tok)
    baseline = unigram_baseline(train, val, max_batches=3)
    train.set_epoch(0)
    targets = torch.cat([b["labels"][b["labels"] != -100] for _, b in zip(range(3), train,
                                                                          strict=False)])
    assert baseline["token_id"] == int(torch.bincount(targets).argmax())
    val_targets = torch.cat([b["labels"][b["labels"] != -100] for _, b in zip(range(3), val,
                                                                              strict=False)])
    expected = float((val_targets == baseline["token_id"]).float().mean())
    assert baseline["mlm_accuracy"] == pytest.approx(expected)


def test_evaluate_counts_every_target_once(tok, examples):
    _, val = loaders(examples, tok)
    model = make_model(tok)
    metrics = evaluate(model, val, max_batches=2)
    batches = [b for _, b in zip(range(2), val, strict=False)]
    targets = sum(int((b["labels"] != -100).sum()) for b in batches)
    with torch.no_grad():
        model.eval()
        correct = sum(int((model(**b).target_logits.argmax(-1) == b["labels"][b["labels"] != -100])
                          .sum()) for b in batches)
    assert metrics["mlm_accuracy"] == pytest.approx(correct / targets)
    kinds = {f"{k}_{m}" for k in ("mask", "random", "kept") for m in ("accuracy", "loss")}
    assert set(metrics) == {"mlm_loss", "mlm_accuracy", "perplexity", "nsp_loss", "nsp_accuracy",
                            "mask_unigram_accuracy", "mask_unigram_loss", "mask_targets", *kinds}
    assert list(metrics)[0] == "mask_accuracy"  # the headline comes first
    mask_id = tok.token_to_id("[MASK]")
    shown_mask = sum(int(((b["labels"] != -100) & (b["input_ids"] == mask_id)).sum()) for b in batches)
    assert metrics["mask_targets"] == shown_mask  # what the bar was counted on


def test_an_untrained_pair_head_reports_no_nsp_figure(tok, examples):
    # Masked LM alone never trains the NSP head: its accuracy is chance, not a result, so the
    # metrics, the history and its table leave it out, and the table says why.
    _, val = loaders(examples, tok)
    model = make_model(tok)
    assert "nsp_accuracy" in evaluate(model, val, max_batches=1, objectives=("mlm", "nsp"))
    assert "nsp_accuracy" in evaluate(model, val, max_batches=1)  # objectives unknown
    mlm_only = evaluate(model, val, max_batches=1, objectives=("mlm",))
    assert not [k for k in mlm_only if k.startswith("nsp")]
    history = [{"step": 0, "tokens": 0, **{f"val_{k}": v for k, v in mlm_only.items()}}]
    table = history_table(history)
    assert "NSP acc" not in table and "NSP: not trained" in table
    assert f"on these {mlm_only['mask_targets']:,} targets" in table



def test_the_first_history_row_after_a_resume_counts_every_step_since_the_last_row(tok, examples,
                                                                                    tmp_path):
    # Rows at steps 5 and 10; the run is stopped after step 7, so the row at step 10 must average
    # steps 6-10 as the uninterrupted run's does, not only the three steps after the resume.
    config = quiet(max_steps=10, lr=3e-3, checkpoint_interval=4, eval_interval=5)
    train, _ = loaders(examples, tok, n_train=40)
    full = pretrain(make_model(tok), train, None, config, out_dir=tmp_path / "full")
    train, _ = loaders(examples, tok, n_train=40)
    with pytest.raises(KeyboardInterrupt):
        pretrain(make_model(tok), InterruptAt(train, 8), None, config, out_dir=tmp_path / "cut")
    train, _ = loaders(examples, tok, n_train=40)
    resumed = pretrain(make_model(tok, seed=123), train, None, config, out_dir=tmp_path / "cut",
                       resume=True)
    assert [row["step"] for row in resumed.history] == [5, 10]
    assert resumed.history[-1]["train_loss"] == pytest.approx(full.history[-1]["train_loss"],
                                                              abs=1e-6)
    assert resumed.history[-1]["train_loss"] == pytest.approx(
        sum(full.step_losses[5:10]) / 5, abs=1e-6)


@pytest.mark.parametrize("change, message", [
    ({"lr": 5e-3}, "lr 0.001, this resume has 0.005"),
    ({"schedule": "cosine"}, "schedule linear, this resume has cosine"),
    ({"weight_decay": 0.1}, "weight_decay 0.01, this resume has 0.1"),
    ({"grad_clip": None}, "grad_clip 1.0, this resume has None"),
    ({"optimizer": "muon"}, "optimizer adamw, this resume has muon"),
])
def test_an_api_resume_with_other_learning_settings_is_refused(tok, examples, tmp_path, change,
                                                               message):
    train, _ = loaders(examples, tok, n_train=40)
    pretrain(make_model(tok), train, None, quiet(max_steps=2, lr=1e-3), out_dir=tmp_path / "run")
    before = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    with pytest.raises(ValueError, match=message + ".*--resume"):
        pretrain(make_model(tok), loaders(examples, tok, n_train=40)[0], None,
                 quiet(**{"max_steps": 4, "lr": 1e-3, **change}), out_dir=tmp_path / "run",
                 resume=True)
    assert {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("change, message", [
    ({"masking": MaskingConfig(mlm_probability=0.4)},
     "masking mlm_probability 0.15, this resume has 0.4"),
    ({"masking": MaskingConfig(mask_replace_prob=1.0, random_replace_prob=0.0)},
     "masking mask_replace_prob 0.8, this resume has 1.0"),
    ({"group_by_length": 2}, "group_by_length 0, this resume has 2"),
])
def test_a_resume_with_other_masking_or_grouping_is_refused(tok, examples, tmp_path, change,
                                                            message):
    train = pretraining_loader(examples[:40], tok, split=None, seed=0,
                               options=LoaderOptions(batch_size=8))
    pretrain(make_model(tok), train, None, quiet(max_steps=2), out_dir=tmp_path / "run")
    other = pretraining_loader(examples[:40], tok, split=None, seed=0,
                               options=LoaderOptions(batch_size=8, **change))
    with pytest.raises(ValueError, match=message):
        pretrain(make_model(tok), other, None, quiet(max_steps=4), out_dir=tmp_path / "run",
                 resume=True)


def test_a_checkpoint_written_before_masking_and_grouping_were_recorded_still_resumes(
        tok, examples, tmp_path):
    config = quiet(max_steps=4, checkpoint_interval=2)
    train = pretraining_loader(examples[:40], tok, split=None, seed=0,
                               options=LoaderOptions(batch_size=8))
    full = pretrain(make_model(tok), train, None, config, out_dir=tmp_path / "full")
    shutil.copytree(tmp_path / "full", tmp_path / "old")
    shutil.rmtree(tmp_path / "old" / "checkpoints" / "step-00000004")
    ckpt = tmp_path / "old" / "checkpoints" / "step-00000002"
    state = json.loads((ckpt / "state.json").read_text())
    del state["masking"], state["group_by_length"]  # as a checkpoint of the last release
    (ckpt / "state.json").write_text(json.dumps(state))
    digests = json.loads((ckpt / "digests.json").read_text())
    digests["state.json"] = hashlib.sha256((ckpt / "state.json").read_bytes()).hexdigest()
    (ckpt / "digests.json").write_text(json.dumps(digests))
    train = pretraining_loader(examples[:40], tok, split=None, seed=0,
                               options=LoaderOptions(batch_size=8))
    resumed = pretrain(make_model(tok), train, None, config, out_dir=tmp_path / "old",
                       resume=True)
    assert resumed.first_step == 2
    assert resumed.step_losses == pytest.approx(full.step_losses[2:], abs=1e-6)


class InterruptEvaluation:
    """A validation loader whose `n`-th pass is stopped by Ctrl-C after one batch (SIGTERM during
    an evaluation)."""

    def __init__(self, loader, n: int):
        self.loader, self.n, self.passes = loader, n, 0

    def __getattr__(self, name):
        return getattr(self.loader, name)

    def __iter__(self):
        self.passes += 1
        for i, batch in enumerate(self.loader):
            if self.passes == self.n and i == 1:
                raise KeyboardInterrupt
            yield batch


def test_a_stop_during_an_evaluation_keeps_that_history_row_on_resume(tok, examples, tmp_path):
    # Rows at steps 0, 5 and 10; the stop lands in the evaluation of step 5 (the loader's second
    # pass), so the checkpoint of step 5 has no row for it yet: the resume makes it.
    config = quiet(max_steps=10, lr=3e-3, eval_interval=5, checkpoint_interval=None)
    train, val = loaders(examples, tok, n_train=40)
    full = pretrain(make_model(tok), train, val, config, out_dir=tmp_path / "full")
    train, val = loaders(examples, tok, n_train=40)
    with pytest.raises(KeyboardInterrupt):
        pretrain(make_model(tok), train, InterruptEvaluation(val, 2), config,
                 out_dir=tmp_path / "cut")
    assert [p.name for p in list_checkpoints(tmp_path / "cut")] == ["step-00000005"]
    train, val = loaders(examples, tok, n_train=40)
    resumed = pretrain(make_model(tok, seed=123), train, val, config, out_dir=tmp_path / "cut",
                       resume=True)
    assert [row["step"] for row in resumed.history] == [0, 5, 10]
    timing = ("elapsed_s", "tokens_per_s")
    for a, b in zip(full.history, resumed.history, strict=True):
        assert {k: v for k, v in a.items() if k not in timing} == pytest.approx(
            {k: v for k, v in b.items() if k not in timing}, abs=1e-6)
    on_disk = json.loads((tmp_path / "cut" / "history.json").read_text())
    assert [row["step"] for row in on_disk] == [0, 5, 10]


def test_a_resume_on_another_corpus_of_the_same_size_is_refused(tok, examples, tmp_path):
    config = quiet(max_steps=4, checkpoint_interval=2)
    train, _ = loaders(examples, tok, n_train=40)
    pretrain(make_model(tok), train, None, config, out_dir=tmp_path / "run")
    other = [dataclasses.replace(e, input_ids=[e.input_ids[0], *reversed(e.input_ids[1:-1]),
                                                e.input_ids[-1]]) for e in examples[:40]]
    assert len(other) == len(train.dataset)  # the same number of examples...
    swapped = pretraining_loader(other, tok, split=None, seed=0,
                                 options=LoaderOptions(batch_size=8))
    with pytest.raises(ValueError, match="training examples' digest .* this resume has"):
        pretrain(make_model(tok), swapped, None, quiet(max_steps=6, checkpoint_interval=2),
                 out_dir=tmp_path / "run", resume=True)  # ...but other text


@pytest.mark.slow
def test_a_compiled_training_step_on_the_cpu_matches_eager_in_one_graph(tok, examples):
    # torch.compile (inductor: C++ on a CPU, Triton on a GPU) of the training forward, the loss
    # and the backward; the fused optimizer step stays eager. The MLM head gets a fixed number
    # of rows (bertlab.pretraining.mlm_capacity), so no data-dependent shape splits the graph.
    import torch._dynamo as dynamo

    train, _ = loaders(examples, tok)
    config = quiet(max_steps=3, lr=1e-3, schedule="constant", warmup_fraction=0.0)
    eager = pretrain(make_model(tok, dropout=0.0), train, None, config)
    dynamo.reset()
    dynamo.utils.counters.clear()
    compiled = pretrain(make_model(tok, dropout=0.0), train, None,
                        dataclasses.replace(config, compile=True))
    assert not dynamo.utils.counters["graph_break"], dict(dynamo.utils.counters["graph_break"])
    assert compiled.steps == eager.steps == 3
    assert compiled.step_losses == pytest.approx(eager.step_losses, rel=1e-4)


def test_a_batch_without_padding_reaches_the_model_without_a_mask_and_trains_the_same(
        tok, examples, monkeypatch):
    # No mask at all is the form in which scaled_dot_product_attention may pick its flash
    # kernel; the check runs on the CPU batch, so the step never waits on the device for it.
    full = [e for e in examples if len(e.input_ids) == SEQ][:16]
    assert len(full) == 16
    batch = next(iter(pretraining_loader(full, tok, split=None, seed=0,
                                         options=LoaderOptions(batch_size=16))))
    assert "attention_mask" not in fast_inputs(batch)
    short = next(e for e in examples if len(e.input_ids) < SEQ)
    padded = next(iter(pretraining_loader([*full[:15], short], tok, split=None,
                                          options=LoaderOptions(batch_size=16))))
    assert not bool(padded["attention_mask"].all())
    assert fast_inputs(padded) is padded  # padding keeps its mask
    seen = []

    def inputs(batch, **settings):  # what the objective's inputs() hands the model
        prepared = fast_inputs(batch, **settings)
        seen.append(prepared.get("attention_mask"))
        return prepared
    loader = pretraining_loader(full, tok, split=None, seed=0, options=LoaderOptions(batch_size=8))
    monkeypatch.setattr(pretraining_mod, "fast_inputs", inputs)
    run = pretrain(make_model(tok, dropout=0.0), loader, None, quiet(max_steps=2, lr=1e-3))
    assert seen == [None, None]
    # The same steps with the all-ones mask handed over, as the batches come.
    monkeypatch.setattr(pretraining_mod, "fast_inputs", lambda batch, **settings: batch)
    again = train_loop(make_model(tok, dropout=0.0), loader, quiet(max_steps=2, lr=1e-3),
                       PretrainingObjective(("mlm", "nsp")))
    assert run.step_losses == pytest.approx(again.step_losses, rel=1e-5)


