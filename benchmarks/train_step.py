"""One pretraining step, bertlab vs transformers.BertForPreTraining, side by side on this CPU.

bertlab's side is what its training step runs (`bertlab.pretraining.FastPretraining` over a
`BertForPreTraining`: the last block at [CLS] and the targets only, the MLM head at the targets).
Both sides get the same config (dropout on, fp32), the same start weights, the same batch
(32 x 128 tokens, vocab 8192, 15% MLM targets, NSP labels, no padding) and the same optimizer
(AdamW, lr 1e-4, weight decay 0.01, fused kernel). A step is zero_grad + forward + backward +
optimizer step. The two sides alternate, repeat after repeat, so a noisy machine hits both;
medians are printed, then bertlab's tokens/s divided by transformers'.

Speed is wall-clock tokens/s (what you wait for). Each round also records the process CPU time;
tokens per CPU-second is printed too: on a machine shared with other jobs it is the steadier
number, best with `--threads 1` (with more threads it also counts the time threads spin while
waiting for each other).

Memory: each side also runs in a fresh subprocess that reports its peak resident set size
(VmHWM in /proc/self/status: everything the process ever held, i.e. Python, torch, weights,
optimizer state, activations and the allocator's slack) and the step's share of it (peak minus
the RSS just before the first step: activations, gradients and AdamW state). `ru_maxrss` would
be wrong here: Linux carries it over from the parent process across fork and exec.

Usage: python benchmarks/train_step.py [--presets tiny mini] [--repeats 5] [--no-memory]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from bertlab.hf import hf_config_fields, to_hf_state_dict
from bertlab.masking import IGNORE_INDEX
from bertlab.model import BertConfig, BertForPreTraining
from bertlab.pretraining import FastPretraining

SIDES = ("bertlab", "transformers")


def make_model(side: str, preset: str, vocab_size: int, seed: int = 0) -> torch.nn.Module:
    """Return one side's model for the preset: bertlab's or transformers' (same config)."""
    cfg = BertConfig.preset(preset, vocab_size=vocab_size)
    if side == "bertlab":
        return BertForPreTraining(cfg, generator=torch.Generator().manual_seed(seed))
    import transformers

    return transformers.BertForPreTraining(transformers.BertConfig(**hf_config_fields(cfg)))


def make_batch(batch_size: int, seq_len: int, vocab_size: int, mlm_fraction: float, seed: int = 0):
    """Return a pretraining batch: random ids, two segments, exactly mlm_fraction targets a row."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab_size, (batch_size, seq_len), generator=g)
    per_row = round(mlm_fraction * seq_len)
    chosen = torch.rand(batch_size, seq_len, generator=g).argsort(dim=1)[:, :per_row]
    labels = torch.full_like(ids, IGNORE_INDEX).scatter_(1, chosen, ids.gather(1, chosen))
    return dict(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        token_type_ids=(torch.arange(seq_len) >= seq_len // 2).long().expand(batch_size, -1),
        labels=labels,
        next_sentence_label=torch.randint(0, 2, (batch_size,), generator=g),
    )


def make_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    """Return the optimizer both sides use (same settings, same fused CPU kernel)."""
    return torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)


def train_step(model, optimizer, batch) -> None:
    optimizer.zero_grad(set_to_none=True)
    step_module(model)(**batch).loss.backward()
    optimizer.step()


def step_module(model: torch.nn.Module) -> torch.nn.Module:
    """Return what a training step calls: bertlab's training forward over its model's weights,
    or transformers' model itself."""
    return FastPretraining(model) if isinstance(model, BertForPreTraining) else model


def check_same_loss(ours, theirs, batch) -> float:
    """Return |loss difference| of the two models in eval mode (same weights: should be ~1e-6)."""
    ours.eval()
    theirs.eval()
    with torch.no_grad():
        diff = abs(step_module(ours)(**batch).loss.item() - theirs(**batch).loss.item())
    ours.train()
    theirs.train()
    return diff


