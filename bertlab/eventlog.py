"""TensorBoard event files of a run: each history row's numbers, and the loss of each log step.

The writer is torch's own `torch.utils.tensorboard.SummaryWriter`. It ships with torch (only the
`tensorboard` package it writes through is an extra, `pip install 'bertlab[tensorboard]'`), and
it is the writer Hugging Face's Trainer uses for `report_to="tensorboard"`, so a bertlab run and
a Trainer run are read by the same TensorBoard the same way. Nothing here imports `tensorboard`
until a run asks for event files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

INSTALL = "pip install 'bertlab[tensorboard]'"
# The bar a masked LM must clear: always guessing the most frequent [MASK] target.
BAR = "mask_unigram_accuracy"


class TensorBoardMissingError(ValueError, ImportError):
    """Event files were asked for, but the `tensorboard` package is not installed.

    A ValueError, like every refusal of a setting (the CLI prints it as one line), that is
    also an ImportError, so code that catches the latter keeps working.
    """


def check_tensorboard(setting: str) -> None:
    """Raise TensorBoardMissingError (naming `setting` and the fix) unless tensorboard imports."""
    try:
        import tensorboard  # noqa: F401  (only whether it is there)
    except ImportError:
        raise TensorBoardMissingError(
            f"{setting} asks for TensorBoard event files, but the tensorboard package is not "
            f"installed; install it with {INSTALL}, or leave {setting} out (nothing was "
            f"written)") from None


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
    step's value is read once, and it is the value of the run that went on.
    """

    def __init__(self, folder: str | Path, val_labels: tuple[str, ...], first_step: int = 0,
                 resumed: bool = False) -> None:
        check_tensorboard("tensorboard_dir")
        from torch.utils.tensorboard import SummaryWriter

        self.labels = val_labels
        self.writer = SummaryWriter(str(folder), purge_step=first_step + 1 if resumed else None)
        if not resumed:  # one chart per validation set: accuracy at [MASK] beside the bar
            charts = {}
            for label in val_labels:
                group = f"val_{label}" if label else "val"
                charts[f"{group}: accuracy at [MASK] and the bar"] = [
                    "Multiline", [f"{group}/mask_accuracy", f"{group}/{BAR}"]]
            if charts:
                self.writer.add_custom_scalars({"masked LM": charts})

    def row(self, row: dict[str, Any]) -> None:
        """Write every number of a history row at its step, and flush."""
        for key, value in row.items():
            if key != "step" and isinstance(value, int | float) and not isinstance(value, bool):
                self.writer.add_scalar(scalar_tag(key, self.labels), value, row["step"])
        self.writer.flush()

    def step_loss(self, step: int, loss: float) -> None:
        """Write the training loss of one optimizer step."""
        self.writer.add_scalar("train/step_loss", loss, step)

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()
