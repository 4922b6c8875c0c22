"""Unpadding in the loop: a padded batch's blocks run on its real tokens only, with the same
numbers (the forward itself is checked against the textbook model in tests/test_fast.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import bertlab.pretraining as pretraining_mod
from bertlab.data import LoaderOptions, pretraining_loader
from bertlab.finetune import finetune_classifier
from bertlab.model import BertConfig, BertForPreTraining
from bertlab.pairs import create_nsp_examples
from bertlab.pretraining import fast_inputs, pretrain, real_token_positions
from bertlab.readers import load_corpus
from bertlab.tokenizer import train_tokenizer
from bertlab.train import TrainConfig

pytestmark = pytest.mark.usefixtures("one_thread")

SEQ = 128  # BBC pairs at 128 tokens: about a tenth of the positions are padding


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(load_corpus("bbc")[:200], vocab_size=500)


@pytest.fixture(scope="module")
def examples(tok):
    return create_nsp_examples(load_corpus("bbc")[:40], tok, max_seq_len=SEQ, seed=0)


def pretraining_model(tok, seed: int = 0) -> BertForPreTraining:
    config = BertConfig.preset("tiny", vocab_size=tok.get_vocab_size(), hidden_size=32,
                               num_heads=2, intermediate_size=64, max_position_embeddings=SEQ,
                               hidden_dropout=0.0, attention_dropout=0.0)
    return BertForPreTraining(config, generator=torch.Generator().manual_seed(seed))


def quiet(**settings) -> TrainConfig:
    return TrainConfig(**{**dict(batch_size=8, max_steps=4, lr=1e-3, eval_interval=None,
                                 checkpoint_interval=None, progress=False, log_interval=0),
                          **settings})


def test_pretrain_with_unpad_hands_padded_batches_their_real_tokens_and_trains_the_same(
        tok, examples, monkeypatch):
    loader = pretraining_loader(examples, tok, split=None, seed=0,
                                options=LoaderOptions(batch_size=8))
    batches = list(loader)[:4]
    padded_ones = [not bool(b["attention_mask"].all()) for b in batches]
    assert 0 < sum(padded_ones) < 4, padded_ones  # both kinds among the 4 steps' batches
    batch = batches[padded_ones.index(True)]
    assert "real_tokens" not in fast_inputs(batch)  # off unless asked
    torch.testing.assert_close(fast_inputs(batch, unpad=True)["real_tokens"],
                               real_token_positions(batch["attention_mask"]))
    seen = []

    def inputs(batch, **settings):  # what the objective's inputs() hands the model, batch by batch
        prepared = fast_inputs(batch, **settings)
        seen.append(prepared.get("real_tokens") is not None)
        return prepared
    monkeypatch.setattr(pretraining_mod, "fast_inputs", inputs)
    unpadded = pretrain(pretraining_model(tok), loader, None, quiet(unpad=True))
    monkeypatch.undo()
    padded = pretrain(pretraining_model(tok), loader, None, quiet())
    assert seen == padded_ones  # a batch with no padding has no mask, so nothing to unpad
    assert unpadded.step_losses == pytest.approx(padded.step_losses, rel=1e-5)


@pytest.mark.slow
def test_a_compiled_unpadded_training_step_matches_eager_without_graph_breaks(tok, examples):
    # Each batch has its own number of real tokens: torch.compile recompiles once with that
    # length as a symbolic size (automatic dynamic shapes), then reuses the graph.
    import torch._dynamo as dynamo

    loader = pretraining_loader(examples, tok, split=None, seed=0,
                                options=LoaderOptions(batch_size=8))
    config = quiet(schedule="constant", warmup_fraction=0.0, unpad=True)
    eager = pretrain(pretraining_model(tok), loader, None, config)
    dynamo.reset()
    dynamo.utils.counters.clear()
    compiled = pretrain(pretraining_model(tok), loader, None,
                        dataclasses.replace(config, compile=True))
    assert not dynamo.utils.counters["graph_break"], dict(dynamo.utils.counters["graph_break"])
    assert compiled.step_losses == pytest.approx(eager.step_losses, rel=1e-4)


def test_finetune_refuses_the_pretraining_only_unpad_setting(tok):
    with pytest.raises(ValueError, match="unpad=True is a pretraining setting"):
        finetune_classifier(pretraining_model(tok).config, load_corpus("bbc")[:8], tokenizer=tok,
                            config=TrainConfig(max_steps=1, unpad=True))


def test_the_unpadding_benchmark_runs_on_a_small_slice_and_writes_its_record(tmp_path):
    # benchmarks/unpadding.py (its record, benchmarks/results/unpadding.json, is measured with
    # the defaults): here only that it runs, agrees on the loss and fills the record's fields.
    import json
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("transformers")
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "unpadding.json"
    done = subprocess.run([sys.executable, "benchmarks/unpadding.py", "--preset", "tiny",
                           "--batch-size", "8", "--batches", "2", "--repeats", "1", "--docs",
                           "120", "--threads", "1", "--out", str(out)],
                          cwd=root, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["command"].startswith("python benchmarks/unpadding.py --preset tiny")
    padded, grouped = record["conditions"].values()
    for condition in (padded, grouped):
        assert set(condition["tokens_per_s"]) == {"padded", "unpadded", "transformers"}
        assert condition["loss_difference"] < 1e-4 and condition["unpadded_over_padded"]["median"] > 0
    assert padded["batches"] == grouped["batches"] == 2
    assert 0 < padded["padding_share"] < 0.5
