"""The training step's forward: a `BertForPreTraining`'s pretraining loss, computed faster, on
the model's own weights.

`bertlab.model` is the textbook encoder. The training step (`bertlab.pretraining`) runs the same
weights through `FastPretraining` instead, which differs only in how much work it does:

- **the last block at the targets only**: the MLM loss reads the final vectors of the targets
  (about 15% of the tokens) and the pooler reads [CLS], so the last block attends over every
  token but projects and feeds forward only those rows;
- **a fixed number of MLM rows** (`mlm_capacity`) for torch.compile: the targets first, then
  positions labelled -100 that add nothing, so every batch of a shape traces to one graph with no
  data-dependent shape;
- **unpadding** (`real_tokens`, `TrainConfig.unpad`): every block's projections, feed-forward and
  LayerNorms run on the real tokens only, as a flat (N, d) tensor; attention alone puts them back
  in their (B, T) places (`Unpadded`);
- under torch.compile, a given attention mask is always applied: a data-dependent branch would
  split the graph (the step leaves out the mask of a batch without padding before the call).

The loss, the logits at the targets and the gradients are those of the textbook model up to
float rounding (tests/test_fast.py holds them equal, eager and compiled). This is also the
computation the training step has always run, so every reproduce trace replays bit for bit.

Taught in notebooks/05_pretraining.ipynb
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from bertlab.config import TrainConfig
from bertlab.data import RunData
from bertlab.engine.device import resolve_compile, resolve_device
from bertlab.masking import IGNORE_INDEX, MaskingConfig
from bertlab.model import (
    BertForPreTraining,
    EncoderLayer,
    PreTrainingOutput,
    check_inputs,
    key_mask,
    pretraining_output,
)


@dataclass
class Unpadded:
    """Where the real tokens of a padded (B, T) batch sit, for blocks that skip the padding.

    The projections, the feed-forward and the LayerNorms work token by token, so they run on the
    N real tokens alone, as a flat (N, d) tensor; only attention needs the (B, T) layout, and
    `pad` puts the tokens back in place for it (zeros at padding, which the key mask hides).
    """

    batch: int
    seq_len: int
    tokens: torch.Tensor  # (N,) flat indices into the B*T positions of the real tokens, in order
    slot: torch.Tensor  # (B*T,) each position's row among the N (a padding position: a neighbour's)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """Return the flat rows back in their places, (N, k) -> (B, T, k), zeros at padding."""
        padded = x.new_zeros(self.batch * self.seq_len, x.shape[-1])
        return padded.index_copy(0, self.tokens, x).view(self.batch, self.seq_len, -1)


def real_token_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Return the flat positions (into B*T, row-major) where `attention_mask` is 1: the
    `real_tokens` that `FastPretraining` unpads with. Its length depends on the data, so compute
    it where that costs nothing: on the CPU batch, before it moves to the device."""
    return attention_mask.flatten().nonzero().squeeze(1)


def unpadded(attention_mask: torch.Tensor | None, real_tokens: torch.Tensor) -> Unpadded:
    """Return the `Unpadded` layout of a batch from its mask and `real_token_positions`, after
    checking (outside torch.compile) that they agree and that every sequence starts real."""
    if attention_mask is None:
        raise ValueError("real_tokens= needs the attention_mask it was computed from: attention "
                         "still masks the padding keys")
    if not torch.compiler.is_compiling() and not torch.equal(
            real_tokens.to(attention_mask.device), real_token_positions(attention_mask)):
        raise ValueError("real_tokens does not list the positions where attention_mask is 1 (in "
                         "row-major order); compute it with bertlab.engine.fast.real_token_positions("
                         "attention_mask)")
    if not torch.compiler.is_compiling() and not bool(attention_mask[:, 0].all()):
        raise ValueError("real_tokens= needs every sequence to start with a real token ([CLS] at "
                         "position 0, padding at the end), as bertlab's loaders build them")
    B, T = attention_mask.shape
    # Each position's row among the real tokens: its count of real tokens so far, minus one.
    slot = (attention_mask.flatten().long().cumsum(0) - 1).clamp(min=0)
    return Unpadded(B, T, real_tokens, slot)


