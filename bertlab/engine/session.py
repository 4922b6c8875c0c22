"""The run session: what the training loop does around its step, one call each (`RunHooks`):
the device, the run folder, resume, signals, evaluation, logging and checkpoints, and what a run
returns (`TrainResult`).

`bertlab.train.train_loop` reads as the step and its budget; everything here is what a long run
needs besides: a run folder that one process at a time may write (`bertlab.engine.resume`), an exact
resume from the newest checkpoint that verifies, Ctrl-C and SIGTERM answered with a checkpoint,
a dropout stream of the run's own, held-out evaluations whose time does not count as training,
a progress bar, TensorBoard event files (`tensorboard_dir`, `bertlab.engine.eventlog`), and
checkpoints every `checkpoint_interval` steps. Under torchrun every process
runs the same calls; rank 0 alone writes and logs.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import sys
import time
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from tqdm.auto import tqdm

from bertlab.atomic import atomic_write_json, atomic_write_text
from bertlab.config import TrainConfig, check_train_config, lr_at, rank_world
from bertlab.data import Batch, check_loader_batch
from bertlab.engine.checkpoint import (
    checkpoint_folders,
    latest_checkpoint,
    load_checkpoint,
    read_checkpoint_state,
)
from bertlab.engine.device import (
    fast_math,
    from_rank0,
    made_with,
    resolve_compile,
    resolve_device,
    resolve_precision,
)
from bertlab.engine.eventlog import EventLog, check_event_folder
from bertlab.engine.outputs import check_output
from bertlab.engine.resume import (
    CheckpointSaver,
    DataPosition,
    changed_on_resume,
    check_resume,
    check_run_folder,
    hold_run_folder,
    interrupt_on_sigterm,
    restore_rng,
    resume_checkpoint,
    rng_state,
    run_contract,
    run_data,
)
from bertlab.precision import cpu_has_native_bf16, resolve_newton_schulz
from bertlab.tokenizer import save_tokenizer

_DETAIL = ("val_random", "val_kept", "val_mask_unigram", "val_perplexity")  # not in the eval line


@dataclass
class Window:
    """Training loss and speed since the last evaluation (what its history row reports)."""

    loss: float = 0.0
    steps: int = 0
    tokens: int = 0
    seconds: float = 0.0


# What a checkpoint saves of a run's state, and a resume restores.
SAVED = ("step", "epoch", "offset", "tokens", "elapsed_s", "history", "window")


@dataclass
class RunState:
    """Where a run stands: everything `train_loop` changes as it trains, in one place.

    The fields in SAVED go into every checkpoint; the rest belong to this call of the loop.
    """

    step: int = 0  # optimizer steps done
    epoch: int = 0  # the data position after the last step: its epoch...
    offset: int = 0  # ...and how many of that epoch's batches were used
    tokens: int = 0  # positions fed to the model, padding included, all processes together
    elapsed_s: float = 0.0  # training time, evaluations left out
    history: list[dict[str, Any]] = field(default_factory=list)  # one row per evaluation
    window: Window = field(default_factory=Window)  # since the last history row
    first_step: int = 0  # where this call started (0, or the step it resumed at)
    step_losses: list[float] = field(default_factory=list)  # each step of this call
    # Steps not counted yet, (loss share, tokens, seconds): under DDP each process holds its
    # share of a step's loss, and the shares are summed only when a loss is read.
    pending: list[tuple[float, int, float]] = field(default_factory=list)
    stopped_by: str = "max_steps"
    checkpoint: Path | None = None  # the newest one this call saved
    rng: dict[str, Any] = field(default_factory=dict)  # the random states after the last step
    # What this call's resume changed on purpose ({setting: [before, now]}): the next history
    # row says so.
    changed: dict[str, list] = field(default_factory=dict)

    def saved(self) -> dict[str, Any]:
        """Return what a checkpoint saves of the run (the fields in SAVED)."""
        return {name: asdict(self.window) if name == "window" else getattr(self, name)
                for name in SAVED}

    @classmethod
    def restored(cls, saved: dict[str, Any]) -> RunState:
        """Return the state a checkpoint saved (one written before windows were saved starts a
        new window)."""
        return cls(**{name: saved[name] for name in SAVED if name != "window"},
                   window=Window(**saved.get("window", {})), first_step=saved["step"])


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


class RunHooks:
    """The calls `train_loop` makes around its step; each hides one mechanism of a long run.

    Built before anything is written: it resolves the device and precision and checks the
    loader's batch size and the run folder (rank 0), so a bad setting fails before any work.
    The `objective`'s `evaluate(model, loader, max_batches, device=, precision=)` gives the
    "val_" metrics of each history row (with a `val_loader`); its `name` is saved with every
    checkpoint. `val_loader` may be a dict of loaders, {"": at 128 tokens, "64": at 64 tokens}:
    each row then holds each one's metrics, "val_" for the "" loader and "val_64_" for "64".
    """

    def __init__(self, train_loader: Iterable[Batch], config: TrainConfig, objective: Any, *,
                 val_loader: Iterable[Batch] | dict[str, Iterable[Batch]] | None = None,
                 out_dir: str | Path | None = None, resume: bool = False) -> None:
        check_train_config(config, "train_loop")
        self.config, self.resume = config, resume
        self.rank, self.world = rank_world()
        self.is_main = self.rank == 0
        self.device = resolve_device(config.device)
        self.precision = resolve_precision(config.precision, self.device)
        if self.precision == "bf16" and self.device.type == "cpu" and not cpu_has_native_bf16():
            warnings.warn("precision bf16 on a CPU without native bf16 matmuls (no AMX or "
                          "AVX-512 BF16): torch emulates them, so this run is several times "
                          "slower than in fp32; pass --precision fp32 (precision='fp32')",
                          stacklevel=3)
        self.compile = resolve_compile(config.compile, self.device)
        check_loader_batch(train_loader, config, self.world)
        # Rank 0 alone writes into the run folder (and may be writing right now): it alone checks.
        self.out = check_run_folder(out_dir, resume) if self.is_main else (
            None if out_dir is None else Path(out_dir))
        if self.is_main:  # another run's event files: refused before anything is written
            check_event_folder(config.tensorboard_dir, self.out, resume)
            check_events_outside_artefacts(config.tensorboard_dir, self.out)
        self.objective = objective.name
        self.run_record = objective.run_record  # what a new run's run.json says
        data = objective.data  # what the run needs from its data (None: not said)
        self.tokenizer = None if data is None else data.tokenizer  # its tokenizer.json
        self.evaluate_fn = objective.evaluate if val_loader is not None else None
        self.val_loaders = (val_loader if isinstance(val_loader, dict) else
                            {} if val_loader is None else {"": val_loader})
        # What the run's checkpoints record, and a resume must keep (`check_resume`).
        self.data = {**run_data(train_loader, data),
                     **run_contract(config, self.precision, self.compile, self.val_loaders)}
        # Muon's Newton-Schulz dtype, as resolved on this machine: recorded, never refused (a
        # run moved to a machine that resolves "auto" otherwise goes on, and says so).
        self.newton_schulz = (resolve_newton_schulz(config.newton_schulz, self.device)
                              if config.optimizer == "muon" else None)
        self.bar: tqdm | None = None
        self.events: EventLog | None = None  # TensorBoard, rank 0 alone (opened by start)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Hold the run folder, turn SIGTERM into Ctrl-C and give the run its own dropout stream.

        Dropout draws from torch's global generator: it is forked, so this run's stream is a
        function of (seed, rank) and the caller's generator is left as it was.
        """
        cuda = [self.device] if self.device.type == "cuda" else []
        with hold_run_folder(self.out, self.resume, self.rank, self.world), \
                interrupt_on_sigterm(), torch.random.fork_rng(devices=cuda), \
                fast_math(self.device):
            torch.manual_seed(self.config.seed + self.rank)
            try:
                yield
            except BaseException:
                if self.is_main and self.out is not None and not self.resume:
                    clear_untrained_start(self.out)
                raise
            finally:
                self._close_bar()
                if self.events is not None:
                    self.events.close()

    def start(self, model: nn.Module, optimizer: torch.optim.Optimizer,
              scaler: torch.amp.GradScaler, train_loader: Iterable[Batch]) -> RunState:
        """Return the run's state at its first step: step 0, or restored from the newest
        checkpoint that verifies (weights, optimizer, random states, data position).

        Also opens the checkpoint saver, the progress bar and the training clock, and evaluates
        once at step 0.
        """
        run = RunState()
        if self.out is not None and self.is_main:
            (self.out / "checkpoints").mkdir(exist_ok=True)
            if not self.resume:  # a resumed run keeps its own files
                self._write_run_files(model)
        if self.resume:
            ckpt = resume_checkpoint(self.out, self.is_main, self.world)
            state = read_checkpoint_state(ckpt, verified=True)
            check_resume(state, ckpt, self.config, {**self.data, "objective": self.objective})
            saved = load_checkpoint(ckpt, model, optimizer, scaler=scaler, verify=False)
            run = RunState.restored(saved)  # the window of the next row goes on where it was
            run.changed = {**changed_on_resume(state, self.config),
                           **newton_schulz_change(state, self.newton_schulz)}
            if run.changed and self.is_main:
                _record_resume(self.out, run.step, run.changed)
            restore_rng(saved, self.device, self.rank, self.world)
        self.model = model
        self.batches = DataPosition(train_loader, run.epoch, run.offset)
        self.saver = CheckpointSaver(
            self.out if self.is_main else None, model, optimizer, scaler,
            self.config.keep_checkpoints,
            {**self.data, "objective": self.objective, "world_size": self.world,
             "train_config": self.config.to_dict(), "newton_schulz": self.newton_schulz},
            saved_step=run.step if self.resume else None)
        self.bar = _progress_bar(self.config, run, self.is_main)
        if self.config.tensorboard_dir is not None and self.is_main:
            self.events = EventLog(self.config.tensorboard_dir, tuple(self.val_loaders),
                                   run.step, resumed=self.resume, run=self.out,
                                   advice=self._resume_advice)
        self.clock = time.perf_counter() - run.elapsed_s
        self.last_line = time.perf_counter()  # when log mode last printed a progress line
        run.rng = rng_state(self.device)  # a checkpoint stores the RNG after the last step
        if self.evaluate_fn is not None and self.is_main and self._row_missing(run):
            self.clock += self._evaluate(run)  # evaluating is not training time
        return run

    def _write_run_files(self, model: nn.Module) -> None:
        # What the other commands read a run folder by: its vocabulary (fill-mask, export-hf,
        # finetune, --resume) and what it trained (the model card, --resume's checks).
        if self.tokenizer is not None:
            save_tokenizer(self.tokenizer, self.out / "tokenizer.json")
        record = self.run_record(model, self.config)
        if record is not None:  # and what made it: versions, platform, commit
            atomic_write_json(self.out / "run.json", {**record, "made_with": made_with()})

    def _row_missing(self, run: RunState) -> bool:
        # Step 0 has a row, and so has every step a row was due at: a run stopped while that
        # evaluation ran (Ctrl-C, SIGTERM) saved its checkpoint without it, so it is made now,
        # from the same weights and window, as the uninterrupted run made it.
        due = run.step == 0 or bool(self.config.eval_interval and
                                    run.step % self.config.eval_interval == 0)
        return due and not (run.history and run.history[-1]["step"] == run.step)

    def another_step(self, run: RunState) -> bool:
        """Return whether the budget (max_steps, max_minutes) allows another step; start its timer.

        With a deadline, every process takes rank 0's clock at every step (under torchrun), so
        all stop at the same step and follow the same time-based schedule; a run without one
        needs no clock but rank 0's.
        """
        run.elapsed_s = time.perf_counter() - self.clock
        if self.config.max_minutes is not None:
            run.elapsed_s = from_rank0(run.elapsed_s, self.device)
        if self.config.max_steps is not None and run.step >= self.config.max_steps:
            return False
        if self.config.stop_after is not None and run.step >= self.config.stop_after:
            run.stopped_by = "stop_after"
            return False
        if self.config.max_minutes is not None and run.elapsed_s >= 60 * self.config.max_minutes:
            run.stopped_by = "max_minutes"
            return False
        self.step_start = time.perf_counter()
        return True

    def next_batches(self) -> list[Batch]:
        """Return the next step's `grad_accum` micro-batches, epoch after epoch."""
        return [self.batches.next() for _ in range(self.config.grad_accum)]

    def after_step(self, run: RunState, loss: float, tokens: int, lr: float) -> None:
        """Count the finished step (`loss`: this process's share of it); log it; evaluate and
        checkpoint when they are due."""
        run.step += 1
        run.epoch, run.offset = self.batches.epoch, self.batches.offset
        run.tokens += tokens
        run.rng = rng_state(self.device)
        run.pending.append((loss, tokens, time.perf_counter() - self.step_start))
        config, step = self.config, run.step
        logged = bool(config.log_interval) and step % config.log_interval == 0
        at_end = config.max_steps is not None and step >= config.max_steps
        due = bool(config.eval_interval) and step % config.eval_interval == 0
        saving = bool(config.checkpoint_interval) and step % config.checkpoint_interval == 0
        if self.world == 1 or logged or due or at_end or saving:
            self._count_losses(run)  # under DDP: one collective, only when a loss is read
        if self.events is not None and logged:
            self.events.step_loss(step, run.step_losses[-1])
        # Without a bar, a line is due at a logged step or LOG_EVERY_S after the last one.
        shows = not self.bar.disable or logged or (
            config.progress and time.perf_counter() - self.last_line >= LOG_EVERY_S)
        if shows and _show_progress(self.bar, config, run, lr, self.is_main, self.clock,
                                    self.last_line):
            self.last_line = time.perf_counter()
        if self.is_main and (due or at_end):
            run.elapsed_s = time.perf_counter() - self.clock
            self.clock += self._evaluate(run)
        if saving:
            run.checkpoint = self.saver.save(run.saved(), run.rng)

    def _count_losses(self, run: RunState) -> None:
        # The pending steps' losses: each process's shares summed (one small collective under
        # DDP), then counted in the order the steps ran.
        shares = [loss for loss, _, _ in run.pending]
        if self.world > 1 and shares:
            summed = torch.tensor(shares, dtype=torch.float64, device=self.device)
            dist.all_reduce(summed)
            shares = summed.tolist()
        window = run.window
        for loss, (_, tokens, seconds) in zip(shares, run.pending, strict=True):
            run.step_losses.append(loss)
            window.loss, window.steps = window.loss + loss, window.steps + 1
            window.tokens, window.seconds = window.tokens + tokens, window.seconds + seconds
        run.pending.clear()

    def _resume_advice(self) -> str:
        """Return how to go on after a failed write: resume from the newest checkpoint, or,
        with none yet, start again."""
        last = latest_checkpoint(self.out) if self.out is not None else None
        if last is not None:
            return (f"then continue the run from its newest checkpoint, {last}, with the same "
                    f"command and --resume (resume=True)")
        if self.out is not None:
            return (f"then run the same command again (no checkpoint was saved yet; delete "
                    f"{self.out} first if it is still there)")
        return "then run it again"

    def diverged(self, run: RunState, error: FloatingPointError) -> FloatingPointError:
        """Return the error for a NaN/inf loss: the step, the newest checkpoint and the fix."""
        last = latest_checkpoint(self.out) if self.out is not None else None
        # The rate that took the weights here is the last step's; the peak is what a user sets.
        lr = lr_at(max(run.step - 1, 0), self.config, run.elapsed_s)
        return FloatingPointError(
            f"{error} at step {run.step}; stopped before the update. Newest checkpoint: {last}. "
            f"The run diverged: lower lr (peak {self.config.lr:.3g}, {lr:.3g} at the last "
            f"update) or check the data for bad batches")

    def interrupted(self, run: RunState, stop: KeyboardInterrupt) -> None:
        """Save a checkpoint after Ctrl-C or SIGTERM (with a run folder), saying where it went.

        Under DDP the losses of steps since the last log are not in its window (summing them
        would need every process at one collective while they stop): the first history row after
        a resume then averages fewer steps. On one process nothing is pending.
        """
        if self.out is not None:
            self.saver.save_on_interrupt(stop, run.saved(), run.rng)

    def finish(self, run: RunState) -> TrainResult:
        """Return the run's result after a last evaluation and checkpoint, unless the last step
        already had them."""
        self._close_bar()
        self._count_losses(run)
        run.elapsed_s = time.perf_counter() - self.clock
        if self.evaluate_fn is not None and self.is_main and (
                not run.history or run.history[-1]["step"] != run.step):
            self._evaluate(run)
        if self.out is not None and self.saver.saved_step != run.step:
            run.checkpoint = self.saver.save(run.saved(), run.rng)
        elif self.out is not None and self.is_main:
            run.checkpoint = latest_checkpoint(self.out)
        return TrainResult(history=run.history, step_losses=run.step_losses,
                           first_step=run.first_step, steps=run.step, tokens=run.tokens,
                           elapsed_s=run.elapsed_s, stopped_by=run.stopped_by, out_dir=self.out,
                           checkpoint=run.checkpoint, config=self.config)

    def _close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def _evaluate(self, run: RunState) -> float:
        # One history row (rank 0): the step, the training loss and speed since the last row, and
        # the held-out metrics; printed, and rewritten to history.json/csv. Returns the seconds it
        # took: the loop's clock (elapsed_s, the time-based schedule and budget) counts training
        # only, however often a run evaluates.
        start, window, config = time.perf_counter(), run.window, self.config
        row = {"step": run.step, "tokens": run.tokens, "elapsed_s": round(run.elapsed_s, 3),
               "lr": lr_at(run.step, config, run.elapsed_s),
               "train_loss": window.loss / window.steps if window.steps else None,
               "tokens_per_s": window.tokens / window.seconds if window.seconds else None}
        if run.changed:
            row["resumed_with"] = _changes(run.changed)
            run.changed = {}
        if self.evaluate_fn is not None:
            # Evaluation must not move the dropout stream (a loader, for one, may draw from it).
            for label, loader in self.val_loaders.items():
                with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda"
                                           else []):
                    metrics = self.evaluate_fn(self.model, loader, config.eval_batches,
                                               device=self.device, precision=self.precision)
                prefix = f"val_{label}_" if label else "val_"
                row.update({f"{prefix}{k}": v for k, v in (metrics or {}).items()})
        run.history.append(row)
        run.window = Window()  # a new window starts
        if config.progress:
            tqdm.write(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in
                                row.items() if not k.startswith(_DETAIL)))  # history.json has all
        if self.out is not None:
            _write_history(self.out, run.history)
        if self.events is not None:
            self.events.row(row)
        return time.perf_counter() - start


