"""Where and how the arithmetic runs: the device, mixed precision, torch.compile and DDP.

The training loop calls these once per run: `resolve_device`, `resolve_precision` and
`resolve_newton_schulz` (Muon's arithmetic, by what the CPU does natively) read the settings, `fast_math` sets the process-wide switches for the run and restores them after, and
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
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

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


# oneDNN's instruction-set caps (ONEDNN_MAX_CPU_ISA) below the first with bf16 arithmetic: under
# one of them bf16 matmuls are emulated even on a CPU that has the instructions.
_ISA_WITHOUT_BF16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX512_CORE", "AVX512_CORE_VNNI")
# /proc/cpuinfo flags of bf16 matrix arithmetic: x86's AMX and AVX-512 BF16, Arm's BF16.
_BF16_FLAGS = {"amx_bf16", "avx512_bf16", "bf16"}


def cpu_has_native_bf16() -> bool:
    """Return whether this CPU multiplies bf16 matrices in hardware (AMX-BF16 or AVX-512 BF16 on
    x86, the BF16 extension on Arm) and oneDNN may use it (ONEDNN_MAX_CPU_ISA does not cap it
    below). Elsewhere torch emulates a bf16 matmul, many times slower than fp32."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", os.environ.get("DNNL_MAX_CPU_ISA", "")).upper()
    if cap in _ISA_WITHOUT_BF16:
        return False
    if sys.platform == "darwin":  # Apple silicon says so through sysctl, not /proc
        done = subprocess.run(["sysctl", "-n", "hw.optional.arm.FEAT_BF16"],
                              capture_output=True, text=True)
        return done.stdout.strip() == "1"
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return False
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return bool(_BF16_FLAGS & set(value.split()))
    return False


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
            "native_bf16": cpu_has_native_bf16(), "commit": commit}


NEWTON_SCHULZ = ("auto", "bf16", "fp32")


def resolve_newton_schulz(setting: str, device: torch.device) -> str:
    """Return "bf16" or "fp32": the dtype of Muon's Newton-Schulz iterations for `setting`
    (TrainConfig.newton_schulz) on `device`.

    "auto" is bf16 where bf16 matmuls are native (a GPU, or `cpu_has_native_bf16`) and fp32
    elsewhere: on a CPU without them the iterations in bf16 make the whole step 4-5x slower, and
    in fp32 they are as fast as the rest of the step. The environment variable
    BERTLAB_NEWTON_SCHULZ (bf16 or fp32) overrides "auto" for a whole process: a reproduce trace
    recorded before the setting existed replays with it set to bf16.
    """
    if setting == "auto":
        setting = os.environ.get("BERTLAB_NEWTON_SCHULZ", "auto") or "auto"
        if setting not in NEWTON_SCHULZ:
            raise ValueError(f"BERTLAB_NEWTON_SCHULZ={setting!r} is not one of bf16, fp32; "
                             f"unset it, or set one of them")
    if setting != "auto":
        return setting
    if device.type != "cpu":
        return "bf16"
    return "bf16" if cpu_has_native_bf16() else "fp32"


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
    (`bertlab.engine.fast.mlm_capacity`), so no data-dependent shape
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
