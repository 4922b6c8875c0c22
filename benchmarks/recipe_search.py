"""The search behind the course recipe: candidate recipes at equal wall-clock on one CPU thread.

Every trial pretrains the `tiny` preset on BBC News for the same number of minutes (the learning
rate schedule follows the clock, as in Cramming) and is scored on one yardstick: the same
validation pairs masked BERT's way (15%, 80/10/10, fixed seed), whatever masking it trained
with. The score is the accuracy at [MASK] positions (can it fill a blank from context?), with
NSP accuracy beside it. Trials run as separate processes with one torch thread each, `--jobs`
at a time, and append one JSON line each to benchmarks/results/recipe_search.jsonl (a trial
already recorded with the same settings, seed and budget is skipped, so a search resumes).

Stages: "screen" (one seed, one factor at a time from the first Muon probe), "combine" (the
screen's winners together, then one factor at a time again), and the three-seed confirmation,
which is benchmarks/time_to_quality.py (the two recipes and transformers at equal time). The
screen and combine records were scored on 128-token validation pairs (`val_seq_len`); the
yardstick then moved to 64 tokens (`bertlab.recipes.VAL_SEQ_LEN`), the length every recipe
trains, since a 64-token recipe has never seen positions 64-127.

Usage:
  python benchmarks/recipe_search.py --stage screen --minutes 3 --jobs 2
  python benchmarks/recipe_search.py --trials muon40 muon40-b32 --seeds 0 1 2 --minutes 3
  python benchmarks/recipe_search.py --show
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bertlab.recipes import VAL_SEQ_LEN, recipe

RESULTS = Path(__file__).resolve().parent / "results" / "recipe_search.jsonl"

# The starting point: the demo's settings before this search (BERT's recipe, lr for `tiny`).
BERT = dict(optimizer="adamw", lr=2e-3, muon_lr=0.02, mlm_probability=0.15, nsp=True,
            dropout=0.1, batch=32, seq=128, warmup=0.06, schedule="linear", precision="fp32",
            preset="tiny", betas=(0.9, 0.999), weight_decay=0.01)
# The probe that first left the plateau (../shared/REFERENCE.md): Muon, 40%, MLM only.
MUON = {**BERT, "optimizer": "muon", "mlm_probability": 0.4, "nsp": False, "dropout": 0.0,
        "batch": 16, "seq": 64}
TRIALS = {
    "bert": BERT,
    "bert-lr5e-4": {**BERT, "lr": 5e-4},
    "adamw40": {**MUON, "optimizer": "adamw"},
    "adamw40-b32-lr1e-3": {**MUON, "optimizer": "adamw", "batch": 32, "lr": 1e-3},
    "muon40": MUON,
    "muon15": {**MUON, "mlm_probability": 0.15},
    "muon30": {**MUON, "mlm_probability": 0.3},
    "muon50": {**MUON, "mlm_probability": 0.5},
    "muon40-mlr.01": {**MUON, "muon_lr": 0.01},
    "muon40-mlr.04": {**MUON, "muon_lr": 0.04},
    "muon40-alr5e-3": {**MUON, "lr": 5e-3},
    "muon40-alr1e-3": {**MUON, "lr": 1e-3},
    "muon40-b8": {**MUON, "batch": 8},
    "muon40-b32": {**MUON, "batch": 32},
    "muon40-s128": {**MUON, "seq": 128},
    "muon40-s32": {**MUON, "seq": 32, "batch": 32},
    "muon40-bf16": {**MUON, "precision": "bf16"},
    "muon40-drop.1": {**MUON, "dropout": 0.1},
    # Not run (cut for time): cosine decay, 2% warmup, NSP with 128-token pairs, the mini preset.
}
# Stage 2: the lower learning rates that won the screen, combined, then one factor at a time.
LOW = {**MUON, "muon_lr": 0.01, "lr": 1e-3}
TRIALS.update({
    "low": LOW,
    "low-mlr.005": {**LOW, "muon_lr": 0.005},
    "low-alr5e-4": {**LOW, "lr": 5e-4},
    "low-b32": {**LOW, "batch": 32},
    "low-s128-b8": {**LOW, "seq": 128, "batch": 8},
    "low-bf16": {**LOW, "precision": "bf16"},
    "low-nsp": {**LOW, "nsp": True},
    "low-50": {**LOW, "mlm_probability": 0.5},
})
# Stage 3, the confirmation: the two named recipes exactly as bertlab.recipes defines them.
for _name in ("bert", "course"):
    _r = recipe(_name)
    TRIALS[f"recipe-{_name}"] = {
        **BERT, "optimizer": _r.optimizer, "lr": _r.lr, "muon_lr": _r.muon_lr,
        "mlm_probability": _r.mlm_probability, "nsp": "nsp" in _r.objectives, "dropout": _r.dropout,
        "batch": _r.batch_size, "seq": _r.max_seq_len, "warmup": _r.warmup_fraction,
        "schedule": _r.schedule}
STAGES = {"screen": [name for name in TRIALS if not name.startswith("low")],
          "combine": [name for name in TRIALS if name.startswith("low")],
          "confirm": ["recipe-bert", "recipe-course"]}


def run_trial(name: str, spec: dict, seed: int, minutes: float) -> dict:
    """Pretrain one trial in this process (1 thread) and return its record."""
    import torch

    torch.set_num_threads(1)
    import bertlab as bl
    from bertlab.data import LoaderOptions, pretraining_loader
    from bertlab.masking import MaskingConfig
    from bertlab.pretraining import evaluate

    docs = bl.load_corpus("bbc")
    tok = bl.train_tokenizer(docs, vocab_size=8192)
    train = pretraining_loader(docs, tok, split="train", seed=seed, options=LoaderOptions(
        batch_size=spec["batch"], max_seq_len=spec["seq"],
        masking=MaskingConfig(mlm_probability=spec["mlm_probability"])))
    val = pretraining_loader(docs, tok, split="validation", seed=0,  # BERT's masking, a fixed seed
                             options=LoaderOptions(batch_size=32, max_seq_len=VAL_SEQ_LEN))
    config = bl.BertConfig.preset(spec["preset"], vocab_size=tok.get_vocab_size(),
                                  hidden_dropout=spec["dropout"],
                                  attention_dropout=spec["dropout"])
    model = bl.BertForPreTraining(config, generator=torch.Generator().manual_seed(seed))
    train_config = bl.TrainConfig(
        max_steps=None, max_minutes=minutes, batch_size=spec["batch"], lr=spec["lr"],
        optimizer=spec["optimizer"], muon_lr=spec["muon_lr"], warmup_fraction=spec["warmup"],
        schedule=spec["schedule"], precision=spec["precision"], betas=spec["betas"],
        weight_decay=spec["weight_decay"], eval_interval=None, checkpoint_interval=None,
        device="cpu", seed=seed, progress=False, log_interval=0)
    objectives = ("mlm", "nsp") if spec["nsp"] else ("mlm",)
    result = bl.pretrain(model, train, None, train_config, objectives=objectives)
    metrics = evaluate(model, val, 40, objectives=objectives)  # no NSP figure unless trained
    return {"trial": name, "seed": seed, "minutes": minutes, "spec": spec,
            "val_seq_len": VAL_SEQ_LEN,
            "steps": result.steps, "tokens": result.tokens,
            "tokens_per_s": result.tokens / result.elapsed_s,
            "nsp_accuracy": None,  # None: not trained (MLM only)
            **{k: round(v, 5) for k, v in metrics.items()}}


def not_trained_or(values) -> str:
    """Return the median NSP accuracy of `values` as text, or "not trained" (None: MLM only)."""
    values = list(values)
    return "not trained" if None in values else f"{statistics.median(values):.3f}"


def _key(record: dict) -> tuple:
    return (record["trial"], record["seed"], record["minutes"],
            json.dumps(record["spec"], sort_keys=True))


def _recorded() -> set[tuple]:
    if not RESULTS.exists():
        return set()
    return {_key(json.loads(line)) for line in RESULTS.read_text().splitlines() if line.strip()}


def show(records: list[dict] | None = None) -> None:
    """Print every recorded trial's median [MASK] accuracy (and spread) over its seeds."""
    if records is None:
        records = [json.loads(x) for x in RESULTS.read_text().splitlines() if x.strip()]
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["trial"], r["minutes"], r["val_seq_len"]), []).append(r)
    rows = sorted(groups.items(), key=lambda kv: -statistics.median(
        r["mask_accuracy"] for r in kv[1]))
    print(f"{'trial':22} {'min':>4} {'val':>4} {'seeds':>5} {'[MASK] acc':>18} {'NSP acc':>7} "
          f"{'steps':>6} {'tok/s':>6}")
    for (trial, minutes, val_len), rs in rows:
        acc = [r["mask_accuracy"] for r in rs]
        spread = f" ({min(acc):.3f}-{max(acc):.3f})" if len(acc) > 1 else ""
        print(f"{trial:22} {minutes:4g} {val_len:4d} {len(rs):5d} {statistics.median(acc):7.3f}{spread:>11} "
              f"{not_trained_or(r['nsp_accuracy'] for r in rs):>7} "
              f"{statistics.median(r['steps'] for r in rs):6.0f} "
              f"{statistics.median(r['tokens_per_s'] for r in rs):6.0f}")
    print(f"bar: always the most frequent [MASK] target = "
          f"{records[0]['mask_unigram_accuracy']:.3f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stage", choices=sorted(STAGES))
    p.add_argument("--trials", nargs="*", default=[])
    p.add_argument("--seeds", nargs="*", type=int, default=[0])
    p.add_argument("--minutes", type=float, default=3.0)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--show", action="store_true")
    p.add_argument("--child", help=argparse.SUPPRESS)  # name:seed, run in this process
    args = p.parse_args()
    if args.child:
        name, seed = args.child.rsplit(":", 1)
        print(json.dumps(run_trial(name, TRIALS[name], int(seed), args.minutes)))
        return
    if args.show:
        show()
        return
    names = (STAGES[args.stage] if args.stage else []) + args.trials
    unknown = [n for n in names if n not in TRIALS]
    if unknown or not names:
        p.error(f"unknown trials {unknown}; known: {', '.join(TRIALS)}")
    done = _recorded()
    todo = [(n, s) for s in args.seeds for n in names
            if (n, s, args.minutes, json.dumps(TRIALS[n], sort_keys=True)) not in done]
    print(f"{len(todo)} trials to run, {args.jobs} at a time, {args.minutes:g} min each")

    def one(item: tuple[str, int]) -> None:
        name, seed = item
        start = time.perf_counter()
        out = subprocess.run([sys.executable, __file__, "--child", f"{name}:{seed}",
                              "--minutes", str(args.minutes)], capture_output=True, text=True,
                             env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
        if out.returncode:
            print(f"{name}:{seed} failed:\n{out.stderr[-2000:]}", flush=True)
            return
        record = json.loads(out.stdout.strip().splitlines()[-1])
        with RESULTS.open("a") as f:
            f.write(json.dumps(record) + "\n")
        print(f"{name}:{seed} [MASK] {record['mask_accuracy']:.3f} NSP "
              f"{not_trained_or([record['nsp_accuracy']])} steps {record['steps']} "
              f"({time.perf_counter() - start:.0f} s)", flush=True)

    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(one, todo))
    show()


if __name__ == "__main__":
    main()