def clear_untrained_start(out: Path) -> None:
    """Remove the files a new run wrote if it stopped before it trained a step or saved a
    checkpoint (a refusal in the loop, a divergence at step 1), so that the same call, once
    fixed, finds the folder as it was; a run with a checkpoint or a trained step keeps them."""
    if checkpoint_folders(out):
        return
    history = out / "history.json"
    try:
        rows = json.loads(history.read_text()) if history.is_file() else []
    except (OSError, ValueError):
        return
    if any(row.get("step", 0) > 0 for row in rows):
        return
    for name in ("tokenizer.json", "run.json", "history.json", "history.csv"):
        (out / name).unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # only an empty one
        (out / "checkpoints").rmdir()


def check_events_outside_artefacts(events: str | None, out: Path | None) -> None:
    """Refuse an event folder inside another artefact (a run, shards, an export) before anything
    is written; inside this run's own folder it is the run's to write."""
    if events is None or (out is not None and Path(events).resolve().is_relative_to(out.resolve())):
        return
    check_output(events, "tensorboard_dir (--tensorboard)", folder=True)


def newton_schulz_change(saved: dict, now: str | None) -> dict[str, list]:
    """Return {"newton_schulz": [before, now]} when this resume runs Muon's Newton-Schulz in
    another dtype than the checkpoint's run did (one that records none ran bf16, the only dtype
    before the setting), else {}: a change `_record_resume` writes into run.json."""
    train = saved.get("train_config") or {}
    before = saved.get("newton_schulz") or ("bf16" if train.get("optimizer") == "muon" else None)
    return {"newton_schulz": [before, now]} if None not in (before, now) and before != now else {}


