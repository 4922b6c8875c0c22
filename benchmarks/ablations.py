"""Ablations of BERT's pretraining recipe, ours beside the papers': masking procedure (BERT
Table 8), NSP on/off (BERT Table 5, RoBERTa), masking rate (Wettig et al. 2022) and static vs
dynamic masking (RoBERTa).

Each cell of the grid (`bertlab.course.grid.GROUPS` x seeds) pretrains a fresh model and measures
held-out accuracy at [MASK] and at all targets (and with no [MASK] in the input), NSP accuracy,
[CLS] linear probes on BBC topics and, in the budgets that ask for it, fine-tuned BBC topic
accuracy. Finished cells are cached by a hash of their full config in --cache-dir, so an
interrupted sweep resumes where it stopped and a changed setting re-runs only what it changes.
The results file (written after every cell, kept in the repository) holds the exact command, the
budget, and every cell's config, seed and metrics; its records seed the cache before a sweep, so
a fresh clone resumes from them instead of running them again.

Budgets (`bertlab.course.grid.BUDGETS`): "course" (default: the course recipe, tiny model, 64-token
pairs, 2,500 steps, fine-tuning on; its reference cell leaves the unigram plateau), "quick" (tiny
model, 64-token pairs, 250 steps: the machinery only), "cpu" (128 tokens, 300 steps), "cpu-long"
(BERT-style 15% masking with AdamW, 4,000 steps: still on the plateau at [MASK]), "gpu" (mini
model, 3000 steps, fine-tuning on). The wall clock of a sweep is in its results file (`wall_s`).

Usage:
  python benchmarks/ablations.py --seeds 0 1 2 --jobs 2 --threads 1   # course budget, ~2.5 core-hours
  python benchmarks/ablations.py --budget quick --seeds 0 1 --groups masking-procedure nsp --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

import torch

from bertlab.atomic import atomic_write_json
from bertlab.course.ablations import (
    compare_to_baseline,
    format_summary,
    random_init_scores,
    run_grid,
    summarize_records,
    unigram_reference,
)
from bertlab.course.grid import (
    BUDGETS,
    GROUPS,
    PAPER_CLAIMS,
    PAPER_MASKING,
    PAPER_NSP,
    ablation_grid,
    cell_key,
    config_key,
    group_baseline,
)

DEFAULT_CACHE = Path(os.environ.get("BERTLAB_CACHE", Path.home() / ".cache" / "bertlab")) / "ablations"
VERDICT_METRICS = ("mask_accuracy", "mlm_accuracy", "mlm_accuracy_no_mask", "nsp_accuracy", "probe_accuracy",
                   "probe_accuracy_cls", "finetune_accuracy")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget", choices=sorted(BUDGETS), default="course")
    p.add_argument("--groups", nargs="+", choices=list(GROUPS), default=list(GROUPS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE,
                   help="one JSON per finished cell, keyed by its config hash")
    p.add_argument("--out", type=Path, default=None,
                   help="results file (default benchmarks/results/ablations-<budget>.json)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (1 is fastest on a machine shared with other jobs)")
    p.add_argument("--jobs", type=int, default=1,
                   help="cells run at once, in worker processes of --threads threads each "
                        "(default 1; on a 2-core machine, --jobs 2 --threads 1 halves the wall "
                        "clock)")
    p.add_argument("--force", action="store_true", help="re-run cells even if cached")
    p.add_argument("--trace", nargs=4, metavar=("GROUP", "NAME", "SEED", "STEPS"), default=None,
                   help="print the first STEPS steps of one cell of --budget as JSON (its curve "
                        "rows, every step's loss, the weights' SHA-256), and run nothing else: "
                        "the reproduce trace in the record (tools/record_traces.py)")
    return p.parse_args(argv)


def trace(args: argparse.Namespace) -> int:
    """Print the reproduce trace of one cell (`--trace GROUP NAME SEED STEPS`)."""
    from bertlab.course.ablations import trace_cell

    group, name, seed, steps = args.trace
    cells = [c for c in ablation_grid([group], [int(seed)], BUDGETS[args.budget]) if c.name == name]
    if not cells:
        raise SystemExit(f"--trace: group {group} has no cell {name!r}")
    print(json.dumps(trace_cell(cells[0], int(steps))))
    return 0


def summary_with_verdicts(records: list[dict], groups: list[str],
                          budget) -> tuple[list, list]:
    rows = summarize_records(records)
    verdicts = []
    for group in groups:
        names = {r["name"] for r in rows if r["group"] == group}
        baseline = group_baseline(group, budget)
        if baseline not in names or len(names) < 2:
            continue
        # NSP accuracy means something only where the baseline trained the head (an MLM-only
        # run's head is its random initialisation, a constant guess on the fixed pairs).
        trains_nsp = any(r["config"]["settings"]["nsp"] for r in records
                         if r["cell"]["group"] == group and r["cell"]["name"] == baseline)
        for metric in VERDICT_METRICS:
            if metric == "nsp_accuracy" and not trains_nsp:
                continue
            if all(f"{metric}_mean" in r for r in rows if r["group"] == group):
                verdicts += [{"group": group, **v}
                             for v in compare_to_baseline(rows, group, metric, baseline)]
    return rows, verdicts


def seed_cache(results_file: Path, cache_dir: Path) -> int:
    """Copy the finished records of a saved results file into the cache (those not there yet),
    so a fresh clone resumes the sweep from the repository; return how many were copied."""
    if not results_file.is_file():
        return 0
    copied = 0
    for record in json.loads(results_file.read_text(encoding="utf-8")).get("records", []):
        record = {k: v for k, v in record.items() if k not in ("cell", "cached")}
        if record.get("key") != config_key(record["config"]):
            continue  # a record whose key does not match its config is not trusted
        path = cache_dir / f"{record['key']}.json"
        if not path.is_file():
            cache_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_json(path, record)
            copied += 1
    return copied


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.trace:
        return trace(args)
    budget = BUDGETS[args.budget]
    out = args.out or Path(__file__).parent / "results" / f"ablations-{args.budget}.json"
    cells = ablation_grid(args.groups, args.seeds, budget)
    command = "python " + shlex.join([f"benchmarks/{Path(sys.argv[0]).name}", *(argv or sys.argv[1:])])
    started, clock = time.strftime("%Y-%m-%dT%H:%M:%S%z"), time.perf_counter()
    copied = seed_cache(out, args.cache_dir)
    if copied:
        print(f"{copied} finished record(s) from {out} copied into the cache {args.cache_dir}")
    records: list[dict] = []
    distinct = len({cell_key(c) for c in cells})
    print(f"{len(cells)} cells ({len({c.name for c in cells})} variants x {len(args.seeds)} seeds), "
          f"budget {budget.name}: {budget.to_dict()}", flush=True)

    references: dict = {}
    # The frequency guess on this sweep's own vocabulary and held-out targets: the bar every
    # cell's MLM accuracy is read against (a vocabulary cannot be rebuilt from the records).
    unigram = unigram_reference(budget)

    def save(complete: bool) -> None:
        rows, verdicts = summary_with_verdicts(records, args.groups, budget)
        result = {
            "command": command,
            "budget": budget.to_dict(),
            "groups": args.groups,
            "seeds": args.seeds,
            "torch_threads": torch.get_num_threads() if args.jobs == 1 else args.threads or 1,
            "jobs": args.jobs,
            "started": started,
            "wall_s": round(time.perf_counter() - clock, 1),
            "complete": complete,
            "cells_planned": len(cells),
            "paper": {"masking": PAPER_MASKING, "nsp": PAPER_NSP, "claims": PAPER_CLAIMS},
            "code": sorted({r.get("code", "?") for r in records}),  # source digests of the records
            "records": records,
            "random_init": references,
            "unigram": unigram,
            "summary": rows,
            "verdicts": verdicts,
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out, result)

    def on_record(record: dict) -> None:
        records.append(record)
        m, c = record["metrics"], record["cell"]
        probe = "-" if m["probe_accuracy"] is None else f"{100 * m['probe_accuracy']:.1f}"
        how = "cached" if record["cached"] else f"ran {record['elapsed_s']:.0f}s"
        mask = m.get("mask_accuracy")
        print(f"[{len(records)}/{distinct}] {c['group']:<18} {c['name']:<10} seed {c['seed']} "
              f"{how}: " + ("" if mask is None else f"[MASK] {100 * mask:.1f} ") +
              f"mlm {100 * m['mlm_accuracy']:.1f} no-mask {100 * m['mlm_accuracy_no_mask']:.1f} "
              "nsp " + ("not trained" if m["nsp_accuracy"] is None else
                        f"{100 * m['nsp_accuracy']:.1f}") + f" probe {probe}", flush=True)
        save(complete=False)

    records[:] = run_grid(cells, args.cache_dir, force=args.force, on_record=on_record,
                          jobs=args.jobs, threads=args.threads or 1)
    if budget.probe:
        if args.jobs > 1:
            torch.set_num_threads(args.threads or 1)
        print("random-init references (the cells' starting weights, no pretraining)...", flush=True)
        references.update(random_init_scores(budget, args.seeds))
    save(complete=True)
    rows, verdicts = summary_with_verdicts(records, args.groups, budget)
    print()
    print(format_summary(rows))
    if references:
        print("\nrandom init, no pretraining (mean over seeds): " + ", ".join(
            f"{name} {100 * sum(v) / len(v):.1f}" for name, v in references.items()
            if name != "seeds"))
    print("\npaper, BERT Table 8 (MNLI / NER fine-tune / NER feature-based):")
    for name, v in PAPER_MASKING.items():
        print(f"  {name:<9} {v['mnli']:.1f} / {v['ner_finetune']:.1f} / {v['ner_feature']:.1f}")
    print("paper, BERT Table 5 (MNLI / QNLI):")
    for name, v in PAPER_NSP.items():
        print(f"  {name:<9} {v['mnli']:.1f} / {v['qnli']:.1f}")
    print("\ndifference from each group's baseline (points; noise = 2 x standard error):")
    for v in verdicts:
        print(f"  {v['group']:<18} {v['name']:<10} {v['metric']:<22} {100 * v['diff']:+6.1f} "
              f"(se {100 * v['se']:.1f}) {v['verdict']}")
    print(f"\nwrote {out} in {time.perf_counter() - clock:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
