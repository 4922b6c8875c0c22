"""The pretraining loop, top to bottom: settings, optimizer and schedule, mixed precision, DDP,
evaluation, atomic checkpoints with exact resume, the loop itself, and fill-mask.

Each mechanism is a handful of lines in one place (the nanoGPT habit): read `train_loop` to see
how they fit together. `pretrain` is `train_loop` with BERT's two losses; fine-tuning reuses the
same loop with its own `loss_fn`, `count_fn` and `eval_fn`.

Taught in notebooks/05_pretraining.ipynb
"""

from __future__ import annotations

import contextlib
import csv
import errno
import hashlib
import io
import json
import math
import os
import random
import re
import shutil
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn

from bertlab.model import IGNORE_INDEX, BertConfig, BertForPreTraining
from bertlab.util import (
    FolderLock,
    atomic_write_json,
    atomic_write_text,
    check_output_folder,
    fsync_path,
)

Batch = dict[str, torch.Tensor]
CHECKPOINT_FORMAT = 2  # 2: digests.json (SHA-256 of every file); 1 is still read, unverified
_CHECKPOINT_NAME = re.compile(r"^step-(\d{8})$")

# =============================================================================================
# Settings


def _setting(default: Any, help: str) -> Any:
    # A dataclass field that carries its one-line help (the CLI turns each into a flag).
    return field(default=default, metadata={"help": help})


@dataclass
class TrainConfig:
    """Every setting of the training loop, with its default.

    The run stops at `max_steps` optimizer steps or after `max_minutes` of wall-clock time,
    whichever comes first (set either or both). The learning-rate schedule runs over the same
    budget: with a time budget the schedule follows elapsed time (as in Cramming), so for
    bit-exact resumes set only `max_steps`. `batch_size` is the global batch of one optimizer
    step: loader batch x `grad_accum` x number of processes.

    Taught in notebooks/05_pretraining.ipynb
    """

    max_steps: int | None = _setting(1000, "optimizer steps to run (None: no step limit)")
    max_minutes: float | None = _setting(None, "wall-clock budget in minutes (None: no limit)")
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
        _check_positive(self, "max_steps", "batch_size", "grad_accum", "eval_interval",
                        "eval_batches", "checkpoint_interval", "keep_checkpoints", integer=True)
        _check_positive(self, "max_minutes", "lr", "eps", "grad_clip", integer=False)
        for name in ("seed", "log_interval"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"TrainConfig.{name} must be an integer >= 0, got {value!r}")
        if self.warmup_steps is not None and (
            isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int)
            or self.warmup_steps < 0
        ):
            raise ValueError(f"TrainConfig.warmup_steps must be an integer >= 0 or None, "
                             f"got {self.warmup_steps!r}")
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
        choices = {"schedule": ("linear", "cosine", "constant"),
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


def _check_positive(config: TrainConfig, *names: str, integer: bool) -> None:
    for name in names:
        value = getattr(config, name)
        if value is None and name in ("max_steps", "max_minutes", "checkpoint_interval",
                                      "grad_clip", "eval_interval"):
            continue
        ok = not isinstance(value, bool) and (
            isinstance(value, int) if integer else isinstance(value, (int, float))
        ) and value > 0
        if not ok:
            kind = "a positive integer" if integer else "a positive number"
            raise ValueError(f"TrainConfig.{name} must be {kind}, got {value!r}")


# =============================================================================================
# Reusable pieces: device, precision, optimizer, schedule


def resolve_device(spec: str = "auto") -> torch.device:
    """Return the torch.device for "auto" (CUDA, else MPS, else CPU) or an explicit name.

    Under torchrun, "auto" and "cuda" mean this process's GPU (cuda:LOCAL_RANK).

    Taught in notebooks/05_pretraining.ipynb
    """
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if spec == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank)
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if spec.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={spec!r} was asked for but CUDA is not available here; "
                         f"use device='auto' or 'cpu'")
    if spec == "cuda":
        return torch.device("cuda", local_rank)
    return torch.device(spec)


def resolve_precision(precision: str, device: torch.device) -> str:
    """Return "bf16", "fp16" or "fp32": what `precision="auto"` means on `device`."""
    if precision == "fp16" and device.type == "cpu":
        raise ValueError("precision='fp16' needs a GPU; use 'bf16' or 'fp32' on CPU")
    if precision != "auto":
        return precision
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "fp32"


