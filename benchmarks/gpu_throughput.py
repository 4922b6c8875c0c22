"""GPU pretraining throughput and MFU: bertlab vs transformers' BertForPreTraining, side by side.

For each preset (default: base and tiny) at sequence length 128: the full training step (forward,
MLM + NSP loss, backward, gradient clipping, fused AdamW) under bf16 autocast and torch.compile,
for bertlab's model and for transformers' (SDPA attention), both with the process-wide switches
the training loop sets (`bertlab.device.fast_math`: TF32). bertlab's MLM head runs at the targets
only, with the fixed number of rows a compiled run gives it (`bertlab.pretraining.mlm_capacity`).
Prints the median step time, tokens/s, model FLOPs utilisation (bertlab.sizes.flops_per_token x
tokens/s / peak; the same FLOP count for both, so the MFU ratio is the speed ratio) and the
ratio transformers / bertlab.

Batches are full-length sequences (no padding) with 15% of positions as MLM targets, drawn from
a seeded generator: the step costs what a packed pretraining batch costs.

Usage: python benchmarks/gpu_throughput.py [--presets base tiny] [--peak-tflops 989]
Needs a CUDA GPU; without one it says so and exits (status 0, so `make bench` carries on).
`--device cpu --steps 2 --warmup 1` runs the same code on the CPU as a smoke test (no MFU); a
CPU run writes into a temporary folder unless `--out` says where, never over the GPU record.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from bertlab.device import autocast_context, fast_math
from bertlab.hf import hf_config_fields
from bertlab.masking import MaskingConfig
from bertlab.model import BertConfig, BertForPreTraining
from bertlab.pretraining import pretraining_counts, pretraining_loss, target_share_bound
from bertlab.sizes import flops_per_token
from bertlab.train import TrainConfig, build_optimizer

RESULTS = Path(__file__).resolve().parent / "results"


def make_batch(batch_size: int, seq_len: int, vocab_size: int, device: torch.device,
               generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Return a full-length pretraining batch with 15% MLM targets (ids from `generator`)."""
    ids = torch.randint(5, vocab_size, (batch_size, seq_len), generator=generator)
    targets = torch.rand(batch_size, seq_len, generator=generator) < 0.15
    targets[:, 0] = False  # [CLS]
    labels = torch.where(targets, ids, torch.full_like(ids, -100))
    batch = {"input_ids": ids.masked_fill(targets, 4),
             "token_type_ids": (torch.arange(seq_len) >= seq_len // 2).long().expand(batch_size, -1),
             "attention_mask": torch.ones_like(ids), "labels": labels,
             "next_sentence_label": torch.randint(0, 2, (batch_size,), generator=generator)}
    return {k: v.contiguous().to(device) for k, v in batch.items()}


def hf_model(config: BertConfig):
    import transformers

    hf_config = transformers.BertConfig(**hf_config_fields(config))
    hf_config._attn_implementation = "sdpa"
    return transformers.BertForPreTraining(hf_config)


def time_steps(model, batch, device, precision, compile_model, warmup, steps) -> list[float]:
    """Return the seconds of `steps` training steps after `warmup` (compilation) steps."""
    config = TrainConfig(lr=1e-4)
    model.to(device).train()
    optimizer = build_optimizer(model, config, device)
    step_model = torch.compile(model) if compile_model else model
    totals = pretraining_counts(batch)
    # As pretrain does for a compiled model: a fixed number of MLM rows (BERT's 15% masking).
    share = target_share_bound(MaskingConfig()) if compile_model else None
    times = []
    for i in range(warmup + steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with autocast_context(device, precision):
            if isinstance(model, BertForPreTraining):
                loss = pretraining_loss(step_model, batch, totals, target_share=share)
            else:
                loss = step_model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", nargs="+", default=["base", "tiny"])
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, nargs="+", default=[256, 1024],
                        help="one per preset (default: 256 for base, 1024 for tiny)")
    parser.add_argument("--vocab-size", type=int, default=30522, help="BERT's WordPiece size")
    parser.add_argument("--peak-tflops", type=float, default=989.0,
                        help="dense bf16 peak of the GPU (989 for H100 SXM / H200)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps (compilation)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--no-reference", action="store_true", help="skip transformers")
    parser.add_argument("--out", default=None, help="the JSON to write (default: on a GPU, "
                        "benchmarks/results/gpu_throughput.json; on a CPU, a temporary folder)")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_throughput: no CUDA GPU here, nothing measured. This benchmark times bf16 + "
              "torch.compile + fused AdamW training steps; run it on a machine with an NVIDIA "
              "GPU (or pass --device cpu for a smoke test of the code path).")
        return 0
    precision = "bf16" if device.type == "cuda" else "fp32"
    if device.type == "cuda":
        print(f"GPU: {torch.cuda.get_device_name(device)}, peak {args.peak_tflops} TFLOP/s bf16")
    sizes = args.batch_size + [args.batch_size[-1]] * (len(args.presets) - len(args.batch_size))
    rows = []
    for preset, batch_size in zip(args.presets, sizes, strict=False):
        config = BertConfig.preset(preset, vocab_size=args.vocab_size)
        batch = make_batch(batch_size, args.seq_len, args.vocab_size, device,
                           torch.Generator().manual_seed(0))
        tokens = batch_size * args.seq_len
        flops = flops_per_token(config, args.seq_len, mlm_fraction=0.15)
        models = {"bertlab": lambda c=config: BertForPreTraining(c)}
        if not args.no_reference:
            models["transformers"] = lambda c=config: hf_model(c)
        medians = {}
        for name, build in models.items():
            model = build()
            # The switches pretraining sets (TF32, dynamo tracing the sparse head's gather).
            with fast_math(device, compile=not args.no_compile):
                times = time_steps(model, batch, device, precision, not args.no_compile,
                                   args.warmup, args.steps)
            medians[name] = statistics.median(times)
            rate = tokens / medians[name]
            mfu = flops * rate / (args.peak_tflops * 1e12)
            rows.append({"preset": preset, "model": name, "batch": batch_size,
                         "seq_len": args.seq_len, "median_step_s": medians[name],
                         "tokens_per_s": rate, "mfu": mfu if device.type == "cuda" else None})
            print(f"{preset:>6} {name:>12}: batch {batch_size} x {args.seq_len}, median step "
                  f"{1000 * medians[name]:.1f} ms, {rate:,.0f} tokens/s"
                  + (f", MFU {100 * mfu:.1f}%" if device.type == "cuda" else ""))
            del model
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if "transformers" in medians:
            print(f"{preset:>6} ratio transformers / bertlab step time: "
                  f"{medians['transformers'] / medians['bertlab']:.2f}x")
    if args.out is None:  # a CPU smoke run never lands on the GPU record
        args.out = str(RESULTS / "gpu_throughput.json" if device.type == "cuda" else
                       Path(tempfile.mkdtemp(prefix="gpu_throughput-")) / "gpu_throughput.json")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"settings": vars(args), "device": str(device), "rows": rows},
                              indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
