"""The training loop: the optimizer, one step (`train_step`), and the loop that repeats it.

Read top to bottom:

- The optimizer: `MuonAdamW`, Muon on the encoder's hidden matrices and AdamW on the rest, held
  together so that the loop sees one optimizer (`build_optimizer` returns it, or plain AdamW, as
  `TrainConfig.optimizer` says).
- `Objective`: what the loop trains, a batch's loss and the counts it is divided by. The loop
  knows no objective of its own: `bertlab.pretraining.pretrain` hands it BERT's loss,
  fine-tuning (`bertlab.finetune`) a classification loss.
- `train_step` is the whole of learning: batch -> forward -> loss -> backward -> clip -> step,
  at the learning rate the schedule gives for that step.
- `train_loop` repeats it until the budget is spent; what a long run needs besides (a run
  folder, exact resume, Ctrl-C and SIGTERM, DDP, evaluation, logging, checkpoints) is one call
  each on `bertlab.engine.session.RunHooks`.

Taught in notebooks/05_pretraining.ipynb.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from bertlab.config import TrainConfig, lr_at, rank_world
from bertlab.data import Batch, RunData
from bertlab.engine.device import wrap_model
from bertlab.engine.session import RunHooks, TrainResult
from bertlab.precision import resolve_newton_schulz

__all__ = ['Objective', 'TrainConfig', 'TrainResult', 'build_optimizer', 'lr_at', 'train_loop', 'train_step']

# --------------------------------------------------------------------------------------------
# The optimizer: Muon for the encoder's hidden matrices, AdamW for everything else
#
# Muon (Jordan et al. 2024; `torch.optim.Muon` since torch 2.9) keeps a momentum of the gradient
# like SGD, but before it steps it replaces that momentum by the nearest orthogonal matrix (a few
# Newton-Schulz iterations). Every direction of a weight matrix then moves by the same amount,
# instead of the few directions that dominate a raw gradient. It is defined for 2-D weights only,
# and it is meant for the hidden ones: the attention and feed-forward matrices inside the encoder
# layers. Embeddings (a lookup table, and here tied to the output layer), the heads, biases and
# LayerNorm gains stay on AdamW, as in Muon's reference setup.
#
# `MuonAdamW` holds one of each and looks like a single optimizer to `train_loop`: its
# `param_groups` are both optimizers' groups (the loop sets their learning rates, and
# `torch.amp.GradScaler` unscales and checks their gradients, skipping both steps together after an
# overflow), and its state dict has the ordinary flat shape of one optimizer's, so checkpoints and
# exact resume handle it as they handle AdamW.


# Muon's step, in bertlab's own code so that its Newton-Schulz iterations run in a dtype of our
# choosing: `torch.optim.Muon` always casts to bf16, which is fast where bf16 matmuls are native
# (GPUs, CPUs with AMX or AVX-512 BF16) and 4-5x slower for the whole step on a CPU without them.
# In bf16 it computes what torch's does, bit for bit (tests/test_optim.py holds them equal).
_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


class Muon(torch.optim.Muon):
    """`torch.optim.Muon`, with its Newton-Schulz iterations in `newton_schulz` ("bf16", as
    torch's own, or "fp32"); the same options, parameter groups and state dict.

    `bertlab.precision.resolve_newton_schulz` picks the dtype a run uses: bf16 where bf16
    matmuls are native, fp32 elsewhere.
    """

    def __init__(self, params: Iterable, newton_schulz: str = "bf16", **options: Any) -> None:
        if newton_schulz not in _DTYPES:
            raise ValueError(f"Muon(newton_schulz={newton_schulz!r}) is not one of "
                             f"{', '.join(_DTYPES)}")
        super().__init__(params, **options)
        self.newton_schulz = newton_schulz

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        """Step every matrix that has a gradient: momentum, orthogonalize, decay, update.

        The orthogonalization is a quintic Newton-Schulz iteration X <- a X + (b A + c A^2) X
        with A = X X^T, after scaling X to a norm of at most 1 (Jordan et al. 2024); a tall
        matrix is iterated as its transpose, so A is the smaller Gram. One function, so that
        an optimizer step stays followable (tests/test_step_functions.py).
        """
        if closure is not None:
            raise ValueError("bertlab's Muon takes no closure")
        dtype = _DTYPES[self.newton_schulz]
        for group in self.param_groups:
            (a, b, c), momentum, lr = group["ns_coefficients"], group["momentum"], group["lr"]
            for param in (p for p in group["params"] if p.grad is not None):
                grad, state = param.grad, self.state[param]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(
                        grad, memory_format=torch.preserve_format)
                buf = state["momentum_buffer"]
                buf.lerp_(grad, 1 - momentum)
                update = grad.lerp(buf, momentum) if group["nesterov"] else buf
                x = update.to(dtype, copy=True)  # a copy: the momentum stays as it was
                tall = update.size(0) > update.size(1)
                x = x.T if tall else x  # (rows, cols) -> (cols, rows)
                x.div_(x.norm().clamp(min=group["eps"]))
                for _ in range(group["ns_steps"]):
                    gram = x @ x.T  # (r, r), r the smaller side
                    x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
                rows, cols = param.shape[:2]
                scale = {None: math.sqrt(max(1, rows / cols)),
                         "original": math.sqrt(max(1, rows / cols)),
                         "match_rms_adamw": 0.2 * math.sqrt(max(rows, cols))}.get(
                    group["adjust_lr_fn"], 1.0)
                param.mul_(1 - lr * group["weight_decay"])
                param.add_(x.T if tall else x, alpha=-lr * scale)


def is_hidden_matrix(name: str, param: torch.Tensor) -> bool:
    """Return whether `param` is a 2-D weight inside an encoder layer (Muon's share)."""
    return param.dim() == 2 and ".layers." in f".{name}"


class MuonAdamW:
    """Muon on the hidden matrices, AdamW on the other parameters, stepped together.

    Not a `torch.optim.Optimizer` itself: it holds a `Muon` (torch's, with the Newton-Schulz
    dtype `muon_options["newton_schulz"]`) and a `torch.optim.AdamW` (`parts`, in that order) and offers what the loop, checkpoints and
    `torch.amp.GradScaler` use of an optimizer: `param_groups`, `step`, `zero_grad`,
    `state_dict` and `load_state_dict`. `muon_groups` and `adamw_groups` are parameter groups
    (lists of dicts) for each part; `muon_options` and `adamw_options` their constructor
    arguments (lr, weight_decay, ...).

    Taught in notebooks/05_pretraining.ipynb
    """

    def __init__(self, muon_groups: Iterable[dict], adamw_groups: Iterable[dict], *,
                 muon_options: dict[str, Any], adamw_options: dict[str, Any]) -> None:
        self.muon = Muon(list(muon_groups), **muon_options)
        self.adamw = torch.optim.AdamW(list(adamw_groups), **adamw_options)
        self.parts = (self.muon, self.adamw)
        self._share_groups()

    def _share_groups(self) -> None:
        # Both parts' parameter groups, Muon's first: the live dicts, so the loop's lr updates
        # (and GradScaler's unscaling) reach the parts. load_state_dict gives the parts new
        # dicts, and calls this again.
        self.param_groups = [g for part in self.parts for g in part.param_groups]

    def step(self) -> None:
        """Step both parts (Muon, then AdamW) on the gradients their parameters hold."""
        for part in self.parts:
            part.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear both parts' gradients (to None by default, as torch's optimizers do)."""
        for part in self.parts:
            part.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """Return one flat state dict: parameters numbered across both parts, Muon's first.

        The shape of a single optimizer's ({"state": {index: {...}}, "param_groups": [...]}),
        which is what `bertlab.engine.checkpoint` splits into safetensors and JSON.
        """
        state, groups, offset = {}, [], 0
        for part in self.parts:
            sd = part.state_dict()
            groups += [{**g, "params": [i + offset for i in g["params"]]}
                       for g in sd["param_groups"]]
            state.update({i + offset: s for i, s in sd["state"].items()})
            offset += sum(len(g["params"]) for g in sd["param_groups"])
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict written by `state_dict`, splitting it back into the two parts."""
        groups, offset = list(state_dict["param_groups"]), 0
        if len(groups) != len(self.param_groups):
            raise ValueError(f"the state dict has {len(groups)} parameter groups, this "
                             f"MuonAdamW has {len(self.param_groups)}")
        for part in self.parts:
            mine, groups = groups[:len(part.param_groups)], groups[len(part.param_groups):]
            ids = {i for g in mine for i in g["params"]}
            part.load_state_dict({
                # Only this part's parameters: torch would keep state under unknown keys as is.
                "state": {i - offset: s for i, s in state_dict["state"].items() if i in ids},
                "param_groups": [{**g, "params": [i - offset for i in g["params"]]}
                                 for g in mine]})
            offset += len(ids)
        self._share_groups()


def split_for_muon(model: nn.Module) -> tuple[list[nn.Parameter], list[tuple[str, nn.Parameter]]]:
    """Return (the hidden matrices, the other named trainable parameters) of `model`."""
    hidden, rest = [], []
    for name, p in model.named_parameters():  # tied weights appear once
        if p.requires_grad:
            (hidden.append(p) if is_hidden_matrix(name, p) else rest.append((name, p)))
    return hidden, rest


# --------------------------------------------------------------------------------------------
# The loop: what it trains, one step, and the steps until the budget is spent



class Objective:
    """What the loop trains: a batch's loss, the counts it is divided by, and how to score it.

    A subclass defines `counts` and `loss`; the rest have defaults. `name` goes into every
    checkpoint, and a resume with another objective is refused.
    """

    name = ""
    # What the run needs from its data (`bertlab.data.RunData`): pretraining's objective is
    # built with its loader's; None checks and records less (fine-tuning's own batches).
    data: RunData | None = None

    def counts(self, batch: Batch) -> dict[str, float]:
        """Return the batch's loss denominators (MLM targets, sequences...), on the CPU batch."""
        raise NotImplementedError

    def loss(self, model: nn.Module, batch: Batch, totals: dict[str, float]) -> torch.Tensor:
        """Return the batch's share of the step's loss; `totals` holds the step's sums of
        `counts` over all its micro-batches and processes."""
        raise NotImplementedError

    def module(self, model: nn.Module) -> nn.Module:
        """Return what the training step calls: the model itself, or a faster module over the
        same weights (pretraining's `bertlab.pretraining.FastPretraining`)."""
        return model

    def inputs(self, batch: Batch) -> Batch:
        """Return what the model is handed for `batch`, prepared on the CPU before it moves to
        the device (pretraining drops an all-ones attention mask there)."""
        return batch

    def evaluate(self, model: nn.Module, loader: Iterable[Batch], max_batches: int | None, *,
                 device: torch.device, precision: str) -> dict[str, float] | None:
        """Return the held-out metrics of a history row (None: this objective has none)."""
        return None

    def run_record(self, model: nn.Module, config: TrainConfig) -> dict[str, Any] | None:
        """Return what a new run folder's run.json says the run trained (None: no run.json)."""
        return None


def autocast_context(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """Return the mixed-precision context for forward passes (a no-op for fp32).

    Under autocast, matmuls run in bf16/fp16 while the weights, their gradients and the
    optimizer state stay fp32 (so no master-weight copy is needed).
    """
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    return torch.autocast(device_type=device.type, dtype=dtype)


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """Return the batch with its tensors on `device` (other values as they are)."""
    # non_blocking overlaps the copy with compute when the loader pins memory (pin_memory=True).
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v
            for k, v in batch.items()}


def build_optimizer(model: nn.Module, config: TrainConfig,
                    device: torch.device | None = None) -> torch.optim.Optimizer:
    """Return the optimizer `config.optimizer` names, with weight decay on matrices only.

    "adamw": AdamW on everything. "muon": `bertlab.train.MuonAdamW`, Muon (peak `muon_lr`, no
    weight decay, Newton-Schulz in the dtype `config.newton_schulz` resolves to on `device`:
    bf16 where bf16 matmuls are native, fp32 elsewhere) on the encoder layers' matrices and
    AdamW on the rest. Every parameter with
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
    dtype = resolve_newton_schulz(config.newton_schulz, device)
    return MuonAdamW(muon, groups, muon_options=dict(lr=config.muon_lr, newton_schulz=dtype),
                     adamw_options=adamw)


def step_totals(micro_batches: list[Batch], counts, device: torch.device) -> dict[str, float]:
    """Return the step's loss denominators and its input tokens ("tokens"), summed over its
    micro-batches and over the processes (one collective), before any forward pass, so each
    batch's loss is its share of the step."""
    totals: dict[str, float] = {"tokens": 0.0}
    for batch in micro_batches:
        for key, value in counts(batch).items():
            totals[key] = totals.get(key, 0.0) + value
        totals["tokens"] += batch["input_ids"].numel()
    if rank_world()[1] == 1:
        return totals
    keys = sorted(totals)  # every process sends its numbers in the same order
    summed = torch.tensor([float(totals[k]) for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(summed)
    return dict(zip(keys, summed.tolist(), strict=True))


def train_step(model: nn.Module, micro_batches: list[Batch], objective: Objective,
               optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, *, lr: float,
               grad_clip: float | None = None, precision: str = "fp32") -> tuple[float, int]:
    """Return (this process's share of the step's loss, the step's tokens) after one optimizer
    step on `micro_batches`; on one process the share is the loss.

    For each micro-batch: forward -> loss -> backward (gradients add up over the micro-batches;
    under DDP, `model` being the DistributedDataParallel wrapper, they are all-reduced once, after
    the last). Then clip the gradient norm to `grad_clip`, and step at learning rate `lr` (times
    each parameter group's "lr_scale").
    A NaN or inf loss or gradient norm raises FloatingPointError before the update, so the
    weights stay good (under DDP the all-reduced norm is the same on every process).
    """
    device, world = next(model.parameters()).device, rank_world()[1]
    ddp = model if isinstance(model, nn.parallel.DistributedDataParallel) else None
    totals = step_totals(micro_batches, objective.counts, device)
    for group in optimizer.param_groups:  # the schedule's learning rate for this step
        group["lr"] = lr * group.get("lr_scale", 1.0)
    step_loss = torch.zeros((), device=device)
    for i, batch in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with contextlib.nullcontext() if ddp is None or last else ddp.no_sync():
            with autocast_context(device, precision):
                # DDP averages gradients over processes; this loss is already a share of the
                # global sum, so it is scaled back up by the number of processes.
                loss = objective.loss(model, to_device(objective.inputs(batch), device),
                                      totals) * world
            scaler.scale(loss).backward()  # fp16 only: scaled up, so small gradients survive
        step_loss += loss.detach() / world
    norm = step_loss  # without clipping there is no norm: the loss alone is checked
    if grad_clip is not None:
        scaler.unscale_(optimizer)
        norm = nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    # The step's one look at the device: the loss and the gradient norm must be finite.
    loss_value, norm_value = torch.stack([step_loss, norm.float()]).tolist()
    for what, value in (("training loss", loss_value), ("gradient norm", norm_value)):
        if not math.isfinite(value):
            raise FloatingPointError(f"{what} is {value}")
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss_value, int(totals["tokens"])


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
        # What the step calls (a faster module over the same weights), compiled, under DDP.
        train_model = wrap_model(objective.module(model), hooks.device, hooks.compile)
        try:
            while hooks.another_step(run):
                lr = lr_at(run.step, config, run.elapsed_s)
                loss, tokens = train_step(train_model, hooks.next_batches(), objective,
                                          optimizer, scaler, lr=lr, grad_clip=config.grad_clip,
                                          precision=hooks.precision)
                hooks.after_step(run, loss, tokens, lr)  # logs; evaluates, checkpoints if due
        except KeyboardInterrupt as stop:
            hooks.interrupted(run, stop)  # saves a checkpoint to resume from
            raise
        except FloatingPointError as error:
            raise hooks.diverged(run, error) from None
        return hooks.finish(run)  # a last evaluation and checkpoint
