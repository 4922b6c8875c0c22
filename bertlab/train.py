"""The training loop, top to bottom: settings, schedule and optimizer, the loop itself.

Each mechanism is a handful of lines in one place (the nanoGPT habit): read `train_loop` to see
how they fit together. What it calls lives beside it: `bertlab.device` (device, mixed precision,
compile, DDP), `bertlab.checkpoint` (atomic checkpoints) and `bertlab.resume` (exact resume,
safe stops). The loop knows no objective: `bertlab.pretraining.pretrain` runs it with BERT's
loss, fine-tuning (`bertlab.finetune`) with a classification loss, each through its own
`loss_fn`, `count_fn` and `eval_fn`.

Taught in notebooks/05_pretraining.ipynb
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from bertlab.checkpoint import latest_checkpoint, load_checkpoint
from bertlab.device import (
    autocast_context,
    fast_math,
    from_rank0,
    rank_world,
    resolve_device,
    resolve_precision,
    sum_over_processes,
    to_device,
    wrap_model,
)
from bertlab.optim import MuonAdamW, split_for_muon
from bertlab.resume import (
    CheckpointSaver,
    DataPosition,
    check_resume,
    check_run_folder,
    hold_run_folder,
    interrupt_on_sigterm,
    restore_rng,
    resume_checkpoint,
    rng_state,
)
from bertlab.util import atomic_write_json, atomic_write_text, check_number

Batch = dict[str, torch.Tensor]

# =============================================================================================
# Settings


def _setting(default: Any, help: str) -> Any:
    # A dataclass field that carries its one-line help (the CLI turns each into a flag).
    return field(default=default, metadata={"help": help})


_DETAIL = ("val_random", "val_kept", "val_mask_unigram", "val_perplexity")  # not in the eval line
_OPTIONAL = ("max_steps", "max_minutes", "warmup_steps", "grad_clip", "eval_interval",
             "checkpoint_interval")  # the settings where None means "no limit" or "off"


@dataclass
class TrainConfig:
    """Every setting of the training loop, with its default.

    The run stops at `max_steps` optimizer steps or after `max_minutes` of training time
    (evaluations excluded), whichever comes first. The learning-rate schedule runs over the
    same budget (with a time budget it follows elapsed time, as in Cramming; for bit-exact
    resumes set only `max_steps`). `batch_size` is the global batch of one optimizer step.

    Taught in notebooks/05_pretraining.ipynb
    """

    max_steps: int | None = _setting(1000, "optimizer steps to run (None: no step limit)")
    max_minutes: float | None = _setting(None, "training-time budget in minutes, evaluations "
                                                "excluded (None: no limit)")
    batch_size: int = _setting(32, "global batch per optimizer step (all micro-batches, all "
                                   "processes)")
    grad_accum: int = _setting(1, "micro-batches accumulated per optimizer step")
    lr: float = _setting(5e-4, "peak learning rate")
    warmup_steps: int | None = _setting(None, "warmup length in steps (None: warmup_fraction)")
    warmup_fraction: float = _setting(0.06, "warmup length as a fraction of the run")
    schedule: str = _setting("linear", "decay after warmup: linear, cosine or constant")
    min_lr_ratio: float = _setting(0.0, "the decay ends at lr x min_lr_ratio")
    weight_decay: float = _setting(0.01, "AdamW weight decay (matrices only; never biases or "
                                         "LayerNorm weights)")
    betas: tuple[float, float] = _setting((0.9, 0.999), "AdamW betas")
    eps: float = _setting(1e-6, "AdamW epsilon")
    optimizer: str = _setting("adamw", "adamw, or muon: Muon on the encoder layers' matrices, "
                                        "AdamW on the rest (bertlab.optim)")
    muon_lr: float = _setting(0.02, "Muon's peak learning rate (optimizer=muon)")
    grad_clip: float | None = _setting(1.0, "max global gradient norm (None: no clipping)")
    eval_interval: int | None = _setting(100, "steps between evaluations (also at step 0 and the "
                                               "end; None: only there)")
    eval_batches: int = _setting(20, "validation batches per evaluation")
    checkpoint_interval: int | None = _setting(500, "steps between checkpoints (also at the end; "
                                                    "None: only at the end)")
    keep_checkpoints: int = _setting(2, "how many of the newest checkpoints to keep")
    device: str = _setting("auto", "auto (CUDA, else MPS, else CPU), cpu, cuda, cuda:N or mps")
    precision: str = _setting("auto", "auto (bf16 on CUDA, fp32 elsewhere), fp32, bf16 or fp16")
    compile: bool | None = _setting(None, "torch.compile the model (None: on for CUDA)")
    seed: int = _setting(0, "seed of the dropout stream (data order and masks use the "
                            "loader's seed)")
    log_interval: int = _setting(10, "steps between progress updates (0: none)")
    progress: bool = _setting(True, "show a progress bar and one line per evaluation")

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)
        if self.max_steps is None and self.max_minutes is None:
            raise ValueError("TrainConfig needs a budget: set max_steps, max_minutes or both")
        kinds = {"positive integer": ("max_steps", "batch_size", "grad_accum", "eval_interval",
                                      "eval_batches", "checkpoint_interval", "keep_checkpoints"),
                 "positive number": ("max_minutes", "lr", "eps", "grad_clip", "muon_lr"),
                 "integer >= 0": ("seed", "log_interval", "warmup_steps")}
        for kind, names in kinds.items():
            for name in names:
                check_number("TrainConfig", name, getattr(self, name), kind,
                             none_ok=name in _OPTIONAL)
        if self.warmup_steps is not None and self.max_steps is not None and \
                self.warmup_steps >= self.max_steps:
            raise ValueError(f"TrainConfig.warmup_steps={self.warmup_steps} is not below "
                             f"max_steps={self.max_steps}: the run would never leave warmup; use "
                             f"fewer warmup steps (or warmup_fraction)")
        for name in ("warmup_fraction", "min_lr_ratio"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"TrainConfig.{name} must be in [0, 1), got {getattr(self, name)!r}")
        if self.weight_decay < 0:
            raise ValueError(f"TrainConfig.weight_decay must be >= 0, got {self.weight_decay!r}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"TrainConfig.betas must be two numbers in [0, 1), got {self.betas!r}")
        choices = {"schedule": ("linear", "cosine", "constant"), "optimizer": ("adamw", "muon"),
                   "precision": ("auto", "fp32", "bf16", "fp16")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"TrainConfig.{name}={getattr(self, name)!r} is not one of "
                                 f"{', '.join(allowed)}")
        if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", str(self.device)):
            raise ValueError(f"TrainConfig.device={self.device!r} is not auto, cpu, mps, cuda or "
                             f"cuda:N")
        if self.batch_size % self.grad_accum:
            raise ValueError(f"TrainConfig.batch_size={self.batch_size} is not divisible by "
                             f"grad_accum={self.grad_accum}; the global batch is split evenly "
                             f"into micro-batches")

    def to_dict(self) -> dict:
        """Return the settings as a JSON-ready dict; `TrainConfig(**d)` reverses it."""
        return asdict(self)


# =============================================================================================
# Schedule and optimizer


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


def _progress(step: int, config: TrainConfig, elapsed_s: float) -> float:
    # How far the run is (0 -> 1) at optimizer step `step` after `elapsed_s` seconds.
    done = []
    if config.max_steps is not None:
        done.append((step + 1) / config.max_steps)
    if config.max_minutes is not None:
        done.append(elapsed_s / (60.0 * config.max_minutes))
    return min(1.0, max(done))


def lr_at(step: int, config: TrainConfig, elapsed_s: float = 0.0) -> float:
    """Return the learning rate of step `step`: linear warmup, then linear/cosine/constant decay.

    Taught in notebooks/05_pretraining.ipynb
    """
    progress = _progress(step, config, elapsed_s)
    if config.warmup_steps is not None:
        if step < config.warmup_steps:
            return config.lr * (step + 1) / config.warmup_steps
        warm = config.warmup_steps / config.max_steps if config.max_steps else 0.0
    else:
        if progress < config.warmup_fraction:
            return config.lr * progress / config.warmup_fraction
        warm = config.warmup_fraction
    t = min(1.0, max(0.0, (progress - warm) / max(1e-12, 1.0 - warm)))  # 0 -> 1 while decaying
    shape = {"linear": 1.0 - t, "cosine": 0.5 * (1.0 + math.cos(math.pi * t)), "constant": 1.0}
    return config.lr * (config.min_lr_ratio + (1.0 - config.min_lr_ratio) * shape[config.schedule])


# =============================================================================================
# The loop


@dataclass
class RunState:
    """Where a run stands: what every checkpoint saves and a resume restores."""

    step: int = 0  # optimizer steps done
    epoch: int = 0  # the data position after the last step: its epoch...
    offset: int = 0  # ...and how many of that epoch's batches were used
    tokens: int = 0  # tokens trained on, all processes together
    elapsed_s: float = 0.0
    history: list[dict[str, Any]] = field(default_factory=list)  # one row per evaluation


@dataclass
class _Window:
    """Training loss and speed since the last evaluation (what its history row reports)."""

    loss: float = 0.0
    steps: int = 0
    tokens: int = 0
    seconds: float = 0.0

    def add(self, loss: float, tokens: int, seconds: float) -> None:
        """Count one more optimizer step."""
        self.loss, self.steps = self.loss + loss, self.steps + 1
        self.tokens, self.seconds = self.tokens + tokens, self.seconds + seconds


@dataclass
class TrainResult:
    """What `train_loop` / `pretrain` return: the evaluation history and how the run ended.

    `history` has one dict per evaluation (step, tokens, elapsed_s, lr, train_loss,
    tokens_per_s and val_* metrics); `step_losses` has the training loss of every step this call
    ran, starting at `first_step`.
    """

    history: list[dict[str, Any]]
    step_losses: list[float]
    first_step: int
    steps: int
    tokens: int
    elapsed_s: float
    stopped_by: str
    out_dir: Path | None = None
    checkpoint: Path | None = None
    config: TrainConfig = field(default_factory=TrainConfig)

    @property
    def final(self) -> dict[str, Any]:
        """Return the last evaluation row (empty dict if there was none)."""
        return self.history[-1] if self.history else {}


def _write_history(out_dir: Path, history: list[dict]) -> None:
    atomic_write_json(out_dir / "history.json", history)
    columns: list[str] = []
    for row in history:
        columns += [k for k in row if k not in columns]
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, fieldnames=columns)
    writer.writeheader()
    writer.writerows(history)
    atomic_write_text(out_dir / "history.csv", table.getvalue())


def _check_loader_batch(loader: Iterable, config: TrainConfig, world: int) -> None:
    per_batch = getattr(loader, "batch_size", None)
    if per_batch is not None and per_batch * config.grad_accum * world != config.batch_size:
        raise ValueError(
            f"the loader gives batches of {per_batch}, but TrainConfig.batch_size="
            f"{config.batch_size} with grad_accum={config.grad_accum} on {world} process(es) "
            f"needs {config.batch_size / (config.grad_accum * world):g} per batch; build the "
            f"loader with batch_size=batch_size // (grad_accum x processes)")


def train_loop(
    model: nn.Module,
    train_loader: Iterable[Batch],
    config: TrainConfig,
    *,
    loss_fn: Callable[[nn.Module, Batch, dict[str, float]], torch.Tensor],
    count_fn: Callable[[Batch], dict[str, float]],
    eval_fn: Callable[..., dict[str, float]] | None = None,
    val_loader: Iterable[Batch] | None = None,
    out_dir: str | Path | None = None,
    resume: bool = False,
) -> TrainResult:
    """Return a `TrainResult` after training `model` with `loss_fn` until the budget is spent.

    `count_fn(batch)` gives the denominators of the loss (e.g. number of MLM targets);
    they are summed over the step's micro-batches and processes, and `loss_fn(model, batch,
    totals)` returns that batch's share of the step's loss. `eval_fn(model, val_loader,
    max_batches, device=, precision=)` gives the metrics logged with prefix "val_". With `out_dir`,
    checkpoints go to out_dir/checkpoints and the history to history.csv/json. The loader's
    `set_epoch(epoch)` (if it has one) is called before each epoch, and its `seed` (if any) is
    saved and checked on resume. Under an active process group (torchrun) the model is wrapped
    in DistributedDataParallel; rank 0 logs and writes. Ctrl-C (or SIGTERM) saves a checkpoint,
    then re-raises; a NaN/inf loss raises FloatingPointError naming the step, leaving the last
    good checkpoint as it was.
    """
    rank, world = rank_world()
    is_main = rank == 0
    device = resolve_device(config.device)
    precision = resolve_precision(config.precision, device)
    _check_loader_batch(train_loader, config, world)
    # Rank 0 alone writes into the run folder (and may be writing right now): it alone checks.
    out = check_run_folder(out_dir, resume) if is_main else (
        None if out_dir is None else Path(out_dir))
    model.to(device)
    optimizer = build_optimizer(model, config, device)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    dataset = getattr(train_loader, "dataset", None)
    data = {"data_seed": getattr(train_loader, "seed", None),
            "train_examples": len(dataset) if hasattr(dataset, "__len__") else None}
    compile_model = device.type == "cuda" if config.compile is None else config.compile
    evaluating = eval_fn is not None and val_loader is not None
    cuda_devices = [device] if device.type == "cuda" else []
    run = RunState()

    # Dropout draws from torch's global generator: fork it, so this run's stream is a function of
    # (seed, rank) and the caller's generator is left as it was.
    with hold_run_folder(out, resume, rank, world), interrupt_on_sigterm(), \
            torch.random.fork_rng(devices=cuda_devices), fast_math(device, compile_model):
        if out is not None and is_main:
            (out / "checkpoints").mkdir(exist_ok=True)
        torch.manual_seed(config.seed + rank)
        if resume:
            ckpt = resume_checkpoint(out, is_main, world)
            saved = load_checkpoint(ckpt, model, optimizer, scaler=scaler, verify=False)
            check_resume(saved, ckpt, config.batch_size, config.grad_accum, *data.values())
            run = RunState(**{f.name: saved[f.name] for f in fields(RunState)})
            restore_rng(saved, device, rank, world)
        train_model, ddp = wrap_model(model, device, compile_model)
        amp = autocast_context(device, precision)
        batches = DataPosition(train_loader, run.epoch, run.offset)
        saver = CheckpointSaver(out if is_main else None, model, optimizer, scaler,
                                config.keep_checkpoints, {**data, "world_size": world,
                                                          "train_config": config.to_dict()},
                                saved_step=run.step if resume else None)
        first_step, step_losses, window = run.step, [], _Window()
        eval_args = dict(model=model, val_loader=val_loader, eval_fn=eval_fn, config=config,
                         device=device, precision=precision, out=out)
        bar = _progress_bar(config, run, is_main)
        checkpoint, stopped_by = None, "max_steps"
        clock = time.perf_counter() - run.elapsed_s
        rng = rng_state(device)  # what a checkpoint stores: the RNG after the last finished step
        if evaluating and is_main and run.step == 0:
            clock += _evaluate(run, window, **eval_args)  # evaluating is not training time
        try:
            while True:
                run.elapsed_s = from_rank0(time.perf_counter() - clock, device)
                if config.max_steps is not None and run.step >= config.max_steps:
                    break
                if config.max_minutes is not None and run.elapsed_s >= 60 * config.max_minutes:
                    stopped_by = "max_minutes"
                    break
                step_start = time.perf_counter()
                micro = [batches.next() for _ in range(config.grad_accum)]
                totals = _step_totals(micro, count_fn, device)
                lr = lr_at(run.step, config, run.elapsed_s)
                for group in optimizer.param_groups:
                    group["lr"] = lr * group.get("lr_scale", 1.0)
                step_loss = torch.zeros((), device=device)
                for i, batch in enumerate(micro):
                    sync = ddp is None or i == len(micro) - 1  # all-reduce grads once per step
                    with contextlib.nullcontext() if sync else ddp.no_sync():
                        with amp:
                            # DDP averages gradients over processes; our loss is already a share
                            # of the global sum, so scale it back up by the number of processes.
                            loss = loss_fn(train_model, to_device(batch, device), totals) * world
                        scaler.scale(loss).backward()
                    step_loss += loss.detach() / world
                loss_value = sum_over_processes({"loss": step_loss.item()}, device)["loss"]
                if not math.isfinite(loss_value):
                    last = latest_checkpoint(out) if out is not None else None
                    raise FloatingPointError(
                        f"training loss is {loss_value} at step {run.step}; stopped before the "
                        f"update. Newest checkpoint: {last}. The run diverged: lower lr (now "
                        f"{lr:.3g}) or check the data for bad batches")
                if config.grad_clip is not None:
                    scaler.unscale_(optimizer)
                    nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)

                run.step += 1
                run.epoch, run.offset, rng = batches.epoch, batches.offset, rng_state(device)
                run.tokens += int(totals["_tokens"])
                step_losses.append(loss_value)
                window.add(loss_value, int(totals["_tokens"]), time.perf_counter() - step_start)
                _show_progress(bar, config, run, window, loss_value, lr, is_main, clock)
                at_end = config.max_steps is not None and run.step >= config.max_steps
                due = config.eval_interval and run.step % config.eval_interval == 0
                if is_main and (due or at_end):
                    run.elapsed_s = time.perf_counter() - clock
                    clock += _evaluate(run, window, **eval_args)
                if config.checkpoint_interval and run.step % config.checkpoint_interval == 0:
                    checkpoint = saver.save(asdict(run), rng)
        except KeyboardInterrupt as stop:
            if out is not None:
                saver.save_on_interrupt(stop, asdict(run), rng)
            raise
        finally:
            bar.close()
        run.elapsed_s = time.perf_counter() - clock
        if evaluating and is_main and (not run.history or run.history[-1]["step"] != run.step):
            _evaluate(run, window, **eval_args)
        if out is not None and saver.saved_step != run.step:
            checkpoint = saver.save(asdict(run), rng)
        elif out is not None and is_main:
            checkpoint = latest_checkpoint(out)
    return TrainResult(history=run.history, step_losses=step_losses, first_step=first_step,
                       steps=run.step, tokens=run.tokens, elapsed_s=run.elapsed_s,
                       stopped_by=stopped_by, out_dir=out, checkpoint=checkpoint, config=config)


def _step_totals(micro: list[Batch], count_fn: Callable[[Batch], dict[str, float]],
                 device: torch.device) -> dict[str, float]:
    # The denominators of the step's loss ("_tokens" too): summed over its micro-batches and
    # over the processes, before any forward pass, so each batch's loss is its share of the step.
    counts: dict[str, float] = {"_tokens": 0.0}
    for b in micro:
        counts["_tokens"] += b["input_ids"].numel()
        for k, v in count_fn(b).items():
            counts[k] = counts.get(k, 0.0) + v
    return sum_over_processes(counts, device)


def _show_progress(bar: tqdm, config: TrainConfig, run: RunState, window: _Window,
                   loss: float, lr: float, is_main: bool, clock: float) -> None:
    # Every log_interval steps: the loss, lr and speed, on the bar (or printed without one).
    if config.log_interval and run.step % config.log_interval == 0:
        rate = window.tokens / max(window.seconds, 1e-9)
        if config.progress:
            bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{rate:.0f}",
                            refresh=False)
        elif is_main:
            print(f"step {run.step} loss {loss:.4f} lr {lr:.3g} tokens/s {rate:.0f}", flush=True)
    bar.update(1 if config.max_steps is not None else round(time.perf_counter() - clock) - bar.n)


def _progress_bar(config: TrainConfig, run: RunState, is_main: bool) -> tqdm:
    by_steps = config.max_steps is not None
    return tqdm(total=config.max_steps if by_steps else round(config.max_minutes * 60),
                initial=run.step if by_steps else round(run.elapsed_s),
                unit="step" if by_steps else "s", disable=not (config.progress and is_main),
                dynamic_ncols=True, bar_format=None if by_steps else
                "{l_bar}{bar}| {n_fmt}/{total_fmt} s [{elapsed}<{remaining}{postfix}]")


def _evaluate(run: RunState, window: _Window, *, model: nn.Module,
              val_loader: Iterable[Batch] | None, eval_fn: Callable[..., dict[str, float]] | None,
              config: TrainConfig,
              device: torch.device, precision: str, out: Path | None) -> float:
    # One history row (rank 0): the step, the training loss and speed since the last row, and
    # the held-out metrics when there is an eval_fn and a val_loader; printed, and rewritten to
    # history.json/csv. Returns the seconds it took: the loop's clock (elapsed_s, the time-based
    # schedule and budget) counts training only, however often a run evaluates.
    start = time.perf_counter()
    row = {"step": run.step, "tokens": run.tokens, "elapsed_s": round(run.elapsed_s, 3),
           "lr": lr_at(run.step, config, run.elapsed_s),
           "train_loss": window.loss / window.steps if window.steps else None,
           "tokens_per_s": window.tokens / window.seconds if window.seconds else None}
    if eval_fn is not None and val_loader is not None:
        # Evaluation must not move the dropout stream (a loader, for one, may draw from it).
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            metrics = eval_fn(model, val_loader, config.eval_batches, device=device,
                              precision=precision)
        row.update({f"val_{k}": v for k, v in metrics.items()})
    run.history.append(row)
    window.__init__()  # a new window starts
    if config.progress:
        tqdm.write(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in
                            row.items() if not k.startswith(_DETAIL)))  # history.json has them
    if out is not None:
        _write_history(out, run.history)
    return time.perf_counter() - start
