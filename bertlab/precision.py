"""Which arithmetic this machine does natively, and the dtype Muon's Newton-Schulz runs in.

`cpu_has_native_bf16` says whether this CPU multiplies bf16 matrices in hardware (elsewhere torch
emulates them, many times slower than fp32); `resolve_newton_schulz` turns
`TrainConfig.newton_schulz` into the dtype a run uses, by that capability and never by a timing,
so a run's numbers never depend on how busy the machine is.

Taught in notebooks/05_pretraining.ipynb
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

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