def layer_forward(layer: EncoderLayer, x: torch.Tensor, mask: torch.Tensor | None,
                  rows: torch.Tensor | None, flat: Unpadded | None) -> torch.Tensor:
    """Return one block's output, like `EncoderLayer.forward`, with two savings.

    With `rows` (flat indices into the B*T tokens) every token is still attended to, but only
    those rows go on through the output projection and the feed-forward: output (R, d).
    With `flat`, `x` is the real tokens only, (N, d), and so is the output.
    """
    attention = layer.attention
    qkv = attention.qkv(x)  # (B, T, d) -> (B, T, 3d), or unpadded (N, d) -> (N, 3d)
    if flat is not None:
        qkv = flat.pad(qkv)  # (N, 3d) -> (B, T, 3d): attention needs the layout
    context, _ = attention.attend(qkv, mask)  # -> (B, T, d)
    kept = flat.tokens if rows is None and flat is not None else rows  # the rows that go on
    if kept is not None:
        context = context.flatten(0, 1).index_select(0, kept)  # (B*T, d) -> (R, d) or (N, d)
    attended = attention.out(context)
    if rows is not None and flat is None:
        x = x.flatten(0, 1).index_select(0, rows)  # (B, T, d) -> (R, d)
    elif rows is not None:
        x = x.index_select(0, flat.slot[rows])  # (N, d) -> (R, d)
    return layer.feed_forward(x, attended)


class FastPretraining(nn.Module):
    """`BertForPreTraining`'s pretraining output with less work, on the model's own weights.

    The training step calls it in place of the model (torch.compile and DDP wrap it, and the
    parameters they see are the model's). Its `forward` needs `labels`: it computes the
    pretraining loss, not a general forward.
    """

    def __init__(self, model: BertForPreTraining):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                next_sentence_label: torch.Tensor | None = None, mlm_capacity: int | None = None,
                real_tokens: torch.Tensor | None = None) -> PreTrainingOutput:
        """Return the `PreTrainingOutput` the textbook model gives for these inputs (`labels`
        required): `target_logits` (N, V) and no `mlm_logits`. With `mlm_capacity`,
        `target_logits` is (mlm_capacity, V): the N targets first, then rows labelled -100.
        `real_tokens` (`real_token_positions(attention_mask)`) unpads the blocks."""
        model, bert = self.model, self.model.bert
        if labels is None:
            raise ValueError("FastPretraining computes the pretraining loss: pass labels (for "
                             "logits at every position, call the BertForPreTraining itself)")
        check_inputs(input_ids, model.config, attention_mask=attention_mask,
                     token_type_ids=token_type_ids, labels=labels)
        B, T = input_ids.shape
        untargeted = labels.flatten() == IGNORE_INDEX  # (B*T,)
        if mlm_capacity is None:  # the targets, in row-major order: a data-dependent length
            where = (~untargeted).nonzero().squeeze(1)  # (N,)
        else:  # exactly mlm_capacity rows: the targets first, then positions labelled -100. A
            # stable sort keeps each group's order; a fixed length, so torch.compile traces one
            # graph with no nonzero.
            where = torch.sort(untargeted.to(torch.uint8), stable=True).indices[:mlm_capacity]
        # The pooler reads [CLS] and the MLM head the targets: the last block makes just those.
        rows = torch.cat([torch.arange(B, device=input_ids.device) * T, where])  # (B + N,)
        flat = None if real_tokens is None else unpadded(attention_mask, real_tokens)
        if attention_mask is not None and torch.compiler.is_compiling():
            # A given mask is always applied: no data-dependent branch to split the graph.
            mask = attention_mask.bool()[:, None, None, :]  # (B, T) -> (B, 1, 1, T)
        else:
            mask = key_mask(attention_mask)  # None when nothing is padded
        x = bert.embeddings(input_ids, token_type_ids)  # (B, T) -> (B, T, d)
        if flat is not None:
            x = x.flatten(0, 1).index_select(0, flat.tokens)  # (B, T, d) -> (N, d)
        for i, layer in enumerate(bert.layers):
            last = i == len(bert.layers) - 1
            x = layer_forward(layer, x, mask, rows if last else None, flat)
        cls, targets = x[:B], x[B:]  # (B + N, d) -> (B, d), (N, d)
        pooled = torch.tanh(bert.pooler(cls))
        target_logits = model.mlm_logits(targets)  # (N, d) -> (N, V)
        nsp_logits = model.nsp(pooled)  # (B, d) -> (B, 2)
        return pretraining_output(target_logits, labels.flatten().index_select(0, where),
                                  nsp_logits, next_sentence_label)


