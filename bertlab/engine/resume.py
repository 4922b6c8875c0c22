"""Stopping a run safely and resuming it exactly: the run folder, random states, data position.

A resumed run must continue as if it had never stopped: same batches, same masks, same dropout.
That takes three things besides the weights and the optimizer (`bertlab.engine.checkpoint`):

- the random-generator states of every process (`rng_state`, `gather_rng`, `restore_rng`),
  saved with the run state by `CheckpointSaver`;
- where the data stands: the epoch and how many of its batches were used (`DataPosition`);
- the settings that decide which examples each step sees, checked on resume (`check_resume`).

And a run must stop cleanly: Ctrl-C, and SIGTERM (what schedulers, `docker stop` and `kill`
send), raise a KeyboardInterrupt the loop answers by saving a checkpoint (`interrupt_on_sigterm`).
One process at a time may write into a run folder (`hold_run_folder`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import signal
import threading
import warnings
from collections.abc import Iterable, Iterator, Sized
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from bertlab.artefacts import LOCK_NAME
from bertlab.config import rank_world
from bertlab.data import Batch, EpochLoader, RunData, run_data_of
from bertlab.engine.checkpoint import (
    checkpoint_folders,
    latest_checkpoint,
    latest_verified_checkpoint,
    remove_checkpoint,
    save_checkpoint,
)
from bertlab.engine.folders import in_use_error, lock_holder, writing_into
from bertlab.engine.outputs import check_output
from bertlab.errors import BadInput

# ---------------------------------------------------------------------------------------------
# The run folder


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
    # not empty, not inside an artefact, writable, and new, empty or a run already
    kind = check_output(out_dir, flag, folder=True, accept=("run",))
    newest = latest_checkpoint(out)
    if resume and newest is None:
        holder = lock_holder(out)
        if holder is not None:  # a live run before its first checkpoint: never "delete it"
            raise in_use_error("run folder", out, holder)
        # The advice must work when followed: a new run refuses the files of a start that never
        # saved (the CLI keeps them until you delete them), so then the folder goes first.
        files = sorted(p.name for p in out.iterdir() if p.name != LOCK_NAME) \
            if kind == "run" else []
        fix = (f"it holds only the files of a start that never saved ({', '.join(files)}), "
               f"nothing to resume: delete the folder, then start a new run there without "
               f"resume, or start one in another folder" if files else
               "start a new run there without resume")
        raise BadInput(f"resume=True (--resume): {flag} {out}",
                       f"has no checkpoint to continue from (looked in {out / 'checkpoints'})",
                       f"{fix} (nothing was written)")
    if not resume and newest is not None:
        raise ValueError(f"{flag} {out} already holds a pretraining run (newest checkpoint "
                         f"{newest.name}); continue it with resume=True (--resume), or choose "
                         f"another folder (nothing was written)")
    return out


@contextlib.contextmanager
def hold_run_folder(out: Path | None, resume: bool, rank: int = 0, world: int = 1,
                    flag: str = "out_dir") -> Iterator[None]:
    """Hold the run folder's lock (rank 0) for the block, after checking the folder again.

    One process per run folder: two runs writing the same checkpoints would destroy each
    other. The check is repeated once the lock is held, in case another run wrote in between;
    a refusal leaves no folder behind (`writing_into`). Under torchrun every rank gets rank 0's
    refusal, so none waits forever for a partner that has left.
    """
    if out is None:
        yield
        return
    lock = contextlib.ExitStack()
    refusal = None
    if rank == 0:
        try:
            lock.enter_context(writing_into(out, "run folder"))
            check_run_folder(out, resume, flag=flag)
        except ValueError as e:
            lock.close()
            refusal = str(e)
    if world > 1:
        shared = [refusal]
        dist.broadcast_object_list(shared, src=0)
        refusal = shared[0]
    if refusal is not None:
        raise ValueError(refusal)
    with lock:
        yield


def resume_checkpoint(out: Path, is_main: bool, world: int) -> Path:
    """Return the checkpoint to resume from: the newest one of the run that verifies.

    Newer ones that fail are moved aside (renamed corrupt-step-..., never deleted), so later
    saves and keep_checkpoints never mistake them for the run's newest.
    """
    if is_main:
        good = latest_verified_checkpoint(out)
        for bad in checkpoint_folders(out):
            if bad.name > good.name:
                aside = bad.with_name(f"corrupt-{bad.name}")
                os.replace(bad, aside)
                warnings.warn(f"moved the corrupt checkpoint {bad.name} aside to {aside}",
                              stacklevel=3)
    if world > 1:
        dist.barrier()
    return latest_checkpoint(out)


# The TrainConfig settings that decide how a run learns: a resume that changed one would
# continue another run. (The budget may move: a finished run can be given more steps.)
LEARNING = ("batch_size", "grad_accum", "lr", "warmup_steps", "warmup_fraction", "schedule",
            "min_lr_ratio", "weight_decay", "betas", "eps", "optimizer", "muon_lr", "grad_clip")
# What a checkpoint records besides the learning settings (`run_data`, `run_contract`): the words
# for each, and the fix as a function of the run's own value. Compared in this order, so a
# refusal names the setting that moved, not a digest it moved (the pair draws and the tokenizer
# move the training examples' digest too).
_CHECKED: dict[str, tuple[str, Any]] = {
    "objective": ("objective", lambda v: f"the same objectives (--objectives {v})"),
    "precision": ("precision", lambda v: f"the same precision (pass --precision {v}, or "
                                         f"precision={v!r} in TrainConfig)"),
    "compile": ("compile", lambda v: f"the same compilation (pass --{'' if v else 'no-'}compile, "
                                     f"or compile={v} in TrainConfig)"),
    "unpad": ("unpad", lambda v: f"the same unpadding (pass --{'' if v else 'no-'}unpad, or "
                                 f"unpad={v} in TrainConfig)"),
    "segments": ("segments", lambda v: f"the same segments (pass --segments "
                                       f"{'single' if v == 'single' else 'pairs'}, or "
                                       f"LoaderOptions(pairs={v!r}))"),
    "pair_draws": ("pair draws", lambda v: f"the same draws of pairs (pass --pair-draws {v}, "
                                           f"or LoaderOptions(pair_draws={v}))"),
    "tokenizer": ("tokenizer (vocabulary digest)", lambda v: "the run's own tokenizer (its "
                  "tokenizer.json, as the run saved it)"),
    "data_seed": ("data seed", lambda v: f"the same data seed (--data-seed {v})"),
    "train_examples": ("number of training examples",
                       lambda v: "the same corpus, read with the same flags (--text-field, "
                                 "--doc-field, --on-bad-row...), and the same --max-seq-len"),
    "train_digest": ("training examples' digest",
                     lambda v: "the same corpus, read with the same flags (--text-field, "
                               "--doc-field, --on-bad-row...), tokenizer and --max-seq-len"),
    "masking": ("masking", None),
    "group_by_length": ("group_by_length",
                        lambda v: f"the same --group-by-length ({v}; 0: off)"),
    "validation": ("validation examples' digest", lambda v: "the same validation documents "
                   "and --validate-also lengths (the history's val_ columns are measured on them)"),
    "eval_batches": ("eval batches", lambda v: f"the same yardstick (pass --eval-batches {v}, "
                                               f"or eval_batches={v} in TrainConfig)"),
}
# Settings a user may change on purpose when resuming: the budget, and how often the run
# reports and saves. Each change is recorded (`changed_on_resume`).
ADJUSTABLE = ("max_steps", "max_minutes", "stop_after", "eval_interval", "checkpoint_interval",
              "keep_checkpoints", "log_interval", "progress", "tensorboard_dir")


def run_data(train_loader: Iterable[Batch], data: RunData | None) -> dict[str, Any]:
    """Return what decides which batches a run sees, as a checkpoint records it.

    From `data` (the loader's `RunData`): the data seed, the number of training examples and
    their digest, the training masking (`MaskingConfig`, as a dict), the length grouping
    (0: off), the kind of segments, the number of pair draws and the tokenizer's vocabulary
    digest. Without it (a loader that is not bertlab's) only what any DataLoader says: the
    number of examples, and an `EpochLoader`'s seed; None is never compared.
    """
    if data is None:
        dataset = train_loader.dataset if isinstance(train_loader, DataLoader) else None
        return {"data_seed": train_loader.seed if isinstance(train_loader, EpochLoader) else None,
                "train_examples": len(dataset) if isinstance(dataset, Sized) else None,
                "train_digest": None, "masking": None, "group_by_length": None,
                "segments": None, "pair_draws": None, "tokenizer": None}
    dataset = data.dataset
    return {"data_seed": data.seed,
            "train_examples": None if dataset is None else len(dataset),
            "train_digest": None if dataset is None else dataset.digest(),
            "masking": asdict(data.masking),
            "group_by_length": None if dataset is None else data.group_by_length,
            "segments": data.pairs,
            "pair_draws": None if dataset is None else dataset.pair_draws,
            "tokenizer": data.tokenizer_digest}


def run_contract(config: Any, precision: str, compiled: bool,
                 val_loaders: dict[str, Iterable[Batch]]) -> dict[str, Any]:
    """Return the settings besides the data that a resume must keep, as a checkpoint records
    them: the resolved `precision` and compilation, `config.unpad` (a TrainConfig), the
    validation examples' digest over `val_loaders` (by label; None when one cannot say) and
    `config.eval_batches` (None without validation)."""
    datasets = {label: run_data_of(loader) for label, loader in val_loaders.items()}
    digests = [f"{label}={data.dataset.digest()}" for label, data in datasets.items()
               if data is not None and data.dataset is not None]
    known = val_loaders and len(digests) == len(val_loaders)
    return {"precision": precision, "compile": bool(compiled), "unpad": config.unpad,
            "validation": (hashlib.sha256("\n".join(sorted(digests)).encode()).hexdigest()[:16]
                           if known else None),
            "eval_batches": config.eval_batches if val_loaders else None}


def _shown(value: Any) -> Any:
    # A setting as both sides are compared: JSON turns tuples into lists.
    return tuple(value) if isinstance(value, list) else value


def check_resume(saved: dict, checkpoint: Path, config: Any, data: dict[str, Any]) -> None:
    """Refuse a resume that would learn differently, compute differently, or see other batches
    than the run it continues.

    Compared with the checkpoint's own state (never with files beside it that a user may have
    edited or deleted): every `LEARNING` setting of `config` (a TrainConfig) against the
    checkpoint's train_config, then each entry of `data` (`run_data`'s and `run_contract`'s
    keys, plus "objective", e.g. "mlm,nsp") against what the checkpoint recorded, in `_CHECKED`
    order. A value missing on either side (a checkpoint written before it was recorded, a check
    made before the data is built) is not compared. A `BadInput` names the setting, both
    values and the fix; nothing is written.
    """
    train, now = saved.get("train_config") or {}, config.to_dict()
    for name in (n for n in LEARNING if n in train):
        flag = "--" + name.replace("_", "-")
        value = _shown(train[name])
        typed = " ".join(map(str, value)) if isinstance(value, tuple) else value  # as argv takes it
        _same(checkpoint, name, value, _shown(now[name]),
              f"the same value (pass {flag} {typed}, or {name}={value!r} in TrainConfig)")
    for name, (words, fix) in _CHECKED.items():
        before, after = saved.get(name), data.get(name)
        if before is None and name in ("unpad", "eval_batches"):
            before = train.get(name)  # recorded in the train_config before it was checked
        if before in (None, "") or after in (None, ""):
            continue
        if name == "masking":  # one setting at a time, so the message names the one that moved
            for key in before:
                hint = (f"--mlm-probability {before[key]}" if key == "mlm_probability" else
                        f"MaskingConfig({key}={before[key]!r})")
                _same(checkpoint, f"masking {key}", before[key], after.get(key),
                      f"the same masking (pass {hint})")
            continue
        _same(checkpoint, words, before, after, f"{fix(before)} as in the original run")


def changed_on_resume(saved: dict, config: Any) -> dict[str, list]:
    """Return the `ADJUSTABLE` settings of `config` that differ from the checkpoint's
    train_config, {name: [before, now]}: what a resume changed on purpose, to be recorded."""
    train, now = saved.get("train_config") or {}, config.to_dict()
    return {name: [train[name], now[name]] for name in ADJUSTABLE
            if name in train and _shown(train[name]) != _shown(now[name])}


def _same(checkpoint: Path, what: str, before: Any, after: Any, needs: str) -> None:
    if before != after:
        raise BadInput(f"checkpoint {checkpoint}",
                       f"this run was trained with {what} {before}, this resume has {after}",
                       f"an exact resume (--resume, resume=True) needs {needs}, or start a new "
                       f"run in another folder (nothing was written)")


# ---------------------------------------------------------------------------------------------
# Random states


def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    """Return this process's torch generator states (CPU, and CUDA on a GPU)."""
    rng = {"torch_cpu": torch.get_rng_state()}
    if device.type == "cuda":
        rng["torch_cuda"] = torch.cuda.get_rng_state(device)
    return rng


