"""Where and how the arithmetic runs: the device, mixed precision, torch.compile and DDP.

The training loop calls these once per run: `resolve_device`, `resolve_precision` and
`bertlab.precision.resolve_newton_schulz` (Muon's arithmetic, by what the CPU does natively) read the settings, `fast_math` sets the process-wide switches for the run and restores them after, and
`wrap_model` compiles the model and wraps it in DistributedDataParallel under torchrun.
`from_rank0` keeps every process's time-based decisions identical; on one process it does
nothing. What the step itself does per batch (autocast, moving a batch, summing the step's
denominators over the processes) sits beside the step, in `bertlab.train`.
"""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import warnings
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from bertlab import precision
from bertlab.config import rank_world


def resolve_device(spec: str = "auto") -> torch.device:
    """Return the torch.device for "auto" (CUDA, else MPS, else CPU) or an explicit name.

    Under torchrun, "auto" and "cuda" mean this process's GPU (cuda:LOCAL_RANK).
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
    if spec == "mps" and not (getattr(torch.backends, "mps", None) is not None
                              and torch.backends.mps.is_available()):
        raise ValueError("device='mps' was asked for but MPS (the GPU of Apple silicon) is not "
                         "available here; use device='auto' or 'cpu'")
    if spec == "cuda":
        return torch.device("cuda", local_rank)
    if spec.startswith("cuda:") and int(spec[5:]) >= torch.cuda.device_count():
        raise ValueError(f"device={spec!r}: this machine has {torch.cuda.device_count()} CUDA "
                         f"device(s), numbered from 0; pick one of them or use device='cuda'")
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


def made_with() -> dict[str, str | bool | None]:
    """Return what a run's numbers depend on besides its settings: the versions of bertlab,
    torch and Python, the platform, the CPU's bf16, and the git commit (with "+dirty" for
    changes in bertlab/) when bertlab runs from a checkout, else None."""
    checkout = Path(__file__).resolve().parents[2]
    commit = None
    if (checkout / ".git").exists():
        def git(*args: str) -> str:
            return subprocess.run(["git", *args], cwd=checkout, capture_output=True,
                                  text=True).stdout.strip()
        head = git("rev-parse", "HEAD")
        commit = (head + ("+dirty" if git("status", "--porcelain", "--", "bertlab") else "")
                  if head else None)
    try:
        version = metadata.version("bertlab")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        version = None
    return {"bertlab": version, "torch": torch.__version__,
            "python": platform.python_version(), "platform": platform.platform(),
            "native_bf16": precision.cpu_has_native_bf16(), "commit": commit}




def resolve_compile(compile: bool | None, device: torch.device) -> bool:
    """Return whether the training loop compiles the model: `compile`, or None for on with CUDA."""
    return device.type == "cuda" if compile is None else compile


@contextlib.contextmanager
def fast_math(device: torch.device) -> Iterator[None]:
    """Set the process-wide switches a training run wants for the `with` block; restore them after.

    torch has these only as global flags, so the loop sets them once, here, and a caller's own
    settings come back when the run ends:

    - on CUDA, TF32 for matmuls and convolutions: what autocast leaves in fp32 runs on the
      tensor cores (a 10-bit mantissa, plenty for training).

    A compiled run needs no switch of its own: the compiled MLM head has a fixed number of rows
    (`bertlab.pretraining.mlm_capacity`), so no data-dependent shape
    needs dynamo's `capture_dynamic_output_shape_ops`.
    """
    with contextlib.ExitStack() as stack:
        if device.type == "cuda":
            before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
            stack.callback(_set_tf32, *before)
        yield


def _set_tf32(matmul: bool, cudnn: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def wrap_model(model: nn.Module, device: torch.device, compile: bool) -> nn.Module:
    """Return the module to train: `model` compiled if asked, under DistributedDataParallel when
    a process group is active. The parameters stay those of `model`."""
    train_model: nn.Module = torch.compile(model) if compile else model
    if rank_world()[1] == 1:
        return train_model
    ddp_ids = [device.index] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(train_model, device_ids=ddp_ids)


# ---------------------------------------------------------------------------------------------
# Distributed data parallel (torchrun)


def init_distributed() -> tuple[int, int]:
    """Return (rank, world_size); under torchrun, first join the process group (NCCL or gloo).

    Without torchrun this is (0, 1) and nothing happens. The training loop then wraps the
    model in DistributedDataParallel whenever a process group is active.
    """
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world > 1 and not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
            dist.init_process_group("nccl")
        else:
            dist.init_process_group("gloo")
    return rank_world()


def from_rank0(value: float, device: torch.device) -> float:
    """Return rank 0's `value` on every process, so all take the same time-based decisions."""
    if rank_world()[1] == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.broadcast(t, src=0)
    return t.item()


def close_distributed(together: bool = True) -> None:
    """Leave the process group and close it (nothing to do in a single process).

    A process that exits while gloo's threads are still up can abort ("terminate called without
    an active exception"), so every way out closes the group. After success the ranks leave
    `together` (a barrier first); a rank that failed passes together=False and closes its side
    without waiting, since a barrier would hang it beside partners that are elsewhere (torchrun
    then stops them).
    """
    if dist.is_available() and dist.is_initialized():
        if together:
            dist.barrier()
        dist.destroy_process_group()


def __getattr__(name: str):
    """The names that moved to `bertlab.precision`, for one release, with a DeprecationWarning."""
    if name in ("resolve_newton_schulz", "NEWTON_SCHULZ"):
        warnings.warn(f"bertlab.engine.device.{name} is now bertlab.precision.{name}; the old "
                      f"name goes in the next release", DeprecationWarning, stacklevel=2)
        return getattr(precision, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