# ---------------------------------------------------------------------------------------------
# What the step prepares on the CPU batch, before it moves to the device


def target_share_bound(masking: MaskingConfig) -> float:
    """Return the share of a batch's positions a compiled run gives MLM rows: a quarter above
    the masking rate, plus 2 points (whole words, and at least one per row, are covered by
    `mlm_capacity`'s extra row per sequence). A statistical margin, not a bound: a small batch
    can draw more targets than that (a 1 x 8 batch at 15% does about 0.6% of the time), and
    such a batch gets a row for every position instead (`fast_inputs`)."""
    return min(1.0, 1.25 * masking.mlm_probability + 0.02)


def compiled_target_share(config: TrainConfig, data: RunData | None) -> float | None:
    """Return the share of MLM rows a run of `config` gives each batch (`target_share_bound` of
    the loader's masking, `data`): compiled, the model sees one graph per batch shape, with no
    nonzero inside. None when the run is not compiled, or the loader does not state its data."""
    compiled = resolve_compile(config.compile, resolve_device(config.device))
    return target_share_bound(data.masking) if compiled and data is not None else None


def mlm_capacity(shape: Sequence[int], target_share: float) -> int:
    """Return how many rows the MLM head gets for labels of `shape` (B, T) with at most
    `target_share` of the positions as targets: fixed by the shape alone, so a compiled model
    sees the same shapes on every batch of that shape."""
    rows, length = shape
    return min(rows * length, math.ceil(target_share * rows * length) + rows)


def fast_inputs(batch: dict[str, torch.Tensor], target_share: float | None = None,
                unpad: bool = False) -> dict[str, torch.Tensor]:
    """Return the batch as the training step hands it to `FastPretraining`, found on the CPU
    batch (no device sync).

    A batch without padding loses its `attention_mask`: attention then runs with no mask at all,
    which lets `scaled_dot_product_attention` pick its fastest (flash) kernel; the numbers are
    the same. With `target_share` (a compiled model) it gets `mlm_capacity`: the rows
    `mlm_capacity` gives its shape, or, for the rare batch with more targets than that, every
    position (one more graph to compile, never a target cut). A padded batch keeps its mask and,
    with `unpad`, gets `real_tokens` (`real_token_positions`): the blocks then skip the padding
    everywhere but inside attention.
    """
    if target_share is not None:
        labels = batch["labels"]
        rows = mlm_capacity(labels.shape, target_share)
        if int((labels != IGNORE_INDEX).sum()) > rows:
            rows = labels.numel()
        batch = {**batch, "mlm_capacity": rows}
    mask = batch.get("attention_mask")
    if mask is None or mask.device.type != "cpu":
        return batch
    if bool(mask.all()):
        return {k: v for k, v in batch.items() if k != "attention_mask"}
    return {**batch, "real_tokens": real_token_positions(mask)} if unpad else batch
