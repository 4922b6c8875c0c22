"""Unpadding on real BBC batches: bertlab padded vs bertlab unpadded vs transformers, on this CPU.

A batch of BBC pairs at 128 tokens is padded to its longest pair, and about a tenth of its
positions hold padding. `TrainConfig.unpad` (`real_tokens=` in `bertlab.pretraining.FastPretraining`) runs every
block's projections, feed-forward and LayerNorms on the real tokens only and pads them back just
for attention. This script times one training step (zero_grad, forward, MLM + NSP loss,
backward, AdamW) three ways on the same batches, from the same start weights, dropout on, fp32:

- `padded`: bertlab as its training step runs by default (`FastPretraining`, attention mask,
  every position computed up to the last block);
- `unpadded`: bertlab with the batch's real tokens (`fast_inputs(batch, unpad=True)`);
- `transformers`: `transformers.BertForPreTraining` (SDPA attention) on the padded batch.

Twice: batches as the loader makes them (padded to each batch's longest pair, a multiple of 8)
and batches grouped by length (`group_by_length=8`, less padding, and many batches with none,
where unpadding has nothing to skip). Before timing, the three sides must give the same
eval-mode loss on a padded batch. The sides alternate, round after round, so a noisy machine
hits all three; tokens/s counts real tokens, and each round's unpadded/padded ratio is kept, so
the record gives the median ratio and its spread over rounds.

Usage: python benchmarks/unpadding.py [--preset mini] [--batch-size 64] [--batches 4]
       [--repeats 5] [--threads N]
Writes benchmarks/results/unpadding.json (or --out).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from _record import write_record  # benchmarks/ is on sys.path when run as a script

import bertlab as bl
from bertlab.data import LoaderOptions, pretraining_loader
from bertlab.hf import hf_config_fields, to_hf_state_dict
from bertlab.model import BertConfig, BertForPreTraining
from bertlab.pretraining import FastPretraining, fast_inputs

SIDES = ("padded", "unpadded", "transformers")
RESULTS = Path(__file__).resolve().parent / "results"


def make_models(preset: str, vocab_size: int, seq_len: int) -> dict[str, torch.nn.Module]:
    """Return the three sides' models with the same start weights."""
    import transformers

    config = BertConfig.preset(preset, vocab_size=vocab_size, max_position_embeddings=seq_len)
    ours = BertForPreTraining(config, generator=torch.Generator().manual_seed(0))
    twin = BertForPreTraining(config)
    twin.load_state_dict(ours.state_dict())
    hf_config = transformers.BertConfig(**hf_config_fields(config))
    hf_config._attn_implementation = "sdpa"
    theirs = transformers.BertForPreTraining(hf_config)
    theirs.load_state_dict(to_hf_state_dict(ours.state_dict()), strict=False)
    return {"padded": FastPretraining(ours), "unpadded": FastPretraining(twin),
            "transformers": theirs}


def side_batches(batches: list[dict]) -> dict[str, list[dict]]:
    """Return each side's form of the loader's batches: what bertlab's training loop hands its
    model (no mask on a batch without padding; with unpad, the real tokens), and the loader's
    batch as is for transformers."""
    return {"padded": [fast_inputs(b) for b in batches],
            "unpadded": [fast_inputs(b, unpad=True) for b in batches],
            "transformers": batches}


def check_same_loss(models, forms) -> float:
    """Return the largest |loss difference| between the sides in eval mode on the first padded
    batch (the same weights: should be ~1e-6); a disagreement stops the benchmark."""
    padded = next((i for i, b in enumerate(forms["transformers"])
                   if not bool(b["attention_mask"].all())), 0)
    with torch.no_grad():
        losses = [models[s].eval()(**forms[s][padded]).loss.item() for s in SIDES]
    for model in models.values():
        model.train()
    return max(losses) - min(losses)


def time_condition(name: str, loader, args) -> dict:
    """Return one condition's figures: padding, per-side median tokens/s and the ratios."""
    batches = []
    while len(batches) < args.batches:
        batches += list(loader)
    batches = batches[:args.batches]
    real = sum(int(b["attention_mask"].sum()) for b in batches)
    positions = sum(b["input_ids"].numel() for b in batches)
    unmasked = sum(bool(b["attention_mask"].all()) for b in batches)
    models = make_models(args.preset, args.vocab_size, args.seq_len)
    forms = side_batches(batches)
    diff = check_same_loss(models, forms)
    if diff > 1e-4:
        raise SystemExit(f"{name}: the three sides disagree (losses differ by {diff:.2e})")
    optimizers = {s: torch.optim.AdamW(m.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
                  for s, m in models.items()}

    def steps(side: str) -> float:  # one pass over the batches; its real tokens per second
        start = time.perf_counter()
        for batch in forms[side]:
            optimizers[side].zero_grad(set_to_none=True)
            models[side](**batch).loss.backward()
            optimizers[side].step()
        return real / (time.perf_counter() - start)

    for side in SIDES:  # warm-up: first-call allocations, optimizer state
        steps(side)
    rates: dict[str, list[float]] = {s: [] for s in SIDES}
    for repeat in range(args.repeats):
        for side in SIDES[repeat % 3:] + SIDES[:repeat % 3]:  # each side first in turn
            rates[side].append(steps(side))
    ratios = [u / p for u, p in zip(rates["unpadded"], rates["padded"], strict=True)]
    medians = {s: statistics.median(r) for s, r in rates.items()}
    result = {"batches": len(batches), "padding_share": 1 - real / positions,
              "batches_without_padding": unmasked, "loss_difference": diff,
              "tokens_per_s": medians,
              "unpadded_over_padded": {"median": statistics.median(ratios),
                                       "min": min(ratios), "max": max(ratios)},
              "padded_over_transformers": medians["padded"] / medians["transformers"],
              "unpadded_over_transformers": medians["unpadded"] / medians["transformers"]}
    print(f"{name}: {result['padding_share']:.1%} of positions are padding, {unmasked} of "
          f"{len(batches)} batches have none; loss difference {diff:.1e}")
    for side in SIDES:
        print(f"  {side:>12}: {medians[side]:8,.0f} real tokens/s (median of {args.repeats})")
    r = result["unpadded_over_padded"]
    print(f"  unpadded / padded {r['median']:.3f} (rounds {r['min']:.3f} to {r['max']:.3f}); "
          f"padded / transformers {result['padded_over_transformers']:.2f}, unpadded / "
          f"transformers {result['unpadded_over_transformers']:.2f}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="mini", help="model size (the GPU twins' is mini)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batches", type=int, default=4, help="batches per timed round")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per side")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    parser.add_argument("--docs", type=int, default=None, help="use the first N BBC articles")
    parser.add_argument("--out", type=Path, default=RESULTS / "unpadding.json")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    docs = bl.load_corpus("bbc")[:args.docs]
    tok = bl.train_tokenizer(docs, vocab_size=8192)  # the course tokenizer (cached)
    args.vocab_size = tok.get_vocab_size()
    conditions = {}
    for name, grouping in (("padded to each batch's longest pair", None),
                           ("grouped by length", 8)):
        loader = pretraining_loader(docs, tok, split="train", seed=0,
                                    options=LoaderOptions(batch_size=args.batch_size,
                                                          max_seq_len=args.seq_len,
                                                          pad_to_multiple_of=8,
                                                          group_by_length=grouping))
        conditions[name] = time_condition(name, loader, args)
    write_record("unpadding.py", args, argv, args.out, device="cpu", preset=args.preset,
                 conditions=conditions)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
