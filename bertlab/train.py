"""The training loop: one optimizer step (`train_step`), and the loop that repeats it (`train_loop`).

`train_step` is the whole of learning: batch -> forward -> loss -> backward -> clip -> step, at
the learning rate the schedule gives for that step. `train_loop` repeats it until the budget is
spent; what a long run needs besides (a run folder, exact resume, Ctrl-C and SIGTERM, DDP,
evaluation, logging, checkpoints) is one call each on `bertlab.hooks.RunHooks`. The loop knows
no objective: `bertlab.pretraining.pretrain` hands it BERT's loss, fine-tuning
(`bertlab.finetune`) a classification loss, each as an `Objective`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from bertlab.config import TrainConfig, lr_at
from bertlab.device import autocast_context, rank_world, sum_over_processes, to_device, wrap_model
from bertlab.hooks import RunHooks, TrainResult
from bertlab.optim import MuonAdamW, split_for_muon

__all__ = ["Objective", "TrainConfig", "TrainResult", "build_optimizer", "lr_at", "train_loop",
           "train_step"]

Batch = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Objective:
    """What the loop trains: a batch's loss, the counts it is divided by, and how to score it.

    `loss(model, batch, totals)` returns the batch's share of the step's loss, where `totals`
    holds the step's sums of `counts(batch)` (MLM targets, sequences...) over all its
    micro-batches and processes. `evaluate(model, loader, max_batches, device=, precision=)`,
    when given, returns the held-out metrics of each history row. `name` goes into every
    checkpoint, and a resume with another objective is refused. `inputs(batch)`, when given,
    turns the batch into what the model is handed, on the CPU before it moves to the device
    (pretraining drops an all-ones attention mask there, so attention runs unmasked).
    """

    loss: Callable[[nn.Module, Batch, dict[str, float]], torch.Tensor]
    counts: Callable[[Batch], dict[str, float]]
    evaluate: Callable[..., dict[str, float]] | None = None
    name: str = ""
    inputs: Callable[[Batch], Batch] | None = None


def build_optimizer(model: nn.Module, config: TrainConfig,
                    device: torch.device | None = None) -> torch.optim.Optimizer:
    """Return the optimizer `config.optimizer` names, with weight decay on matrices only.

    "adamw": AdamW on everything. "muon": `bertlab.optim.MuonAdamW`, Muon (peak `muon_lr`, no
    weight decay) on the encoder layers' matrices and AdamW on the rest. Every parameter with
    fewer than 2 dimensions (biases, LayerNorm gains and shifts, the MLM output bias) is left
    undecayed, as in Google's BERT. On CUDA AdamW uses the fused kernel. Each group's
    "lr_scale" is its peak over `config.lr`: the loop multiplies the scheduled lr by it.

    Taught in notebooks/05_pretraining.ipynb
    """
    hidden, rest = split_for_muon(model) if config.optimizer == "muon" else ([], [
        (n, p) for n, p in model.named_parameters() if p.requires_grad])
    groups = [{"params": [p for _, p in rest if p.dim() >= 2],
               "weight_decay": config.weight_decay, "lr_scale": 1.0},
              {"params": [p for _, p in rest if p.dim() < 2], "weight_decay": 0.0,
               "lr_scale": 1.0}]
    device = next(model.parameters()).device if device is None else device
    adamw = dict(lr=config.lr, betas=config.betas, eps=config.eps, fused=device.type == "cuda")
    if config.optimizer == "adamw":
        return torch.optim.AdamW(groups, **adamw)
    muon = [{"params": hidden, "weight_decay": 0.0, "lr_scale": config.muon_lr / config.lr}]
    return MuonAdamW(muon, groups, muon_options=dict(lr=config.muon_lr), adamw_options=adamw)


def step_totals(micro_batches: list[Batch], counts: Callable[[Batch], dict[str, float]],
                device: torch.device) -> tuple[int, dict[str, float]]:
    """Return (the step's input tokens, its loss denominators), summed over its micro-batches and
    over the processes, before any forward pass, so each batch's loss is its share of the step."""
    totals: dict[str, float] = {}
    for batch in micro_batches:
        for key, value in counts(batch).items():
            totals[key] = totals.get(key, 0.0) + value
    tokens = sum(batch["input_ids"].numel() for batch in micro_batches)
    tokens = int(sum_over_processes({"tokens": tokens}, device)["tokens"])
    return tokens, sum_over_processes(totals, device)


def train_step(model: nn.Module, micro_batches: list[Batch], objective: Objective,
               optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, *, lr: float,
               grad_clip: float | None = None, precision: str = "fp32",
               ddp: nn.parallel.DistributedDataParallel | None = None) -> tuple[float, int]:
    """Return (the step's loss, its tokens) after one optimizer step on `micro_batches`.

    For each micro-batch: forward -> loss -> backward (gradients add up over the micro-batches;
    under DDP they are all-reduced once, after the last). Then clip the gradient norm to
    `grad_clip`, and step at learning rate `lr` (times each parameter group's "lr_scale").
    A NaN or inf loss raises FloatingPointError before the update, so the weights stay good.
    """
    device = next(model.parameters()).device
    world = rank_world()[1]
    tokens, totals = step_totals(micro_batches, objective.counts, device)
    for group in optimizer.param_groups:  # the schedule's learning rate for this step
        group["lr"] = lr * group.get("lr_scale", 1.0)
    step_loss = torch.zeros((), device=device)
    if objective.inputs is not None:
        micro_batches = [objective.inputs(batch) for batch in micro_batches]
    for i, batch in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with contextlib.nullcontext() if ddp is None or last else ddp.no_sync():
            with autocast_context(device, precision):
                # DDP averages gradients over processes; this loss is already a share of the
                # global sum, so it is scaled back up by the number of processes.
                loss = objective.loss(model, to_device(batch, device), totals) * world
            scaler.scale(loss).backward()  # fp16 only: scaled up, so small gradients survive
        step_loss += loss.detach() / world
    loss_value = sum_over_processes({"loss": step_loss.item()}, device)["loss"]
    if not math.isfinite(loss_value):
        raise FloatingPointError(f"training loss is {loss_value}")
    if grad_clip is not None:
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss_value, tokens


def train_loop(model: nn.Module, train_loader: Iterable[Batch], config: TrainConfig,
               objective: Objective, *,
               val_loader: Iterable[Batch] | dict[str, Iterable[Batch]] | None = None,
               out_dir: str | Path | None = None, resume: bool = False) -> TrainResult:
    """Return a `TrainResult` after training `model` on `objective` until the budget is spent.

    Repeats `train_step` at the learning rate `lr_at` gives, until `config.max_steps` steps or
    `config.max_minutes` of training (evaluations excluded). Evaluates on `val_loader` (or a
    dict of them: see `RunHooks`) with `objective.evaluate` at step 0, every `eval_interval`
    steps and at the end. With `out_dir`, checkpoints go to out_dir/checkpoints and the history
    to history.csv/json; `resume=True` continues the run there exactly. The loader's
    `set_epoch(epoch)` (if it has one) is called before each epoch. Under torchrun the model is
    wrapped in DistributedDataParallel; rank 0 logs and writes. Ctrl-C (or SIGTERM) saves a
    checkpoint, then re-raises; a NaN/inf loss raises FloatingPointError naming the step,
    leaving the last good checkpoint as it was.
    """
    hooks = RunHooks(train_loader, config, objective, val_loader=val_loader, out_dir=out_dir,
                     resume=resume)  # checks the settings and the run folder
    model.to(hooks.device)
    optimizer = build_optimizer(model, config, hooks.device)
    scaler = torch.amp.GradScaler(hooks.device.type, enabled=hooks.precision == "fp16")
    with hooks.running():  # holds the run folder; SIGTERM acts as Ctrl-C; own dropout stream
        run = hooks.start(model, optimizer, scaler, train_loader)  # step 0, or resumed
        train_model, ddp = wrap_model(model, hooks.device, hooks.compile)  # compile, DDP
        try:
            while hooks.another_step(run):
                lr = lr_at(run.step, config, run.elapsed_s)
                loss, tokens = train_step(train_model, hooks.next_batches(), objective,
                                          optimizer, scaler, lr=lr, grad_clip=config.grad_clip,
                                          precision=hooks.precision, ddp=ddp)
                hooks.after_step(run, loss, tokens, lr)  # logs; evaluates, checkpoints if due
        except KeyboardInterrupt as stop:
            hooks.interrupted(run, stop)  # saves a checkpoint to resume from
            raise
        except FloatingPointError as error:
            raise hooks.diverged(run, error) from None
        return hooks.finish(run)  # a last evaluation and checkpoint
