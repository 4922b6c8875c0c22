"""Every setting of the training loop (`TrainConfig`), and the learning-rate schedule they define.

The settings sit low in the package, below the loop, so that what only needs to read them (the
recipes, the CLI's flags, a plot of the schedule) does not import the loop.

Taught in notebooks/05_pretraining.ipynb
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

import torch.distributed as dist

from bertlab.errors import BadInput, check_number

# TensorBoard's event files are an extra; a setting that asks for them is refused without it.
INSTALL = "pip install 'bertlab[tensorboard]'"


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

# torch's CPU threads per model preset, chosen once by measurement (benchmarks/threads.py,
# benchmarks/results/threads.json) and never measured at run time, so that a run's speed does not
# depend on what else the machine did when it started. A tiny model's matrices are too small to
# split well: a second thread mostly waits, and beside another busy program it waits a long time.
# Presets not named keep torch's default, one thread per core.
CPU_THREADS = {"tiny": 1, "mini": 1}


def cpu_threads(preset: str | None) -> int | None:
    """Return the torch CPU threads a run of `preset` uses unless told otherwise (None:
    torch's default, one per core). The demo, the notebooks, `pretrain` and the doctor use it."""
    return CPU_THREADS.get(preset) if preset else None


def _setting(default: Any, help: str) -> Any:
    # A dataclass field that carries its one-line help (the CLI turns each into a flag).
    return field(default=default, metadata={"help": help})


# The settings where None means "no limit" or "off".
_OPTIONAL = ("max_steps", "max_minutes", "stop_after", "warmup_steps", "grad_clip",
             "eval_interval", "checkpoint_interval")


@dataclass
class TrainConfig:
    """Every setting of the training loop, with its default.

    The run stops at `max_steps` optimizer steps or after `max_minutes` of training time
    (evaluations excluded), whichever comes first (or earlier, at `stop_after` steps, which
    leaves the schedule as it is). The learning-rate schedule runs over the
    same budget (with a time budget it follows elapsed time, as in Cramming; for bit-exact
    resumes set only `max_steps`). `batch_size` is the global batch of one optimizer step.

    Taught in notebooks/05_pretraining.ipynb
    """

    max_steps: int | None = _setting(1000, "optimizer steps to run (None: no step limit)")
    max_minutes: float | None = _setting(None, "training-time budget in minutes, evaluations "
                                                "excluded (None: no limit)")
    stop_after: int | None = _setting(None, "stop after this many optimizer steps, the schedule "
                                            "still running over max_steps: the first steps of a "
                                            "longer run, e.g. a reproduce trace (None: at the "
                                            "budget)")
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
                                        "AdamW on the rest (bertlab.train)")
    muon_lr: float = _setting(0.02, "Muon's peak learning rate (optimizer=muon)")
    newton_schulz: str = _setting("auto", "dtype of Muon's Newton-Schulz iterations: auto (bf16 "
                                          "where bf16 matmuls are native: GPUs, CPUs with AMX "
                                          "or AVX-512 BF16; fp32 elsewhere), bf16 or fp32")
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
    unpad: bool = _setting(False, "pretraining: run each block's projections and feed-forward "
                                  "on a padded batch's real tokens only (same loss, less work)")
    seed: int = _setting(0, "seed of the dropout stream (data order and masks use the "
                            "loader's seed)")
    log_interval: int = _setting(10, "steps between progress updates (0: none)")
    progress: bool = _setting(True, "show a progress bar and one line per evaluation (in a "
                              "log file, not a terminal: a plain line every 30 s instead)")
    tensorboard_dir: str | None = _setting(None, "also write TensorBoard event files here: the "
                                                 "losses, lr, tokens/s and every validation "
                                                 f"metric (None: off; needs {INSTALL})")

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)
        if self.max_steps is None and self.max_minutes is None:
            raise ValueError("TrainConfig needs a budget: set max_steps, max_minutes or both")
        kinds = {"positive integer": ("max_steps", "stop_after", "batch_size", "grad_accum",
                                      "eval_interval", "eval_batches", "checkpoint_interval",
                                      "keep_checkpoints"),
                 "positive number": ("max_minutes", "lr", "eps", "grad_clip", "muon_lr"),
                 "integer >= 0": ("seed", "log_interval", "warmup_steps"),
                 "number >= 0": ("weight_decay",)}
        for kind, names in kinds.items():
            for name in names:
                check_number("TrainConfig", name, getattr(self, name), kind,
                             none_ok=name in _OPTIONAL)
        if self.warmup_steps is not None and self.max_steps is not None and \
                self.warmup_steps >= self.max_steps:
            raise ValueError(f"TrainConfig.warmup_steps={self.warmup_steps} is not below "
                             f"max_steps={self.max_steps}: the run would never leave warmup; "
                             f"use fewer warmup steps (or warmup_fraction)")
        for name in ("warmup_fraction", "min_lr_ratio"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"TrainConfig.{name} must be in [0, 1), got "
                                 f"{getattr(self, name)!r}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"TrainConfig.betas must be two numbers in [0, 1), got "
                             f"{self.betas!r}")
        choices = {"schedule": ("linear", "cosine", "constant"), "optimizer": ("adamw", "muon"),
                   "precision": ("auto", "fp32", "bf16", "fp16"),
                   "newton_schulz": ("auto", "bf16", "fp32")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"TrainConfig.{name}={getattr(self, name)!r} is not one of "
                                 f"{', '.join(allowed)}")
        if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", str(self.device)):
            raise ValueError(f"TrainConfig.device={self.device!r} is not auto, cpu, "
                             f"mps, cuda or cuda:N")
        if self.batch_size % self.grad_accum:
            raise ValueError(f"TrainConfig.batch_size={self.batch_size} is not divisible by "
                             f"grad_accum={self.grad_accum}; the "
                             f"global batch is split evenly into micro-batches")
        if self.tensorboard_dir is not None:  # refused now, before a run writes anything
            check_tensorboard("TrainConfig.tensorboard_dir")
            self.tensorboard_dir = str(self.tensorboard_dir)  # a Path too; saved as JSON

    def to_dict(self) -> dict:
        """Return the settings as a JSON-ready dict; `TrainConfig(**d)` reverses it."""
        return asdict(self)