def autocast_context(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """Return the mixed-precision context for forward passes (a no-op for fp32).

    Under autocast, matmuls run in bf16/fp16 while the weights, their gradients and the
    optimizer state stay fp32 (so no master-weight copy is needed).

    Taught in notebooks/05_pretraining.ipynb
    """
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    return torch.autocast(device_type=device.type, dtype=dtype)


def build_optimizer(model: nn.Module, config: TrainConfig,
                    device: torch.device | None = None) -> torch.optim.AdamW:
    """Return AdamW with weight decay on matrices only (not on biases or LayerNorm weights).

    Every parameter with fewer than 2 dimensions (biases, LayerNorm gains and shifts, the MLM
    output bias) is left undecayed, as in Google's BERT. On CUDA the fused kernel is used.

    Taught in notebooks/05_pretraining.ipynb
    """
    params = [p for p in model.parameters() if p.requires_grad]  # tied weights appear once
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    if device is None:
        device = next(model.parameters()).device
    return torch.optim.AdamW(groups, lr=config.lr, betas=config.betas, eps=config.eps,
                             fused=device.type == "cuda")


def run_progress(step: int, config: TrainConfig, elapsed_s: float = 0.0) -> float:
    """Return how far the run is (0 -> 1) at optimizer step `step` after `elapsed_s` seconds."""
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
    progress = run_progress(step, config, elapsed_s)
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
# Distributed data parallel (torchrun)


def init_distributed() -> tuple[int, int]:
    """Return (rank, world_size); under torchrun, first join the process group (NCCL or gloo).

    Without torchrun this is (0, 1) and nothing happens. `train_loop` then wraps the model in
    DistributedDataParallel whenever a process group is active.

    Taught in notebooks/05_pretraining.ipynb
    """
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world > 1 and not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
            dist.init_process_group("nccl")
        else:
            dist.init_process_group("gloo")
    return _rank_world()


def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _all_reduce(values: dict[str, float], device: torch.device) -> dict[str, float]:
    # Sum numbers over processes (one small collective); no-op on a single process.
    if _rank_world()[1] == 1:
        return values
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist(), strict=True))


def _broadcast(value: float, device: torch.device) -> float:
    # Rank 0's number everywhere, so every rank takes the same time-based decisions.
    if _rank_world()[1] == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.broadcast(t, src=0)
    return t.item()


# =============================================================================================
# Losses and evaluation


def pretraining_counts(batch: Batch) -> dict[str, float]:
    """Return the denominators of the pretraining loss for one batch: MLM targets and sequences."""
    return {"targets": float((batch["labels"] != IGNORE_INDEX).sum()),
            "sequences": float(batch["next_sentence_label"].numel())}


def pretraining_loss(model: nn.Module, batch: Batch, totals: dict[str, float]) -> torch.Tensor:
    """Return this batch's share of the step's loss: MLM and NSP sums over the step's totals.

    Dividing summed cross-entropies by the targets of the whole optimizer step (all micro-batches,
    all processes) makes the loss, and so the gradient, identical whether a global batch is seen
    at once, in `grad_accum` pieces or split over DDP processes; averaging per-piece means would
    weight a target by how many others share its piece.

    Taught in notebooks/05_pretraining.ipynb
    """
    out = model(**batch)
    labels = batch["labels"]
    targets = labels[labels != IGNORE_INDEX]  # row-major: the order of out.mlm_logits' rows
    mlm = F.cross_entropy(out.mlm_logits.float(), targets, reduction="sum")
    nsp = F.cross_entropy(out.nsp_logits.float(), batch["next_sentence_label"], reduction="sum")
    return mlm / max(totals["targets"], 1.0) + nsp / max(totals["sequences"], 1.0)


def mlm_only_loss(model: nn.Module, batch: Batch, totals: dict[str, float]) -> torch.Tensor:
    """Return the masked-LM part of `pretraining_loss` only: the objective without NSP.

    What `pretrain(..., nsp=False)` trains (RoBERTa's choice, and the "MLM only" ablation). No
    gradient then reaches the pooler or the NSP head, and no loss reads the last layer's [CLS]
    vector.

    Taught in notebooks/06_cls_and_downstream.ipynb
    """
    inputs = {k: v for k, v in batch.items() if k != "next_sentence_label"}
    out = model(**inputs)
    labels = batch["labels"]
    targets = labels[labels != IGNORE_INDEX]  # row-major: the order of out.mlm_logits' rows
    mlm = F.cross_entropy(out.mlm_logits.float(), targets, reduction="sum")
    return mlm / max(totals["targets"], 1.0)


def _to_device(batch: Batch, device: torch.device) -> Batch:
    # non_blocking overlaps the copy with compute when the loader pins memory (pin_memory=True).
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v
            for k, v in batch.items()}


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
    s = dict.fromkeys(("mlm_loss", "mlm_correct", "targets", "nsp_loss", "nsp_correct",
                       "sequences"), 0.0)
    for i, batch in enumerate(loader):
        if max_batches is not None and i >= max_batches:
            break
        batch = _to_device(batch, device)
        with autocast_context(device, precision):
            out = model(**batch)
        labels = batch["labels"]
        targets = labels[labels != IGNORE_INDEX]
        mlm_logits = out.mlm_logits.float()
        s["mlm_loss"] += F.cross_entropy(mlm_logits, targets, reduction="sum").item()
        s["mlm_correct"] += (mlm_logits.argmax(-1) == targets).sum().item()
        s["targets"] += targets.numel()
        nsp_label = batch["next_sentence_label"]
        s["nsp_loss"] += F.cross_entropy(out.nsp_logits.float(), nsp_label, reduction="sum").item()
        s["nsp_correct"] += (out.nsp_logits.argmax(-1) == nsp_label).sum().item()
        s["sequences"] += nsp_label.numel()
    model.train(was_training)
    if s["targets"] == 0 or s["sequences"] == 0:
        raise ValueError("evaluate: the loader gave no MLM targets or no sequences; check that "
                         "it is not empty and that it masks tokens")
    mlm_loss = s["mlm_loss"] / s["targets"]
    return {"mlm_loss": mlm_loss, "mlm_accuracy": s["mlm_correct"] / s["targets"],
            "perplexity": math.exp(min(mlm_loss, 50.0)), "nsp_loss": s["nsp_loss"] / s["sequences"],
            "nsp_accuracy": s["nsp_correct"] / s["sequences"]}


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