def gather_rng(rng: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Return every process's `rng_state`, keyed "rank{r}.{name}" (a collective under DDP).

    Each process has its own dropout stream; rank 0 stores them all.
    """
    rank, world = rank_world()
    if world == 1:
        return {f"rank0.{k}": v for k, v in rng.items()}
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, {k: v.cpu() for k, v in rng.items()})
    return {f"rank{r}.{k}": v for r, states in enumerate(gathered) for k, v in states.items()}


def restore_rng(saved: dict, device: torch.device, rank: int, world: int) -> None:
    """Put back the generator states a checkpoint's `saved` state holds for this process.

    The torch states only when the run had as many processes as now (otherwise each process
    keeps the fresh stream seeded by the loop); Python's `random` state whenever it was saved.
    """
    rng = saved.get("rng", {})
    if saved.get("world_size") == world and f"rank{rank}.torch_cpu" in rng:
        torch.set_rng_state(rng[f"rank{rank}.torch_cpu"])
        if device.type == "cuda" and f"rank{rank}.torch_cuda" in rng:
            torch.cuda.set_rng_state(rng[f"rank{rank}.torch_cuda"], device)
    if "python_random" in saved:
        version, internal, gauss = saved["python_random"]
        random.setstate((version, tuple(internal), gauss))


class CheckpointSaver:
    """Saves a run's checkpoints, keeping the newest `keep`: rank 0 writes, every rank takes part.

    `out` is the run folder on rank 0 and None elsewhere (and without a run folder). Each
    checkpoint holds the run state given to `save`, `extra` (what the resume checks need:
    settings, data seed...), every process's torch generator states and Python's `random`.
    """

    def __init__(self, out: Path | None, model: nn.Module, optimizer: torch.optim.Optimizer,
                 scaler: torch.amp.GradScaler, keep: int, extra: dict[str, Any],
                 saved_step: int | None = None) -> None:
        self.out, self.model, self.optimizer, self.scaler = out, model, optimizer, scaler
        self.keep, self.extra = keep, extra
        self.saved_step = saved_step  # the step of the newest checkpoint (None: none yet)

    def save(self, state: dict[str, Any], rng: dict[str, torch.Tensor]) -> Path | None:
        """Return the new checkpoint of `state` (whose "step" names it); None off rank 0."""
        rngs = gather_rng(rng)  # a collective: every rank takes part
        self.saved_step = state["step"]
        if self.out is None:
            return None
        state = {**state, **self.extra, "python_random": list(random.getstate())}
        path = save_checkpoint(self.out / "checkpoints" / f"step-{self.saved_step:08d}",
                               self.model, self.optimizer, state=state, rng=rngs,
                               scaler=self.scaler)
        for old in checkpoint_folders(self.out)[:-self.keep]:
            remove_checkpoint(old)  # renamed away first: never seen half deleted
        return path

    def save_on_interrupt(self, stop: KeyboardInterrupt, state: dict[str, Any],
                          rng: dict[str, torch.Tensor]) -> None:
        """Save `state` after Ctrl-C or SIGTERM (`stop`), and say where it went (rank 0).

        A second interrupt during that save abandons it (no partial files are left), says
        which complete checkpoint is the newest on disk, and re-raises the first.
        """
        how = signal.Signals(getattr(stop, "signum", signal.SIGINT)).name
        try:
            path = self.save(state, rng)
        except KeyboardInterrupt:
            if self.out is not None:
                tqdm.write(self._second_interrupt(how, state["step"]))
            raise stop from None
        if self.out is not None:
            tqdm.write(f"{how} at step {state['step']}: checkpoint saved to {path}; continue "
                       f"with resume=True (--resume)")


    def _second_interrupt(self, how: str, step: int) -> str:
        # The second interrupt may land after this step's checkpoint was complete (while older
        # ones were pruned), or the step may have had its periodic checkpoint already.
        newest = latest_checkpoint(self.out)
        if newest is not None and newest.name == f"step-{step:08d}":
            return (f"{how}, then a second interrupt during the save: the checkpoint of step "
                    f"{step} is complete at {newest}; continue with resume=True (--resume)")
        return (f"{how}, then a second interrupt during the save: the checkpoint of step {step} "
                f"was abandoned (no partial files are left); the newest complete checkpoint on "
                f"disk is {newest or 'none'}")


# ---------------------------------------------------------------------------------------------
# Data position


class DataPosition:
    """Yields batches forever, epoch after epoch, and knows where it is (epoch, batches used).

    The order and masks of an epoch must be a function of (loader seed, epoch): before each
    epoch the loader gets `set_epoch(epoch)` when it has that method. Resuming skips the
    batches already used in that epoch.
    """

    def __init__(self, loader: Iterable[Batch], epoch: int = 0, offset: int = 0):
        self.loader, self.epoch, self.offset = loader, epoch, offset
        self._iter: Iterator[Batch] | None = None

    def _start_epoch(self) -> None:
        if hasattr(self.loader, "set_epoch"):
            self.loader.set_epoch(self.epoch)
        self._iter = iter(self.loader)
        for _ in range(self.offset):
            next(self._iter)

    def next(self) -> Batch:
        """Return the next batch, starting the next epoch when this one is used up."""
        # A DataLoader draws worker seeds (and a shuffling sampler its order) from torch's global
        # generator; fork it, so fetching data never moves the dropout stream.
        with torch.random.fork_rng(devices=[]):
            if self._iter is None:
                self._start_epoch()
            try:
                batch = next(self._iter)
            except StopIteration:
                if self.offset == 0:
                    raise ValueError("the training loader (train_loader) is empty; it needs at least one "
                                     "batch") from None
                self.epoch, self.offset = self.epoch + 1, 0
                self._start_epoch()
                batch = next(self._iter)
        self.offset += 1
        return batch


# ---------------------------------------------------------------------------------------------
# Stopping on a signal


class Interrupted(KeyboardInterrupt):
    """Training was stopped by a signal other than Ctrl-C; `signum` says which (e.g. SIGTERM).

    A KeyboardInterrupt, so everything that handles Ctrl-C (save a checkpoint, then stop)
    handles it the same way. The CLI exits with 128 + signum (143 for SIGTERM).
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def interrupt_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM into `Interrupted` for the `with` block (main thread only), then restore.

    SIGTERM is what cluster schedulers, `docker stop` and `kill` send before killing: treated
    like Ctrl-C (save, then stop) instead of dying with the steps since the last checkpoint.
    """
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
