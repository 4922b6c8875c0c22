"""bertlab.pretraining: the training step's forward equals the textbook model's, eager and compiled.

The textbook `BertForPreTraining` runs every block on every position; `FastPretraining` runs the
last block at [CLS] and the targets only, can give the MLM head a fixed number of rows, and can
skip the padding. Same weights, so the same loss, logits and gradients up to float rounding.
"""

from __future__ import annotations

import pytest
import torch

from bertlab.masking import IGNORE_INDEX, MaskingConfig
from bertlab.model import BertConfig, BertForPreTraining
from bertlab.pretraining import (
    FastPretraining,
    fast_inputs,
    mlm_capacity,
    real_token_positions,
    target_share_bound,
)

pytestmark = pytest.mark.usefixtures("one_thread")

V = 300


def small_model(seed: int = 0) -> BertForPreTraining:
    config = BertConfig.preset("tiny", vocab_size=V, hidden_size=32, num_heads=2,
                               intermediate_size=64, num_layers=3)
    return BertForPreTraining(config, generator=torch.Generator().manual_seed(seed)).eval()


def padded_batch(padding: bool = True) -> dict[str, torch.Tensor]:
    # Three sequences of 16 positions with 16, 10 and 5 real tokens (or all 16), the targets
    # at real tokens only, two segments.
    ids = torch.randint(5, V, (3, 16), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    if padding:
        mask[1, 10:] = 0
        mask[2, 5:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[:, 2], labels[0, 12], labels[1, 9] = ids[:, 2], ids[0, 12], ids[1, 9]
    segments = (torch.arange(16) >= 4).long().expand(3, -1) * mask
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=segments, labels=labels,
                next_sentence_label=torch.tensor([0, 1, 0]))


def forward_and_backward(module: torch.nn.Module, model: BertForPreTraining, batch: dict):
    """Return (output, gradients by parameter name) of one forward and backward of `module`."""
    model.zero_grad(set_to_none=True)
    out = module(**batch)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same(fast, textbook, rows: int | None = None) -> None:
    (out, grads), (ref, ref_grads) = fast, textbook
    n = len(ref.target_logits)  # the textbook's rows: one per target
    assert out.mlm_logits is None and ref.mlm_logits is None  # with labels: the targets only
    assert rows is None or out.target_logits.shape == (rows, V)
    torch.testing.assert_close(out.target_logits[:n], ref.target_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.nsp_logits, ref.nsp_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.loss, ref.loss, atol=1e-6, rtol=1e-6)
    assert {k: int(v) for k, v in out.loss_sums.items() if k in ("targets", "sequences")} == \
        {k: int(v) for k, v in ref.loss_sums.items() if k in ("targets", "sequences")}
    assert grads.keys() == ref_grads.keys()
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("padding", [True, False])
@pytest.mark.parametrize("capacity", [None, 12])
@pytest.mark.parametrize("unpad", [False, True])
def test_the_fast_forward_equals_the_textbook_model(padding, capacity, unpad):
    batch = padded_batch(padding)
    model = small_model()
    textbook = forward_and_backward(model, model, batch)
    extra = {} if capacity is None else {"mlm_capacity": capacity}
    if unpad and padding:
        extra["real_tokens"] = real_token_positions(batch["attention_mask"])
    fast = forward_and_backward(FastPretraining(model), model, {**batch, **extra})
    assert_same(fast, textbook, rows=capacity or 5)


def test_the_fast_forward_equals_the_textbook_model_under_the_steps_own_inputs():
    # What the training step hands over: no mask on a batch without padding, a fixed number of
    # rows for a compiled model, the real tokens with unpadding.
    model = small_model()
    for padding in (True, False):
        batch = padded_batch(padding)
        textbook = forward_and_backward(model, model, batch)
        prepared = fast_inputs(batch, target_share=target_share_bound(MaskingConfig()),
                               unpad=True)
        assert ("attention_mask" in prepared) == padding == ("real_tokens" in prepared)
        assert_same(forward_and_backward(FastPretraining(model), model, prepared), textbook)


@pytest.mark.parametrize("unpad", [False, True])
def test_the_fast_target_logits_are_the_textbook_logits_at_the_targets(unpad):
    batch = padded_batch()
    model = small_model()
    extra = {"real_tokens": real_token_positions(batch["attention_mask"])} if unpad else {}
    with torch.no_grad():
        out = FastPretraining(model)(**batch, **extra)
        everywhere = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    targets = batch["labels"] != IGNORE_INDEX  # (B, T) -> N = 5 targets
    assert everywhere.mlm_logits.shape == (3, 16, V) and out.mlm_logits is None
    assert out.target_logits.shape == (5, V)
    torch.testing.assert_close(out.target_logits, everywhere.mlm_logits[targets], atol=1e-5,
                               rtol=1e-5)


def test_the_fast_forward_needs_labels_and_checks_its_inputs():
    batch = padded_batch()
    fast = FastPretraining(small_model())
    with pytest.raises(ValueError, match="pass labels"):
        fast(batch["input_ids"])
    with pytest.raises(ValueError, match="labels has shape"):
        fast(batch["input_ids"], labels=batch["labels"][:2])


def test_bad_real_tokens_are_refused_with_the_fix():
    batch = padded_batch()
    fast = FastPretraining(small_model())
    real = real_token_positions(batch["attention_mask"])
    assert real_token_positions(torch.tensor([[1, 1, 1], [1, 0, 0]])).tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="needs the attention_mask"):
        fast(batch["input_ids"], labels=batch["labels"], real_tokens=real)
    with pytest.raises(ValueError, match="real_token_positions"):
        fast(batch["input_ids"], batch["attention_mask"], labels=batch["labels"],
             real_tokens=real[1:])
    left = batch["attention_mask"].flip(1)  # padding first: position 0 is no [CLS]
    with pytest.raises(ValueError, match="start with a real token"):
        fast(batch["input_ids"], left, labels=batch["labels"],
             real_tokens=real_token_positions(left))


