"""BERT pretraining on the training loop: the step's forward, the loss share, `pretrain`, and
what the model learned.

`pretrain` is `bertlab.train.train_loop` with a pretraining objective: masked LM, plus BERT's
next-sentence prediction or ALBERT's sentence order (`bertlab.pairs`), from the loss sums
defined once in `bertlab.model`. `evaluate`
gives the held-out metrics it logs, `unigram_baseline` the score of a model that learned no
context, and `fill_mask` what the model guesses for the [MASK]s of a text.

The step's forward, first below: `bertlab.model` is the textbook encoder; the training step runs
the same weights through `FastPretraining` instead, which differs only in how much work it does:

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

import functools
import math
from collections.abc import Iterable, Mapping, Sequence, Sized
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import nn
from torch.utils.data import DataLoader

from bertlab.config import TrainConfig, check_train_config
from bertlab.data import Batch, RunData, check_loader_batch, run_data_of
from bertlab.engine.device import resolve_compile, resolve_device
from bertlab.errors import BadInput, check_number, check_type
from bertlab.masking import IGNORE_INDEX, MaskingConfig
from bertlab.model import (
    BertForPreTraining,
    EncoderLayer,
    PreTrainingOutput,
    check_inputs,
    key_mask,
    loss_counts,
    pretraining_output,
)
from bertlab.pairs import OBJECTIVES, SINGLE, check_objectives, pair_objective
from bertlab.tokenizer import check_tokenizer_fits, special_ids
from bertlab.train import (
    Objective,
    TrainResult,
    autocast_context,
    to_device,
    train_loop,
)

# --------------------------------------------------------------------------------------------
# The training step's forward: the textbook model's loss, with less work


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
                         "row-major order); compute it with bertlab.pretraining.real_token_positions("
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


# --------------------------------------------------------------------------------------------
# The pretraining objective and its loop

# The parameters only some objective trains (the pooler and the pair head on [CLS]).
_PAIR_ONLY = tuple(sorted({prefix for spec in OBJECTIVES.values() for prefix in spec.trains}))
BERT_OBJECTIVES = ("mlm", "nsp")


def pretraining_counts(batch: Batch) -> dict[str, float]:
    """Return the denominators of the pretraining loss for one batch: MLM targets and sequences."""
    return {k: float(v) for k, v in loss_counts(batch["labels"],
                                                batch["next_sentence_label"]).items()}


def pretraining_loss(model: nn.Module, batch: Batch, totals: dict[str, float],
                     objectives: Sequence[str] = BERT_OBJECTIVES) -> torch.Tensor:
    """Return this batch's share of the step's loss: each objective's sum over the step's totals.

    Dividing summed cross-entropies (`loss_sums`, from `bertlab.model.pretraining_loss_sums`) by
    the targets of the whole optimizer step (all micro-batches, all processes) makes the loss,
    and so the gradient, identical whether a global batch is seen at once, in `grad_accum`
    pieces or split over DDP processes; averaging per-piece means would weight a target by how
    many others share its piece. `objectives` (`bertlab.pairs`): ("mlm", "nsp") is BERT's
    loss; ("mlm",) is masked LM only (RoBERTa's choice, and the "MLM only" ablation): the model
    then gets no pair labels, so no gradient reaches the pooler or the pair head, and no loss
    reads the last layer's [CLS] vector; ("mlm", "sop") trains that head on sentence order.
    `model` is the textbook `BertForPreTraining` or the training step's `FastPretraining` over it.

    Taught in notebooks/05_pretraining.ipynb
    """
    return PretrainingObjective(objectives).loss(model, batch, totals)


class PretrainingObjective(Objective):
    """BERT's pretraining for the training loop: masked LM plus a pair objective, or alone.

    The step runs `bertlab.pretraining.FastPretraining` over the model's weights (`module`), hands it
    batches prepared on the CPU (`inputs`: no mask when there is no padding; with `target_share`,
    a compiled model's fixed number of MLM rows; with `unpad`, the real tokens), divides each
    objective's summed loss by the step's counts (`counts`, `loss`) and scores held-out batches
    with `evaluate`.

    Taught in notebooks/05_pretraining.ipynb
    """

    def __init__(self, objectives: Sequence[str] | str = BERT_OBJECTIVES,
                 target_share: float | None = None, unpad: bool = False, *,
                 data: RunData | None = None, record: Mapping[str, Any] | None = None) -> None:
        self.objectives = check_objectives(objectives)
        self.name = ",".join(self.objectives)  # saved with every checkpoint
        self.pair = pair_objective(self.objectives)  # "nsp", "sop", or None: masked LM alone
        self.data, self.record = data, dict(record or {})
        # The batch as the step hands it to the model, prepared on the CPU: `fast_inputs` with
        # these settings (no mask when nothing is padded, the compiled MLM rows, the real tokens).
        self.inputs = functools.partial(fast_inputs, target_share=target_share, unpad=unpad)

    def run_record(self, model: nn.Module, config: TrainConfig) -> dict[str, Any]:
        """Return a new run's run.json: the caller's `record` (the CLI's flags and what reading
        the corpus skipped), then what the run trains, its masking and length, the model and
        the training settings."""
        masking = None if self.data is None else self.data.masking
        return {**self.record, "objectives": list(self.objectives),
                "mlm_probability": None if masking is None else masking.mlm_probability,
                "max_seq_len": None if self.data is None else self.data.max_seq_len,
                "model": model.config.to_dict(), "train": config.to_dict()}

    def module(self, model: nn.Module) -> nn.Module:
        """Return the training step's forward over `model`'s weights."""
        return FastPretraining(model)

    counts = staticmethod(pretraining_counts)  # the batch's MLM targets and sequences

    def loss(self, model: nn.Module, batch: Batch, totals: dict[str, float]) -> torch.Tensor:
        """Return the batch's share of the step's loss: each objective's summed loss over the
        step's count of it (`pretraining_loss` says why sums)."""
        if self.pair is None:  # no pair labels: no gradient reaches the pooler or the pair head
            batch = {k: v for k, v in batch.items() if k != "next_sentence_label"}
        sums = model(**batch).loss_sums
        loss = None
        for name in self.objectives:
            spec = OBJECTIVES[name]
            term = sums[spec.loss_sum] / max(totals[spec.count], 1.0)
            loss = term if loss is None else loss + term
        return loss

    def evaluate(self, model: nn.Module, loader: Iterable[Batch], max_batches: int | None, *,
                 device: torch.device, precision: str) -> dict[str, float]:
        """Return the held-out metrics of a history row (`evaluate`)."""
        return evaluate(model, loader, max_batches, device=device, precision=precision,
                        objectives=self.objectives)


def pretrain(model: nn.Module, train_loader: Iterable[Batch],
             val_loader: Iterable[Batch] | dict[str, Iterable[Batch]] | None,
             config: TrainConfig, out_dir: str | Path | None = None,
             resume: bool = False, objectives: Sequence[str] | str = BERT_OBJECTIVES,
             record: Mapping[str, Any] | None = None) -> TrainResult:
    """Return a `TrainResult` after pretraining `model` on `objectives` with `config`.

    `objectives`: ("mlm", "nsp") is BERT's; ("mlm",) masked LM only; ("mlm", "sop") sentence
    order (build the loaders with the matching `pairs`, e.g. `recipe.loader_options()`).
    `train_loader`/`val_loader` yield dicts with input_ids, token_type_ids, attention_mask,
    labels and next_sentence_label (bertlab.pretraining_loader). Evaluates on `val_loader` at
    step 0, every `eval_interval` steps and at the end; see `train_loop` for checkpoints, resume,
    DDP and errors. Without a pair objective the pair head gets no gradient, and the history
    has no NSP figure: an untrained head's accuracy is not a result.

    With `out_dir`, a new run's folder is complete: beside the checkpoints and the history go
    the loader's tokenizer (tokenizer.json) and run.json (what it trains, the model, the
    settings, and `record`: facts of the caller's own, such as the CLI's flags), so every
    command of `python -m bertlab` reads it.

    Taught in notebooks/05_pretraining.ipynb
    """
    check_type(model, BertForPreTraining, "pretrain(model)", "a bertlab BertForPreTraining",
               "pass bl.BertForPreTraining(config), or the model bl.load_model gives")
    check_type(train_loader, Iterable, "pretrain(train_loader)", "a loader of batches",
               "pass bl.pretraining_loader(...)")
    if isinstance(val_loader, Sized) and not isinstance(val_loader, dict) and not len(val_loader):
        raise BadInput("pretrain(val_loader=[])", "holds no batch",
                       "pass bl.pretraining_loader(..., split='validation'), or None")
    check_type(objectives, (str, list, tuple), "pretrain(objectives)", "a list of objective "
               "names", "pass e.g. ('mlm', 'nsp') or ('mlm',)")
    check_train_config(config, "pretrain")
    # A resume is checked against its checkpoint instead (the objectives, the data's digest),
    # which names what the run was started with.
    check_pretraining_loaders(train_loader, val_loader, config, objectives,
                              vocab_size=model.config.vocab_size, pairs=not resume)
    data = run_data_of(train_loader)
    # A compiled model gets a fixed number of MLM rows per batch shape (one graph, no nonzero),
    # sized from the training loader's masking rate when the loader says what it is.
    share = compiled_target_share(config, data)
    objective = PretrainingObjective(objectives, target_share=share, unpad=config.unpad,
                                     data=data, record=record)
    trained = {prefix for name in objective.objectives for prefix in OBJECTIVES[name].trains}
    # Parameters only an objective outside this run trains (the pooler and the pair head, for
    # masked LM alone) get no gradient: they sit the run out (so DDP does not wait for their
    # gradients, and no optimizer state is kept for them), then rejoin.
    idle = [p for n, p in model.named_parameters() if p.requires_grad and
            n.startswith(_PAIR_ONLY) and not n.startswith(tuple(trained))]
    for p in idle:
        p.requires_grad_(False)
    try:
        return train_loop(model, train_loader, config, objective, val_loader=val_loader,
                          out_dir=out_dir, resume=resume)
    finally:
        for p in idle:
            p.requires_grad_(True)


_BUILT = {"nsp": "NSP pairs (IsNext/NotNext labels)", "sop": "sentence-order pairs (in order/"
          "swapped labels)", SINGLE: "single segments ([CLS] text [SEP], no pair label)"}


def check_loader_fits(loader: object, vocab_size: int, where: str) -> None:
    """Raise ValueError when a bertlab loader's tokenizer has more tokens than a model of
    `vocab_size` has rows: its ids would index past the embedding table."""
    data = run_data_of(loader)
    size = None if data is None else data.special.vocab_size
    if size is not None and size > vocab_size:
        raise ValueError(f"{where}: the loader's tokenizer has {size} tokens but the model's "
                         f"vocabulary has {vocab_size}, so its ids run past the embedding "
                         f"table; build the model with vocab_size=tokenizer.get_vocab_size() "
                         f"({size}), or the loader with the model's own tokenizer")


def check_pretraining_loaders(train_loader: Iterable[Batch],
                              val_loader: Iterable[Batch] | dict[str, Iterable[Batch]] | None,
                              config: TrainConfig, objectives: Sequence[str] | str, *,
                              vocab_size: int | None = None, pairs: bool = True) -> None:
    """Raise ValueError, naming both sides and the fix, when the loaders cannot train
    `objectives` with `config` as asked: training batches that do not add up to
    `config.batch_size` over grad_accum and the processes (`check_loader_batch`), fewer
    training examples than one global batch (every step would be smaller than
    `config.batch_size` says), a pair objective on pairs of another
    kind (a bertlab loader's `pairs`; other loaders are not checked for it; `pairs=False`
    skips this), or, with the model's `vocab_size`, a tokenizer larger than the model's
    vocabulary."""
    names = check_objectives(objectives)
    check_loader_batch(train_loader, config)
    dataset = train_loader.dataset if isinstance(train_loader, DataLoader) else None
    if isinstance(dataset, Sized) and config.batch_size > len(dataset):
        raise ValueError(f"batch_size={config.batch_size} is larger than the {len(dataset)} "
                         f"training examples: every step would train on those {len(dataset)} "
                         f"while the run records {config.batch_size}; pass a batch_size (the "
                         f"CLI's --batch-size) of at most {len(dataset)}, or a larger corpus")
    pair = pair_objective(names)
    loaders = val_loader if isinstance(val_loader, dict) else {"validation": val_loader}
    for role, loader in {"training": train_loader, **loaders}.items():
        if vocab_size is not None:
            check_loader_fits(loader, vocab_size, f"pretrain ({role} loader)")
        data = run_data_of(loader)
        built = None if data is None else data.pairs
        if not pairs or pair is None or built is None or built == pair:
            continue
        raise ValueError(f"objectives {','.join(names)}: {pair} trains the pair head on "
                         f"{_BUILT[pair]}, but the {role} loader holds {_BUILT[built]}; build "
                         f"the loaders with pairs={pair!r} (the recipe's loader_options() does), "
                         f"or train objectives ('mlm',) alone")


KINDS = ("mask", "random", "kept")  # what the model sees at a target: [MASK], another token, itself


def loader_mask_id(loader: object) -> int | None:
    """Return the [MASK] id a bertlab loader's collator uses (None for any other iterable)."""
    data = run_data_of(loader)
    return None if data is None else data.special.mask


@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable[Batch], max_batches: int | None = None, *,
             device: torch.device | None = None, precision: str = "fp32",
             mask_id: int | None = None,
             objectives: Sequence[str] | str | None = None) -> dict[str, float]:
    """Return held-out metrics, led by the accuracy at [MASK] positions.

    A target position shows the model [MASK], a random token, or the original token ("kept").
    Only the first asks "can it fill a blank from context?": a kept target can be copied from
    the input. So beside `mlm_loss`/`mlm_accuracy` (all targets, as BERT's code reports them)
    and `perplexity` (exp(mlm_loss)) come `mask_accuracy`/`mask_loss`, `random_*` and `kept_*`,
    and the bar a model without context reaches on the same [MASK] targets:
    `mask_unigram_accuracy` (always the most frequent of them) and `mask_unigram_loss` (their
    unigram entropy, in nats), with `mask_targets`, how many [MASK] targets they count (the
    bar moves with the targets: another validation set, length or number of batches has another
    most frequent target share). Then `nsp_loss` and `nsp_accuracy` (`sop_*` when the
    objectives train sentence order: the figures are named by the task), when the batches have pair
    labels (single segments, `bertlab.pairs`, have none) and the pair head was trained: with
    `objectives` that hold no pair objective (masked LM alone) they are left out, since an
    untrained head scores chance and that is not a result. Sums run over every
    target, not per batch. The kinds need the [MASK] id: `mask_id`, or a bertlab loader's
    (else only the all-target and NSP figures are returned).

    Uses the first `max_batches` batches (all when None) of epoch 0 (a loader with `set_epoch`
    is set to 0 first, so repeated evaluations see the same batches and masks), in eval mode.
    For one yardstick across recipes, build the validation loader with BERT's masking (the
    defaults), whatever masking the training loader uses.

    Taught in notebooks/05_pretraining.ipynb
    """
    _check_evaluate(model, loader, max_batches)
    device = device or next(model.parameters()).device
    mask_id = loader_mask_id(loader) if mask_id is None else mask_id
    if hasattr(loader, "set_epoch"):
        loader.set_epoch(0)
    forward = FastPretraining(model) if isinstance(model, BertForPreTraining) else model
    was_training = model.training
    model.eval()
    total = dict.fromkeys(("mlm", "mlm_correct", "targets", "nsp", "nsp_correct", "sequences"),
                          0.0)
    mask_targets: list[torch.Tensor] = []
    for i, batch in enumerate(loader):
        if max_batches is not None and i >= max_batches:
            break
        batch = to_device(batch, device)
        with autocast_context(device, precision):
            out = forward(**batch)  # the step's arithmetic: the last block at the targets
        labels, nsp_label = batch["labels"], batch["next_sentence_label"]
        where = labels != IGNORE_INDEX
        targets = labels[where]  # (N,) row-major: the order of out.target_logits' rows
        for key, value in out.loss_sums.items():
            total[key] += value.item()
        hit = out.target_logits.argmax(-1) == targets  # (N, V) -> (N,)
        total["mlm_correct"] += hit.sum().item()
        total["nsp_correct"] += (out.nsp_logits.argmax(-1) == nsp_label).sum().item()
        if mask_id is not None:
            shown = batch["input_ids"][where]
            losses = F.cross_entropy(out.target_logits.float(), targets, reduction="none")
            kind = {"mask": shown == mask_id, "kept": shown == targets}
            kind["random"] = ~(kind["mask"] | kind["kept"])
            for name, rows in kind.items():
                total[f"{name}_n"] = total.get(f"{name}_n", 0.0) + rows.sum().item()
                total[f"{name}_correct"] = total.get(f"{name}_correct", 0.0) + hit[rows].sum().item()
                total[f"{name}_loss"] = total.get(f"{name}_loss", 0.0) + losses[rows].sum().item()
            mask_targets.append(targets[kind["mask"]].cpu())
    model.train(was_training)
    if total["targets"] == 0:
        raise ValueError("evaluate: the loader gave no MLM targets; check that it is not empty "
                         "and that it masks tokens")
    mlm_loss = total["mlm"] / total["targets"]
    metrics = {}
    if mask_id is not None:
        for name in KINDS:
            n = max(total[f"{name}_n"], 1.0)
            metrics[f"{name}_accuracy"] = total[f"{name}_correct"] / n
            metrics[f"{name}_loss"] = total[f"{name}_loss"] / n
        metrics.update(unigram_bar(torch.cat(mask_targets)))
        metrics["mask_targets"] = int(total["mask_n"])  # what the bar was measured on
    metrics.update({"mlm_loss": mlm_loss, "mlm_accuracy": total["mlm_correct"] / total["targets"],
                    "perplexity": math.exp(min(mlm_loss, 50.0))})
    # Named by the task the head learned: nsp_* for NSP (and when the objectives are not said),
    # sop_* for sentence order; no pair figure at all for masked LM alone, or without pairs.
    pair = "nsp" if objectives is None else pair_objective(check_objectives(objectives))
    if total["sequences"] and pair is not None:
        metrics.update({f"{pair}_loss": total["nsp"] / total["sequences"],
                        f"{pair}_accuracy": total["nsp_correct"] / total["sequences"]})
    return metrics


def _check_evaluate(model: nn.Module, loader: object, max_batches: object) -> None:
    check_type(model, nn.Module, "evaluate(model)", "a bertlab model",
               "pass the model bl.load_model or bl.BertForPreTraining gives")
    check_type(loader, Iterable, "evaluate(loader)", "a loader of batches",
               "pass bl.pretraining_loader(..., split='validation')")
    # Zero batches would reach the "no MLM targets" error, which blames the loader.
    if hasattr(model, "config"):
        check_loader_fits(loader, model.config.vocab_size, "evaluate")
    if max_batches is not None and (isinstance(max_batches, bool) or
                                    not isinstance(max_batches, int) or max_batches < 1):
        raise BadInput(f"evaluate(max_batches={max_batches!r})",
                       "asks for no batch at all, so there is nothing to measure",
                       "pass a whole number >= 1, or None for every batch of the loader "
                       "(in training: TrainConfig.eval_batches, --eval-batches)")


def unigram_bar(targets: torch.Tensor) -> dict[str, float]:
    """Return the best context-free scores on `targets`: the top token's share and the entropy.

    `mask_unigram_accuracy`: always guessing the most frequent of these targets;
    `mask_unigram_loss`: the cross-entropy of guessing their own frequencies (nats). Both are
    fitted on the targets themselves, so no model without context beats them.
    """
    if targets.numel() == 0:
        return {"mask_unigram_accuracy": 0.0, "mask_unigram_loss": 0.0}
    counts = torch.bincount(targets).double()
    p = counts[counts > 0] / counts.sum()
    return {"mask_unigram_accuracy": float(p.max()),
            "mask_unigram_loss": float(-(p * p.log()).sum())}


def unigram_baseline(train_loader: Iterable[Batch], val_loader: Iterable[Batch],
                     max_batches: int | None = 20) -> dict[str, float | int]:
    """Return the MLM accuracy of always guessing the most frequent training target token.

    The token is counted on the first `max_batches` training batches and scored on the first
    `max_batches` validation batches (the same ones `evaluate` uses), so a model that learned
    nothing about context scores about this.

    Taught in notebooks/05_pretraining.ipynb
    """
    counts: torch.Tensor | None = None
    for i, batch in enumerate(train_loader):
        if max_batches is not None and i >= max_batches:
            break
        targets = batch["labels"][batch["labels"] != IGNORE_INDEX]
        c = torch.bincount(targets, minlength=1)
        if counts is None:
            counts = c
        else:
            size = max(len(counts), len(c))
            counts = F.pad(counts, (0, size - len(counts))) + F.pad(c, (0, size - len(c)))
    if counts is None or counts.sum() == 0:
        raise ValueError("unigram_baseline: the training loader gave no MLM targets")
    token = int(counts.argmax())
    hits = total = 0
    for i, batch in enumerate(val_loader):
        if max_batches is not None and i >= max_batches:
            break
        targets = batch["labels"][batch["labels"] != IGNORE_INDEX]
        hits += int((targets == token).sum())
        total += targets.numel()
    if total == 0:
        raise ValueError("unigram_baseline: the validation loader gave no MLM targets")
    return {"token_id": token, "mlm_accuracy": hits / total}


def fill_mask(model: BertForPreTraining, tokenizer: Tokenizer, text: str,
              top_k: int = 5) -> list[list[tuple[str, float]]]:
    """Return, for each [MASK] in `text`, the `top_k` (token, probability) guesses, best first.

    Taught in notebooks/05_pretraining.ipynb
    """
    check_type(model, nn.Module, "fill_mask(model)", "a bertlab BertForPreTraining",
               "pass the model bl.load_model or bl.BertForPreTraining gives")
    check_type(text, str, "fill_mask(text)", "a string", "pass one text with [MASK] in it")
    check_number("fill_mask", "top_k", top_k, "positive integer")
    check_tokenizer_fits(tokenizer, model.config.vocab_size, "fill_mask")
    mask_id = special_ids(tokenizer).mask
    encoding = tokenizer.encode(text)
    if mask_id not in encoding.ids:
        raise ValueError(f"text {text!r} has no [MASK] token; write [MASK] where a word should "
                         f"be guessed")
    # One sequence, (1, T) -> (masks, top_k) probabilities and token ids.
    probs, ids = model.fill_mask(torch.tensor([encoding.ids]), mask_id, top_k,
                                 token_type_ids=torch.tensor([encoding.type_ids]))
    return [[(tokenizer.id_to_token(int(i)), float(p)) for p, i in zip(ps, row, strict=True)]
            for ps, row in zip(probs.cpu(), ids.cpu(), strict=True)]
