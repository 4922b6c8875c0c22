"""What is a pretrained encoder worth downstream? BBC topics with the course model beside three
baselines, all labels and few.

One run, on CPU, measures:

1. Probes on frozen vectors (test accuracy of a logistic regression): the pooled output, the raw
   last-layer [CLS] state and the mean of all token vectors, for the course model and for the
   same architecture at its random initialisation (seeds 0, 1, 2). The course model is trained
   MLM-only, so its pooler is the random one it started with: whether NSP would have made
   [CLS] better is the NSP group of benchmarks/ablations.py, with 3 seeds per arm.
2. `compare_downstream` with all labels and with k labelled documents per class (default 8 and
   32): fine-tuned (every weight of the course model trained on the labels), the linear probe
   on its pooled [CLS], TF-IDF + logistic regression on the same WordPiece tokens, and the
   same architecture trained from random weights with the same fine-tuning recipe. Every row
   over several seeds (head init, data order, and the k documents drawn).

The model is models/course-tiny (made by `make course-model`: the course recipe, 8,000 steps;
its MANIFEST.json, copied into the results, says how). Every method reads the first
`--max-seq-len` tokens of each article; by default the length the model was pretrained at (its
MANIFEST's recipe: 64 for course-tiny), since positions beyond it never had a gradient: their
embeddings never learned. Results, with the command, go to
benchmarks/results/downstream.json; the script prints the checks it makes, PASS or MISS.

Usage: python benchmarks/downstream.py [--model models/course-tiny] [--seeds 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from _record import write_record  # benchmarks/ is on sys.path when run as a script

from bertlab.downstream import compare_downstream, load_task
from bertlab.finetune import (
    FinetuneConfig,
    ProbeConfig,
    cls_features,
    format_table,
    linear_probe,
    summarize,
)
from bertlab.loading import load_model, pretrained_length
from bertlab.model import BertForPreTraining

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
POOLINGS = ("pooled", "cls", "mean")


def probe_scores(model, docs, labels, tok, max_seq_len: int) -> dict[str, float]:
    """Return the test accuracy of a linear probe on each pooling of a frozen model."""
    out = {}
    for pooling in POOLINGS:
        features = cls_features(model, docs, tok, pooling=pooling, max_seq_len=max_seq_len)
        probe = ProbeConfig(pooling=pooling, max_seq_len=max_seq_len)
        out[pooling] = linear_probe(model, docs, labels, tokenizer=tok, config=probe,
                                    features=features).accuracy
    return out


def low_label_config(args: argparse.Namespace) -> FinetuneConfig:
    """The fine-tuning of the few-label rows: at least FinetuneConfig's min_steps (40 documents
    give 2 steps an epoch)."""
    return FinetuneConfig(epochs=args.epochs, max_seq_len=args.max_seq_len, device="cpu")


def trace(args: argparse.Namespace) -> int:
    """Print the reproduce trace of one low-label cell (`--trace K SEED`)."""
    model, tok = load_model(args.model, require_tokenizer=True)
    k, seed = args.trace
    results = compare_downstream(model, tok, "bbc-topic", config=low_label_config(args),
                                 k_per_class=[k], seeds=[seed])
    print(json.dumps({r.method: trace_row(r.to_dict()) for r in results}))
    return 0


def trace_row(result: dict) -> dict:
    """The numbers of one result that its trace compares (its times left out)."""
    return {"accuracy": result["accuracy"], "macro_f1": result["macro_f1"],
            "predictions": result["predictions"],
            "final_train_loss": result["details"].get("final_train_loss")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "course-tiny",
                        help="a pretrained model folder (Hugging Face export or bertlab run)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds of every row")
    parser.add_argument("--labels-per-class", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--epochs", type=float, default=5.0, help="fine-tuning epochs")
    parser.add_argument("--max-seq-len", type=int, default=None,
                        help="tokens read from each article (default: the length the model was "
                             "pretrained at, from its MANIFEST.json or a run folder's "
                             "run.json; 128 without one)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--out", type=Path, default=RESULTS / "downstream.json")
    parser.add_argument("--trace", nargs=2, type=int, metavar=("K", "SEED"), default=None,
                        help="print one low-label cell as JSON (every method at K labels per "
                             "class, one seed: scores, predictions, final loss) and run nothing "
                             "else: the reproduce trace in the record (tools/record_traces.py)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.max_seq_len is None:  # positions past the pretrained length never had a gradient
        found = pretrained_length(args.model)
        args.max_seq_len = FinetuneConfig.max_seq_len if found is None else found[0]
    if args.trace:
        return trace(args)
    start = time.perf_counter()
    timings: dict[str, float] = {}

    model, tok = load_model(args.model, require_tokenizer=True)
    manifest_file = args.model / "MANIFEST.json"
    manifest = json.loads(manifest_file.read_text()) if manifest_file.is_file() else None
    docs, labels = load_task("bbc-topic")
    seeds = list(range(args.seeds))
    print(f"BBC: {len(docs)} documents; model {args.model} "
          f"({manifest['steps'] if manifest else '?'} steps of pretraining); seeds {seeds}; "
          f"{torch.get_num_threads()} threads; first {args.max_seq_len} tokens of each article",
          flush=True)

    print("1. probes on frozen vectors", flush=True)
    t = time.perf_counter()
    probes = {"course model": probe_scores(model, docs, labels, tok, args.max_seq_len)}
    random_init = []
    for seed in seeds:
        fresh = BertForPreTraining(model.config, generator=torch.Generator().manual_seed(seed))
        random_init.append(probe_scores(fresh.eval(), docs, labels, tok, args.max_seq_len))
    probes["random init"] = {p: statistics.fmean(r[p] for r in random_init) for p in POOLINGS}
    probes["random init (per seed)"] = random_init
    for name in ("random init", "course model"):
        print(f"  {name:<13} " + "  ".join(f"{p} {probes[name][p]:.3f}" for p in POOLINGS),
              flush=True)
    timings["probes"] = time.perf_counter() - t

    print("2. fine-tuned / probe / TF-IDF / from scratch", flush=True)
    t = time.perf_counter()
    results = compare_downstream(model, tok, "bbc-topic", config=FinetuneConfig(
        epochs=args.epochs, min_steps=1, max_seq_len=args.max_seq_len, device="cpu"),
        seeds=seeds)
    timings["all_labels"] = time.perf_counter() - t
    t = time.perf_counter()
    results += compare_downstream(model, tok, "bbc-topic", config=low_label_config(args),
                                  k_per_class=args.labels_per_class, seeds=seeds)
    timings["low_label"] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - start
    rows = summarize(results)
    print("\nBBC topic classification, test split:")
    print(format_table(rows))

    def row(method, k):
        return next(r for r in rows if r["method"] == method and r["k_per_class"] == k)

    checks = {}
    for k in (None, *args.labels_per_class):
        a, b = row("fine-tuned", k), row("from scratch", k)
        gap = a["accuracy_mean"] - b["accuracy_mean"]
        noise = 2 * (a["accuracy_std"] ** 2 / a["runs"] + b["accuracy_std"] ** 2 / b["runs"]) ** 0.5
        checks[f"fine-tuned beats from scratch beyond 2 se, k={k or 'all'} "
               f"({100 * gap:+.1f} points, 2 se {100 * noise:.1f})"] = gap > noise
    for pooling in POOLINGS:
        gain = probes["course model"][pooling] - probes["random init"][pooling]
        checks[f"probe ({pooling}) above random init ({100 * gain:+.1f} points)"] = gain > 0
    print("\nchecks:")
    for name, ok in checks.items():
        print(f"  {'PASS' if ok else 'MISS'}  {name}")
    print("\ntimings (min): " + ", ".join(f"{k} {v / 60:.1f}" for k, v in timings.items()))
    write_record("downstream.py", args, argv, args.out, timings_s=timings, model=manifest,
                 probes=probes, summary=rows, checks=checks,
                 results=[r.to_dict() for r in results])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