# =============================================================================================
# Checkpoints: tensors in safetensors, everything else in JSON, written atomically, verified


class CorruptCheckpoint(ValueError):
    """A checkpoint whose files do not match the SHA-256 digests written when it was saved."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _model_config(model: nn.Module) -> dict | None:
    config = getattr(model, "config", None)
    return config.to_dict() if hasattr(config, "to_dict") else None


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    # A Ctrl-C or SIGTERM that arrives while checkpoint folders are being renamed waits until the
    # renames are done, so the folder being replaced is never left missing.
    if hasattr(signal, "pthread_sigmask") and threading.current_thread() is threading.main_thread():
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    else:
        yield


def _is_disk_full(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc)  # safetensors reports I/O errors as text ("StorageFull", "os error 28")
    return isinstance(exc, SafetensorError) and ("StorageFull" in text or "code: 28" in text
                                                 or "No space left" in text)


def save_checkpoint(path: str | Path, model: nn.Module,
                    optimizer: torch.optim.Optimizer | None = None, *,
                    state: dict | None = None,
                    rng: dict[str, torch.Tensor] | None = None,
                    scaler: torch.amp.GradScaler | None = None) -> Path:
    """Return `path` after writing a complete checkpoint folder there, atomically.

    Files: model.safetensors (tied weights stored once), optimizer.safetensors + its settings in
    state.json, rng.safetensors (random-generator states), state.json (step, data position,
    configs, history: anything JSON-serialisable in `state`) and digests.json (the SHA-256 of
    each file, checked on every load). Everything is written into a hidden temporary folder,
    flushed to disk, then renamed into place, so a crash, a kill or a full disk mid-write leaves
    the previous checkpoints untouched and never a half-written one. A full disk raises an
    OSError (ENOSPC) that names the newest complete checkpoint.

    Taught in notebooks/05_pretraining.ipynb
    """
    path = Path(path)
    tmp = path.parent / f".{path.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        _write_checkpoint_files(tmp, model, optimizer, state, rng, scaler)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if _is_disk_full(exc):
            kept = _complete_checkpoints(path.parent)
            previous = (f"the newest complete checkpoint is still {kept[-1]}" if kept
                        else "no earlier checkpoint exists")
            raise OSError(errno.ENOSPC, f"no space left on the device while writing checkpoint "
                          f"{path}; nothing of it was kept and {previous}. Free some space, "
                          f"then continue the run with --resume (resume=True)") from exc
        raise
    with _signals_deferred():
        if path.exists():  # overwriting: move the old one aside first, so one copy always exists
            old = path.parent / f".{path.name}.old"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old)
        else:
            os.replace(tmp, path)
        fsync_path(path.parent)
    for stale in path.parent.glob(".*.tmp"):  # left by a process killed mid-write
        shutil.rmtree(stale, ignore_errors=True)
    return path


def _write_checkpoint_files(tmp: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None,
                            state: dict | None, rng: dict[str, torch.Tensor] | None,
                            scaler: torch.amp.GradScaler | None) -> None:
    save_model(model, str(tmp / "model.safetensors"))
    meta = {"format": CHECKPOINT_FORMAT, "model_class": type(model).__name__,
            "model_config": _model_config(model), **(state or {})}
    if optimizer is not None:
        sd = optimizer.state_dict()
        tensors, scalars = {}, {}
        for index, param_state in sd["state"].items():
            for key, value in param_state.items():
                if torch.is_tensor(value):
                    tensors[f"{index}.{key}"] = value.detach().cpu().contiguous()
                else:
                    scalars[f"{index}.{key}"] = value
        save_file(tensors, str(tmp / "optimizer.safetensors"))
        meta["optimizer"] = {"param_groups": sd["param_groups"], "scalars": scalars}
    if scaler is not None and scaler.is_enabled():
        meta["grad_scaler"] = scaler.state_dict()
    if rng:
        save_file({k: v.contiguous() for k, v in rng.items()}, str(tmp / "rng.safetensors"))
    (tmp / "state.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
    digests = {file.name: _sha256(file) for file in sorted(tmp.iterdir())}
    (tmp / "digests.json").write_text(json.dumps(digests, indent=1), encoding="utf-8")
    for file in tmp.iterdir():
        fsync_path(file)
    fsync_path(tmp)


def _describe_mismatch(saved: dict, current: dict) -> str:
    keys = sorted(set(saved) | set(current))
    return "; ".join(f"{k}: checkpoint {saved.get(k)!r} vs model {current.get(k)!r}"
                     for k in keys if saved.get(k) != current.get(k))


def _corrupt(path: Path, problem: str) -> CorruptCheckpoint:
    return CorruptCheckpoint(
        f"checkpoint {path} is corrupt: {problem}. Its files were damaged or changed on disk "
        f"after it was saved; use an older checkpoint (load_run and --resume fall back to the "
        f"newest one that verifies)")


def verify_checkpoint(path: str | Path) -> None:
    """Check every file of a checkpoint against the SHA-256 digests written when it was saved.

    Raises `CorruptCheckpoint` (a ValueError) naming the first file that is missing or differs.
    Checkpoints of format 1 (before digests) pass unverified.
    """
    path = Path(path)
    digests_file = path / "digests.json"
    if not digests_file.is_file():
        if read_checkpoint_state(path, verified=True).get("format") == 1:
            return
        raise _corrupt(path, "digests.json is missing")
    try:
        digests = json.loads(digests_file.read_text(encoding="utf-8"))
        items = sorted(digests.items())
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
        raise _corrupt(path, f"digests.json is not readable ({e})") from None
    for name, expected in items:
        file = path / name
        if not file.is_file():
            raise _corrupt(path, f"{name} is missing")
        if _sha256(file) != expected:
            raise _corrupt(path, f"{name} does not match the SHA-256 written when it was saved")


def read_checkpoint_state(path: str | Path, *, verified: bool = False) -> dict:
    """Return the JSON part of a checkpoint (step, configs, history...), checking it is readable.

    Unless `verified`, the checkpoint's digests are checked first (`verify_checkpoint`).
    """
    path = Path(path)
    state_file = path / "state.json"
    if not state_file.is_file():
        raise ValueError(f"{path} is not a bertlab checkpoint (no state.json); pass a folder "
                         f"written by save_checkpoint, e.g. RUN/checkpoints/step-00001000")
    if not verified:
        verify_checkpoint(path)
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise _corrupt(path, f"state.json is not valid JSON ({e})") from None
    if state.get("format") not in (1, CHECKPOINT_FORMAT):
        raise ValueError(f"checkpoint {path} has format {state.get('format')!r}; this bertlab "
                         f"reads formats 1 and {CHECKPOINT_FORMAT}")
    return state


def load_checkpoint(path: str | Path, model: nn.Module,
                    optimizer: torch.optim.Optimizer | None = None, *,
                    scaler: torch.amp.GradScaler | None = None, verify: bool = True) -> dict:
    """Return the checkpoint's state dict after loading its weights into `model` (and optimizer).

    Every file is first checked against the digests written at save time (`CorruptCheckpoint`
    if one differs; `verify=False` skips that for a checkpoint just verified); weights that are not finite (a run saved after it diverged) are refused.
    The model must have the configuration the checkpoint was trained with; otherwise this raises
    a ValueError naming both values (e.g. vocab_size 8192 vs 4096). Only safetensors and JSON
    are read: nothing is unpickled. Random-generator states come back under "rng" (tensors); the
    caller decides whether to restore them (`train_loop` does, for exact resumes).

    Taught in notebooks/05_pretraining.ipynb
    """
    path = Path(path)
    state = read_checkpoint_state(path, verified=not verify)
    current = _model_config(model)
    if state.get("model_class") != type(model).__name__:
        raise ValueError(f"checkpoint {path} holds a {state.get('model_class')}, but the model "
                         f"is a {type(model).__name__}")
    if state.get("model_config") != current:
        raise ValueError(f"checkpoint {path} was trained with a different model config: "
                         f"{_describe_mismatch(state.get('model_config') or {}, current or {})}. "
                         f"Build the model from the checkpoint's config (bertlab.load_run) or "
                         f"start a new run")
    try:
        missing, unexpected = load_model(model, str(path / "model.safetensors"), strict=False,
                                         device=str(next(model.parameters()).device))
        if missing or unexpected:
            raise ValueError(f"checkpoint {path} does not fit the model: missing {missing}, "
                             f"unexpected {unexpected}")
        if optimizer is not None and "optimizer" not in state:
            raise ValueError(f"checkpoint {path} has no optimizer state; load it without "
                             f"an optimizer, or resume from a training checkpoint")
        flat = load_file(str(path / "optimizer.safetensors")) if optimizer is not None else {}
        rng_file = path / "rng.safetensors"
        rng = load_file(str(rng_file)) if rng_file.exists() else {}
    except (SafetensorError, OSError, RuntimeError) as e:
        raise _corrupt(path, f"its files cannot be read ({e})") from e
    bad = [name for name, p in model.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        raise ValueError(f"checkpoint {path} holds non-finite weights (NaN or inf in {bad[0]}"
                         f"{f' and {len(bad) - 1} more' if len(bad) > 1 else ''}): the run had "
                         f"diverged before it was saved; use an older checkpoint")
    if optimizer is not None:
        per_param: dict[int, dict] = {}
        for key, value in flat.items():
            index, name = key.split(".", 1)
            per_param.setdefault(int(index), {})[name] = value
        for key, value in state["optimizer"]["scalars"].items():
            index, name = key.split(".", 1)
            per_param.setdefault(int(index), {})[name] = value
        groups = state["optimizer"]["param_groups"]
        for saved, live in zip(groups, optimizer.param_groups, strict=False):
            # Keep this machine's kernel choice (a CPU checkpoint may be resumed with fused CUDA).
            for key in ("fused", "foreach", "capturable", "differentiable"):
                if key in live:
                    saved[key] = live[key]
            saved["betas"] = tuple(saved["betas"])
        if len(groups) != len(optimizer.param_groups):
            raise ValueError(f"checkpoint {path} has {len(groups)} optimizer parameter groups, "
                             f"the optimizer has {len(optimizer.param_groups)}")
        optimizer.load_state_dict({"state": per_param, "param_groups": groups})
    if scaler is not None and "grad_scaler" in state:
        scaler.load_state_dict(state["grad_scaler"])
    state["rng"] = rng
    return state


def _complete_checkpoints(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if _CHECKPOINT_NAME.match(p.name) and p.is_dir()]
    return sorted(found, key=lambda p: p.name)


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Return the complete checkpoints of a run, oldest first (half-written ones never count)."""
    return _complete_checkpoints(Path(run_dir) / "checkpoints")


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """Return the newest complete checkpoint folder of a run, or None when there is none."""
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def latest_verified_checkpoint(run_dir: str | Path) -> Path | None:
    """Return the newest checkpoint of a run whose files match their digests (None: no checkpoint).

    A newer checkpoint that fails verification is skipped with a warning that names it and the
    one used instead. If every checkpoint fails, the CorruptCheckpoint error of the newest is
    raised.
    """
    found = list_checkpoints(run_dir)
    first_error: CorruptCheckpoint | None = None
    for path in reversed(found):
        try:
            verify_checkpoint(path)
        except CorruptCheckpoint as e:
            first_error = first_error or e
            continue
        if first_error is not None:
            warnings.warn(f"{first_error} Using {path.name} instead, the newest checkpoint that "
                          f"verifies.", stacklevel=2)
        return path
    if first_error is not None:
        raise first_error
    return None


