"""GPU pretraining the course can read: mini with MLM + NSP beside its MLM-only twin, on one GPU.

The `gpu` recipe (`bertlab.recipes`) trains `--preset` (mini) on prepared BBC shards, with pairs
drawn afresh each epoch (`prepare --pair-draws`). Its twin has the same step budget, seeds,
data and schedule, and leaves NSP out of the loss (`recipe("gpu").with_objectives("mlm")`).
Two seeds of each run at the same time as separate processes, so the four share the GPU (the
record says so) and finish together: the twins' only difference is the objective.

Two stages, because the GPU machine has shards and a tokenizer but no corpus package:

  train  (the GPU): the runs, each evaluated every `--eval-interval` steps on the course's
         yardstick, BERT-masked validation pairs (15%, 80/10/10, seed 0) at 128 tokens and,
         from a second shard folder, at 64: accuracy at [MASK], NSP accuracy (not for the twin:
         an untrained head's figure is not a result) and the bar a model without context
         reaches on the same targets. Each run folder holds summary.json (the history, tokens,
         minutes) and model/, its weights as a bf16 Hugging Face folder: what travels back.
  score  (anywhere; a CPU will do): from those folders, for every run, the word-overlap rule's
         NSP accuracy on the same validation pairs (notebook 03's rule: NotNext when A and B
         share few tokens, the threshold fitted on training pairs), the cloze score, the [CLS]
         linear probe (all labels) and low-label fine-tuning and probe at 8 and 32 labels per
         class, 3 seeds each; then the record, benchmarks/results/gpu_pretrain.json, and the
         shipped model: the MLM + NSP run of the first seed as a Hugging Face folder in bf16,
         models/<--model-name>/, with MANIFEST.json (device, command, steps, tokens, minutes,
         scores).

Usage (see the README's "On a GPU"):
  python -m bertlab prepare --corpus bbc --out data/bbc_shards --pair-draws 16
  python -m bertlab prepare --corpus bbc --out data/bbc_shards64 --max-seq-len 64 \\
      --tokenizer data/bbc_shards/tokenizer.json
  python benchmarks/gpu_pretrain.py train --shards data/bbc_shards --shards64 \\
      data/bbc_shards64 --runs runs/gpu-twins --steps 3000 --minutes 3      (on the GPU)
  python benchmarks/gpu_pretrain.py score --runs runs/gpu-twins               (anywhere)

`--device cpu` runs the same code on the CPU as a smoke test; a CPU run writes its record and
model into a temporary folder unless `--out` / `--model-out` say where, never over the GPU's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from _record import REPO, write_record  # benchmarks/ is on sys.path when run as a script

RESULTS = REPO / "benchmarks" / "results"
TWINS = {"mlm+nsp": ("mlm", "nsp"), "mlm": ("mlm",)}
LABEL_BUDGETS = (8, 32)


# ---------------------------------------------------------------------------------------------
# Stage 1: the runs (on the GPU)


def run_one(args: argparse.Namespace) -> int:
    """Train one run into `args.run_dir` and write its summary.json (what the score stage reads)."""
    from bertlab.data import pretraining_loader
    from bertlab.hf import save_hf
    from bertlab.model import BertForPreTraining
    from bertlab.pretraining import pretrain
    from bertlab.recipes import recipe
    from bertlab.tokenizer import load_tokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    chosen = recipe("gpu").with_objectives(TWINS[args.twin])
    tok = load_tokenizer(args.shards / "tokenizer.json")
    on_gpu = torch.device(args.device).type == "cuda"
    options = dict(pad_to_multiple_of=8 if on_gpu else None, pin_memory=on_gpu,
                   num_workers=args.num_workers)
    loader_options = {**chosen.loader_options(), "pair_draws": None}  # the shards' own draws
    if args.batch_size:
        loader_options["batch_size"] = args.batch_size
    train = pretraining_loader(args.shards, tok, split="train", seed=args.seed,
                               **loader_options, **options)
    # The yardstick: BERT's masking, seed 0, the same pairs for every run and every row.
    val = {"": pretraining_loader(args.shards, tok, split="validation", batch_size=64, seed=0,
                                  shuffle=False, **options),
           "64": pretraining_loader(args.shards64, tok, split="validation", batch_size=64,
                                    seed=0, shuffle=False, **options)}
    config = chosen.train_config(
        max_steps=args.steps, max_minutes=args.minutes, device=args.device,
        batch_size=loader_options["batch_size"], eval_interval=args.eval_interval,
        eval_batches=args.eval_batches, checkpoint_interval=None, progress=False,
        log_interval=0, **({} if args.compile is None else {"compile": args.compile}))
    model = BertForPreTraining(chosen.model_config(args.preset, tok.get_vocab_size()),
                               generator=torch.Generator().manual_seed(args.seed))
    start = time.perf_counter()
    result = pretrain(model, train, val, config, objectives=chosen.objectives)
    wall = time.perf_counter() - start
    # What travels back from the GPU machine: the weights in bf16 (no optimizer state) and the
    # summary, small enough to carry four runs.
    save_hf(model.cpu().to(torch.bfloat16), tok, Path(args.run_dir) / "model")
    device = (torch.cuda.get_device_name() if on_gpu else "cpu")
    summary = {
        "twin": args.twin, "objectives": list(chosen.objectives), "seed": args.seed,
        "preset": args.preset, "device": device, "steps": result.steps,
        "stopped_by": result.stopped_by,
        "tokens": result.tokens,  # positions fed to the model, padding included
        "minutes": round(result.elapsed_s / 60, 3), "wall_minutes": round(wall / 60, 3),
        "tokens_per_s": result.tokens / result.elapsed_s if result.elapsed_s else None,
        "pair_draws": train.dataset.pair_draws, "train_pairs": len(train.dataset),
        "recipe": chosen.to_dict(), "batch_size": loader_options["batch_size"],
        "history": result.history,
    }
    (Path(args.run_dir) / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"{args.twin} seed {args.seed}: {result.steps} steps, {result.tokens:,} tokens in "
          f"{summary['minutes']:.2f} min of training, {summary['tokens_per_s'] or 0:,.0f} "
          f"tokens/s ({result.stopped_by}; {summary['wall_minutes']:.2f} min in all)")
    return 0


def train_stage(args: argparse.Namespace) -> int:
    """Start every run at once (one process each, sharing the device); wait for all of them."""
    args.runs.mkdir(parents=True, exist_ok=True)
    procs = []
    for seed in args.seeds:
        for twin in TWINS:
            run_dir = args.runs / f"{twin}-seed{seed}"
            cmd = [sys.executable, __file__, "run-one", "--twin", twin, "--seed", str(seed),
                   "--run-dir", str(run_dir), "--shards", str(args.shards),
                   "--shards64", str(args.shards64), "--preset", args.preset,
                   "--steps", str(args.steps), "--device", args.device,
                   "--eval-interval", str(args.eval_interval),
                   "--eval-batches", str(args.eval_batches),
                   "--num-workers", str(args.num_workers)]
            cmd += [] if args.minutes is None else ["--minutes", str(args.minutes)]
            cmd += [] if args.batch_size is None else ["--batch-size", str(args.batch_size)]
            cmd += [] if args.threads is None else ["--threads", str(args.threads)]
            cmd += [] if args.compile is None else ["--compile" if args.compile else
                                                    "--no-compile"]
            log = open(args.runs / f"{twin}-seed{seed}.log", "w")  # noqa: SIM115
            procs.append((run_dir, log, subprocess.Popen(cmd, stdout=log,
                                                         stderr=subprocess.STDOUT)))
    failed = []
    for run_dir, log, proc in procs:
        if proc.wait() != 0:
            failed.append(run_dir.name)
        log.close()
    shared = {"concurrent_runs": len(procs), "shared_device": len(procs) > 1,
              "command": "python benchmarks/gpu_pretrain.py " + " ".join(args.argv)}
    (args.runs / "train.json").write_text(json.dumps(shared, indent=1))
    for run_dir, _, _ in procs:
        print((args.runs / f"{run_dir.name}.log").read_text().strip().splitlines()[-1:])
    if failed:
        print(f"gpu_pretrain: runs failed: {', '.join(failed)} (their logs are in {args.runs})")
        return 1
    return 0


# ---------------------------------------------------------------------------------------------
# Stage 2: what each run learned (anywhere)


def overlap(example) -> float:
    """Return the Jaccard overlap of the token sets of A and B (notebook 03's NSP rule)."""
    ids = [int(t) for t in example.input_ids]
    a, b = set(ids[1:1 + example.a_len]), set(ids[2 + example.a_len:-1])
    return len(a & b) / max(len(a | b), 1)


def word_overlap_rule(train, val, fit_pairs: int = 4000) -> dict:
    """Return the rule's NSP accuracy on the validation pairs, its threshold fitted on up to
    `fit_pairs` training pairs (NotNext when the overlap is below it)."""
    picks = random.Random(0).sample(range(len(train)), min(fit_pairs, len(train)))
    fit = [(overlap(train[i]), train[i].next_sentence_label) for i in picks]
    held = [(overlap(val[i]), val[i].next_sentence_label) for i in range(len(val))]

    def accuracy(pairs, threshold):
        return sum((o < threshold) == bool(label) for o, label in pairs) / len(pairs)

    threshold = max((i / 200 for i in range(1, 60)), key=lambda t: accuracy(fit, t))
    return {"accuracy": accuracy(held, threshold), "threshold": threshold,
            "validation_pairs": len(held), "fitted_on_training_pairs": len(fit)}


def final_scores(history: list[dict], prefix: str, trained_nsp: bool) -> dict:
    """Return the last history row's yardstick at one length: [MASK] accuracy, NSP, the bar."""
    last = history[-1]
    return {"mask_accuracy": last[f"{prefix}mask_accuracy"],
            "mask_unigram_accuracy": last[f"{prefix}mask_unigram_accuracy"],
            "mask_targets": last[f"{prefix}mask_targets"],
            "nsp_accuracy": last[f"{prefix}nsp_accuracy"] if trained_nsp else "not trained"}


def curve(history: list[dict], prefix: str, trained_nsp: bool) -> list[dict]:
    """Return the validation history at one length, one row per evaluation."""
    keep = ("mask_accuracy", "mask_unigram_accuracy") + (("nsp_accuracy",) if trained_nsp else ())
    return [{"step": row["step"], "tokens": row["tokens"],
             **{k: row[f"{prefix}{k}"] for k in keep}} for row in history]


def downstream(model, tok, seeds: int, budgets: list[int]) -> dict:
    """Return the [CLS] probe (all labels) and low-label fine-tuning and probe, with spread."""
    from bertlab.downstream import linear_probe, load_task
    from bertlab.finetune import compare_downstream, summarize

    docs, labels = load_task("bbc-topic")
    probe = linear_probe(model, docs, labels, tokenizer=tok)
    results = compare_downstream(model, tok, k_per_class=budgets, seeds=range(seeds),
                                 methods=("fine-tuned", "linear probe"))
    rows = {f"{r['method']} @ {r['k_per_class']}": {
        "accuracy_mean": r["accuracy_mean"], "accuracy_std": r["accuracy_std"],
        "macro_f1_mean": r["macro_f1_mean"], "runs": r["runs"]} for r in summarize(results)}
    return {"cls_probe_all_labels": {"accuracy": probe.accuracy, "macro_f1": probe.macro_f1},
            "low_label": rows, "seeds": seeds}


def score_stage(args: argparse.Namespace) -> int:
    from bertlab.course.cloze import CLOZE_SET, cloze_score
    from bertlab.loading import load_model
    from bertlab.shards import ShardExamples, shard_folder
    from bertlab.tokenizer import load_tokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    train_info = json.loads((args.runs / "train.json").read_text())
    folders = sorted(p for p in args.runs.iterdir() if (p / "summary.json").is_file())
    if not folders:
        raise SystemExit(f"gpu_pretrain score: no finished run in {args.runs} (train first)")
    tok = load_tokenizer(args.shards / "tokenizer.json")
    train = ShardExamples(shard_folder(args.shards, "train"))
    val = ShardExamples(shard_folder(args.shards, "validation"))
    rule = word_overlap_rule(train, val)  # the same pairs for every run
    runs = []
    for folder in folders:
        summary = json.loads((folder / "summary.json").read_text())
        nsp = "nsp" in summary["objectives"]
        model = load_model(folder / "model")[0]
        cloze = cloze_score(model, tok, CLOZE_SET)
        run = {k: summary[k] for k in ("twin", "objectives", "seed", "preset", "device", "steps",
                                       "stopped_by", "tokens", "tokens_per_s", "minutes",
                                       "wall_minutes", "pair_draws", "batch_size")}
        run.update({
            "at_128": final_scores(summary["history"], "val_", nsp),
            "at_64": final_scores(summary["history"], "val_64_", nsp),
            "history_128": curve(summary["history"], "val_", nsp),
            "history_64": curve(summary["history"], "val_64_", nsp),
            "word_overlap_rule_nsp_accuracy": rule,
            "cloze": {"items": len(CLOZE_SET), "top1": cloze["top1"], "top5": cloze["top5"]},
            **downstream(model, tok, args.finetune_seeds, args.label_budgets),
        })
        runs.append(run)
        print(f"{folder.name}: [MASK] {run['at_128']['mask_accuracy']:.3f} at 128 (bar "
              f"{run['at_128']['mask_unigram_accuracy']:.3f}), NSP {run['at_128']['nsp_accuracy']}"
              f", overlap rule {run['word_overlap_rule_nsp_accuracy']['accuracy']:.3f}, cloze "
              f"top-1 {cloze['top1']:.2f}, probe "
              f"{run['cls_probe_all_labels']['accuracy']:.3f}")
    device = runs[0]["device"]
    on_gpu = device != "cpu"
    out = args.out or (RESULTS / "gpu_pretrain.json" if on_gpu else
                       Path(tempfile.mkdtemp(prefix="gpu_pretrain-")) / "gpu_pretrain.json")
    comparison = twin_comparison(runs)
    write_record("gpu_pretrain.py", args, args.argv, out, device=device,
                 shared_device=train_info["shared_device"],
                 concurrent_runs=train_info["concurrent_runs"],
                 train_command=train_info["command"], runs=runs, twins=comparison)
    model_out = args.model_out or (REPO / "models" / args.model_name if on_gpu else
                                   out.parent / args.model_name)
    ship(args, folders, runs, model_out, train_info, tok)
    return 0


def twin_comparison(runs: list[dict]) -> dict:
    """Return, per measure, MLM + NSP minus MLM-only: mean and spread over the seeds."""
    by = {(r["twin"], r["seed"]): r for r in runs}
    seeds = sorted({s for t, s in by if (("mlm", s) in by and ("mlm+nsp", s) in by)})
    measures = {
        "mask_accuracy_128": lambda r: r["at_128"]["mask_accuracy"],
        "cloze_top1": lambda r: r["cloze"]["top1"],
        "cls_probe_all_labels": lambda r: r["cls_probe_all_labels"]["accuracy"],
        **{f"{name}": (lambda r, name=name: r["low_label"][name]["accuracy_mean"])
           for name in runs[0]["low_label"]},
    }
    out = {}
    for name, get in measures.items():
        gaps = [get(by[("mlm+nsp", s)]) - get(by[("mlm", s)]) for s in seeds]
        out[name] = {"gaps": gaps, "mean": statistics.fmean(gaps) if gaps else None,
                     "spread": (max(gaps) - min(gaps)) if gaps else None}
    # The twins share the step budget; a deadline reached first would make one train less.
    same_steps = all(by[("mlm+nsp", s)]["steps"] == by[("mlm", s)]["steps"] for s in seeds)
    return {"seeds": seeds, "same_steps": same_steps, "nsp_minus_mlm_only": out}


def ship(args, folders: list[Path], runs: list[dict], model_out: Path, train_info: dict,
         tok) -> None:
    """Write the MLM + NSP model of the first seed as a bf16 Hugging Face folder + MANIFEST."""
    from bertlab.hf import save_hf
    from bertlab.loading import load_model
    from bertlab.util import atomic_write_json

    first = min(r["seed"] for r in runs if r["twin"] == "mlm+nsp")
    index = next(i for i, r in enumerate(runs) if r["twin"] == "mlm+nsp" and r["seed"] == first)
    model = load_model(folders[index] / "model")[0]
    save_hf(model.to(torch.bfloat16), tok, model_out)
    run = runs[index]
    manifest = {
        "what": f"a {run['preset']} BERT pretrained by bertlab with the gpu recipe (MLM + NSP) "
                f"on BBC News, on one GPU shared with {train_info['concurrent_runs'] - 1} other "
                f"runs",
        "device": run["device"], "command": train_info["command"],
        "scored_by": "python benchmarks/gpu_pretrain.py " + " ".join(args.argv),
        "steps": run["steps"], "tokens": run["tokens"], "minutes": run["minutes"],
        "recipe": json.loads((folders[index] / "summary.json").read_text())["recipe"],
        "scores": {k: run[k] for k in ("at_128", "at_64", "word_overlap_rule_nsp_accuracy",
                                       "cloze", "cls_probe_all_labels", "low_label")},
        "dtype": "bfloat16",
        "files": {f.name: f.stat().st_size for f in sorted(model_out.iterdir()) if f.is_file()},
    }
    atomic_write_json(model_out / "MANIFEST.json", manifest)
    biggest = max(f.stat().st_size for f in model_out.iterdir()) / 2**20
    print(f"model written: {model_out} (largest file {biggest:.1f} MiB)")


# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="stage", required=True)
    for name in ("train", "run-one", "score"):
        p = sub.add_parser(name)
        p.add_argument("--runs", type=Path, default=REPO / "runs" / "gpu-twins")
        p.add_argument("--shards", type=Path, default=REPO / "data" / "bbc_shards",
                       help="shards prepared at 128 tokens (with --pair-draws) and tokenizer")
        p.add_argument("--threads", type=int, default=None, help="torch CPU threads per process")
        if name == "score":
            p.add_argument("--finetune-seeds", type=int, default=3)
            p.add_argument("--label-budgets", type=int, nargs="+", default=list(LABEL_BUDGETS),
                           help="labelled documents per class for fine-tuning and the probe")
            p.add_argument("--out", type=Path, default=None, help="the record (default: on a "
                           "GPU run, benchmarks/results/gpu_pretrain.json; else a temp folder)")
            p.add_argument("--model-out", type=Path, default=None)
            p.add_argument("--model-name", default="gpu-mini")
            continue
        p.add_argument("--shards64", type=Path, default=REPO / "data" / "bbc_shards64",
                       help="shards prepared at 64 tokens (their validation split is read)")
        p.add_argument("--preset", default="mini")
        p.add_argument("--steps", type=int, default=3000, help="every run's step budget")
        p.add_argument("--minutes", type=float, default=None,
                       help="a deadline as well (a run that reaches it first says so)")
        p.add_argument("--batch-size", type=int, default=None, help="default: the recipe's")
        p.add_argument("--eval-interval", type=int, default=250)
        p.add_argument("--eval-batches", type=int, default=50)
        p.add_argument("--num-workers", type=int, default=2)
        p.add_argument("--device", default="cuda")
        p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                       help="default: on with CUDA")
        p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
        if name == "run-one":
            p.add_argument("--twin", choices=sorted(TWINS), required=True)
            p.add_argument("--seed", type=int, required=True)
            p.add_argument("--run-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.stage != "score" and torch.device(args.device).type == "cuda" and (
            not torch.cuda.is_available()):
        print("gpu_pretrain: no CUDA GPU here, nothing trained. Run the train stage on a "
              "machine with an NVIDIA GPU (or pass --device cpu for a smoke test).")
        return 0
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return {"train": train_stage, "run-one": run_one, "score": score_stage}[args.stage](args)


if __name__ == "__main__":
    sys.exit(main())
