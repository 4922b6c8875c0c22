"""The search behind the nsp recipe: which settings learn next-sentence prediction on one CPU core.

Every trial pretrains BBC News with masked LM + NSP for a fixed step budget, at equal CPU work:
`base` trains `--base-steps` steps and every other trial the steps that cost as much, by the
seconds per step that `--stage calibrate` measured (benchmarks/results/nsp_search_calibration
.json: each process times every step cost in turn, so a load that drifts meets them all alike,
and only their ratios are used). A step budget, not a clock, so a trial that is cut off (Ctrl-C,
SIGTERM, a session that ends) resumes exactly from its checkpoint in
runs/nsp-search/<trial>-seed<k>/ instead of starting over: run the same command again. Trials
run as 1-thread processes, `--jobs 2` at a time, so each core trains one; the record gives each
trial's minutes and the load average beside them.

The score is held-out NSP accuracy on the course's 64-token validation pairs (all 2,122 of them,
seed 0), with accuracy at [MASK] beside it on the course's yardstick (BERT's masking, 15%,
80/10/10) at 64 and at 128 tokens, and the bar (always the most frequent target) on the same
targets. The word-overlap rule of notebook 03, fitted on training pairs, is scored on the same
validation pairs once, as the baseline NSP has to beat. Each finished trial appends one JSON
line to benchmarks/results/nsp_search.jsonl (settings, commit, minutes, load averages, the
history); a trial already recorded with the same settings, seed and steps is skipped.

The knobs (one at a time from `base`, the issue's probe: the course recipe with NSP on at 128
tokens, batch 32, 16 pair draws): the masking rate (15% against 40%: heavier masking corrupts the
text NSP reads), the length, the batch, the learning rate, the pair draws, bf16 and the preset.

Usage:
  python benchmarks/nsp_search.py --stage calibrate --jobs 2
  python benchmarks/nsp_search.py --stage screen --jobs 2 --base-steps 2000
  python benchmarks/nsp_search.py --stage bf16 --jobs 2      (3 seeds, fp32 against bf16)
  python benchmarks/nsp_search.py --show
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _record import REPO  # benchmarks/ is on sys.path when run as a script

RESULTS = REPO / "benchmarks" / "results"
RECORD = RESULTS / "nsp_search.jsonl"
CALIBRATION = RESULTS / "nsp_search_calibration.json"
RUNS = REPO / "runs" / "nsp-search"
VAL_PAIRS_SEQ = 64  # the course's yardstick (bertlab.recipes.VAL_SEQ_LEN)
EVAL_INTERVAL = 500
CHECKPOINT_INTERVAL = 250

BASE = dict(preset="tiny", mlm_probability=0.4, seq=128, batch=32, optimizer="muon", lr=1e-3,
            muon_lr=0.01, dropout=0.0, pair_draws=16, precision="fp32", warmup=0.06,
            schedule="linear")
TRIALS = {
    "base": BASE,
    "m15": {**BASE, "mlm_probability": 0.15},
    "s64": {**BASE, "seq": 64, "batch": 64},  # the same tokens a step, half as long
    "b64": {**BASE, "batch": 64},
    "lr2x": {**BASE, "lr": 2e-3, "muon_lr": 0.02},
    "draws1": {**BASE, "pair_draws": 1},
    "drop.1": {**BASE, "dropout": 0.1},
    "bf16": {**BASE, "precision": "bf16"},
    "mini-bf16": {**BASE, "preset": "mini", "precision": "bf16"},
}
STAGES = {"screen": ([*TRIALS], [0]), "bf16": (["base", "bf16"], [0, 1, 2])}


def run_trial(name: str, spec: dict, seed: int, steps: int, run_dir: Path) -> dict:
    """Pretrain one trial in this process (1 thread), resuming its run folder; return its record."""
    import torch

    torch.set_num_threads(1)
    import bertlab as bl
    from bertlab.course.doctor import load_average
    from bertlab.data import LoaderOptions, pretraining_loader
    from bertlab.masking import MaskingConfig

    load_start, start = load_average(), time.perf_counter()
    docs = bl.load_corpus("bbc")
    tok = bl.train_tokenizer(docs, vocab_size=8192)
    train = pretraining_loader(docs, tok, split="train", seed=seed, options=LoaderOptions(
        batch_size=spec["batch"], max_seq_len=spec["seq"], pairs="nsp",
        pair_draws=spec["pair_draws"],
        masking=MaskingConfig(mlm_probability=spec["mlm_probability"])))
    # The yardstick: BERT's masking, seed 0, every validation pair, at 128 and at 64 tokens.
    val = {"": pretraining_loader(docs, tok, split="validation", seed=0,
                                  options=LoaderOptions(batch_size=32, max_seq_len=128)),
           "64": pretraining_loader(docs, tok, split="validation", seed=0, options=LoaderOptions(
               batch_size=32, max_seq_len=VAL_PAIRS_SEQ))}
    config = bl.BertConfig.preset(spec["preset"], vocab_size=tok.get_vocab_size(),
                                  hidden_dropout=spec["dropout"],
                                  attention_dropout=spec["dropout"])
    model = bl.BertForPreTraining(config, generator=torch.Generator().manual_seed(seed))
    train_config = bl.TrainConfig(
        max_steps=steps, batch_size=spec["batch"], lr=spec["lr"], optimizer=spec["optimizer"],
        muon_lr=spec["muon_lr"], warmup_fraction=spec["warmup"], schedule=spec["schedule"],
        precision=spec["precision"], eval_interval=EVAL_INTERVAL,
        eval_batches=max(len(v) for v in val.values()), checkpoint_interval=CHECKPOINT_INTERVAL,
        device="cpu", seed=seed, progress=False, log_interval=0)
    resume = (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").iterdir())
    result = bl.pretrain(model, train, val, train_config, out_dir=run_dir, resume=resume,
                         objectives=("mlm", "nsp"))
    last = result.history[-1]
    return {"trial": name, "seed": seed, "steps": steps, "spec": spec,
            "tokens": result.tokens, "train_minutes": round(result.elapsed_s / 60, 2),
            # this sitting's minutes (a resumed trial's earlier sittings are in train_minutes)
            "wall_minutes_this_sitting": round((time.perf_counter() - start) / 60, 2),
            "resumed": resume, "load_average": [load_start, load_average()],
            "nsp_accuracy": last["val_64_nsp_accuracy"],
            "mask_accuracy_64": last["val_64_mask_accuracy"],
            "mask_unigram_accuracy_64": last["val_64_mask_unigram_accuracy"],
            "mask_accuracy_128": last["val_mask_accuracy"],
            "mask_unigram_accuracy_128": last["val_mask_unigram_accuracy"],
            "nsp_accuracy_128": last["val_nsp_accuracy"],
            "history": [{k: row[k] for k in ("step", "tokens", "elapsed_s", "train_loss",
                                             "val_64_nsp_accuracy", "val_64_mask_accuracy",
                                             "val_mask_accuracy", "val_nsp_accuracy")}
                        for row in result.history]}


# What a step costs depends on these settings alone: trials that share them (the learning rate,
# the pair draws) share a step budget, so they differ in nothing but their own setting.
# Dropout's few elementwise ops are left out: its trial gets the steps of the one it varies.
COST = ("preset", "seq", "batch", "mlm_probability", "precision")


def cost_key(spec: dict) -> str:
    """Return the name of `spec`'s step cost: its COST settings, as text."""
    return ",".join(f"{k}={spec[k]}" for k in COST)