def rank_world() -> tuple[int, int]:
    """Return (rank, world size) of this process in a torchrun group, or (0, 1) when alone.

    `TrainConfig.batch_size` counts the examples of a step over every process, so the loop
    needs to know how many there are, and which one it is.
    """
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def check_train_config(config: object, where: str) -> None:
    """Raise BadInput unless `config` is a TrainConfig: a dict or anything else would fail deep
    inside the loop, naming an attribute instead of the argument."""
    if not isinstance(config, TrainConfig):
        shown = f"the dict {config!r}" if isinstance(config, dict) else f"a {type(config).__name__}"
        fix = ("pass TrainConfig(**that_dict)" if isinstance(config, dict) else
               "pass a TrainConfig")
        raise BadInput(f"{where}(config=...)", f"got {shown}, not a bertlab.TrainConfig",
                       f"{fix}, e.g. TrainConfig(max_steps=100, batch_size=32); its checks then "
                       f"name any bad setting")


def lr_at(step: int, config: TrainConfig, elapsed_s: float = 0.0) -> float:
    """Return the learning rate of step `step`: linear warmup, then linear/cosine/constant decay.

    Taught in notebooks/05_pretraining.ipynb
    """
    done = []  # how far the run is, 0 -> 1: by its steps, its minutes, or the further of the two
    if config.max_steps is not None:
        done.append((step + 1) / config.max_steps)
    if config.max_minutes is not None:
        done.append(elapsed_s / (60.0 * config.max_minutes))
    progress = min(1.0, max(done))
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
