"""TensorBoard event files of a run: each history row's numbers, and the loss of each log step.

The writer is torch's own `torch.utils.tensorboard.SummaryWriter`. It ships with torch (only the
`tensorboard` package it writes through is an extra, `pip install 'bertlab[tensorboard]'`), and
it is the writer Hugging Face's Trainer uses for `report_to="tensorboard"`, so a bertlab run and
a Trainer run are read by the same TensorBoard the same way. Nothing here imports `tensorboard`
until a run asks for event files.
"""

from __future__ import annotations

import contextlib
import errno
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bertlab.atomic import atomic_write_json, is_disk_full
from bertlab.config import check_tensorboard
from bertlab.errors import BadInput

# The bar a masked LM must clear: always guessing the most frequent [MASK] target.
BAR = "mask_unigram_accuracy"
# Which run a folder's event files belong to: this file, beside them, names the run folder (its
# absolute path; null for a run without one). TensorBoard reads only events.out.tfevents.* files.
MARKER = "bertlab-run.json"
EVENTS = "events.out.tfevents.*"


def _owner(folder: Path) -> tuple[bool, str | None]:
    """Return (whether `folder` holds event files, the run its marker names or None)."""
    if not folder.is_dir() or not any(folder.glob(EVENTS)):
        return False, None
    try:
        marked = json.loads((folder / MARKER).read_text(encoding="utf-8"))
        return True, marked.get("run") if isinstance(marked, dict) else None
    except (OSError, ValueError):  # no marker (another writer's events), or not readable
        return True, None


def _run_id(run: str | Path | None) -> str | None:
    return None if run is None else str(Path(run).absolute())


def check_event_folder(folder: str | Path | None, run: str | Path | None, resume: bool,
                       flag: str = "tensorboard_dir") -> None:
    """Raise BadInput unless the run in `run` (a run folder, or None) may write event files into
    `folder`: a missing or empty folder, or one holding this run's own events (its marker names
    the same run folder). A resume may also adopt events that carry no marker (written before
    runs were marked). Events of another run, or a file, are refused: two runs' curves in one
    folder would be read as one run's. Nothing is written."""
    if folder is None:
        return
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise BadInput(f"{flag} {folder}", "is a file, not a folder",
                       "pass a folder for the event files (nothing was written)")
    has_events, owner = _owner(folder)
    if not has_events or (owner is not None and owner == _run_id(run)):
        return
    if owner is None and resume:
        return
    whose = (f"the run in {owner}" if owner else
             "another writer (it has no " + MARKER + " naming a bertlab run)")
    raise BadInput(f"{flag} {folder}", f"holds the TensorBoard event files of {whose}, and two "
                   f"runs' events in one folder read as one run's curves",
                   f"give each run its own folder, e.g. {folder.parent / 'NAME'}, and point "
                   f"TensorBoard at {folder.parent} to see them side by side (nothing was "
                   f"written)")


def _quiet_writer_threads() -> None:
    """Keep the writer's background thread from printing a traceback when its write fails: the
    writer raises the same error again in the run's thread, where EventLog names the folder."""
    if getattr(threading.excepthook, "bertlab_quiet", False):
        return
    previous = threading.excepthook

    def hook(args: Any) -> None:
        if type(args.thread).__name__ != "_AsyncWriterThread":
            previous(args)
    hook.bertlab_quiet = True  # type: ignore[attr-defined]
    threading.excepthook = hook


def scalar_tag(key: str, val_labels: tuple[str, ...] = ("",)) -> str:
    """Return the TensorBoard tag of a history row's key: "train/loss", "val/mask_accuracy",
    "val_64/mask_accuracy" (for the validation set labelled "64")."""
    for label in sorted(val_labels, key=len, reverse=True):  # "val_64_..." before "val_..."
        prefix = f"val_{label}_" if label else "val_"
        if key.startswith(prefix):
            return f"{prefix[:-1]}/{key.removeprefix(prefix)}"
    return "train/" + key.removeprefix("train_")


class EventLog:
    """One sitting of a run writing its scalars into the event files of `folder`.

    A resumed sitting (`first_step` from its checkpoint) starts a new event file that tells
    readers to drop what earlier files hold after `first_step` (SummaryWriter's `purge_step`):
    those steps, written before a crash or after the checkpoint, are made again now, so each
    step's value is read once, and it is the value of the run that went on. A new start of the
    same run folder (its first sitting died before a checkpoint) drops all of them.

    The folder's MARKER names the run (`run`, its folder) that writes there (`check_event_folder`
    refuses another run's folder). A write that fails (a full disk, a folder made read-only)
    raises one OSError that names the folder and, from `advice()`, how to go on.
    """

    def __init__(self, folder: str | Path, val_labels: tuple[str, ...], first_step: int = 0,
                 resumed: bool = False, run: str | Path | None = None,
                 advice: Callable[[], str] | None = None) -> None:
        check_tensorboard("tensorboard_dir")
        from torch.utils.tensorboard import SummaryWriter

        self.folder, self.labels, self.failed = Path(folder), val_labels, False
        self.advice = advice or (lambda: "then rerun the same command")
        earlier, owner = _owner(self.folder)
        purge = first_step + 1 if resumed else (0 if earlier else None)
        _quiet_writer_threads()
        with self._writing():
            self.folder.mkdir(parents=True, exist_ok=True)
            if owner is None or owner != _run_id(run):  # new, or adopted by a resume
                atomic_write_json(self.folder / MARKER, {"run": _run_id(run),
                                                         "written_by": "bertlab pretrain"})
            self.writer = SummaryWriter(str(self.folder), purge_step=purge)
        if not resumed:  # one chart per validation set: accuracy at [MASK] beside the bar
            charts = {}
            for label in val_labels:
                group = f"val_{label}" if label else "val"
                charts[f"{group}: accuracy at [MASK] and the bar"] = [
                    "Multiline", [f"{group}/mask_accuracy", f"{group}/{BAR}"]]
            if charts:
                with self._writing():
                    self.writer.add_custom_scalars({"masked LM": charts})

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        # The writer fails in its own thread and raises that error at a later call, with no
        # path: it becomes one error that names the folder, what is kept and how to go on.
        try:
            yield
        except OSError as exc:
            self.failed = True
            full = is_disk_full(exc)
            problem = ("no space left on the device" if full else
                       f"cannot write there ({exc.strerror or exc})")
            raise OSError(errno.ENOSPC if full else (exc.errno or errno.EIO),
                          f"{problem} while writing the TensorBoard event files in "
                          f"{self.folder} (--tensorboard); the event files written before are "
                          f"kept. {'Free some space there' if full else 'Make it writable'} "
                          f"(or pass another --tensorboard folder), {self.advice()}") from None

    def row(self, row: dict[str, Any]) -> None:
        """Write every number of a history row at its step, and flush."""
        with self._writing():
            for key, value in row.items():
                if key != "step" and isinstance(value, int | float) and \
                        not isinstance(value, bool):
                    self.writer.add_scalar(scalar_tag(key, self.labels), value, row["step"])
            self.writer.flush()

    def step_loss(self, step: int, loss: float) -> None:
        """Write the training loss of one optimizer step."""
        with self._writing():
            self.writer.add_scalar("train/step_loss", loss, step)

    def close(self) -> None:
        """Flush and close the event file (after a failed write: close quietly, the error has
        been raised already)."""
        if self.failed:
            with contextlib.suppress(Exception):
                self.writer.close()
            return
        with self._writing():
            self.writer.flush()  # raises the background thread's error, if it had one
            self.writer.close()