class StepClock:
    """A training loader that notes the time each batch is asked for (one per optimizer step)."""

    def __init__(self, loader):
        self.loader, self.times = loader, []

    def __getattr__(self, name):
        return getattr(self.loader, name)

    def __iter__(self):
        for batch in self.loader:
            self.times.append(time.perf_counter())
            yield batch


def calibrate(names: list[str], rounds: int, steps: int = 40, timed: int = 25) -> dict:
    """Return the median seconds per warm training step of each cost among `names`' trials, on
    1 thread: `rounds` rounds through every cost in turn, so a load that drifts meets them all
    alike; each round trains `steps` steps and times the last `timed`."""
    import torch

    torch.set_num_threads(1)
    import bertlab as bl
    from bertlab.data import LoaderOptions, pretraining_loader
    from bertlab.masking import MaskingConfig

    docs = bl.load_corpus("bbc")
    tok = bl.train_tokenizer(docs, vocab_size=8192)
    specs = {cost_key(TRIALS[n]): TRIALS[n] for n in names}
    seconds: dict[str, list[float]] = {key: [] for key in specs}
    for _ in range(rounds):
        for key, spec in specs.items():
            options = LoaderOptions(
                batch_size=spec["batch"], max_seq_len=spec["seq"], pairs="nsp",
                masking=MaskingConfig(mlm_probability=spec["mlm_probability"]))
            train = StepClock(pretraining_loader(docs, tok, split="train", seed=0,
                                                 options=options))
            config = bl.BertConfig.preset(spec["preset"], vocab_size=tok.get_vocab_size(),
                                          hidden_dropout=spec["dropout"],
                                          attention_dropout=spec["dropout"])
            model = bl.BertForPreTraining(config, generator=torch.Generator().manual_seed(0))
            bl.pretrain(model, train, None, bl.TrainConfig(
                max_steps=steps, batch_size=spec["batch"], lr=spec["lr"],
                optimizer=spec["optimizer"], muon_lr=spec["muon_lr"],
                precision=spec["precision"], eval_interval=None, checkpoint_interval=None,
                device="cpu", progress=False, log_interval=0), objectives=("mlm", "nsp"))
            gaps = [b - a for a, b in zip(train.times, train.times[1:], strict=False)]
            seconds[key] += gaps[-timed:]
    return {key: statistics.median(times) for key, times in seconds.items()}


