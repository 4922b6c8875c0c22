"""The course recipe's step with Muon's Newton-Schulz in bf16 and in fp32, against AdamW, on this CPU.

`torch.optim.Muon` runs its Newton-Schulz iterations in bf16. Where bf16 matmuls are native (a
GPU, a CPU with AMX or AVX-512 BF16) that is fast; elsewhere torch emulates them, and the whole
step slows down several times. bertlab's Muon (`bertlab.train.Muon`) runs them in the dtype
`TrainConfig.newton_schulz` resolves to (`bertlab.precision.resolve_newton_schulz`). This
script measures what that choice costs and whether it changes what the model learns.

Stage `speed` (minutes): first the cause, one 512 x 128 by 128 x 128 matmul in fp32 and in bf16
(the Newton-Schulz shape of a tiny model's feed-forward matrix; median microseconds); then the
course recipe's training step (tiny, 16 x 64-token pairs, `pretrain` as notebook 05 runs it) in
three arms, Muon with bf16 and with fp32 iterations and AdamW for every parameter, alternating
arm after arm `--repeats` times so a noisy machine hits all three; median steps/s of each and
each Muon arm's ratio to AdamW's. With `--emulate` the same runs again in a child process whose
oneDNN and ATen may use no instruction past AVX2 (ONEDNN_MAX_CPU_ISA=AVX2,
ATEN_CPU_CAPABILITY=avx2): a CPU without native bf16, emulated on one that has it. The record
names the CPU, its bf16 flags and the kernel set torch picked, for each.

Stage `learning` (about 2 core-hours on a CPU without native bf16): the course recipe for
`--learning-steps` (2,500; notebook 05's run is shorter), evaluated on the course's 64-token
yardstick as notebook 05 evaluates it, with fp32 and with
bf16 iterations, for each seed; held-out [MASK] accuracy, and the fp32 - bf16 difference paired
by seed with two standard errors and its verdict (`bertlab.course.twins.verdict`).

Usage:
  python benchmarks/optimizer.py --stage speed --emulate
  python benchmarks/optimizer.py --stage learning --seeds 0 1 2 --jobs 2
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from _record import REPO, write_record

from bertlab.course.twins import verdict
from bertlab.data import LoaderOptions, pretraining_loader
from bertlab.model import BertForPreTraining
from bertlab.precision import cpu_has_native_bf16
from bertlab.pretraining import pretrain
from bertlab.readers import load_corpus
from bertlab.recipes import VAL_SEQ_LEN, recipe
from bertlab.tokenizer import train_tokenizer

ARMS = {"muon, Newton-Schulz bf16": dict(newton_schulz="bf16"),
        "muon, Newton-Schulz fp32": dict(newton_schulz="fp32"),
        "adamw": dict(optimizer="adamw")}
QUIET = dict(checkpoint_interval=None, progress=False, log_interval=0, compile=False)
EMULATED = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
VOCAB = 8192  # the course's vocabulary
LEARNING_STEPS = 2500  # the learning stage's run: the course recipe's sweep length (notebook 07)
# The course's earlier machine, where bf16 is native: quoted from notebook 05's stored output of
# that day (this script did not measure it), so the notebook can set both kinds side by side.
COURSE_MACHINE = {"cpu": "Intel Xeon with AMX (native bf16)", "steps": 2500, "threads": 2,
                  "training_minutes": 2.1, "steps_per_s": 20.1, "one_thread_steps_per_s": 12.0,
                  "source": "quoted from the stored runs of notebooks 05 (2 threads) and 09 "
                            "(section 4, 1 thread) of 2026-12-05, commit 7f3e1fd"}


def cpu() -> dict[str, Any]:
    """Return the CPU as a record names it: model, bf16 flags, torch's kernel set, and whether
    bertlab counts bf16 matmuls as native here (under this process's environment)."""
    names, flags = [], set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and not names:
            names.append(value.strip())
        elif key.strip() in ("flags", "Features") and not flags:
            flags = set(value.split())
    return {"cpu": names[0] if names else None,
            "bf16_flags": sorted(flags & {"amx_bf16", "avx512_bf16", "bf16"}),
            "avx512": "avx512f" in flags,
            "torch_capability": torch.backends.cpu.get_cpu_capability(),
            "native_bf16": cpu_has_native_bf16(),
            "environment": {k: os.environ[k] for k in EMULATED if k in os.environ}}


def matmul_us(dtype: torch.dtype, repeats: int = 50) -> float:
    """Return the median microseconds of a (512, 128) @ (128, 128) matmul in `dtype`."""
    a, b = torch.randn(512, 128).to(dtype), torch.randn(128, 128).to(dtype)
    a @ b  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 1e6 * statistics.median(times)


def setup(seed: int = 0) -> tuple[Any, Any, int]:
    """Return notebook 05's training and validation loaders (BBC, the course's tokenizer)."""
    docs = load_corpus("bbc")
    tok = train_tokenizer(docs, vocab_size=VOCAB)  # cached, as the notebooks train it
    course = recipe("course")
    train = pretraining_loader(docs, tok, split="train", seed=seed,
                               options=course.loader_options())
    val = pretraining_loader(docs, tok, split="validation", seed=0,
                             options=LoaderOptions(batch_size=32, max_seq_len=VAL_SEQ_LEN))
    return train, val, tok.get_vocab_size()


def steps_per_s(arm: dict[str, Any], train: Any, vocab: int, steps: int) -> float:
    """Return the training steps/s of `steps` course-recipe steps in `arm` (3 warm-up steps
    first, untimed), from a fresh tiny model."""
    course = recipe("course")
    model = BertForPreTraining(course.model_config("tiny", vocab),
                               generator=torch.Generator().manual_seed(0))
    settings = dict(QUIET, eval_interval=None, **arm)
    pretrain(model, train, None, course.train_config(max_steps=3, **settings),
             objectives=course.objectives)
    result = pretrain(model, train, None, course.train_config(max_steps=steps, **settings),
                      objectives=course.objectives)
    return result.steps / result.elapsed_s


def speed(repeats: int, steps: int) -> dict[str, Any]:
    """Return this process's speed measurements: the matmuls and the three arms (see above)."""
    matmul = {name: matmul_us(dtype) for name, dtype in
              (("fp32", torch.float32), ("bf16", torch.bfloat16))}
    train, _, vocab = setup()
    rates: dict[str, list[float]] = {name: [] for name in ARMS}
    for _ in range(repeats):
        for name, arm in ARMS.items():
            rates[name].append(steps_per_s(arm, train, vocab, steps))
    medians = {name: statistics.median(r) for name, r in rates.items()}
    return {"cpu": cpu(), "threads": torch.get_num_threads(),
            "matmul_512x128x128_us": {**matmul, "bf16 / fp32": matmul["bf16"] / matmul["fp32"]},
            "steps_per_s": {name: {"median": medians[name], "all": rates[name]} for name in ARMS},
            "ratio_to_adamw": {name: medians[name] / medians["adamw"] for name in ARMS
                               if name != "adamw"}}


def learn_one(job: tuple[str, int, int, int]) -> dict[str, Any]:
    """Return one learning run: notebook 05's run in Newton-Schulz dtype `dtype`, seed `seed`,
    scored on `eval_batches` validation batches (notebook 05's 20 for the record)."""
    dtype, seed, steps, eval_batches = job
    torch.set_num_threads(1)
    train, val, vocab = setup(seed)
    course = recipe("course")
    model = BertForPreTraining(course.model_config("tiny", vocab),
                               generator=torch.Generator().manual_seed(seed))
    config = course.train_config(max_steps=steps, eval_interval=steps // 10,
                                 eval_batches=eval_batches,
                                 seed=seed, newton_schulz=dtype, **QUIET)
    start = time.time()
    result = pretrain(model, train, val, config, objectives=course.objectives)
    last = result.history[-1]
    return {"newton_schulz": dtype, "seed": seed, "steps": result.steps,
            "mask_accuracy": last["val_mask_accuracy"],
            "mask_unigram_accuracy": last["val_mask_unigram_accuracy"],
            "mask_loss": last["val_mask_loss"], "train_steps_per_s": result.steps / result.elapsed_s,
            "wall_minutes": (time.time() - start) / 60,
            "curve": [(h["step"], h["val_mask_accuracy"]) for h in result.history]}


def paired_difference(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Return fp32 minus bf16 [MASK] accuracy, paired by seed: mean, two standard errors, n, the
    per-seed differences, and its verdict."""
    by = {(r["newton_schulz"], r["seed"]): r["mask_accuracy"] for r in runs}
    seeds = sorted({r["seed"] for r in runs})
    gaps = [by["fp32", s] - by["bf16", s] for s in seeds]
    two_se = 2 * statistics.stdev(gaps) / math.sqrt(len(gaps)) if len(gaps) > 1 else math.inf
    difference = {"mean": statistics.mean(gaps), "two_se": two_se, "n": len(gaps),
                  "per_seed": gaps}
    return {**difference, "verdict": verdict(difference),
            "rule": "paired by seed: higher or lower when mean +- 2 SE excludes 0"}


def run_emulated(argv: list[str]) -> dict[str, Any]:
    """Return the speed stage as a child process measures it on an emulated CPU without native
    bf16 (oneDNN and ATen capped at AVX2)."""
    env = {**os.environ, **EMULATED}
    done = subprocess.run([sys.executable, __file__, *argv, "--child"], env=env, cwd=REPO,
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"the emulated run failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def check_args(args: argparse.Namespace) -> None:
    for name in ("repeats", "steps", "jobs", "eval_batches"):
        if getattr(args, name) < 1:
            raise SystemExit(f"error: --{name.replace('_', '-')} {getattr(args, name)}: must be at least 1")
    if args.learning_steps < 10:
        raise SystemExit(f"error: --learning-steps {args.learning_steps}: must be at least 10")
    if args.out.is_dir():
        raise SystemExit(f"error: --out {args.out} is a folder; pass a .json file path")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stage", choices=("speed", "learning"), default="speed")
    parser.add_argument("--repeats", type=int, default=5, help="speed: rounds of the three arms")
    parser.add_argument("--steps", type=int, default=40, help="speed: timed steps per arm")
    parser.add_argument("--threads", type=int, default=1, help="speed: torch threads")
    parser.add_argument("--emulate", action="store_true",
                        help="speed: also measure on an emulated CPU without native bf16")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--learning-steps", type=int, default=LEARNING_STEPS)
    parser.add_argument("--eval-batches", type=int, default=20,
                        help="learning: validation batches per evaluation (notebook 05's 20)")
    parser.add_argument("--jobs", type=int, default=1, help="learning: runs at once (1 thread each)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.out = args.out or REPO / "benchmarks" / "results" / f"optimizer-{args.stage}.json"
    check_args(args)
    torch.set_num_threads(args.threads)
    if args.stage == "speed":
        here = speed(args.repeats, args.steps)
        if args.child:
            print(json.dumps(here))
            return
        measured = {"here": here, "course_machine": COURSE_MACHINE}
        if args.emulate:
            child = ["--stage", "speed", "--repeats", str(args.repeats), "--steps",
                     str(args.steps), "--threads", str(args.threads)]
            measured["emulated_without_bf16"] = run_emulated(child)
        for where, m in ((w, m) for w, m in measured.items() if w != "course_machine"):
            print(f"{where}: {m['cpu']['cpu']} ({m['cpu']['torch_capability']}, native bf16 "
                  f"{m['cpu']['native_bf16']}); matmul bf16/fp32 "
                  f"{m['matmul_512x128x128_us']['bf16 / fp32']:.1f}x")
            for name, rate in m["steps_per_s"].items():
                ratio = m["ratio_to_adamw"].get(name)
                print(f"  {name:26s} {rate['median']:6.2f} steps/s"
                      + (f"  ({ratio:.2f}x AdamW)" if ratio is not None else ""))
        write_record("optimizer.py", args, argv, args.out, **measured)
        return
    # The slow arm first, so that the runs at once end together.
    jobs = [(dtype, seed, args.learning_steps, args.eval_batches) for dtype in ("bf16", "fp32")
            for seed in args.seeds]
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        runs = pool.map(learn_one, jobs, chunksize=1)
    summary = {"fp32 - bf16 mask_accuracy": paired_difference(runs)}
    for r in runs:
        print(f"seed {r['seed']} {r['newton_schulz']}: [MASK] accuracy {r['mask_accuracy']:.3f} "
              f"(no context {r['mask_unigram_accuracy']:.3f}), {r['train_steps_per_s']:.2f} steps/s")
    d = summary["fp32 - bf16 mask_accuracy"]
    print(f"fp32 - bf16: {d['mean']:+.4f} +- {d['two_se']:.4f} ({d['verdict']})")
    write_record("optimizer.py", args, argv, args.out, cpu=cpu(), runs=runs, summary=summary)


if __name__ == "__main__":
    main()
