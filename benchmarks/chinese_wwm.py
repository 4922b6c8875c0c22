"""Character masking vs whole-word masking for a Chinese BERT, side by side, on CPU.

For each seed, two tiny BERTs start from the same initialisation and see the same NSP examples
of the zh-news training split in the same order, trained with the course recipe
(`recipe("course")`: 40% of tokens as targets, MLM only, Muon, 16 x 64-token pairs); they differ
only in which tokens are targets: single characters, or every character of a gold word
(`pretraining_loader(..., word_ids=...)`). Then, for each model:

1. masked-LM accuracy on held-out zh-news pairs (validation split) under two fixed maskings,
   every target shown as [MASK]: characters one by one (char_accuracy), and whole words
   (word_accuracy: a word counts as right only if all its characters are; multi_char: the same
   over words of 2+ characters); and the second characters of hidden two-character words with
   the first one hidden too, or shown again (second_char_partner_hidden / _visible: how much a
   model copies from the other half of a word);
2. zh-reviews sentiment (pos/neg) after fine-tuning on `--per-class` reviews per class, test
   accuracy; a model trained from scratch with the same recipe is the baseline.

Prints one row per seed and model, then medians over seeds and the difference whole-word minus
character, and writes everything (with the command) to benchmarks/results/chinese_wwm.json.

Usage: python benchmarks/chinese_wwm.py [--steps 10000] [--seeds 0 1 2] [--per-class 1000] [--device cpu]

Seeds are independent, so on a machine with several cores they can run as separate processes,
each with its own `--out`, and be combined afterwards (the saved 10,000-step results, 2 cores):

  python benchmarks/chinese_wwm.py --steps 10000 --seeds 0 2 --threads 1 --out a.json &
  python benchmarks/chinese_wwm.py --steps 10000 --seeds 1 --threads 1 --out b.json
  python benchmarks/chinese_wwm.py --merge a.json b.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from _record import write_record  # benchmarks/ is on sys.path when run as a script

from bertlab.corpus import split_documents
from bertlab.data import LoaderOptions, pretraining_loader
from bertlab.finetune import FinetuneConfig, finetune_classifier
from bertlab.masking import MaskingConfig
from bertlab.model import BertForPreTraining
from bertlab.pairs import create_nsp_examples
from bertlab.pretraining import pretrain
from bertlab.readers import load_corpus
from bertlab.recipes import recipe
from bertlab.tokenizer import train_tokenizer
from bertlab.zh import nsp_word_ids, second_character_batches, segment_corpus, whole_word_scores

RESULTS = Path(__file__).parent / "results"
KINDS = ("char", "wwm")
RECIPE = recipe("course")


def segmented_examples(docs, tok, seed: int):
    """Return (NSP examples, their word ids) for the documents."""
    corpus = segment_corpus(docs, tok)
    examples = create_nsp_examples(corpus, tok, max_seq_len=RECIPE.max_seq_len, seed=seed)
    return examples, [nsp_word_ids(e, corpus) for e in examples]


METRICS = ("char_masked_char_accuracy", "word_masked_char_accuracy", "word_accuracy",
           "multi_char_word_accuracy", "second_char_partner_hidden",
           "second_char_partner_visible", "sentiment_accuracy")


def medians_of(rows: list[dict]) -> dict:
    """Return, per model, the median over seeds of each metric it has."""
    medians = {}
    for model in ("from scratch", *KINDS):
        chosen = [r for r in rows if r["model"] == model]
        if chosen:
            medians[model] = {m: statistics.median(r[m] for r in chosen) for m in METRICS
                              if m in chosen[0]}
    return medians


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10000, help="pretraining steps per model")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--per-class", type=int, default=1000,
                        help="labelled reviews per class for fine-tuning")
    parser.add_argument("--finetune-epochs", type=float, default=2.0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu",
                        help="cpu (the saved results), cuda, or auto; a GPU makes --steps 20000 "
                             "a matter of minutes")
    parser.add_argument("--out", type=Path, default=RESULTS / "chinese_wwm.json")
    parser.add_argument("--merge", type=Path, nargs="+", metavar="RECORD",
                        help="train nothing: combine finished records of the same settings (seeds "
                             "run as separate processes) into --out")
    args = parser.parse_args(argv)
    if args.merge:
        return merge(args, argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    start = time.perf_counter()
    news = load_corpus("zh-news")
    reviews = load_corpus("zh-reviews")
    tok = train_tokenizer(news)
    parts = split_documents(news)
    train_ex, train_words = segmented_examples(parts["train"], tok, seed=0)
    val_ex, val_words = segmented_examples(parts["validation"], tok, seed=1)
    evals = {  # fixed masks, every target shown as [MASK]
        kind: pretraining_loader(val_ex, tok, split=None, word_ids=val_words,
                                 options=LoaderOptions(
                                     whole_word=kind == "wwm", batch_size=64, shuffle=False,
                                     mask_schedule="static", return_word_ids=True,
                                     masking=MaskingConfig(mask_replace_prob=1.0,
                                                           random_replace_prob=0.0)))
        for kind in KINDS
    }
    # Second characters of hidden two-character words, partner hidden / shown again: the same
    # batches for every model, built once.
    partner_batches = {name: second_character_batches(evals["wwm"], reveal=reveal)
                       for name, reveal in (("hidden", False), ("visible", True))}
    print(f"{len(train_ex)} training pairs, {len(val_ex)} validation pairs, vocabulary "
          f"{tok.get_vocab_size()}; {args.steps} steps per model", flush=True)

    rows = []
    for seed in args.seeds:
        config = RECIPE.model_config("tiny", tok.get_vocab_size())
        finetune = FinetuneConfig(epochs=args.finetune_epochs, max_seq_len=64, device=args.device,
                                  seed=seed)
        scratch = finetune_classifier(config, reviews, tokenizer=tok, config=finetune,
                                      k_per_class=args.per_class)
        rows.append({"seed": seed, "model": "from scratch", "sentiment_accuracy": scratch.accuracy})
        for kind in KINDS:
            model = BertForPreTraining(config, generator=torch.Generator().manual_seed(seed))
            loader = pretraining_loader(train_ex, tok, split=None, word_ids=train_words, seed=seed,
                                        options=LoaderOptions(whole_word=kind == "wwm",
                                                              batch_size=RECIPE.batch_size,
                                                              masking=RECIPE.masking))
            run = pretrain(model, loader, None, RECIPE.train_config(
                max_steps=args.steps, checkpoint_interval=None, progress=False, log_interval=0,
                device=args.device, seed=seed), objectives=RECIPE.objectives)
            row = {"seed": seed, "model": kind, "train_seconds": round(run.elapsed_s, 1),
                   "final_loss": sum(run.step_losses[-20:]) / len(run.step_losses[-20:])}
            for eval_kind, loader in evals.items():
                scores = whole_word_scores(model, loader)
                key = "char_masked" if eval_kind == "char" else "word_masked"
                row[f"{key}_char_accuracy"] = scores["char_accuracy"]
                if eval_kind == "wwm":
                    row["word_accuracy"] = scores["word_accuracy"]
                    row["multi_char_word_accuracy"] = scores["multi_char_word_accuracy"]
            for name, batches in partner_batches.items():
                row[f"second_char_partner_{name}"] = whole_word_scores(model, batches)["char_accuracy"]
            result = finetune_classifier(model, reviews, tokenizer=tok, config=finetune,
                                         k_per_class=args.per_class)
            row["sentiment_accuracy"] = result.accuracy
            rows.append(row)
            print(" ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in row.items()), flush=True)
        # After every seed, so a stopped run keeps what it finished.
        write_record("chinese_wwm.py", args, argv, args.out, complete=False, recipe=RECIPE.to_dict(),
                     total_seconds=round(time.perf_counter() - start, 1), rows=rows,
                     medians=medians_of(rows))

    total = time.perf_counter() - start
    medians = medians_of(rows)
    print_medians(medians, args)
    print(f"total {total / 60:.1f} min")
    write_record("chinese_wwm.py", args, argv, args.out, complete=True, recipe=RECIPE.to_dict(),
                 total_seconds=round(total, 1), rows=rows, medians=medians)
    return 0


def print_medians(medians: dict, args: argparse.Namespace) -> None:
    print(f"\nmedians over seeds {args.seeds} ({args.steps} steps, tiny, course recipe):")
    print(f"{'metric':<28} {'char':>8} {'wwm':>8} {'wwm-char':>9} {'wwm/char':>9}")
    for m in METRICS:
        c, w = medians["char"][m], medians["wwm"][m]
        ratio = f"{w / c:9.2f}" if c else f"{'-':>9}"
        print(f"{m:<28} {c:8.4f} {w:8.4f} {w - c:+9.4f} {ratio}")
    print(f"{'sentiment, from scratch':<28} {medians['from scratch']['sentiment_accuracy']:8.4f}")


# What must agree between records before their rows can sit in one table.
SAME = ("steps", "per_class", "finetune_epochs", "device")


def merge(args: argparse.Namespace, argv: list[str] | None) -> int:
    """Combine finished records, each from its own seeds, into one record at `args.out`."""
    records = []
    for path in args.merge:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise SystemExit(f"--merge {path}: cannot read it as a chinese_wwm.py record ({err})"
                             ) from None
        if not (isinstance(record, dict) and "chinese_wwm.py" in str(record.get("command"))
                and {"settings", "rows", "recipe"} <= record.keys()):
            made_by = record.get("command") if isinstance(record, dict) else None
            raise SystemExit(f"--merge {path}: not a chinese_wwm.py record (made by "
                             f"{made_by or 'something else'}); give the --out files of its runs")
        if not record.get("complete"):
            raise SystemExit(f"--merge {path}: the run did not finish (complete is false); run its "
                             "seeds again, or leave the file out")
        records.append(record)
    first, first_path = records[0], args.merge[0]
    for path, record in zip(args.merge[1:], records[1:], strict=True):
        differ = [k for k in SAME if record["settings"].get(k) != first["settings"].get(k)]
        if record["recipe"] != first["recipe"]:
            differ.append("recipe")
        if differ:
            raise SystemExit(f"--merge {path}: {', '.join(differ)} differ from {first_path}; only "
                             "runs of the same settings can share a table")
    seeds = [s for record in records for s in record["settings"]["seeds"]]
    if len(set(seeds)) < len(seeds):
        raise SystemExit(f"--merge: seeds {seeds} repeat across the records; give each seed once")
    rows = sorted((row for record in records for row in record["rows"]),
                  key=lambda row: row["seed"])  # stable: scratch, char, wwm within a seed
    for key in (*SAME, "threads"):
        setattr(args, key, first["settings"].get(key))
    args.seeds, args.merge = sorted(seeds), [str(path) for path in args.merge]
    medians = medians_of(rows)
    print_medians(medians, args)
    write_record("chinese_wwm.py", args, argv, args.out, complete=True, recipe=first["recipe"],
                 total_seconds=sum(r["total_seconds"] for r in records),
                 merged_from=[{k: r[k] for k in ("command", "machine", "total_seconds")}
                              for r in records],
                 rows=rows, medians=medians)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