def step_budget(name: str, base_steps: int) -> int:
    """Return `name`'s step budget: the steps that cost what `base_steps` steps of `base` cost,
    by the calibration's seconds per step (their ratio: the load of the machine then moves
    every cost alike, so the ratio holds where the seconds do not)."""
    if not CALIBRATION.exists():
        raise SystemExit(f"nsp_search: {CALIBRATION.relative_to(REPO)} is missing; run "
                         f"--stage calibrate first")
    timed = {}
    for key, seconds in json.loads(CALIBRATION.read_text())["s_per_step"].items():
        settings = dict(part.split("=", 1) for part in key.split(","))
        if settings.get("dropout", "0.0") == "0.0":  # calibrations that also timed dropout
            timed.setdefault(",".join(f"{k}={settings[k]}" for k in COST), seconds)
    key, base = cost_key(TRIALS[name]), cost_key(TRIALS["base"])
    if key not in timed or base not in timed:
        raise SystemExit(f"nsp_search: the step cost of trial {name!r} ({key}) was not "
                         f"calibrated; run --stage calibrate --trials base {name}")
    return int(base_steps * timed[base] / timed[key] // 50 * 50)


def _key(record: dict) -> tuple:
    return (record["trial"], record["seed"], record["steps"],
            json.dumps(record["spec"], sort_keys=True))


def recorded() -> list[dict]:
    """Return every finished trial of the record, oldest first."""
    if not RECORD.exists():
        return []
    return [json.loads(line) for line in RECORD.read_text().splitlines() if line.strip()]


def show(records: list[dict]) -> None:
    """Print every trial's NSP and [MASK] accuracy (median and range over its seeds)."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["trial"], r["steps"]), []).append(r)

    def cell(values: list[float]) -> str:
        spread = f" ({min(values):.3f}-{max(values):.3f})" if len(values) > 1 else ""
        return f"{statistics.median(values):.3f}{spread}"

    print(f"{'trial':10} {'steps':>6} {'seeds':>5} {'NSP at 64':>21} {'[MASK] at 64':>21} "
          f"{'[MASK] at 128':>13} {'minutes':>7} {'load':>9}")
    for (trial, steps), rs in sorted(groups.items(), key=lambda kv: -statistics.median(
            r["nsp_accuracy"] for r in kv[1])):
        loads = [x for r in rs for x in r["load_average"] if x is not None]
        print(f"{trial:10} {steps:6d} {len(rs):5d} {cell([r['nsp_accuracy'] for r in rs]):>21} "
              f"{cell([r['mask_accuracy_64'] for r in rs]):>21} "
              f"{statistics.median(r['mask_accuracy_128'] for r in rs):13.3f} "
              f"{statistics.median(r['train_minutes'] for r in rs):7.1f} "
              f"{min(loads):4.1f}-{max(loads):.1f}")
    if records:
        rule = overlap_rule()
        print(f"bar at 64 tokens: {records[0]['mask_unigram_accuracy_64']:.3f}; notebook 03's "
              f"word-overlap rule on the same {rule['validation_pairs']:,} pairs: NSP "
              f"{rule['accuracy']:.3f} +- {2 * rule['se']:.3f} (2 SE)")


def overlap_rule() -> dict:
    """Return the word-overlap rule's NSP accuracy on the search's 64-token validation pairs
    (fitted on training pairs): the baseline a trial's NSP has to beat."""
    from twins import word_overlap_rule  # benchmarks/twins.py

    import bertlab as bl
    from bertlab.data import LoaderOptions, pretraining_loader

    docs = bl.load_corpus("bbc")
    tok = bl.train_tokenizer(docs, vocab_size=8192)
    train, val = (pretraining_loader(docs, tok, split=split, seed=0,
                                     options=LoaderOptions(max_seq_len=VAL_PAIRS_SEQ))
                  .dataset.examples for split in ("train", "validation"))
    return word_overlap_rule(train, val)


def commit() -> str:
    """Return the commit the trials run from (with "+dirty" when the library has changes)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True,
                              text=True).stdout.strip()
    dirty = git("status", "--porcelain", "--", "bertlab", "benchmarks/nsp_search.py")
    return git("rev-parse", "HEAD") + ("+dirty" if dirty else "")


def child(args: argparse.Namespace) -> int:
    name, seed = args.child.rsplit(":", 1)
    if args.stage == "calibrate":  # name: the trials, joined by "+"; seed: the rounds
        from bertlab.course.doctor import load_average

        load = load_average()
        timed = calibrate(name.split("+"), int(seed))
        print(json.dumps({"s_per_step": timed, "load_average": [load, load_average()]}))
        return 0
    run_dir = RUNS / f"{name}-seed{seed}"
    record = run_trial(name, TRIALS[name], int(seed), args.steps, run_dir)
    print(json.dumps({**record, "commit": commit()}))
    return 0


def run_children(todo: list[tuple[str, int, int]], args: argparse.Namespace) -> list[dict]:
    """Run each (trial, seed, steps) as its own 1-thread process, `--jobs` at a time."""
    def one(item: tuple[str, int, int]) -> dict | None:
        name, seed, steps = item
        start = time.perf_counter()
        cmd = [sys.executable, __file__, "--child", f"{name}:{seed}", "--steps", str(steps),
               "--stage", args.stage]
        out = subprocess.run(cmd, capture_output=True, text=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1",
                                  "TOKENIZERS_PARALLELISM": "false"})
        if out.returncode:
            print(f"{name}:{seed} stopped (exit {out.returncode}); run the command again to "
                  f"resume it:\n{out.stderr[-1500:]}", flush=True)
            return None
        record = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{name}:{seed} done in {(time.perf_counter() - start) / 60:.1f} min: "
              f"{json.dumps({k: v for k, v in record.items() if k != 'history'})[:400]}",
              flush=True)
        if args.stage != "calibrate":
            with RECORD.open("a") as f:
                f.write(json.dumps(record) + "\n")
        return record

    with ThreadPoolExecutor(args.jobs) as pool:
        return [r for r in pool.map(one, todo) if r is not None]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stage", choices=["calibrate", *STAGES], default="screen")
    p.add_argument("--trials", nargs="*", default=None, help="default: the stage's")
    p.add_argument("--seeds", nargs="*", type=int, default=None, help="default: the stage's")
    p.add_argument("--base-steps", type=int, default=2000,
                   help="the base trial's steps; every other trial gets the steps that cost as "
                        "much (about 15 minutes of one core beside a second trial)")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--show", action="store_true")
    p.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    p.add_argument("--child", help=argparse.SUPPRESS)  # name:seed, run in this process
    args = p.parse_args()
    if args.child:
        return child(args)
    if args.show:
        show(recorded())
        return 0
    names, seeds = STAGES.get(args.stage, ([*TRIALS], [0]))
    names, seeds = args.trials or names, args.seeds or seeds
    unknown = [n for n in names if n not in TRIALS]
    if unknown:
        p.error(f"unknown trials {unknown}; known: {', '.join(TRIALS)}")
    if args.stage == "calibrate":  # --jobs processes, each through every cost in turn
        jobs = [("+".join(names[i:] + names[:i]), 3, 0) for i in range(args.jobs)]
        timed = run_children(jobs, args)
        costs = {key: statistics.median(t["s_per_step"][key] for t in timed)
                 for key in timed[0]["s_per_step"]}
        CALIBRATION.write_text(json.dumps({
            "command": "python benchmarks/nsp_search.py " + " ".join(sys.argv[1:]),
            "jobs": args.jobs, "commit": commit(),
            "how": "median seconds per warm step (the last 25 of 40 steps, 3 rounds through "
                   "every cost in turn, each process a different order), median over processes",
            "s_per_step": costs, "per_process": timed}, indent=1) + "\n")
        print(f"written: {CALIBRATION.relative_to(REPO)}")
        return 0
    done = {_key(r) for r in recorded()}
    todo = [(n, s, step_budget(n, args.base_steps)) for s in seeds for n in names]
    todo = [(n, s, steps) for n, s, steps in todo
            if (n, s, steps, json.dumps(TRIALS[n], sort_keys=True)) not in done]
    print(f"{len(todo)} trials to run, {args.jobs} at a time, each costing {args.base_steps} "
          f"steps of base: {', '.join(f'{n}:{s} ({steps} steps)' for n, s, steps in todo)}",
          flush=True)
    run_children(todo, args)
    show(recorded())
    return 0


if __name__ == "__main__":
    sys.exit(main())
