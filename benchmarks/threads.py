"""Torch threads for the course's small models, on a quiet CPU and beside one busy process.

torch starts with one thread per core. A tiny model's matrices are small, so a second thread
adds little work to split and a lot of waiting for it: when another program holds a core, each
step waits for the slower thread. This script measures it as the course runs: the demo's first
`--steps` pretraining steps (`recipe("course")`, BBC, its 3,000-step schedule, its evaluation
every 300 steps; `TrainConfig.stop_after` stops the run there), for each preset in `--presets`,
with 1 thread, with every core (torch's default), and with `bertlab.config.cpu_threads(preset)`
(the constant the demo, the notebooks, `pretrain` and the doctor use). Twice: on a quiet machine,
and beside one busy process (a Python loop that holds one core, as another program would).

Every measurement is its own process (a thread pool is set once per process), the settings
alternate round after round so that a drift of the machine hits them all, and the record gives
each one's median seconds for the timed steps (data built first, not timed), with the ratio of
torch's default to the course's choice.

Usage: python benchmarks/threads.py [--presets tiny mini:100] [--steps 300] [--repeats 3]
Writes benchmarks/results/threads.json (or --out). Run it on an otherwise idle machine: the busy
process is the only other load it wants.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _record import REPO, write_record  # benchmarks/ is on sys.path when run as a script

RESULTS = Path(__file__).resolve().parent / "results"
BUSY = "while True: pass"  # one core held by another program


def worker(preset: str, threads: int | None, steps: int) -> dict:
    """Train the demo's first `steps` steps of `preset` with `threads`; return the timing."""
    import torch

    from bertlab.data import LoaderOptions, pretraining_loader
    from bertlab.model import BertForPreTraining
    from bertlab.pretraining import pretrain
    from bertlab.readers import load_corpus
    from bertlab.recipes import DEMO_STEPS, VAL_SEQ_LEN, recipe
    from bertlab.tokenizer import train_tokenizer

    if threads is not None:
        torch.set_num_threads(threads)
    course = recipe("course")
    docs = load_corpus("bbc")
    tok = train_tokenizer(docs, vocab_size=8192)
    train = pretraining_loader(docs, tok, split="train", seed=0, options=course.loader_options())
    val = pretraining_loader(docs, tok, split="validation", seed=0,
                             options=LoaderOptions(batch_size=32, max_seq_len=VAL_SEQ_LEN))
    model = BertForPreTraining(course.model_config(preset, tok.get_vocab_size()),
                               generator=torch.Generator().manual_seed(0))
    config = course.train_config(max_steps=DEMO_STEPS, stop_after=steps,
                                 eval_interval=DEMO_STEPS // 10, eval_batches=20,
                                 checkpoint_interval=None, progress=False, log_interval=0)
    start = time.perf_counter()
    result = pretrain(model, train, val, config, objectives=course.objectives)
    return {"seconds": time.perf_counter() - start, "steps": result.steps,
            "threads": torch.get_num_threads()}


def measure(preset: str, threads: int | None, steps: int, busy: bool) -> dict:
    """Run one `worker` in its own process, beside a busy process if `busy`."""
    other = subprocess.Popen([sys.executable, "-c", BUSY]) if busy else None
    try:
        done = subprocess.run([sys.executable, __file__, "--worker", preset,
                               str(threads or 0), str(steps)], capture_output=True, text=True,
                              cwd=REPO, check=False,
                              env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    finally:
        if other is not None:
            other.kill()
            other.wait()
    if done.returncode != 0:
        raise SystemExit(f"threads: the {preset} run with {threads} thread(s) failed:\n"
                         f"{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", nargs="+", default=["tiny", "mini:100"],
                        help="presets, each NAME or NAME:STEPS (default steps: --steps)")
    parser.add_argument("--steps", type=int, default=300, help="the demo's first N steps")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "threads.json")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        preset, threads, steps = args.worker
        print(json.dumps(worker(preset, int(threads) or None, int(steps))))
        return 0
    from bertlab.config import cpu_threads
    from bertlab.course.doctor import load_average

    cores = os.cpu_count() or 1
    settings = {"1 thread": 1, f"{cores} threads (torch's default)": None}
    steps = {name: int(n or args.steps)
             for name, _, n in (p.partition(":") for p in args.presets)}
    chosen = {p: cpu_threads(p) for p in steps}
    seconds: dict[str, list[float]] = {}
    load_before = load_average()
    for round_ in range(args.repeats):
        for preset in steps:
            for busy in (False, True):
                for name, threads in settings.items():
                    key = f"{preset}, {'beside one busy process' if busy else 'quiet'}, {name}"
                    took = measure(preset, threads, steps[preset], busy)
                    seconds.setdefault(key, []).append(took["seconds"])
                    print(f"round {round_ + 1}: {key}: {took['seconds']:.1f} s for "
                          f"{took['steps']} steps", flush=True)
    median = {k: statistics.median(v) for k, v in seconds.items()}
    ratios = {}
    for preset in steps:
        mine = "1 thread" if chosen[preset] == 1 else f"{cores} threads (torch's default)"
        for where in ("quiet", "beside one busy process"):
            default = median[f"{preset}, {where}, {cores} threads (torch's default)"]
            ratios[f"{preset}, {where}"] = {
                "choice": f"{chosen[preset]} thread(s)" if chosen[preset] else "torch's default",
                "default / choice": default / median[f"{preset}, {where}, {mine}"]}
    for key, value in ratios.items():
        print(f"{key}: torch's default takes {value['default / choice']:.2f}x the time of the "
              f"course's choice ({value['choice']})")
    write_record("threads.py", args, argv, args.out, cores=cores, steps=steps, course_threads=chosen,
                 load_average_before=load_before, load_average_after=load_average(),
                 seconds=seconds, median_seconds=median, ratios=ratios)
    return 0


if __name__ == "__main__":
    sys.exit(main())