def load_run(run_dir: str | Path, checkpoint: str | Path | None = None,
             device: str | torch.device = "cpu") -> tuple[BertForPreTraining, Any]:
    """Return (model, tokenizer) of a pretraining run folder, from its newest sound checkpoint.

    The model is rebuilt from the config stored in the checkpoint; the tokenizer is the
    `tokenizer.json` the CLI saves in the run folder (None if absent). Without `checkpoint`, a
    newest checkpoint that fails its digests is skipped, with a warning, for the newest one that
    verifies.

    Taught in notebooks/05_pretraining.ipynb
    """
    from bertlab.tokenizer import load_tokenizer

    run_dir = Path(run_dir)
    path = Path(checkpoint) if checkpoint is not None else latest_verified_checkpoint(run_dir)
    if path is None:
        raise ValueError(f"run folder {run_dir} has no checkpoint (looked in "
                         f"{run_dir / 'checkpoints'}); train first, e.g. python -m bertlab pretrain")
    if checkpoint is not None:  # latest_verified_checkpoint has hashed the newest already
        verify_checkpoint(path)
    state = read_checkpoint_state(path, verified=True)
    if state.get("model_class") != "BertForPreTraining" or not state.get("model_config"):
        raise ValueError(f"checkpoint {path} holds a {state.get('model_class')}, not a "
                         f"BertForPreTraining")
    model = BertForPreTraining(BertConfig.from_dict(state["model_config"])).to(device)
    load_checkpoint(path, model, verify=False)
    model.eval()
    tok_file = run_dir / "tokenizer.json"
    return model, (load_tokenizer(tok_file) if tok_file.is_file() else None)


