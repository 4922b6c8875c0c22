"""Unpadding: a padded batch's blocks run on its real tokens only, with the same numbers."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from bertlab.corpus import load_corpus
from bertlab.data import pretraining_loader
from bertlab.finetune import finetune_classifier
from bertlab.masking import IGNORE_INDEX
from bertlab.model import BertConfig, BertForPreTraining, real_token_positions
from bertlab.nsp import create_nsp_examples
from bertlab.pretraining import pretrain, unpadded_inputs
from bertlab.tokenizer import train_tokenizer
from bertlab.train import TrainConfig

pytestmark = pytest.mark.usefixtures("one_thread")

SEQ = 128  # BBC pairs at 128 tokens: about a tenth of the positions are padding


def small_model(seed: int = 0, dropout: float = 0.0) -> BertForPreTraining:
    config = BertConfig.preset("tiny", vocab_size=300, hidden_size=32, num_heads=2,
                               hidden_dropout=dropout, attention_dropout=dropout)
    return BertForPreTraining(config, generator=torch.Generator().manual_seed(seed))


def padded_batch():
    # Three sequences of 16 positions with 16, 10 and 5 real tokens; targets at real tokens only.
    ids = torch.randint(5, 300, (3, 16), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 10:] = 0
    mask[2, 5:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[:, 2], labels[0, 12], labels[1, 9] = ids[:, 2], ids[0, 12], ids[1, 9]
    segments = (torch.arange(16) >= 4).long().expand(3, -1) * mask
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=segments, labels=labels,
                next_sentence_label=torch.tensor([0, 1, 0]))


def test_real_token_positions_are_the_flat_indices_of_the_mask_ones():
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert real_token_positions(mask).tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("capacity", [None, 12])
def test_the_unpadded_forward_and_backward_match_the_padded_one(capacity):
    batch = padded_batch()
    real = real_token_positions(batch["attention_mask"])
    assert len(real) == 31  # 48 positions, 17 of them padding: the blocks skip 35% here
    losses, grads = [], []
    for extra in ({}, {"real_tokens": real}):
        model = small_model()
        out = model(**batch, mlm_capacity=capacity, **extra)
        out.loss.backward()
        losses.append(out)
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    padded, unpadded = losses
    torch.testing.assert_close(unpadded.loss, padded.loss)
    torch.testing.assert_close(unpadded.mlm_logits, padded.mlm_logits)
    torch.testing.assert_close(unpadded.nsp_logits, padded.nsp_logits)
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], msg=name)


def test_unpadded_states_match_at_real_tokens_and_are_zero_at_padding():
    batch = padded_batch()
    mask = batch["attention_mask"].bool()
    model = small_model().eval()
    inputs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                  token_type_ids=batch["token_type_ids"], output_hidden_states=True)
    padded = model.bert(**inputs)
    unpadded = model.bert(**inputs, real_tokens=real_token_positions(batch["attention_mask"]))
    assert unpadded.last_hidden_state.shape == padded.last_hidden_state.shape == (3, 16, 32)
    torch.testing.assert_close(unpadded.last_hidden_state[mask], padded.last_hidden_state[mask])
    assert not unpadded.last_hidden_state[~mask].any()
    torch.testing.assert_close(unpadded.pooler_output, padded.pooler_output)
    assert len(unpadded.hidden_states) == len(padded.hidden_states) == 3
    for ours, theirs in zip(unpadded.hidden_states[1:], padded.hidden_states[1:], strict=True):
        torch.testing.assert_close(ours[mask], theirs[mask])


def test_bad_real_tokens_are_refused_with_the_fix():
    batch = padded_batch()
    model = small_model()
    real = real_token_positions(batch["attention_mask"])
    with pytest.raises(ValueError, match="needs the attention_mask"):
        model(batch["input_ids"], real_tokens=real)
    with pytest.raises(ValueError, match="real_token_positions"):
        model(batch["input_ids"], batch["attention_mask"], real_tokens=real[1:])
    left = batch["attention_mask"].flip(1)  # padding first: position 0 is no [CLS]
    with pytest.raises(ValueError, match="start with a real token"):
        model(batch["input_ids"], left, real_tokens=real_token_positions(left))


def test_the_unpadded_forward_is_one_graph_under_torch_compile():
    # The indices come with the batch (found on the CPU), so no nonzero runs inside the graph.
    import torch._dynamo as dynamo

    batch = padded_batch()
    model = small_model()
    dynamo.reset()
    explained = dynamo.explain(model)(**batch, mlm_capacity=12,
                                      real_tokens=real_token_positions(batch["attention_mask"]))
    assert explained.graph_break_count == 0, [b.reason for b in explained.break_reasons]
    assert explained.graph_count == 1


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
        tok, examples):
    loader = pretraining_loader(examples, tok, split=None, batch_size=8, seed=0)
    batches = list(loader)[:4]
    padded_ones = [not bool(b["attention_mask"].all()) for b in batches]
    assert 0 < sum(padded_ones) < 4, padded_ones  # both kinds among the 4 steps' batches
    batch = batches[padded_ones.index(True)]
    assert "real_tokens" not in unpadded_inputs(batch)  # off unless asked
    torch.testing.assert_close(unpadded_inputs(batch, unpad=True)["real_tokens"],
                               real_token_positions(batch["attention_mask"]))
    seen = []
    model = pretraining_model(tok)
    model.register_forward_pre_hook(lambda m, args, kwargs: seen.append(
        kwargs.get("real_tokens") is not None), with_kwargs=True)
    unpadded = pretrain(model, loader, None, quiet(unpad=True))
    padded = pretrain(pretraining_model(tok), loader, None, quiet())
    assert seen == padded_ones  # a batch with no padding has no mask, so nothing to unpad
    assert unpadded.step_losses == pytest.approx(padded.step_losses, rel=1e-5)


@pytest.mark.slow
def test_a_compiled_unpadded_training_step_matches_eager_without_graph_breaks(tok, examples):
    # Each batch has its own number of real tokens: torch.compile recompiles once with that
    # length as a symbolic size (automatic dynamic shapes), then reuses the graph.
    import torch._dynamo as dynamo

    loader = pretraining_loader(examples, tok, split=None, batch_size=8, seed=0)
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
