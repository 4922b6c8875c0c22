"""Reproduce traces: the first steps of a shipped model's own command, so a changed stream shows.

A model made on a CPU (models/*/MANIFEST.json) or a record of benchmarks/results/ carries a
trace: its pretraining command, with the same `--max-steps` (the schedule depends on it), stopped
after its first N steps (`--stop-after N`), one thread and fp32 pinned, and Muon's Newton-Schulz
dtype as this machine resolved it (`newton_schulz`; bf16 for a trace recorded before that
setting); the history rows those steps gave; and the SHA-256 of the weights they left. `replay` runs the command again with
today's code and names every field that differs. Times and rates are left out: they belong to a
machine, not to the stream.

A benchmark record (benchmarks/results/*.json) carries a trace of one cheap cell instead: the
benchmark script's own `--trace` mode runs that cell (or its first steps) and prints what it gave
as JSON; `replay_script` runs it again and names every number that moved.

If a change to the code moves the training stream (the data order, the masks, the pairs, the
initial weights, the optimizer's arithmetic), a trace no longer replays, and the test that
replays every trace (tests/test_traces.py) fails naming the model to re-make, instead of the
course quoting a model its code can no longer build.

The same code computes other bits on another CPU: matrix kernels differ by instruction set and
library version, and over thousands of steps the difference grows into another model (the
shipped course-tiny, made on another machine, is one: the same commit trains another file
here). So a trace notes the machine it was recorded on and is kept short, and a replay compares
exactly only on that machine. Elsewhere every count, step and string must still be equal, and
every real number equal to a relative `CROSS_MACHINE_RTOL`: the first few hundred steps of one
command on an Intel Xeon and an AMD EPYC differed by less than 1e-6 relative, while anything
that moves the stream (another mask, pair, order, initial weight or learning rate) moves the
first losses by far more than that. The weights' hash is compared on the same machine only.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bertlab.precision import resolve_newton_schulz

REPO = Path(__file__).resolve().parents[2]
# A history row's fields that depend on the machine and its load, not on the stream.
TIMING = ("elapsed_s", "tokens_per_s")
OUT = "{out}"  # where a trace's command writes; replay puts a temporary folder there
# How far a real number may move when a trace is replayed on another machine than its own: 100x
# the largest kernel difference measured between two CPUs, far below what a moved stream does.
CROSS_MACHINE_RTOL = 1e-4


def git_commit(repo: Path = REPO) -> str | None:
    """Return the commit checked out in `repo`, with "+dirty" when bertlab/ has changes (None
    outside a git checkout)."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)

    head = git("rev-parse", "HEAD")
    if head.returncode:
        return None
    dirty = git("status", "--porcelain", "--", "bertlab").stdout.strip()
    return head.stdout.strip() + ("+dirty" if dirty else "")


def machine() -> dict[str, Any]:
    """Return what a run's arithmetic depends on besides the code: the CPU, the kernel set torch
    picks for it, and the versions of torch and its math libraries."""
    import torch

    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in
             (cpuinfo.read_text().splitlines() if cpuinfo.is_file() else [])
             if line.startswith("model name")]
    libraries = [line.strip("- ").strip() for line in torch.__config__.show().splitlines()
                 if "Math Kernel" in line or "MKL-DNN" in line or "oneDNN" in line]
    return {"cpu": names[0] if names else platform.processor(),
            "capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
            "libraries": libraries}


def trace_command(command: list[str], steps: int) -> list[str]:
    """Return `command` (a `python -m bertlab pretrain` argument list) as a trace runs it: the
    first `steps` steps, one thread, quiet, into OUT, in the command's own --precision (fp32
    when it names none). The run's own --out, --threads and progress flags are replaced;
    everything else is kept as it was."""
    dropped = {"--out": 1, "--threads": 1, "--stop-after": 1, "--resume": 0,
               "--no-progress": 0, "--progress": 0, "--log-interval": 1}
    kept, skip = [], 0
    for arg in command:
        if skip:
            skip -= 1
        elif arg in dropped:
            skip = dropped[arg]
        else:
            kept.append(arg)
    if kept[:1] != ["pretrain"]:
        raise ValueError(f"a trace replays a pretrain command, not {' '.join(command[:1])!r}")
    pinned = [] if "--precision" in kept else ["--precision", "fp32"]
    return [*kept, "--stop-after", str(steps), "--threads", "1", *pinned, "--no-progress",
            "--out", OUT]