def test_a_fixed_capacity_puts_the_targets_first_and_counts_only_them():
    batch = padded_batch()
    fast = FastPretraining(small_model())
    sparse, fixed = fast(**batch), fast(**batch, mlm_capacity=10)
    assert fixed.target_logits.shape == (10, V) and sparse.target_logits.shape == (5, V)
    torch.testing.assert_close(fixed.target_logits[:5], sparse.target_logits)
    torch.testing.assert_close(fixed.loss, sparse.loss)
    assert fixed.loss_sums["targets"] == 5  # the extra rows are labelled -100: not counted


def test_the_capacity_is_fixed_by_the_shape_and_a_crowded_batch_gets_every_position():
    empty = torch.full((4, 16), IGNORE_INDEX)
    assert mlm_capacity(empty.shape, 0.5) == 4 * 16 // 2 + 4  # half the positions, one more per row
    assert mlm_capacity(empty.shape, 1.0) == 4 * 16  # never more rows than positions
    assert target_share_bound(MaskingConfig(mlm_probability=0.4)) == pytest.approx(0.52)
    crowded = empty.clone()
    crowded[0, :15] = 7
    batch = {"input_ids": torch.full((4, 16), 7), "labels": crowded}
    assert fast_inputs(batch, target_share=0.5)["mlm_capacity"] == 36  # 15 targets fit in 36
    # 15 targets, more than the 8 rows 5% gives: never cut, never refused mid-run; this batch
    # gets a row at every position (one more shape to compile).
    assert fast_inputs(batch, target_share=0.05)["mlm_capacity"] == 64
    assert "mlm_capacity" not in fast_inputs(batch)  # eager: the targets' own number


def test_the_step_leaves_out_the_mask_of_a_batch_without_padding():
    full, padded = padded_batch(padding=False), padded_batch()
    assert "attention_mask" not in fast_inputs(full)
    assert fast_inputs(padded) is padded  # padding keeps its mask
    assert "real_tokens" not in fast_inputs(padded)  # unpadding is off unless asked
    torch.testing.assert_close(fast_inputs(padded, unpad=True)["real_tokens"],
                               real_token_positions(padded["attention_mask"]))


def test_the_fast_forward_is_one_graph_under_torch_compile():
    # No data-dependent Python branch or shape: the fixed rows and the real tokens come with
    # the batch (found on the CPU), so no nonzero runs inside the graph, padding and all.
    import torch._dynamo as dynamo

    batch = padded_batch()
    fast = FastPretraining(small_model())
    for extra in ({}, {"real_tokens": real_token_positions(batch["attention_mask"])}):
        dynamo.reset()
        explained = dynamo.explain(fast)(**batch, mlm_capacity=12, **extra)
        assert explained.graph_break_count == 0, [b.reason for b in explained.break_reasons]
        assert explained.graph_count == 1


@pytest.mark.slow
def test_the_compiled_fast_forward_equals_the_textbook_model():
    # torch.compile with inductor (C++ on a CPU): forward and backward of the training step's
    # module against the textbook model's eager forward, on a padded and an unpadded batch.
    import torch._dynamo as dynamo

    model = small_model()
    dynamo.reset()
    compiled = torch.compile(FastPretraining(model))
    for padding in (True, False):
        batch = padded_batch(padding)
        textbook = forward_and_backward(model, model, batch)
        prepared = fast_inputs(batch, target_share=target_share_bound(MaskingConfig()),
                               unpad=padding)
        assert_same(forward_and_backward(compiled, model, prepared), textbook)
