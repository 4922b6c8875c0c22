"""What a GPU session measured, read for the notebooks, or plainly that none has run yet.

A GPU session (tools/gpu_session.py, then `benchmarks/twins.py score --device cuda`) writes two
records into benchmarks/results/: gpu_throughput.json (tokens/s and MFU, bertlab beside
transformers) and twins-gpu.json (the MLM + NSP runs and their MLM-only twins: what each
learned; the same format as the CPU twins' twins-cpu.json). The notebooks read them here, so a
cell on a CPU still shows the GPU's numbers, and says so in words when there are none: nothing
is skipped in silence. A record made on a CPU (a smoke run of the scripts) is refused: it is
not a GPU result.

Taught in notebooks/05_pretraining.ipynb and notebooks/06_cls_and_downstream.ipynb
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

THROUGHPUT, PRETRAIN = "gpu_throughput.json", "twins-gpu.json"
HOW = ("tools/gpu_session.py runs the scripts on a GPU (one H100/H200 session of minutes), then "
       "benchmarks/twins.py score --device cuda fills in what the runs learned")


@dataclass(frozen=True)
class GpuRecords:
    """The two GPU records (None where a GPU session has not written one) and where they live."""

    folder: Path
    throughput: dict[str, Any] | None
    pretrain: dict[str, Any] | None


def made_on_cpu(record: dict[str, Any]) -> bool:
    """Whether a record (or a run's summary) says it was made on the CPU: a smoke run, no GPU
    result. A record that names no device counts as one."""
    return str(record.get("device", "cpu")).lower() == "cpu"


def load_gpu_records(root: str | Path = "..") -> GpuRecords:
    """Return the GPU records under `root`/benchmarks/results (the repository's root; ".." from
    notebooks/). A record whose device is the CPU is a ValueError: smoke runs are not results."""
    folder = Path(root) / "benchmarks" / "results"
    found = {}
    for name in (THROUGHPUT, PRETRAIN):
        path = folder / name
        record = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
        if record is not None and made_on_cpu(record):
            raise ValueError(f"{path} was made on a CPU (a smoke run of the script), so it is not "
                             f"a GPU result; delete it ({HOW})")
        found[name] = record
    return GpuRecords(folder, found[THROUGHPUT], found[PRETRAIN])


def _share(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def throughput_lines(record: dict[str, Any] | None) -> list[str]:
    """Return one line per measured row (tokens/s, MFU, the ratio to transformers), or the
    sentence that there is no measurement yet."""
    if record is None:
        return [f"No GPU throughput record yet (benchmarks/results/{THROUGHPUT}): no GPU session "
                f"has run in this project, so the figures above are the formula's, not a "
                f"measurement. {HOW}."]
    lines = [f"{record['device']}, torch {record['torch']}, compile {record['compile']}; "
             f"measured bf16 matmul peak {record['matmul_peak_tflops']:.0f} TFLOP/s"]
    for r in record["rows"]:
        ratio = r.get("ratio_vs_transformers")
        unpadded = ", unpadded" if r.get("unpad") else ""
        lines.append(f"{r['preset']:>5} @ {r['seq_len']:>3} ({r['batch']}{unpadded}, batch "
                     f"{r['batch_size']}, compile {r.get('compile', 'whole')}): "
                     f"{r['tokens_per_s']:>12,.0f} tokens/s, MFU {_share(r['mfu'])} "
                     f"({_share(r['mfu_measured_peak'])} of the measured peak)"
                     + ("" if ratio is None else f", {ratio:.2f}x transformers"))
    return lines


def gpu_curves(record: dict[str, Any] | None,
               length: int = 128) -> dict[str, list[tuple[int, float]]]:
    """Return each run's validation curve on `length`-token pairs (128 or 64, the course's
    yardstick), [(tokens, [MASK] accuracy)], by run name ("mlm+nsp seed 0", ...): empty without
    a record."""
    if record is None:
        return {}
    return {f"{r['arm']} seed {r['seed']}": [(h["tokens"], h["mask_accuracy"])
                                             for h in r["history"][str(length)]]
            for r in record["runs"]}
