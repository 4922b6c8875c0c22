"""What is [CLS] worth downstream? BBC topic classification with pretrained vs random encoders.

One run, on CPU by default, measures side by side:

1. Pretraining: a tiny BERT pretrained with MLM + NSP, and the same model (same init, same
   batches) pretrained with MLM only (`bertlab.pretrain(..., nsp=False)`): `--pretrain-steps`
   here, or runs made beforehand with the CLI (`--nsp-run`, `--mlm-run`).
2. Linear probes on frozen [CLS] vectors (pooled output and raw hidden state) for: random init,
   MLM-only, MLM + NSP; beside each, its NSP accuracy on held-out pairs.
3. The full-data table: fine-tuned (MLM + NSP encoder), linear probe, TF-IDF + logistic
   regression, the same model trained from scratch; with `--demo-run`, also the demo's model.
4. Low-label runs: k labelled documents per class (default 8 and 32), several seeds, mean ± std,
   for fine-tuned, from scratch, TF-IDF and the probe.

Results (with the command that produced them) go to benchmarks/results/downstream.json, and the
script prints the targets it checks (the demo-budget model fine-tuned >= 95% test accuracy;
pretrained minus scratch >= +10 points at 8 and 32 labels per class; NSP probe above MLM-only
probe), PASS or MISS.

Usage: python benchmarks/downstream.py [--pretrain-steps 300] [--seeds 3] [--quick]

The saved results: two 20-minute pretraining runs (the same settings, with and without NSP),
the demo's own 4-minute run, then this script on all three:
  python -m bertlab pretrain --minutes 20 --lr 2e-3 --hidden-dropout 0 --attention-dropout 0 \
      --threads 1 --eval-interval 500 --out runs/nsp20        (again with --no-nsp: runs/mlm20)
  python -m bertlab demo                                       (writes runs/demo/run)
  python benchmarks/downstream.py --nsp-run runs/nsp20 --mlm-run runs/mlm20 \
      --demo-run runs/demo/run --threads 1 --max-chunks 4 --epochs 8
Full-data fine-tuning there reads up to four 128-token windows per article (trained on each,
logits averaged at test); probes, TF-IDF and the low-label runs read the first window only.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from _record import write_record  # benchmarks/ is on sys.path when run as a script

from bertlab.checkpoint import load_run
from bertlab.corpus import load_corpus
from bertlab.data import pretraining_loader
from bertlab.downstream import cls_features, linear_probe, tfidf_baseline
from bertlab.finetune import (
    FinetuneConfig,
    finetune_classifier,
    format_table,
    from_scratch,
    summarize,
)
from bertlab.model import BertConfig, BertForPreTraining
from bertlab.pretraining import evaluate, pretrain
from bertlab.tokenizer import train_tokenizer
from bertlab.train import TrainConfig

RESULTS = Path(__file__).parent / "results"


def pretrain_tiny(objective: str, train, val, tok, args,
                  out_dir: Path | None) -> tuple[BertForPreTraining, dict]:
    """Return (model, summary) after pretraining with "mlm+nsp" or "mlm" (same init, batches)."""
    config = BertConfig.preset(args.preset, vocab_size=tok.get_vocab_size())
    model = BertForPreTraining(config, generator=torch.Generator().manual_seed(0))
    train_config = TrainConfig(max_steps=args.pretrain_steps, batch_size=32, lr=args.pretrain_lr,
                               eval_interval=None, eval_batches=10, checkpoint_interval=None,
                               progress=False, log_interval=50, device=args.device)
    start = time.perf_counter()
    run = pretrain(model, train, val, train_config, out_dir=out_dir, nsp=objective == "mlm+nsp")
    if out_dir is not None:
        tok.save(str(out_dir / "tokenizer.json"))
    summary = {"objective": objective, "steps": run.steps, "seconds": time.perf_counter() - start,
               "final": run.final}
    print(f"  {objective}: {run.steps} steps in {summary['seconds'] / 60:.1f} min, "
          f"val MLM acc {run.final.get('val_mlm_accuracy', float('nan')):.3f}, "
          f"NSP acc {run.final.get('val_nsp_accuracy', float('nan')):.3f}", flush=True)
    return model.eval(), summary


def nsp_accuracy(model, val) -> dict:
    """Return held-out MLM and NSP accuracy of a model (its NSP head as it is), 640 pairs."""
    metrics = evaluate(model, val, max_batches=20)
    return {"nsp_accuracy": metrics["nsp_accuracy"], "mlm_accuracy": metrics["mlm_accuracy"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--pretrain-steps", type=int, default=300,
                        help="pretraining steps of batch 32 (default 300: ~4 min on 2 idle cores)")
    parser.add_argument("--pretrain-lr", type=float, default=1e-3, help="as the demo (tiny)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds of the low-label runs")
    parser.add_argument("--labels-per-class", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--epochs", type=float, default=10.0, help="fine-tuning epochs (full data)")
    parser.add_argument("--lr", type=float, default=1e-3, help="fine-tuning peak learning rate")
    parser.add_argument("--low-label-steps", type=int, default=80,
                        help="optimizer steps of each low-label run (batch 16)")
    parser.add_argument("--max-seq-len", type=int, default=128)
    parser.add_argument("--max-chunks", type=int, default=1,
                        help="windows of max-seq-len tokens per article in full-data "
                             "fine-tuning (each trained on; logits averaged at test)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--nsp-run", type=Path, help="reuse this MLM+NSP run folder")
    parser.add_argument("--mlm-run", type=Path, help="reuse this MLM-only run folder")
    parser.add_argument("--demo-run", type=Path,
                        help="also fine-tune this run (e.g. runs/demo/run, pretrained with the "
                             "demo's budget) on the full split: the >= 95%% target is its")
    parser.add_argument("--keep-runs", type=Path, help="write the pretraining runs here")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke test: 20 pretraining steps, 1 seed, few fine-tuning steps")
    parser.add_argument("--out", type=Path, default=RESULTS / "downstream.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.pretrain_steps, args.seeds, args.epochs, args.low_label_steps = 20, 1, 0.1, 5
        if args.out == RESULTS / "downstream.json":
            args.out = RESULTS / "downstream-quick.json"
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    timings: dict[str, float] = {}

    docs = load_corpus("bbc")
    labels = [d.label for d in docs]
    tok = train_tokenizer(docs, vocab_size=8192)
    budget = ("reusing " + ", ".join(str(p) for p in (args.nsp_run, args.mlm_run) if p)
              if args.nsp_run or args.mlm_run else f"{args.pretrain_steps} pretraining steps")
    print(f"BBC: {len(docs)} documents; {args.preset}, {budget}, "
          f"{torch.get_num_threads()} threads", flush=True)

    # 1. Pretraining: MLM + NSP and MLM only, same init and batches.
    print("1. pretraining", flush=True)
    models, pretraining = {}, {}
    t = time.perf_counter()
    # Every run sees the same NSP pairs and masks: the loaders are functions of (seed, epoch).
    train = pretraining_loader(docs, tok, split="train", batch_size=32, max_seq_len=128, seed=0)
    val = pretraining_loader(docs, tok, split="validation", batch_size=32, max_seq_len=128,
                             seed=0)  # a fixed shuffled order: every topic in each eval
    for name, objective, reuse in (("MLM + NSP", "mlm+nsp", args.nsp_run),
                                   ("MLM only", "mlm", args.mlm_run)):
        if reuse is not None:
            models[name] = load_run(reuse)[0].eval()
            history = json.loads((reuse / "history.json").read_text())
            pretraining[name] = {"objective": objective, "reused": str(reuse),
                                 "steps": history[-1]["step"], "final": history[-1]}
        else:
            out_dir = args.keep_runs / objective.replace("+", "-") if args.keep_runs else None
            models[name], pretraining[name] = pretrain_tiny(objective, train, val, tok, args,
                                                            out_dir)
    config = BertConfig.preset(args.preset, vocab_size=tok.get_vocab_size())
    models = {"random init": BertForPreTraining(config, generator=torch.Generator().manual_seed(0))
              .eval(), **models}
    timings["pretraining"] = time.perf_counter() - t

    # 2. Probes on frozen [CLS]: random init vs MLM only vs MLM + NSP.
    print("2. linear probes on [CLS] (frozen encoders)", flush=True)
    t = time.perf_counter()
    probes = []
    features = {}
    for name, model in models.items():
        row = {"model": name, **nsp_accuracy(model, val)}
        # One encoder pass: the pooled vector is tanh(pooler(raw [CLS])), applied here.
        features[name, "cls"] = cls_features(model, docs, tok, pooling="cls",
                                             max_seq_len=args.max_seq_len)
        with torch.no_grad():
            features[name, "pooled"] = torch.tanh(
                model.bert.pooler(torch.from_numpy(features[name, "cls"]))).numpy()
        for pooling in ("pooled", "cls"):
            r = linear_probe(model, docs, labels, tokenizer=tok, pooling=pooling,
                             features=features[name, pooling], max_seq_len=args.max_seq_len)
            row[f"probe_{pooling}_accuracy"] = r.accuracy
            row[f"probe_{pooling}_C"] = r.details["C"]
        probes.append(row)
        print(f"  {name:<12} NSP acc {row['nsp_accuracy']:.3f}  probe pooled "
              f"{row['probe_pooled_accuracy']:.3f}  probe raw [CLS] {row['probe_cls_accuracy']:.3f}",
              flush=True)
    timings["probes"] = time.perf_counter() - t

    # 3. Full data, 4. low-label: the same four methods.
    pre = models["MLM + NSP"]
    full = FinetuneConfig(epochs=args.epochs, lr=args.lr, max_seq_len=args.max_seq_len,
                          max_chunks=args.max_chunks, device=args.device, min_steps=1)
    results = []

    def run_all(k, seed, ft_config):
        out = [
            finetune_classifier(pre, docs, labels, tokenizer=tok, config=ft_config, k_per_class=k),
            linear_probe(pre, docs, labels, tokenizer=tok, k_per_class=k, seed=seed,
                         features=features["MLM + NSP", "pooled"], max_seq_len=args.max_seq_len),
            tfidf_baseline(docs, labels, tokenizer=tok, k_per_class=k, seed=seed,
                           max_seq_len=args.max_seq_len),
            from_scratch(pre, docs, labels, tokenizer=tok, config=ft_config, k_per_class=k),
        ]
        for r in out:
            r.model = None
            print(f"  {r.method:<30} k={k or 'all':<4} seed={seed} acc {r.accuracy:.3f} "
                  f"F1 {r.macro_f1:.3f}", flush=True)
        return out

    print("3. full training split", flush=True)
    t = time.perf_counter()
    results += run_all(None, 0, full)
    if args.demo_run is not None:
        demo_model = load_run(args.demo_run)[0].eval()
        r = finetune_classifier(demo_model, docs, labels, tokenizer=tok, config=full,
                                method="fine-tuned (demo budget)")
        r.model = None
        print(f"  {r.method:<30} k=all  seed=0 acc {r.accuracy:.3f} F1 {r.macro_f1:.3f}", flush=True)
        results.append(r)
        demo_history = json.loads((args.demo_run / "history.json").read_text())
        pretraining["demo budget"] = {"objective": "mlm+nsp", "reused": str(args.demo_run),
                                      "steps": demo_history[-1]["step"],
                                      "final": demo_history[-1]}
    timings["full"] = time.perf_counter() - t
    print("4. low-label runs", flush=True)
    t = time.perf_counter()
    for k in args.labels_per_class:
        for seed in range(args.seeds):
            low = FinetuneConfig(epochs=1, min_steps=args.low_label_steps, batch_size=16,
                                 lr=args.lr, max_seq_len=args.max_seq_len, device=args.device,
                                 seed=seed)
            results += run_all(k, seed, low)
    timings["low_label"] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - start

    # Report
    rows = summarize(results)
    print("\nBBC topic classification, test split (226 documents):")
    print(format_table(rows))
    print("\n[CLS] probes (test accuracy) and NSP accuracy (validation pairs):")
    print(f"{'encoder':<12} {'NSP acc':>8} {'probe pooled':>13} {'probe raw [CLS]':>16}")
    for row in probes:
        print(f"{row['model']:<12} {row['nsp_accuracy']:>8.3f} {row['probe_pooled_accuracy']:>13.3f} "
              f"{row['probe_cls_accuracy']:>16.3f}")

    def mean_acc(method, k):
        return next(r["accuracy_mean"] for r in rows
                    if r["method"] == method and r["k_per_class"] == k)

    demo = "fine-tuned (demo budget)" if args.demo_run is not None else "fine-tuned"
    checks = {f"{demo} >= 95% (full; {100 * mean_acc(demo, None):.1f}%)":
              mean_acc(demo, None) >= 0.95}
    for k in args.labels_per_class:
        gain = mean_acc("fine-tuned", k) - mean_acc("from scratch", k)
        checks[f"pretrained - scratch >= +10 points at k={k} ({100 * gain:+.1f})"] = gain >= 0.10
    by_model = {row["model"]: row for row in probes}
    for pooling in ("pooled", "cls"):
        nsp, mlm = (by_model[m][f"probe_{pooling}_accuracy"] for m in ("MLM + NSP", "MLM only"))
        checks[f"NSP probe > MLM-only probe ({pooling}: {nsp:.3f} vs {mlm:.3f})"] = nsp > mlm
    print("\ntargets:")
    for name, ok in checks.items():
        print(f"  {'PASS' if ok else 'MISS'}  {name}")
    print("\ntimings (min): " + ", ".join(f"{k} {v / 60:.1f}" for k, v in timings.items()))

    write_record("downstream.py", args, argv, args.out, timings_s=timings,
                 pretraining=pretraining, probes=probes, summary=rows, checks=checks,
                 results=[r.to_dict() for r in results])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
