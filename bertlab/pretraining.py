"""BERT pretraining on the training loop: the loss share, `pretrain`, and what the model learned.

`pretrain` is `bertlab.train.train_loop` with BERT's objective: masked LM plus next-sentence
prediction (`nsp=False`: masked LM only), the loss defined once in `bertlab.model`. `evaluate`
gives the held-out metrics it logs, `unigram_baseline` the score of a model that learned no
context, and `fill_mask` what the model guesses for the [MASK]s of a text.

Taught in notebooks/05_pretraining.ipynb
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import nn

from bertlab.device import autocast_context, to_device
from bertlab.model import IGNORE_INDEX, BertForPreTraining, loss_counts
from bertlab.tokenizer import special_ids
from bertlab.train import Batch, TrainConfig, TrainResult, train_loop


def pretraining_counts(batch: Batch) -> dict[str, float]:
    """Return the denominators of the pretraining loss for one batch: MLM targets and sequences."""
    return {k: float(v) for k, v in loss_counts(batch["labels"],
                                                batch["next_sentence_label"]).items()}


def pretraining_loss(model: nn.Module, batch: Batch, totals: dict[str, float], *,
                     nsp: bool = True) -> torch.Tensor:
    """Return this batch's share of the step's loss: MLM and NSP sums over the step's totals.

    Dividing summed cross-entropies (`loss_sums`, from `bertlab.model.pretraining_loss_sums`) by
    the targets of the whole optimizer step (all micro-batches, all processes) makes the loss,
    and so the gradient, identical whether a global batch is seen at once, in `grad_accum`
    pieces or split over DDP processes; averaging per-piece means would weight a target by how
    many others share its piece. With `nsp=False` only the MLM part (RoBERTa's choice, and the
    "MLM only" ablation): the model then gets no NSP labels, so no gradient reaches the pooler
    or the NSP head, and no loss reads the last layer's [CLS] vector.

    Taught in notebooks/05_pretraining.ipynb
    """
    if not nsp:
        batch = {k: v for k, v in batch.items() if k != "next_sentence_label"}
    sums = model(**batch).loss_sums
    loss = sums["mlm"] / max(totals["targets"], 1.0)
    return loss + sums["nsp"] / max(totals["sequences"], 1.0) if nsp else loss


def pretrain(model: nn.Module, train_loader: Iterable[Batch], val_loader: Iterable[Batch] | None,
             config: TrainConfig, out_dir: str | Path | None = None,
             resume: bool = False, nsp: bool = True) -> TrainResult:
    """Return a `TrainResult` after pretraining `model` (MLM + NSP; MLM only with `nsp=False`)
    with `config`.

    `train_loader`/`val_loader` yield dicts with input_ids, token_type_ids, attention_mask,
    labels and next_sentence_label (bertlab.pretraining_loader). Evaluates on `val_loader` at
    step 0, every `eval_interval` steps and at the end; see `train_loop` for checkpoints, resume,
    DDP and errors. With `nsp=False` the NSP head gets no gradient: the history still reports its
    accuracy, which then stays near chance.

    Taught in notebooks/05_pretraining.ipynb
    """
    loss_fn = pretraining_loss if nsp else functools.partial(pretraining_loss, nsp=False)
    return train_loop(model, train_loader, config, loss_fn=loss_fn, count_fn=pretraining_counts,
                      eval_fn=evaluate, val_loader=val_loader, out_dir=out_dir, resume=resume)


@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable[Batch], max_batches: int | None = None, *,
             device: torch.device | None = None, precision: str = "fp32") -> dict[str, float]:
    """Return held-out metrics: mlm_loss, mlm_accuracy, perplexity, nsp_loss, nsp_accuracy.

    MLM loss and accuracy are over every target (not averaged per batch); perplexity is
    exp(mlm_loss). Uses the first `max_batches` batches (all when None) of epoch 0 (a loader
    with `set_epoch` is set to 0 first, so repeated evaluations see the same batches), in eval
    mode.

    Taught in notebooks/05_pretraining.ipynb
    """
    device = device or next(model.parameters()).device
    if hasattr(loader, "set_epoch"):
        loader.set_epoch(0)
    was_training = model.training
    model.eval()
    total = dict.fromkeys(("mlm", "mlm_correct", "targets", "nsp", "nsp_correct", "sequences"),
                          0.0)
    for i, batch in enumerate(loader):
        if max_batches is not None and i >= max_batches:
            break
        batch = to_device(batch, device)
        with autocast_context(device, precision):
            out = model(**batch)
        labels, nsp_label = batch["labels"], batch["next_sentence_label"]
        targets = labels[labels != IGNORE_INDEX]  # row-major: the order of out.mlm_logits' rows
        for key, value in out.loss_sums.items():
            total[key] += value.item()
        total["mlm_correct"] += (out.mlm_logits.argmax(-1) == targets).sum().item()
        total["nsp_correct"] += (out.nsp_logits.argmax(-1) == nsp_label).sum().item()
    model.train(was_training)
    if total["targets"] == 0 or total["sequences"] == 0:
        raise ValueError("evaluate: the loader gave no MLM targets or no sequences; check that "
                         "it is not empty and that it masks tokens")
    mlm_loss = total["mlm"] / total["targets"]
    return {"mlm_loss": mlm_loss, "mlm_accuracy": total["mlm_correct"] / total["targets"],
            "perplexity": math.exp(min(mlm_loss, 50.0)), "nsp_loss": total["nsp"] / total["sequences"],
            "nsp_accuracy": total["nsp_correct"] / total["sequences"]}


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
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
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
