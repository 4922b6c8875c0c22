"""bertlab's masking inside Hugging Face's `transformers.Trainer`.

`PretrainingCollator` is the Trainer's `data_collator` as it is: rows of a `datasets.Dataset`
with `input_ids` (and optionally `token_type_ids`, `next_sentence_label`, `word_ids`) and an
`index` column become the batch dict `BertForMaskedLM` / `BertForPreTraining` take. Two
settings make the masks what bertlab promises (the same for an example whatever batch, worker
or process it lands in, a new one each epoch):

- `TrainingArguments(remove_unused_columns=False)`: else the Trainer drops `index` and
  `word_ids`, which the model's forward does not name;
- `callbacks=[mask_epoch_callback(collator)]`: the Trainer never tells its collator the epoch,
  so without it every epoch gets epoch 0's masks (static masking).

The Trainer's sampler orders the rows by its own seed, not bertlab's `EpochShuffleSampler`:
the masks of an example match a bertlab run with the same seed, the order of the batches does
not. Nothing here imports `transformers` until a callback is asked for.
"""

from __future__ import annotations

import math
from typing import Any

from bertlab.data import PretrainingCollator

INSTALL = "pip install 'transformers>=4.40' accelerate"


class TrainerMissingError(ValueError, ImportError):
    """The Trainer's packages (`transformers`, `accelerate`) are not installed: a ValueError
    like every refused setting, and an ImportError, so code that catches that keeps working."""


def _trainer_callback_class() -> type:
    """Return `transformers.TrainerCallback`, or raise TrainerMissingError naming the fix."""
    missing = []
    for name in ("transformers", "accelerate"):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise TrainerMissingError(
            f"mask_epoch_callback is for transformers.Trainer, which needs "
            f"{' and '.join(missing)} (not installed); install with {INSTALL}, or train with "
            f"bertlab.pretrain, which moves the masking epoch itself")
    from transformers import TrainerCallback

    return TrainerCallback


def mask_epoch_callback(collator: PretrainingCollator) -> Any:
    """Return a `transformers.TrainerCallback` that gives `collator` the Trainer's epoch.

    At each epoch's start, before the Trainer opens its DataLoader (and so before workers copy
    the collator), it calls `collator.set_epoch(epoch)`: dynamic masking, a new mask per epoch.
    Persistent workers keep the copy they made at the first epoch, so it refuses
    `dataloader_persistent_workers=True` with workers.
    """
    if not isinstance(collator, PretrainingCollator):
        raise ValueError(f"mask_epoch_callback: collator={type(collator).__name__}; pass the "
                         f"bertlab.data.PretrainingCollator given to the Trainer as data_collator")
    base = _trainer_callback_class()

    class MaskEpochCallback(base):
        """Moves bertlab's masking epoch on with the Trainer's."""

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if args.dataloader_num_workers > 0 and args.dataloader_persistent_workers:
                raise ValueError(
                    "mask_epoch_callback: dataloader_persistent_workers=True keeps the workers' "
                    "first copy of the collator, so every epoch would reuse epoch 0's masks; "
                    "set dataloader_persistent_workers=False (or dataloader_num_workers=0)")

        def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            # state.epoch is a float (epochs done so far); a resume may start mid-epoch.
            collator.set_epoch(math.floor((state.epoch or 0) + 1e-9))

    return MaskEpochCallback()