def _rng_snapshot(device: torch.device) -> dict[str, torch.Tensor]:
    rng = {"torch_cpu": torch.get_rng_state()}
    if device.type == "cuda":
        rng["torch_cuda"] = torch.cuda.get_rng_state(device)
    return rng


def _restore_rng(rng: dict[str, torch.Tensor], device: torch.device, rank: int) -> bool:
    cpu = rng.get(f"rank{rank}.torch_cpu")
    if cpu is None:
        return False
    torch.set_rng_state(cpu)
    if device.type == "cuda" and f"rank{rank}.torch_cuda" in rng:
        torch.cuda.set_rng_state(rng[f"rank{rank}.torch_cuda"], device)
    return True


def _gather_rng(rng: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # Every process has its own dropout stream; rank 0 stores them all.
    rank, world = _rank_world()
    if world == 1:
        return {f"rank0.{k}": v for k, v in rng.items()}
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, {k: v.cpu() for k, v in rng.items()})
    return {f"rank{r}.{k}": v for r, states in enumerate(gathered) for k, v in states.items()}


# =============================================================================================
# The loop


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


def check_run_folder(out_dir: str | Path | None, resume: bool, flag: str = "out_dir") -> Path | None:
    """Return the run folder as a Path after checking that a run may start (or resume) there.

    A new run needs a missing or empty folder, or a run folder without checkpoints (a start
    that failed before its first save). Resuming needs a run with a checkpoint. Anything else
    (checkpoints of another run, prepared shards, a Hugging Face export, your own files, a
    file) raises a ValueError that names `flag` and the folder and says what is there; nothing
    is written.
    """
    if out_dir is None:
        if resume:
            raise ValueError("resume=True needs out_dir (the run folder to resume from)")
        return None
    out = Path(out_dir)
    check_output_folder(out, flag, accept=("run",))
    newest = latest_checkpoint(out)
    if resume and newest is None:
        raise ValueError(f"resume=True (--resume): {flag} {out} has no checkpoint to continue "
                         f"from (looked in {out / 'checkpoints'}); start a new run there without "
                         f"resume (nothing was written)")
    if not resume and newest is not None:
        raise ValueError(f"{flag} {out} already holds a pretraining run (newest checkpoint "
                         f"{newest.name}); continue it with resume=True (--resume), or choose "
                         f"another folder (nothing was written)")
    return out


def _check_resume(saved: dict, checkpoint: Path, config: TrainConfig, data_seed: int | None,
                  examples: int | None) -> None:
    # What decides which examples each step sees: a resume that changes any of them would
    # silently train on another sequence of batches than the run it continues.
    train = saved.get("train_config") or {}
    checks = [("batch_size", train.get("batch_size"), config.batch_size, "--batch-size"),
              ("grad_accum", train.get("grad_accum"), config.grad_accum, "--grad-accum"),
              ("data seed", saved.get("data_seed"), data_seed, "--data-seed"),
              ("number of training examples", saved.get("train_examples"), examples,
               "the same corpus and --max-seq-len")]
    for name, before, now, fix in checks:
        if before is not None and now is not None and before != now:
            raise ValueError(f"checkpoint {checkpoint} was trained with {name} {before}, this "
                             f"resume has {now}; an exact resume needs the same value (use "
                             f"{fix} as in the original run), or start a new run")