def time_preset(preset: str, args) -> dict[str, tuple[float, float]]:
    """Return (median tokens/s, median tokens per CPU-second) per side, sides alternating."""
    batch = make_batch(args.batch_size, args.seq_len, args.vocab_size, args.mlm_fraction)
    models = {side: make_model(side, preset, args.vocab_size) for side in SIDES}
    # Same start weights (the decoder is tied to the word embeddings on both sides).
    models["transformers"].load_state_dict(to_hf_state_dict(models["bertlab"].state_dict()),
                                           strict=False)
    diff = check_same_loss(models["bertlab"], models["transformers"], batch)
    if diff > 1e-4:
        raise SystemExit(f"{preset}: the two models disagree (loss differs by {diff:.2e})")
    optimizers = {side: make_optimizer(m) for side, m in models.items()}
    for side in SIDES:  # warm-up: first-call allocations, optimizer state
        train_step(models[side], optimizers[side], batch)
    tokens = args.batch_size * args.seq_len * args.steps
    wall: dict[str, list[float]] = {side: [] for side in SIDES}
    cpu: dict[str, list[float]] = {side: [] for side in SIDES}
    for repeat in range(args.repeats):
        order = SIDES if repeat % 2 == 0 else SIDES[::-1]
        for side in order:
            start, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(args.steps):
                train_step(models[side], optimizers[side], batch)
            wall[side].append(tokens / (time.perf_counter() - start))
            cpu[side].append(tokens / (time.process_time() - start_cpu))
    return {side: (statistics.median(wall[side]), statistics.median(cpu[side])) for side in SIDES}


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"/proc/self/status has no {field}")


def memory_probe(side: str, preset: str, args) -> None:
    """(Subprocess) print JSON: peak RSS and the RSS just before the first training step, MiB."""
    batch = make_batch(args.batch_size, args.seq_len, args.vocab_size, args.mlm_fraction)
    model = make_model(side, preset, args.vocab_size).train()
    optimizer = make_optimizer(model)
    before = _status_mib("VmRSS")
    for _ in range(2):
        train_step(model, optimizer, batch)
    print(json.dumps({"before": before, "peak": _status_mib("VmHWM")}))


def measure_memory(side: str, preset: str, args) -> dict[str, float]:
    """Return {"before", "peak"} in MiB from a fresh subprocess running two steps of one side."""
    cmd = [sys.executable, __file__, "--memory-probe", side, "--presets", preset,
           "--vocab-size", str(args.vocab_size), "--batch-size", str(args.batch_size),
           "--seq-len", str(args.seq_len), "--mlm-fraction", str(args.mlm_fraction)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["tiny", "mini"])
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per side")
    parser.add_argument("--steps", type=int, default=2, help="training steps per timed round")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--mlm-fraction", type=float, default=0.15)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory subprocesses")
    parser.add_argument("--memory-probe", choices=SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_probe:
        memory_probe(args.memory_probe, args.presets[0], args)
        return

    import transformers

    load = os.getloadavg()[0]
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.get_num_threads()} threads, {os.cpu_count()} CPUs, load average {load:.1f}")
    print(f"batch {args.batch_size} x {args.seq_len}, vocab {args.vocab_size}, "
          f"{args.mlm_fraction:.0%} MLM targets, fp32, dropout 0.1, AdamW (fused), "
          f"{args.repeats} rounds x {args.steps} steps per side")
    if load > (os.cpu_count() or 1):
        print(f"warning: load average {load:.1f} exceeds the CPU count: other processes share "
              f"the cores, so wall-clock numbers are low and their ratio is noisy; tokens per "
              f"CPU-second with --threads 1 is the steadier comparison")

    rows = []
    for preset in args.presets:
        rates = time_preset(preset, args)
        memory = {side: measure_memory(side, preset, args) for side in SIDES} \
            if not args.no_memory else {}
        for side in SIDES:
            rows.append((preset, side, rates[side], memory.get(side)))
        print(f"  {preset}: done", flush=True)

    print()
    print(f"{'preset':<7} {'side':<13} {'tokens/s':>9} {'ms/step':>8} {'tokens/CPU-s':>13} "
          f"{'peak RSS MiB':>13} {'step MiB':>9}")
    tokens = args.batch_size * args.seq_len
    for preset, side, (rate, cpu_rate), mem in rows:
        mem_cols = (f"{mem['peak']:>13.0f} {mem['peak'] - mem['before']:>9.0f}" if mem
                    else f"{'-':>13} {'-':>9}")
        print(f"{preset:<7} {side:<13} {rate:>9.0f} {1000 * tokens / rate:>8.0f} "
              f"{cpu_rate:>13.0f} {mem_cols}")
    print()
    for preset in args.presets:
        (ours, ours_cpu), (theirs, theirs_cpu) = (r[2] for r in rows if r[0] == preset)
        print(f"{preset}: bertlab / transformers = {ours / theirs:.2f}x tokens/s "
              f"({ours_cpu / theirs_cpu:.2f}x tokens per CPU-second)")
    print("peak RSS: max resident memory of a fresh process running 2 steps (includes Python and "
          "the libraries); step MiB: peak minus RSS before the first step")


if __name__ == "__main__":
    main()
