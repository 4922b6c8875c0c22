"""What do the shipped models' attention heads do? Per head, how often each query's strongest
attention goes to a nameable place, on held-out text, beside the same head untrained.

For each model folder (default: models/course-nsp and models/course-tiny) and for an untrained
model of the same BertConfig (seeded), the script reads held-out text built as the model was
trained: the validation split of its corpus (`split_documents`), cut into examples by the pair
builder of its recipe's objectives (NSP pairs for both shipped models), at its recipe's
max_seq_len (128 for course-nsp, 64 for course-tiny). The examples are drawn at random
(`--seed`) into `--samples` samples of `--per-sample` sequences; every sample is one batch.

For every layer and head it counts, among the real query tokens (never padding), the share
whose largest attention weight goes to:

  previous   the token just before the query (queries that have one)
  next       the token just after it (queries that have a real one)
  sep        a [SEP] token
  cls        the [CLS] token
  self       the query itself
  same_word  another WordPiece of the query's own word (queries in words of 2+ pieces)

Each share comes as the mean and sample standard deviation over the samples. The record,
benchmarks/results/attention_heads.json, holds every share of every head, trained and
untrained, and per behaviour the head with the highest trained share beside that same head's
untrained share. Notebook 04 (section 9) reads it.

Usage: python benchmarks/attention_heads.py [--models models/course-nsp ...] [--samples 5]
       [--per-sample 100] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from _record import (  # benchmarks/ is on sys.path when run as a script
    REPO,
    check_common,
    repo_relative,
    write_record,
)

from bertlab.corpus import split_documents
from bertlab.errors import BadInput, run_reporting
from bertlab.loading import load_model
from bertlab.model import BertForPreTraining
from bertlab.pairs import pad_examples, pair_builder, pairs_of
from bertlab.readers import load_corpus
from bertlab.recipes import Recipe
from bertlab.tokenizer import SpecialIds, Tokenizer, special_ids

RESULTS = REPO / "benchmarks" / "results"
BEHAVIOURS = {
    "previous": "the token just before the query (queries that have one)",
    "next": "the token just after the query (queries that have a real one)",
    "sep": "a [SEP] token",
    "cls": "the [CLS] token",
    "self": "the query itself",
    "same_word": "another WordPiece of the query's own word (queries in words of 2+ pieces)",
}


# ---------------------------------------------------------------------------------------------
# The shares of one batch


def word_ids(input_ids: torch.Tensor, attention_mask: torch.Tensor, continuation: torch.Tensor,
             special: SpecialIds) -> torch.Tensor:
    """Return (B, T) word numbers: pieces of one word share a number (a piece that starts with
    ## continues the word before it); special tokens and padding get -1."""
    real = attention_mask.bool()
    is_special = torch.isin(input_ids, torch.tensor(special.all))
    word_piece = real & ~is_special
    starts = word_piece & ~continuation[input_ids]
    return torch.where(word_piece, starts.long().cumsum(dim=1), torch.full_like(input_ids, -1))


def head_hits(attentions: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor,
              words: torch.Tensor, special: SpecialIds) -> dict[str, tuple[torch.Tensor, int]]:
    """Return, per behaviour, the (layers, heads) count of queries whose largest attention
    weight goes there, and how many queries could do it.

    `attentions` is (layers, B, heads, T, T): query rows, key columns; `words` is `word_ids`.
    A query counts only where the behaviour is possible (a previous token, a real next one, a
    word of several pieces), so a head that always does it scores exactly 1.0."""
    B, T = input_ids.shape
    top = attentions.argmax(dim=-1)                                  # (L, B, H, T): key index
    real = attention_mask.bool()
    q = torch.arange(T).expand(B, T)
    length = real.sum(dim=1, keepdim=True)
    same = (words[:, :, None] == words[:, None, :]) & (words[:, :, None] >= 0)   # (B, T, T)

    def key_is(table: torch.Tensor) -> torch.Tensor:  # (B, T) per key -> (L, B, H, T) per query
        return table[torch.arange(B)[None, :, None, None], top]

    word_of_top = key_is(words)
    aligned = {  # per behaviour: (did the top key fit, which queries count)
        "previous": (top == (q - 1)[None, :, None], real & (q >= 1)),
        "next": (top == (q + 1)[None, :, None], real & (q + 1 < length)),
        "sep": (key_is(input_ids == special.sep), real),
        "cls": (top == 0, real),
        "self": (top == q[None, :, None], real),
        "same_word": ((word_of_top == words[None, :, None]) & (top != q[None, :, None]),
                      real & (same.sum(dim=-1) > 1)),
    }
    out = {}
    for name, (hit, eligible) in aligned.items():
        counted = hit & eligible[None, :, None, :]
        out[name] = (counted.sum(dim=(1, 3)), int(eligible.sum()))
    return out


def head_shares(attentions: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                words: torch.Tensor, special: SpecialIds) -> dict[str, torch.Tensor]:
    """Return, per behaviour, the (layers, heads) share of the queries that could do it whose
    largest attention weight goes there (`head_hits`); nan where no query could."""
    return {name: hits.double() / count if count else torch.full(hits.shape, float("nan"))
            for name, (hits, count) in head_hits(attentions, input_ids, attention_mask, words,
                                                 special).items()}


# ---------------------------------------------------------------------------------------------
# Held-out text and the models


def continuation_table(tok: Tokenizer) -> torch.Tensor:
    """Return a (vocab,) bool table: True for the pieces that continue a word (## pieces)."""
    table = torch.zeros(tok.get_vocab_size(), dtype=torch.bool)
    for piece, index in tok.get_vocab().items():
        table[index] = piece.startswith("##")
    return table


def held_out_samples(folder: Path, tok: Tokenizer, args: argparse.Namespace,
                     validation: Sequence) -> tuple[list[dict[str, torch.Tensor]], dict]:
    """Return `--samples` padded batches of `--per-sample` held-out examples, built as the model
    in `folder` was trained (its MANIFEST's recipe), and what they are."""
    manifest_file = folder / "MANIFEST.json"
    if not manifest_file.is_file():
        raise BadInput(str(folder), "has no MANIFEST.json, so how it was trained is unknown",
                       "pass a shipped model folder (models/course-nsp, models/course-tiny)")
    manifest = json.loads(manifest_file.read_text(encoding="utf-8"))
    recipe = Recipe.from_dict(manifest["recipe"])
    max_seq_len = args.max_seq_len or recipe.max_seq_len
    pairs = pairs_of(recipe.objectives)
    examples = pair_builder(pairs)(validation, tok, max_seq_len=max_seq_len, seed=args.seed)
    wanted = args.samples * args.per_sample
    if len(examples) < wanted:
        raise BadInput(f"--samples {args.samples} --per-sample {args.per_sample}",
                       f"asks for {wanted} sequences, but the validation split gives "
                       f"{len(examples)} at {max_seq_len} tokens", "ask for fewer")
    chosen = random.Random(args.seed).sample(range(len(examples)), wanted)
    pad = special_ids(tok).pad
    batches = [pad_examples([examples[i] for i in chosen[s * args.per_sample:(s + 1) * args.per_sample]],
                            pad) for s in range(args.samples)]
    about = {"objectives": list(recipe.objectives), "pairs": pairs, "max_seq_len": max_seq_len,
             "steps": manifest.get("steps"), "examples_available": len(examples)}
    return batches, about


@torch.no_grad()
def model_shares(model: BertForPreTraining, batches: Sequence[dict[str, torch.Tensor]],
                 continuation: torch.Tensor, special: SpecialIds) -> dict[str, dict]:
    """Return, per behaviour, every head's shares over the samples: per sample, mean, std."""
    per_sample: dict[str, list[torch.Tensor]] = {name: [] for name in BEHAVIOURS}
    for batch in batches:
        attentions = torch.stack(model.bert(**batch, output_attentions=True).attentions)
        words = word_ids(batch["input_ids"], batch["attention_mask"], continuation, special)
        shares = head_shares(attentions, batch["input_ids"], batch["attention_mask"], words,
                             special)
        for name, share in shares.items():
            per_sample[name].append(share)
    out = {}
    for name, samples in per_sample.items():
        stacked = torch.stack(samples)                                # (samples, layers, heads)
        std = stacked.std(dim=0) if len(samples) > 1 else torch.zeros_like(stacked[0])
        out[name] = {"mean": _rounded(stacked.mean(dim=0)), "std": _rounded(std),
                     "samples": _rounded(stacked)}
    return out


def _rounded(t: torch.Tensor) -> list:
    return torch.round(t.double(), decimals=4).tolist()


def best_heads(trained: dict[str, dict], untrained: dict[str, dict]) -> dict[str, dict]:
    """Return, per behaviour, the head with the highest trained mean share, with that same
    head's untrained share."""
    out = {}
    for name in BEHAVIOURS:
        means = trained[name]["mean"]
        layer, head = max(((li, h) for li, row in enumerate(means) for h in range(len(row))),
                          key=lambda lh: means[lh[0]][lh[1]])
        out[name] = {"layer": layer, "head": head, **{
            arm: {k: shares[name][k][layer][head] for k in ("mean", "std")}
            for arm, shares in (("trained", trained), ("untrained", untrained))}}
    return out


def measure_model(folder: Path, args: argparse.Namespace, validation: Sequence) -> dict:
    """Return one model's record: what it read, every head's shares trained and untrained, and
    the most specialised head per behaviour."""
    model, tok = load_model(folder, require_tokenizer=True)
    special = special_ids(tok)
    batches, about = held_out_samples(folder, tok, args, validation)
    untrained = BertForPreTraining(
        model.config, generator=torch.Generator().manual_seed(args.untrained_seed)).eval()
    continuation = continuation_table(tok)
    trained_shares = model_shares(model.eval(), batches, continuation, special)
    untrained_shares = model_shares(untrained, batches, continuation, special)
    return {"folder": repo_relative(folder), **about, "layers": model.config.num_layers,
            "heads": model.config.num_heads,
            "sequences": sum(len(b["input_ids"]) for b in batches),
            "real_tokens": sum(int(b["attention_mask"].sum()) for b in batches),
            "best": best_heads(trained_shares, untrained_shares),
            "trained": trained_shares, "untrained": untrained_shares}


def print_best(name: str, record: dict) -> None:
    """Print a model's most specialised head per behaviour, trained beside untrained."""
    print(f"{name} ({record['sequences']} held-out sequences of up to {record['max_seq_len']} "
          f"tokens, {record['pairs']} examples):")
    for behaviour, best in record["best"].items():
        t, u = best["trained"], best["untrained"]
        print(f"  {behaviour:<10} layer {best['layer']} head {best['head']}: "
              f"{t['mean']:.3f} +- {t['std']:.3f} (untrained {u['mean']:.3f} +- {u['std']:.3f})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", type=Path, nargs="+",
                        default=[REPO / "models" / "course-nsp", REPO / "models" / "course-tiny"],
                        help="model folders with a MANIFEST.json (shipped models)")
    parser.add_argument("--corpus", default="bbc", help="the corpus whose validation split is read")
    parser.add_argument("--samples", type=int, default=5, help="samples (each one batch)")
    parser.add_argument("--per-sample", type=int, default=100, help="sequences per sample")
    parser.add_argument("--max-seq-len", type=int, default=None,
                        help="sequence length (default: each model's recipe's)")
    parser.add_argument("--seed", type=int, default=0, help="builds and draws the examples")
    parser.add_argument("--untrained-seed", type=int, default=0,
                        help="initial weights of the untrained twin")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--out", type=Path, default=RESULTS / "attention_heads.json")
    args = parser.parse_args(argv)
    if args.samples < 1 or args.per_sample < 1:
        raise BadInput("--samples / --per-sample", "must be at least 1", "pass positive counts")
    check_common(args.threads, args.out, args.models)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    validation = split_documents(load_corpus(args.corpus))["validation"]
    models = {}
    for folder in args.models:
        models[folder.name] = measure_model(folder, args, validation)
        print_best(folder.name, models[folder.name])
    # The record names the model folders as the command line would (relative to the repository).
    shown = argparse.Namespace(**{**vars(args), "models": [repo_relative(p) for p in args.models]})
    write_record("attention_heads.py", shown, argv, args.out, behaviours=BEHAVIOURS,
                 validation_documents=len(validation), models=models,
                 seconds=round(time.perf_counter() - start, 1))
    return 0


if __name__ == "__main__":
    # Bad input ends in one `error:` line (exit 2), as in `python -m bertlab`.
    sys.exit(run_reporting(main))