def _check_loader_batch(loader: Iterable, config: TrainConfig, world: int) -> None:
    per_batch = getattr(loader, "batch_size", None)
    if per_batch is not None and per_batch * config.grad_accum * world != config.batch_size:
        raise ValueError(
            f"the loader gives batches of {per_batch}, but TrainConfig.batch_size="
            f"{config.batch_size} with grad_accum={config.grad_accum} on {world} process(es) "
            f"needs {config.batch_size / (config.grad_accum * world):g} per batch; build the "
            f"loader with batch_size=batch_size // (grad_accum x processes)")


class Interrupted(KeyboardInterrupt):
    """Training was stopped by a signal other than Ctrl-C; `signum` says which (e.g. SIGTERM).

    A KeyboardInterrupt, so everything that handles Ctrl-C (save a checkpoint, then stop)
    handles it the same way. The CLI exits with 128 + signum (143 for SIGTERM).
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    # SIGTERM is what cluster schedulers, `docker stop` and `kill` send before killing: treat it
    # like Ctrl-C (save, then stop) instead of dying with the steps since the last checkpoint.
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise Interrupted(signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _run_folder_held(out: Path | None, resume: bool, is_main: bool) -> Iterator[None]:
    # One process per run folder: two runs writing the same checkpoints would destroy each
    # other. Checked again once the lock is held, in case another run wrote in between.
    if out is None or not is_main:
        yield
        return
    with FolderLock(out, "run folder"):
        check_run_folder(out, resume)
        (out / "checkpoints").mkdir(exist_ok=True)
        yield


def _resume_checkpoint(out: Path, is_main: bool, world: int) -> Path:
    # The newest checkpoint that verifies. Newer ones that fail are moved aside (renamed, never
    # deleted), so later saves and keep_checkpoints never mistake them for the run's newest.
    if is_main:
        good = latest_verified_checkpoint(out)
        for bad in list_checkpoints(out):
            if bad.name > good.name:
                aside = bad.with_name(f"corrupt-{bad.name}")
                os.replace(bad, aside)
                warnings.warn(f"moved the corrupt checkpoint {bad.name} aside to {aside}",
                              stacklevel=3)
    if world > 1:
        dist.barrier()
    return latest_checkpoint(out)


class _DataPosition:
    """Yields batches forever, epoch after epoch, and knows where it is (epoch, batches used).

    The order of an epoch must be a function of (loader seed, epoch): the loader's dataset and
    sampler get `set_epoch(epoch)`. Resuming skips the batches already used in that epoch.
    """

    def __init__(self, loader: Iterable[Batch], epoch: int = 0, offset: int = 0):
        self.loader, self.epoch, self.offset = loader, epoch, offset
        self._iter: Iterator[Batch] | None = None

    def _start_epoch(self) -> None:
        for obj in (getattr(self.loader, "dataset", None), getattr(self.loader, "sampler", None),
                    getattr(self.loader, "batch_sampler", None)):
            if hasattr(obj, "set_epoch"):
                obj.set_epoch(self.epoch)
        self._iter = iter(self.loader)
        for _ in range(self.offset):
            next(self._iter)

    def next(self) -> Batch:
        # A DataLoader draws worker seeds (and a shuffling sampler its order) from torch's global
        # generator; fork it, so fetching data never moves the dropout stream.
        with torch.random.fork_rng(devices=[]):
            return self._next()

    def _next(self) -> Batch:
        if self._iter is None:
            self._start_epoch()
        try:
            batch = next(self._iter)
        except StopIteration:
            if self.offset == 0:
                raise ValueError("the training loader is empty; it needs at least one batch") \
                    from None
            self.epoch, self.offset = self.epoch + 1, 0
            self._start_epoch()
            batch = next(self._iter)
        self.offset += 1
        return batch


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
    checkpoints go to out_dir/checkpoints and the history to history.csv/json. Under an active
    process group (torchrun) the model is wrapped in DistributedDataParallel; rank 0 logs and
    writes. Ctrl-C saves a checkpoint, then re-raises; a NaN/inf loss raises FloatingPointError
    naming the step, leaving the last good checkpoint as it was.

    Taught in notebooks/05_pretraining.ipynb
    """
    from tqdm.auto import tqdm

    rank, world = _rank_world()
    is_main = rank == 0
    device = resolve_device(config.device)
    precision = resolve_precision(config.precision, device)
    _check_loader_batch(train_loader, config, world)
    # Rank 0 alone writes into the run folder (and may be writing right now): it alone checks.
    out = check_run_folder(out_dir, resume) if is_main else (
        None if out_dir is None else Path(out_dir))
    model.to(device)
    if device.type == "cuda":  # TF32 matmuls for whatever autocast leaves in fp32
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    optimizer = build_optimizer(model, config, device)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    s: dict[str, Any] = {"step": 0, "epoch": 0, "offset": 0, "tokens": 0, "elapsed_s": 0.0,
                         "history": []}
    dataset = getattr(train_loader, "dataset", None)
    data_seed = getattr(dataset, "seed", None)
    examples = len(dataset) if hasattr(dataset, "__len__") else None

    # Dropout draws from torch's global generator: fork it, so this run's stream is a function of
    # (seed, rank) and the caller's generator is left as it was.
    cuda_devices = [device] if device.type == "cuda" else []
    with _run_folder_held(out, resume, is_main), _sigterm_as_interrupt(), \
            torch.random.fork_rng(devices=cuda_devices):
        torch.manual_seed(config.seed + rank)
        if resume:
            ckpt = _resume_checkpoint(out, is_main, world)
            saved = load_checkpoint(ckpt, model, optimizer, scaler=scaler, verify=False)
            _check_resume(saved, ckpt, config, data_seed, examples)
            s.update({k: saved[k] for k in s})
            if saved.get("world_size") == world:
                _restore_rng(saved["rng"], device, rank)
            if "python_random" in saved:
                version, internal, gauss = saved["python_random"]
                random.setstate((version, tuple(internal), gauss))

        train_model: nn.Module = model
        use_compile = device.type == "cuda" if config.compile is None else config.compile
        if use_compile:
            # The sparse MLM head gathers the masked positions (nonzero): a shape that depends on
            # the data. Let dynamo trace it, so the whole forward stays one graph.
            torch._dynamo.config.capture_dynamic_output_shape_ops = True
            train_model = torch.compile(train_model)
        ddp = None
        if world > 1:
            ddp_ids = [device.index] if device.type == "cuda" else None
            ddp = train_model = nn.parallel.DistributedDataParallel(train_model, device_ids=ddp_ids)
        amp = autocast_context(device, precision)
        data = _DataPosition(train_loader, s["epoch"], s["offset"])
        first_step, step_losses = s["step"], []
        since_eval = {"loss": 0.0, "steps": 0, "tokens": 0, "seconds": 0.0}

        def run_eval() -> None:
            row = {"step": s["step"], "tokens": s["tokens"], "elapsed_s": round(s["elapsed_s"], 3),
                   "lr": lr_at(s["step"], config, s["elapsed_s"]),
                   "train_loss": since_eval["loss"] / since_eval["steps"]
                   if since_eval["steps"] else None,
                   "tokens_per_s": since_eval["tokens"] / since_eval["seconds"]
                   if since_eval["seconds"] else None}
            if eval_fn is not None and val_loader is not None:
                with torch.random.fork_rng(devices=cuda_devices):
                    metrics = eval_fn(model, val_loader, config.eval_batches, device=device,
                                      precision=precision)
                row.update({f"val_{k}": v for k, v in metrics.items()})
            s["history"].append(row)
            since_eval.update(loss=0.0, steps=0, tokens=0, seconds=0.0)
            if config.progress:
                tqdm.write(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                    for k, v in row.items()))
            if out is not None:
                _write_history(out, s["history"])

        saved_step = s["step"] if resume else None

        def save(position: tuple[int, int], rng: dict[str, torch.Tensor]) -> Path | None:
            nonlocal saved_step
            rngs = _gather_rng(rng)  # a collective: every rank takes part
            saved_step = s["step"]
            if out is None or not is_main:
                return None
            state = {**s, "epoch": position[0], "offset": position[1], "data_seed": data_seed,
                     "train_examples": examples, "world_size": world,
                     "train_config": config.to_dict(), "python_random": list(random.getstate())}
            path = save_checkpoint(out / "checkpoints" / f"step-{s['step']:08d}", model,
                                   optimizer, state=state, rng=rngs, scaler=scaler)
            for old in list_checkpoints(out)[:-config.keep_checkpoints]:
                shutil.rmtree(old)
            return path

        by_steps = config.max_steps is not None
        bar = tqdm(total=config.max_steps if by_steps else round(config.max_minutes * 60),
                   initial=s["step"] if by_steps else round(s["elapsed_s"]),
                   unit="step" if by_steps else "s", disable=not (config.progress and is_main),
                   dynamic_ncols=True, bar_format=None if by_steps else
                   "{l_bar}{bar}| {n_fmt}/{total_fmt} s [{elapsed}<{remaining}{postfix}]")
        checkpoint, stopped_by = None, "max_steps"
        clock = time.perf_counter() - s["elapsed_s"]
        # What a Ctrl-C checkpoint stores: the data position and RNG of the last finished step.
        position, rng = (data.epoch, data.offset), _rng_snapshot(device)
        if eval_fn is not None and val_loader is not None and is_main and s["step"] == 0:
            run_eval()
        try:
            while True:
                s["elapsed_s"] = _broadcast(time.perf_counter() - clock, device)
                if config.max_steps is not None and s["step"] >= config.max_steps:
                    break
                if config.max_minutes is not None and s["elapsed_s"] >= 60 * config.max_minutes:
                    stopped_by = "max_minutes"
                    break
                step_start = time.perf_counter()
                batches = [data.next() for _ in range(config.grad_accum)]
                counts: dict[str, float] = {"_tokens": 0.0}
                for b in batches:
                    counts["_tokens"] += b["input_ids"].numel()
                    for k, v in count_fn(b).items():
                        counts[k] = counts.get(k, 0.0) + v
                totals = _all_reduce(counts, device)
                lr = lr_at(s["step"], config, s["elapsed_s"])
                for group in optimizer.param_groups:
                    group["lr"] = lr
                step_loss = torch.zeros((), device=device)
                for i, batch in enumerate(batches):
                    sync = ddp is None or i == len(batches) - 1  # all-reduce grads once per step
                    with contextlib.nullcontext() if sync else ddp.no_sync():
                        with amp:
                            # DDP averages gradients over processes; our loss is already a share
                            # of the global sum, so scale it back up by the number of processes.
                            loss = loss_fn(train_model, _to_device(batch, device), totals) * world
                        scaler.scale(loss).backward()
                    step_loss += loss.detach() / world
                loss_value = _all_reduce({"loss": step_loss.item()}, device)["loss"]
                if not math.isfinite(loss_value):
                    last = latest_checkpoint(out) if out is not None else None
                    raise FloatingPointError(
                        f"training loss is {loss_value} at step {s['step']}; stopped before the "
                        f"update. Newest checkpoint: {last}. The run diverged: lower lr (now "
                        f"{lr:.3g}) or check the data for bad batches")
                if config.grad_clip is not None:
                    scaler.unscale_(optimizer)
                    nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)

                s["step"] += 1
                position, rng = (data.epoch, data.offset), _rng_snapshot(device)
                s["tokens"] += int(totals["_tokens"])
                step_losses.append(loss_value)
                since_eval["loss"] += loss_value
                since_eval["steps"] += 1
                since_eval["tokens"] += int(totals["_tokens"])
                since_eval["seconds"] += time.perf_counter() - step_start
                if config.log_interval and s["step"] % config.log_interval == 0:
                    rate = since_eval["tokens"] / max(since_eval["seconds"], 1e-9)
                    if config.progress:
                        bar.set_postfix(loss=f"{loss_value:.3f}", lr=f"{lr:.2e}",
                                        tok_s=f"{rate:.0f}", refresh=False)
                    elif is_main:
                        print(f"step {s['step']} loss {loss_value:.4f} lr {lr:.3g} "
                              f"tokens/s {rate:.0f}", flush=True)
                bar.update(1 if by_steps else round(time.perf_counter() - clock) - bar.n)
                at_end = config.max_steps is not None and s["step"] >= config.max_steps
                due = config.eval_interval and s["step"] % config.eval_interval == 0
                if is_main and (due or at_end):
                    run_eval()
                if config.checkpoint_interval and s["step"] % config.checkpoint_interval == 0:
                    checkpoint = save(position, rng)
        except KeyboardInterrupt as stop:
            if out is not None:
                how = signal.Signals(getattr(stop, "signum", signal.SIGINT)).name
                try:
                    path = save(position, rng)
                except KeyboardInterrupt:
                    newest = latest_checkpoint(out)
                    if is_main:
                        tqdm.write(f"{how}, then a second interrupt during the save: the "
                                   f"checkpoint of step {s['step']} was abandoned (no partial "
                                   f"files are left); the newest complete checkpoint on disk is "
                                   f"{newest or 'none'}")
                    raise stop from None
                if is_main:
                    tqdm.write(f"{how} at step {s['step']}: checkpoint saved to {path}; "
                               f"continue with resume=True (--resume)")
            raise
        finally:
            bar.close()
        s["elapsed_s"] = time.perf_counter() - clock
        if is_main and eval_fn is not None and val_loader is not None and (
                not s["history"] or s["history"][-1]["step"] != s["step"]):
            run_eval()
        if out is not None and saved_step != s["step"]:
            checkpoint = save(position, rng)
        elif out is not None and is_main:
            checkpoint = latest_checkpoint(out)
    return TrainResult(history=s["history"], step_losses=step_losses, first_step=first_step,
                       steps=s["step"], tokens=s["tokens"], elapsed_s=s["elapsed_s"],
                       stopped_by=stopped_by, out_dir=out, checkpoint=checkpoint, config=config)


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
    return train_loop(model, train_loader, config,
                      loss_fn=pretraining_loss if nsp else mlm_only_loss,
                      count_fn=pretraining_counts, eval_fn=evaluate, val_loader=val_loader,
                      out_dir=out_dir, resume=resume)