def trace_env(newton_schulz: str) -> dict[str, str]:
    """Return the environment a trace's command runs in: one thread, and Muon's Newton-Schulz
    dtype pinned to the one the trace was recorded with (a trace recorded before the setting
    existed ran bf16, the only dtype then)."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
            "BERTLAB_NEWTON_SCHULZ": newton_schulz}


def newton_schulz_here() -> str:
    """Return the Newton-Schulz dtype a CPU run resolves "auto" to on this machine."""
    import torch

    return resolve_newton_schulz("auto", torch.device("cpu"))


def run_trace(command: list[str], out: Path, newton_schulz: str = "bf16") -> dict[str, Any]:
    """Run a trace's command into `out` (a new folder) and return what it gave: the history rows
    without their times and rates, and the SHA-256 of the weights at the last step."""
    args = [str(out) if a == OUT else a for a in command]
    env = trace_env(newton_schulz)
    done = subprocess.run([sys.executable, "-m", "bertlab", *args], capture_output=True,
                          text=True, env=env, cwd=REPO)
    if done.returncode:
        raise RuntimeError(f"the trace's command failed (exit {done.returncode}): "
                           f"python -m bertlab {' '.join(args)}\n{done.stderr[-2000:]}")
    history = json.loads((out / "history.json").read_text(encoding="utf-8"))
    newest = max((out / "checkpoints").iterdir())
    weights = hashlib.sha256((newest / "model.safetensors").read_bytes()).hexdigest()
    return {"history": [{k: v for k, v in row.items() if k not in TIMING} for row in history],
            "weights_sha256": weights, "checkpoint": newest.name}


def make_trace(command: list[str], steps: int) -> dict[str, Any]:
    """Return the trace of `command`'s first `steps` steps, run now with this checkout's code."""
    replayed, newton_schulz = trace_command(command, steps), newton_schulz_here()
    with tempfile.TemporaryDirectory(prefix="bertlab-trace-") as tmp:
        gave = run_trace(replayed, Path(tmp) / "run", newton_schulz)
    return {"command": replayed, "steps": steps, "commit": git_commit(), "machine": machine(),
            "newton_schulz": newton_schulz, **gave}


def recorded_here(trace: dict[str, Any]) -> bool:
    """Return whether `trace` was recorded on a machine like this one (same CPU, kernel set and
    libraries), where its replay must give every bit again."""
    return trace.get("machine") in (None, machine())


def replay(trace: dict[str, Any]) -> list[str]:
    """Return what differs between `trace` and its command run again now (empty: it replays):
    exactly on the machine it was recorded on, within `CROSS_MACHINE_RTOL` elsewhere."""
    with tempfile.TemporaryDirectory(prefix="bertlab-trace-") as tmp:
        now = run_trace(trace["command"], Path(tmp) / "run", trace.get("newton_schulz", "bf16"))
    return differences(trace, now, exact=recorded_here(trace))


def differences(trace: dict[str, Any], now: dict[str, Any], exact: bool = True) -> list[str]:
    """Return one line per field of `trace` that `now` does not give: exactly, or with
    `exact=False` (another machine) equal counts and real numbers within CROSS_MACHINE_RTOL,
    and no weights' hash."""
    found = []
    before, after = trace["history"], now["history"]
    if [r["step"] for r in before] != [r["step"] for r in after]:
        found.append(f"history steps {[r['step'] for r in before]} -> "
                     f"{[r['step'] for r in after]}")
    for old, new in zip(before, after, strict=False):
        for key in sorted(set(old) | set(new)):
            if not same_value(old.get(key), new.get(key), exact):
                found.append(f"step {old.get('step')}: {key} {old.get(key)!r} -> "
                             f"{new.get(key)!r}")
    if exact and trace["weights_sha256"] != now["weights_sha256"]:
        found.append(f"weights after {trace['checkpoint']}: sha256 {trace['weights_sha256'][:12]} "
                     f"-> {now['weights_sha256'][:12]}")
    return found


def same_value(before: Any, after: Any, exact: bool = True) -> bool:
    """Return whether two values of a trace agree: equal, or with `exact=False` two real numbers
    (not counts) within CROSS_MACHINE_RTOL of each other."""
    if exact or not all(isinstance(v, float) for v in (before, after)):
        return before == after
    return math.isclose(before, after, rel_tol=CROSS_MACHINE_RTOL, abs_tol=1e-9)


# ---------------------------------------------------------------------------------------------
# A benchmark record's trace: one cheap cell, run by the benchmark script's own code


def run_script(command: list[str], newton_schulz: str = "bf16") -> dict[str, Any]:
    """Run `python COMMAND` (a benchmark script with `--trace ...`) on one thread from the
    repository root, Muon's Newton-Schulz in `newton_schulz`; return the JSON object its last
    line of output prints."""
    env = trace_env(newton_schulz)
    done = subprocess.run([sys.executable, *command], capture_output=True, text=True, env=env,
                          cwd=REPO)
    if done.returncode:
        raise RuntimeError(f"the trace's command failed (exit {done.returncode}): python "
                           f"{' '.join(command)}\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def make_script_trace(command: list[str], what: str) -> dict[str, Any]:
    """Return the trace of a benchmark's cheap cell: `command` (see `run_script`) run now with this
    checkout's code, what it gave, the commit and the machine."""
    newton_schulz = newton_schulz_here()
    return {"what": what, "command": command, "commit": git_commit(), "machine": machine(),
            "newton_schulz": newton_schulz, "gave": run_script(command, newton_schulz)}


def replay_script(trace: dict[str, Any]) -> list[str]:
    """Return what differs between a benchmark trace and its command run again now (exactly
    on the machine it was recorded on, within CROSS_MACHINE_RTOL elsewhere; no hashes then)."""
    exact = recorded_here(trace)
    gave, now = trace["gave"], run_script(trace["command"], trace.get("newton_schulz", "bf16"))
    if not exact:
        gave, now = ({k: v for k, v in d.items() if k != "weights_sha256"} for d in (gave, now))
    return compare_values(gave, now, exact=exact)


def compare_values(before: Any, after: Any, where: str = "", exact: bool = True) -> list[str]:
    """Return one line per value that differs between two JSON values, named by its path (see
    `same_value` for `exact`)."""
    if isinstance(before, dict) and isinstance(after, dict):
        return [line for key in sorted(set(before) | set(after), key=str)
                for line in compare_values(before.get(key), after.get(key),
                                           f"{where}.{key}" if where else str(key), exact)]
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        return [line for i, (a, b) in enumerate(zip(before, after, strict=True))
                for line in compare_values(a, b, f"{where}[{i}]", exact)]
    return [] if same_value(before, after, exact) else [f"{where or 'value'}: {before!r} -> {after!r}"]