def _changes(changed: dict[str, list]) -> str:
    return ", ".join(f"{name} {before} -> {now}" for name, (before, now) in changed.items())


def _record_resume(out: Path, step: int, changed: dict[str, list]) -> None:
    # The run folder's run.json (every new run writes one) lists each resume that changed a
    # setting on purpose; a run.json that is not a JSON object is left alone, and none is made.
    path, where = out / "run.json", "the next history row"
    try:
        run = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        run = None
    if isinstance(run, dict):
        resumes = run.get("resumes") if isinstance(run.get("resumes"), list) else []
        run["resumes"] = [*resumes, {"step": step, "changed": changed}]
        atomic_write_json(path, run)
        where = f"{path.name} and {where}"
    tqdm.write(f"resumed at step {step} with {_changes(changed)} (recorded in {where})")


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


LOG_EVERY_S = 30.0  # in a log (no terminal), a progress line at most this often


def _show_progress(bar: tqdm, config: TrainConfig, run: RunState, lr: float, is_main: bool,
                   clock: float, last_line: float) -> bool:
    """Show this step's progress; return True if it printed a progress line.

    On the bar: the loss, lr and speed every log_interval steps. Without a bar: a printed line
    every log_interval steps (progress off), or at most every LOG_EVERY_S seconds after
    `last_line` (progress on, but the output is a log file, where a bar would be one line of
    carriage returns). The loss is the newest counted step's (under DDP, counted at log steps).
    """
    window = run.window
    rate = window.tokens / max(window.seconds, 1e-9)
    loss = run.step_losses[-1] if run.step_losses else math.nan
    if not bar.disable:
        if config.log_interval and run.step % config.log_interval == 0:
            bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{rate:.0f}",
                            refresh=False)
        bar.update(1 if config.max_steps is not None else
                   round(time.perf_counter() - clock) - bar.n)
        return False
    if not is_main:
        return False
    now = time.perf_counter()
    if config.progress:
        due = now - last_line >= LOG_EVERY_S
    else:
        due = bool(config.log_interval) and run.step % config.log_interval == 0
    if due:
        total = f" of {config.max_steps}" if config.max_steps is not None else ""
        print(f"step {run.step}{total} loss {loss:.4f} lr {lr:.3g} tokens/s {rate:.0f} "
              f"({(now - clock) / 60:.1f} min)", flush=True)
    return due


def _interactive() -> bool:
    """Return whether a live progress bar can be seen: a terminal, or a Jupyter kernel."""
    if sys.stderr.isatty():
        return True
    ipython = sys.modules.get("IPython")  # imported by a kernel, never imported here
    shell = getattr(ipython, "get_ipython", lambda: None)()
    return type(shell).__name__ == "ZMQInteractiveShell"


def _progress_bar(config: TrainConfig, run: RunState, is_main: bool) -> tqdm:
    by_steps = config.max_steps is not None
    return tqdm(total=config.max_steps if by_steps else round(config.max_minutes * 60),
                initial=run.step if by_steps else round(run.elapsed_s),
                unit="step" if by_steps else "s",
                disable=not (config.progress and is_main and _interactive()),
                dynamic_ncols=True, bar_format=None if by_steps else
                "{l_bar}{bar}| {n_fmt}/{total_fmt} s [{elapsed}<{remaining}{postfix}]")