# =============================================================================================
# Using the model


@torch.no_grad()
def fill_mask(model: BertForPreTraining, tokenizer: Any, text: str,
              top_k: int = 5) -> list[list[tuple[str, float]]]:
    """Return, for each [MASK] in `text`, the `top_k` (token, probability) guesses, best first.

    Taught in notebooks/05_pretraining.ipynb
    """
    from bertlab.tokenizer import special_ids

    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    mask_id = special_ids(tokenizer).mask
    encoding = tokenizer.encode(text)
    ids = torch.tensor([encoding.ids])  # (1, T)
    where = (ids[0] == mask_id).nonzero().squeeze(1)
    if where.numel() == 0:
        raise ValueError(f"text {text!r} has no [MASK] token; write [MASK] where a word should "
                         f"be guessed")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out = model(ids.to(device), torch.ones_like(ids).to(device),
                torch.tensor([encoding.type_ids]).to(device))
    model.train(was_training)
    probs = out.mlm_logits[0, where.to(device)].float().softmax(-1)  # (T, V) -> (masks, V)
    if not torch.isfinite(probs).all():  # finite weights can still overflow inside the model
        raise ValueError("the model gives NaN or inf probabilities: its weights are non-finite "
                         "or overflow (a corrupt checkpoint, or a run that diverged); use an "
                         "earlier checkpoint or train again")
    top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
    return [[(tokenizer.id_to_token(int(i)), float(p)) for p, i in zip(ps, ids_, strict=True)]
            for ps, ids_ in zip(top.values.cpu(), top.indices.cpu(), strict=True)]
