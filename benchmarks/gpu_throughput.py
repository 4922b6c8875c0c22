"""GPU pretraining throughput and MFU: bertlab vs transformers' BertForPreTraining, side by side.

Each row is one training step, timed as a median over `--steps` after `--warmup` (compilation)
steps, for bertlab's model and for transformers' (SDPA attention, compiled the same way, dropout
0.1 as in BERT): forward, MLM + NSP loss, backward, gradient clipping, fused AdamW, under bf16
autocast and torch.compile, with the switches the training loop sets (`bertlab.engine.device.fast_math`).
bertlab's MLM head runs at the targets only, with the fixed number of rows a compiled run gives
it (`bertlab.pretraining.mlm_capacity`), through the training step's forward (`bertlab.pretraining`).

The rows (`--rows preset:seq_len:batch`): tiny, mini and base at 128 tokens and base at 512 on
`full` batches (every position a real token, 15% of them MLM targets: what a packed batch
costs), and base at 128 on `real` batches, BBC pairs from a `prepare`d shard folder (`--shards`),
padded to the length, so the row shows what padding costs (`padding_share`: the positions that
hold padding), and `grouped` rows: the same pairs batched by length (`group_by_length`), which
pads less and leaves most batches with no padding and so no attention mask. tokens_per_s
counts real tokens (the median over timed steps of a step's real tokens over its time). Options
after the kind: `:regional` compiles each encoder layer instead of the whole model (shorter
compiles; is it as fast?), `:unpad` runs bertlab's blocks on a padded batch's real tokens only
(`TrainConfig.unpad`; transformers' side is unchanged), e.g. base:128:real:unpad.

The record, benchmarks/results/gpu_throughput.json (rewritten after every row, so a run cut
short keeps the rows it finished): `device` (the GPU's name), `torch`, `compile`,
`matmul_peak_tflops` (this GPU's measured bf16 matmul peak) and `rows`, each with preset,
seq_len, batch, batch_size, vocab_size, compile (whole, regional or none), unpad, padding_share,
tokens_per_s, mfu (against `--peak-tflops`, 989 for
an H100/H200, with `bertlab.counts.flops_per_token`), mfu_measured_peak,
transformers_tokens_per_s and ratio_vs_transformers (bertlab / transformers).

Usage: python benchmarks/gpu_throughput.py [--rows base:128:full ...] [--shards data/bbc_shards]
Needs a CUDA GPU; without one it says so and exits (status 0, so `make bench` carries on).
`--device cpu` runs the same code on the CPU as a smoke test (no MFU); a CPU run writes into a
temporary folder unless `--out` says where, never over the GPU record.
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
from _record import matmul_peak, write_record  # benchmarks/ is on sys.path when run as a script

from bertlab.counts import flops_per_token
from bertlab.data import LoaderOptions
from bertlab.engine.device import fast_math
from bertlab.engine.shards import shard_loader, shard_pair_length
from bertlab.hf import hf_config_fields
from bertlab.masking import MaskingConfig
from bertlab.model import BertConfig, BertForPreTraining
from bertlab.pretraining import FastPretraining, PretrainingObjective, target_share_bound
from bertlab.tokenizer import load_tokenizer
from bertlab.train import TrainConfig, autocast_context, build_optimizer, to_device

RESULTS = Path(__file__).resolve().parent / "results"


def make_batch(batch_size: int, seq_len: int, vocab_size: int,
               generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Return a full-length pretraining batch with 15% MLM targets (ids from `generator`), on
    the CPU, as a loader gives it."""
    ids = torch.randint(5, vocab_size, (batch_size, seq_len), generator=generator)
    targets = torch.rand(batch_size, seq_len, generator=generator) < 0.15
    targets[:, 0] = False  # [CLS]
    labels = torch.where(targets, ids, torch.full_like(ids, -100))
    batch = {"input_ids": ids.masked_fill(targets, 4),
             "token_type_ids": (torch.arange(seq_len) >= seq_len // 2).long().expand(batch_size, -1),
             "attention_mask": torch.ones_like(ids), "labels": labels,
             "next_sentence_label": torch.randint(0, 2, (batch_size,), generator=generator)}
    return {k: v.contiguous() for k, v in batch.items()}


def hf_model(config: BertConfig):
    import transformers

    hf_config = transformers.BertConfig(**hf_config_fields(config))
    hf_config._attn_implementation = "sdpa"
    return transformers.BertForPreTraining(hf_config)


def compiled(model, mode: str):
    """Return the module a step calls: `model` as it is ("none"), compiled whole ("whole"), or
    with each encoder layer compiled in place and the rest eager ("regional": one layer's graph,
    reused by every layer of the same shape, so compiling takes one layer's time)."""
    if mode == "whole":
        return torch.compile(model)
    if mode == "regional":
        layers = (model.model.bert.layers if isinstance(model, FastPretraining)
                  else model.bert.encoder.layer)
        for layer in layers:
            layer.compile()
    return model


def training_step(model, batches, device, precision, compile_mode, unpad=False):
    """Return step(i): one training step on batch i (cycling over `batches`, CPU batches moved
    to the device here, before any timing), synchronised with the device when it returns.

    bertlab's model runs as its training loop runs it: through `FastPretraining`, with each
    batch as the step hands it over (`PretrainingObjective.inputs`: no mask when there is no
    padding, a compiled model's fixed number of MLM rows, and with `unpad` a padded batch's real
    tokens); transformers' gets the loader's batch, mask included, as its Trainer would."""
    ours = isinstance(model, BertForPreTraining)
    # As pretrain does for a compiled model: a fixed number of MLM rows (BERT's 15% masking).
    share = target_share_bound(MaskingConfig()) if compile_mode != "none" else None
    objective = PretrainingObjective(target_share=share, unpad=unpad)
    totals = [objective.counts(b) for b in batches] if ours else []  # outside the timing
    if ours:
        batches = [objective.inputs(b) for b in batches]
    batches = [to_device(b, device) for b in batches]
    config = TrainConfig(lr=1e-4)
    model.to(device).train()
    optimizer = build_optimizer(model, config, device)
    step_model = compiled(objective.module(model) if ours else model, compile_mode)

    def step(i: int) -> None:
        batch = batches[i % len(batches)]
        with autocast_context(device, precision):
            if ours:
                loss = objective.loss(step_model, batch, totals[i % len(batches)])
            else:
                loss = step_model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()

    return step


def time_steps(model, batches, device, precision, compile_mode, warmup, steps,
               unpad=False) -> list[float]:
    """Return the seconds of `steps` training steps after `warmup` (compilation) steps."""
    step = training_step(model, batches, device, precision, compile_mode, unpad)
    times = []
    for i in range(warmup + steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step(i)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def profile_row(args, spec: str, device: torch.device, precision: str, top: int = 15) -> dict:
    """Return the `top` kernels (operators on a CPU) by self time over `--profile-steps` steps
    of bertlab's model on one row, after the warm-up: where a step's time goes."""
    from torch.profiler import ProfilerActivity, profile

    batches, config, batch_size, _ = row_inputs(args, spec)
    model = BertForPreTraining(config)
    with fast_math(device):
        step = training_step(model, batches, device, precision, compile_mode(args, spec),
                             row_options(spec)["unpad"])
        for i in range(args.warmup):
            step(i)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                               if device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            for i in range(args.profile_steps):
                step(i)
    on_gpu = device.type == "cuda"
    key = "self_device_time_total" if on_gpu else "self_cpu_time_total"
    events = [e for e in prof.key_averages() if getattr(e, key) > 0]
    events.sort(key=lambda e: getattr(e, key), reverse=True)
    total = sum(getattr(e, key) for e in events)
    kernels = [{"name": e.key[:120], "ms_per_step": getattr(e, key) / 1000 / args.profile_steps,
                "share": getattr(e, key) / total} for e in events[:top]]
    for k in kernels:
        print(f"  {k['share']:6.1%} {k['ms_per_step']:8.3f} ms  {k['name']}")
    return {"row": spec, "batch_size": batch_size, "steps": args.profile_steps,
            "time": "device (GPU kernels)" if on_gpu else "CPU operators", "top": kernels}


ROWS = ("tiny:128:full", "mini:128:full", "base:128:full", "base:512:full", "base:128:real",
        "base:128:real:unpad")
BATCH_SIZES = {("tiny", 128): 1024, ("mini", 128): 512, ("base", 128): 256, ("base", 512): 64}


def real_batches(shards: Path, batch_size: int, seq_len: int, count: int, grouped: bool = False):
    """Return (`count` BBC batches from a shard folder, its vocab size): padded to `seq_len`, or
    with `grouped` batched by length (`group_by_length=8`) and padded to a multiple of 32, so
    most batches have no padding and a compiled model sees at most a few shapes."""
    held = shard_pair_length(shards)
    if held != seq_len:
        raise SystemExit(f"gpu_throughput: a real row at {seq_len} tokens needs shards of "
                         f"{seq_len}-token pairs; {shards} holds {held}-token pairs (prepare "
                         f"--max-seq-len {seq_len})")
    tok = load_tokenizer(shards / "tokenizer.json")
    loader = shard_loader(shards, tok, split="train", seed=0,
                          options=LoaderOptions(batch_size=batch_size, max_seq_len=seq_len,
                                                pad_to_multiple_of=32 if grouped else seq_len,
                                                group_by_length=8 if grouped else None))
    batches = []
    while len(batches) < count:  # a small folder is cycled
        batches += list(loader)
    return batches[:count], tok.get_vocab_size()


OPTIONS = ("regional", "unpad")


def row_options(spec: str) -> dict[str, bool]:
    """Return which options a row spec `preset:seq_len:kind[:option...]` names."""
    preset, seq_len, kind, *options = spec.split(":")
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown or kind not in ("full", "real", "grouped") or not seq_len.isdigit():
        raise SystemExit(f"gpu_throughput: row {spec!r} is not preset:seq_len:full|real|grouped "
                         f"with options from {', '.join(OPTIONS)} (e.g. base:128:real:unpad)")
    return {name: name in options for name in OPTIONS}


def compile_mode(args, spec: str) -> str:
    """Return how a row is compiled: "none" with --no-compile, "regional" for a row spec with the
    :regional option, else "whole"."""
    if args.no_compile:
        return "none"
    return "regional" if row_options(spec)["regional"] else "whole"


def row_inputs(args, spec: str):
    """Return (batches, model config, batch size, vocab size) of one row
    `preset:seq_len:kind[:option...]`."""
    preset, seq_len, kind = spec.split(":")[:3]
    seq_len = int(seq_len)
    batch_size = args.batch_size or BATCH_SIZES.get((preset, seq_len), 64)
    count = args.warmup + args.steps
    if kind in ("real", "grouped"):
        batches, vocab = real_batches(args.shards, batch_size, seq_len, count, kind == "grouped")
    else:
        vocab = args.vocab_size
        batches = [make_batch(batch_size, seq_len, vocab, torch.Generator().manual_seed(i))
                   for i in range(min(count, 4))]
    config = BertConfig.preset(preset, vocab_size=vocab, max_position_embeddings=max(512, seq_len))
    return batches, config, batch_size, vocab


def measure_row(args, spec: str, device: torch.device, precision: str) -> dict | None:
    """Return one row of the record: bertlab and transformers on the same batches."""
    preset, seq_len, kind = spec.split(":")[:3]
    seq_len = int(seq_len)
    if kind in ("real", "grouped") and args.shards is None:
        print(f"{spec}: skipped, no --shards folder (python -m bertlab prepare --corpus bbc "
              f"--out data/bbc_shards makes one)")
        return None
    batches, config, batch_size, vocab = row_inputs(args, spec)
    tokens = [int(b["attention_mask"].sum()) for b in batches]  # real tokens, per batch
    padding = 1 - sum(tokens) / sum(b["input_ids"].numel() for b in batches)  # computed for nothing
    mode, unpad = compile_mode(args, spec), row_options(spec)["unpad"]
    flops = flops_per_token(config, seq_len, mlm_fraction=0.15)
    rates = {}
    for name in ("bertlab", "transformers")[: 1 if args.no_reference else 2]:
        model = BertForPreTraining(config) if name == "bertlab" else hf_model(config)
        with fast_math(device):
            times = time_steps(model, batches, device, precision, mode, args.warmup, args.steps,
                               unpad=unpad and name == "bertlab")
        # Each timed step's real tokens over its time (batches of a grouped row differ in size).
        rates[name] = statistics.median(tokens[(args.warmup + i) % len(batches)] / t
                                        for i, t in enumerate(times))
        print(f"{spec:>15} {name:>12}: batch {batch_size} x {seq_len}, median step "
              f"{1000 * statistics.median(times):.1f} ms, {rates[name]:,.0f} tokens/s")
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    on_gpu = device.type == "cuda"
    reference = rates.get("transformers")
    return {"preset": preset, "seq_len": seq_len, "batch": kind, "batch_size": batch_size,
            "vocab_size": vocab, "compile": mode, "unpad": unpad, "padding_share": padding,
            "tokens_per_s": rates["bertlab"],
            "mfu": flops * rates["bertlab"] / (args.peak_tflops * 1e12) if on_gpu else None,
            "mfu_measured_peak": flops * rates["bertlab"] / args.matmul_peak if on_gpu else None,
            "transformers_tokens_per_s": reference,
            "ratio_vs_transformers": None if reference is None else rates["bertlab"] / reference}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", nargs="*", default=list(ROWS),
                        help="preset:seq_len:full|real|grouped, then options: :regional compiles "
                             "each encoder layer instead of the whole model, :unpad skips the "
                             "padding in bertlab's blocks (none: only --profile)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="one batch size for every row (default: 1024 tiny, 512 mini, 256 "
                             "base at 128, 64 base at 512)")
    parser.add_argument("--shards", type=Path, default=None,
                        help="a prepared shard folder with its tokenizer.json, for real rows")
    parser.add_argument("--vocab-size", type=int, default=30522, help="BERT's WordPiece size")
    parser.add_argument("--peak-tflops", type=float, default=989.0,
                        help="dense bf16 peak of the GPU (989 for H100 SXM / H200)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps (compilation)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--no-reference", action="store_true", help="skip transformers")
    parser.add_argument("--profile", default=None, metavar="ROW",
                        help="after the rows, profile bertlab on this row (e.g. base:128:full) "
                             "and record its top kernels by time")
    parser.add_argument("--profile-steps", type=int, default=5)
    parser.add_argument("--append", action="store_true",
                        help="keep the rows (and profile) already in --out and add to them: a "
                             "session in phases, each with its own deadline, builds one record")
    parser.add_argument("--out", type=Path, default=None, help="the JSON to write (default: on a "
                        "GPU, benchmarks/results/gpu_throughput.json; on a CPU, a temp folder)")
    args = parser.parse_args(argv)
    for spec in [*args.rows, *([args.profile] if args.profile else [])]:
        row_options(spec)  # a mistyped row stops here, not after minutes of measuring
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_throughput: no CUDA GPU here, nothing measured. This benchmark times bf16 + "
              "torch.compile + fused AdamW training steps; run it on a machine with an NVIDIA "
              "GPU (or pass --device cpu for a smoke test of the code path).")
        return 0
    if args.out is None:  # a CPU smoke run never lands on the GPU record
        args.out = (RESULTS / "gpu_throughput.json" if device.type == "cuda" else
                    Path(tempfile.mkdtemp(prefix="gpu_throughput-")) / "gpu_throughput.json")
    precision = "bf16" if device.type == "cuda" else "fp32"
    args.matmul_peak = matmul_peak(torch.bfloat16 if device.type == "cuda" else torch.float32,
                                   n=8192 if device.type == "cuda" else 1024, device=device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{name}: measured matmul peak {args.matmul_peak / 1e12:.1f} TFLOP/s ({precision})")
    rows: list[dict] = []
    earlier = json.loads(args.out.read_text()) if args.append and args.out.is_file() else {}
    if earlier and earlier.get("device") != name:
        raise SystemExit(f"gpu_throughput --append: {args.out} was measured on "
                         f"{earlier.get('device')}, not {name}; write another file")
    rows += earlier.get("rows", [])
    measured: dict = {"device": name, "torch": torch.__version__, "compile": not args.no_compile,
                      "matmul_peak_tflops": args.matmul_peak / 1e12, "rows": rows}
    if "profile" in earlier:
        measured["profile"] = earlier["profile"]
    for spec in args.rows:
        row = measure_row(args, spec, device, precision)
        if row is not None:
            rows.append(row)
        write_record("gpu_throughput.py", args, argv, args.out, **measured)
    if args.profile:
        print(f"profile of {args.profile}, bertlab, {args.profile_steps} steps:")
        measured["profile"] = profile_row(args, args.profile, device, precision)
        write_record("gpu_throughput.py", args, argv, args.out, **measured)
    return 0


if __name__ == "__main__":
    sys.exit(main())
