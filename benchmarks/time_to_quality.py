"""Time to quality on CPU: the course's recipe, BERT's recipe, and transformers' BERT, one budget.

Three arms pretrain the same preset (tiny by default) on BBC's training documents with one
tokenizer (`train_tokenizer(docs, vocab_size=8192)`), each for the same training wall-clock:

- "course": `bertlab.pretrain` with `recipe("course")` (its masking, batch and sequence length
  for the training loader, its model config, optimizer and schedule, its NSP choice);
- "bert": the same with `recipe("bert")`;
- "transformers": `transformers.BertForPreTraining` with BERT recipe's sizes and dropout, fed
  the bert arm's NSP examples in the same order (the same `EpochShuffleSampler`) but masked by
  transformers' own `DataCollatorForLanguageModeling` (15%, 80/10/10), trained by a plain loop
  with the bert recipe's optimizer (`build_optimizer`), time-based schedule (`lr_at`) and
  gradient clipping on transformers' own loss (`out.loss`).

Every arm is scored by the same code on the same held-out batches: `bertlab.pretraining.evaluate`
on a validation loader masked BERT's way (seed 0, batch 32, VAL_SEQ_LEN = 64 tokens); transformers' model is
wrapped so that it answers in bertlab's output names. The headline is mask_accuracy, the accuracy
at targets the model saw as [MASK]. Training time excludes evaluation in every arm. Each run
evaluates every N steps, N = --eval-seconds over its step time measured in a 20-step warm-up; at
the end it also takes the cloze probe (`bertlab.course.cloze.cloze_score`). Seeds (model init, dropout,
training data) are interleaved arm by arm, so machine noise hits every arm alike.

Printed and saved: median (min-max over seeds) curves on a common time grid; final scores,
steps and tokens/s; the training time to reach mask_accuracy 0.20 and its ratios to the course's;
accuracies at equal times and the time the course needs to reach each other arm's final accuracy;
model FLOP/s (`bertlab.counts.flops_per_token`; the MLM head counted at every position for
transformers) as a share of this machine's measured fp32 and bf16 matmul peak.

Usage: python benchmarks/time_to_quality.py [--minutes 5] [--seeds 0 1 2] [--threads 1]
Writes benchmarks/results/time_to_quality.json (with the command that produced it).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import transformers
from _record import matmul_peak, write_record  # benchmarks/ is on sys.path when run as a script
from torch import nn

import bertlab as bl
from bertlab.counts import flops_per_token
from bertlab.course.cloze import cloze_score
from bertlab.data import EpochLoader, EpochShuffleSampler, LoaderOptions, pretraining_loader
from bertlab.engine.resume import DataPosition
from bertlab.hf import hf_config_fields
from bertlab.masking import IGNORE_INDEX
from bertlab.model import (
    BertConfig,
    BertForPreTraining,
    PreTrainingOutput,
    pretraining_loss_sums,
)
from bertlab.pretraining import evaluate, pretrain
from bertlab.recipes import VAL_SEQ_LEN, recipe
from bertlab.train import TrainConfig, TrainResult, build_optimizer, lr_at

RESULTS = Path(__file__).parent / "results"
TARGET = 0.20  # the mask_accuracy whose time-to-reach is compared
WARMUP_STEPS = 20  # steps timed before each run to choose its evaluation interval
CURVE_KEYS = ("mask_accuracy", "mlm_accuracy", "nsp_accuracy", "mask_loss")


class HfBert(nn.Module):
    """transformers' BertForPreTraining, answering in bertlab's output names.

    So bertlab's own `evaluate` and `cloze_score` score it with the very code that scores the
    bertlab arms. Training calls `self.hf` directly, with transformers' own loss.
    """

    def __init__(self, config: BertConfig, seed: int):
        super().__init__()
        self.config = config  # what bertlab's functions read of a model (fill_mask: vocab_size)
        hf_config = transformers.BertConfig(**hf_config_fields(config))
        hf_config._attn_implementation = "sdpa"  # fused attention, as bertlab uses
        with torch.random.fork_rng(devices=[]):  # transformers initialises from the global RNG
            torch.manual_seed(seed)
            self.hf = transformers.BertForPreTraining(hf_config)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                next_sentence_label: torch.Tensor | None = None) -> PreTrainingOutput:
        out = self.hf(input_ids=input_ids, attention_mask=attention_mask,
                      token_type_ids=token_type_ids)
        logits, nsp_logits = out.prediction_logits, out.seq_relationship_logits  # (B,T,V), (B,2)
        if labels is None:  # every position predicted: mlm_logits (B, T, V), as bertlab's
            return PreTrainingOutput(None, None, None, logits, nsp_logits)
        where = labels != IGNORE_INDEX
        logits = logits[where]  # (B, T, V) -> (targets, V), row-major as bertlab's
        sums = pretraining_loss_sums(logits, labels[where], nsp_logits, next_sentence_label)
        return PreTrainingOutput(None, None, None, None, nsp_logits, loss_sums=sums,
                                 target_logits=logits)

    fill_mask = BertForPreTraining.fill_mask  # the same top-k at [MASK] that cloze_score calls


def hf_loader(train: EpochLoader, tok, seed: int) -> EpochLoader:
    """Return a loader of `train`'s NSP examples, in its order, masked by transformers' collator."""
    hf_tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]", mask_token="[MASK]")
    collator = transformers.DataCollatorForLanguageModeling(tokenizer=hf_tok, mlm_probability=0.15,
                                                            seed=seed)
    keys = ("input_ids", "token_type_ids", "next_sentence_label")

    def collate(items: list[dict]) -> dict[str, torch.Tensor]:
        return collator([{k: np.asarray(item[k]).tolist() for k in keys} for item in items])

    return EpochLoader(train.dataset, batch_size=train.batch_size, collate_fn=collate, seed=seed,
                       sampler=EpochShuffleSampler(len(train.dataset), seed))


def hf_pretrain(model: HfBert, train: EpochLoader, val: EpochLoader | None,
                config: TrainConfig) -> TrainResult:
    """Return a `TrainResult` of a plain loop on transformers' loss, timed as `train_loop` times."""
    optimizer = build_optimizer(model.hf, config, torch.device("cpu"))
    history, losses, step, tokens, stopped_by = [], [], 0, 0, "max_steps"

    def log(elapsed: float) -> float:  # one history row; returns the seconds it took
        start = time.perf_counter()
        metrics = evaluate(model, val, config.eval_batches)
        history.append({"step": step, "tokens": tokens, "elapsed_s": round(elapsed, 3),
                        **{f"val_{k}": v for k, v in metrics.items()}})
        return time.perf_counter() - start

    with torch.random.fork_rng(devices=[]):  # the dropout stream, as train_loop seeds it
        torch.manual_seed(config.seed)
        batches, clock = DataPosition(train), time.perf_counter()
        if val is not None:
            clock += log(0.0)
        model.train()
        while True:
            elapsed = time.perf_counter() - clock
            if config.max_steps is not None and step >= config.max_steps:
                break
            if config.max_minutes is not None and elapsed >= 60 * config.max_minutes:
                stopped_by = "max_minutes"
                break
            batch = batches.next()
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, config, elapsed) * group.get("lr_scale", 1.0)
            loss = model.hf(**batch).loss  # transformers' loss: mean MLM CE + mean NSP CE
            loss.backward()
            if config.grad_clip is not None:
                nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step, tokens = step + 1, tokens + batch["input_ids"].numel()
            losses.append(loss.item())
            if val is not None and config.eval_interval and step % config.eval_interval == 0:
                clock += log(time.perf_counter() - clock)
        elapsed = time.perf_counter() - clock
        if val is not None and history[-1]["step"] != step:
            log(elapsed)
    return TrainResult(history=history, step_losses=losses, first_step=0, steps=step,
                       tokens=tokens, elapsed_s=elapsed, stopped_by=stopped_by, config=config)


def arm_setup(arm: str, seed: int, docs, tok, args) -> tuple:
    """Return what a run of `arm` trains with: (recipe, model config, train loader, the fit
    function, a builder of the initial weights, the quiet TrainConfig settings)."""
    r = recipe("bert" if arm == "transformers" else arm)
    model_config = r.model_config(args.preset, tok.get_vocab_size())
    train = pretraining_loader(docs, tok, split="train", seed=seed, options=r.loader_options())
    hf = arm == "transformers"
    if hf:
        train = hf_loader(train, tok, seed)
    fit = hf_pretrain if hf else functools.partial(pretrain, objectives=r.objectives)

    def build() -> nn.Module:  # the same initial weights at every call
        if hf:
            return HfBert(model_config, seed)
        return BertForPreTraining(model_config, generator=torch.Generator().manual_seed(seed))

    quiet = dict(checkpoint_interval=None, progress=False, log_interval=0, device="cpu", seed=seed)
    return r, model_config, train, fit, build, quiet


def trace_arm(arm: str, seed: int, docs, tok, val: EpochLoader, args) -> dict:
    """Return the part of a run of `arm` that does not depend on the clock, as JSON: its first
    WARMUP_STEPS steps on a step schedule (the warm-up every run times itself with), every
    step's loss, and the evaluation of the initial weights and of those steps (the run's curve
    starts with the same step-0 row): the reproduce trace in the record."""
    r, _, train, fit, build, quiet = arm_setup(arm, seed, docs, tok, args)
    run = fit(build(), train, val, r.train_config(max_steps=WARMUP_STEPS,
                                                  eval_interval=WARMUP_STEPS,
                                                  eval_batches=args.eval_batches, **quiet))
    return {"curve": [{"step": h["step"], **{k: h.get(f"val_{k}") for k in CURVE_KEYS}}
                      for h in run.history], "step_losses": list(run.step_losses)}


def run_arm(arm: str, seed: int, docs, tok, val: EpochLoader, args) -> dict:
    """Return one run of `arm`: its curve, final scores, cloze, steps and speed."""
    r, model_config, train, fit, build, quiet = arm_setup(arm, seed, docs, tok, args)
    mlm_fraction = 1.0 if arm == "transformers" else r.mlm_probability  # transformers' MLM
    # head runs everywhere
    warm = fit(build(), train, None, r.train_config(max_steps=WARMUP_STEPS, eval_interval=None,
                                                    **quiet))
    interval = max(1, round(args.eval_seconds * warm.steps / warm.elapsed_s))
    config = r.train_config(max_steps=None, max_minutes=args.minutes, eval_interval=interval,
                            eval_batches=args.eval_batches, **quiet)
    model = build()
    result = fit(model, train, val, config)
    curve = [{"step": h["step"], "elapsed_s": h["elapsed_s"], "tokens": h["tokens"],
              **{k: h.get(f"val_{k}") for k in CURVE_KEYS}} for h in result.history]  # NSP
    # accuracy is None (not trained) for a recipe without NSP
    cloze = cloze_score(model, tok)
    per_token = flops_per_token(model_config, r.max_seq_len, mlm_fraction)
    tokens_per_s = result.tokens / result.elapsed_s
    print(f"  seed {seed} {arm:>12}: {result.steps} steps, {tokens_per_s:,.0f} tokens/s, "
          f"mask acc {curve[-1]['mask_accuracy']:.3f}, cloze top1 {cloze['top1']:.3f}",
          flush=True)
    return {"seed": seed, "eval_interval": interval, "warmup_step_s": warm.elapsed_s / warm.steps,
            "steps": result.steps, "tokens": result.tokens, "elapsed_s": result.elapsed_s,
            "tokens_per_s": tokens_per_s, "flops_per_token": per_token,
            "final": result.history[-1], "cloze": {"top1": cloze["top1"], "top5": cloze["top5"]},
            "time_to_target_s": time_to(curve, TARGET), "curve": curve}


def time_to(curve: list[dict], accuracy: float) -> float | None:
    """Return the training time at which mask_accuracy first reaches `accuracy` (interpolated)."""
    for before, row in zip([None, *curve], curve, strict=False):
        if row["mask_accuracy"] >= accuracy:
            if before is None:
                return row["elapsed_s"]
            t0, a0 = before["elapsed_s"], before["mask_accuracy"]
            return t0 + (accuracy - a0) / (row["mask_accuracy"] - a0) * (row["elapsed_s"] - t0)
    return None


def accuracy_at(curve: list[dict], seconds: float) -> float:
    """Return mask_accuracy at `seconds` of training, interpolated (held at the ends)."""
    return float(np.interp(seconds, [r["elapsed_s"] for r in curve],
                           [r["mask_accuracy"] for r in curve]))


def spread(values: list[float | None]) -> dict[str, float | None]:
    """Return median, min and max; None counts as never (above every number)."""
    ranked = sorted(float("inf") if v is None else v for v in values)
    median = statistics.median(ranked)
    return {k: None if v == float("inf") else v
            for k, v in (("median", median), ("min", ranked[0]), ("max", ranked[-1]))}


def trained_spread(values: list[float | None]) -> dict[str, float | None] | None:
    """Return `spread(values)`, or None for a head that was not trained (every value None)."""
    return None if all(v is None for v in values) else spread(values)


def fmt(s: dict | None, digits: int = 3) -> str:
    """Return "median (min-max)", with "never" for None; "not trained" for no spread at all."""
    if s is None:
        return "not trained"
    shown = ["never" if s[k] is None else f"{s[k]:,.{digits}f}" for k in ("median", "min", "max")]
    return f"{shown[0]} ({shown[1]}-{shown[2]})"


def summarize(runs: dict[str, list[dict]], args, peak: dict[str, float]) -> dict:
    """Print the scoreboard; return it as a JSON-ready dict."""
    arms, budget = list(runs), 60 * args.minutes
    grid = [*np.arange(0.0, budget, args.eval_seconds).tolist(), budget]
    print(f"\nmask_accuracy against training time, median (min-max) over seeds {args.seeds}")
    print(f"{'time s':>8} " + " ".join(f"{a:>22}" for a in arms))
    curves = {a: [spread([accuracy_at(r["curve"], t) for r in runs[a]]) for t in grid]
              for a in arms}
    for i, t in enumerate(grid):
        print(f"{t:>8.1f} " + " ".join(f"{fmt(curves[a][i]):>22}" for a in arms))

    final = {a: {"mask_accuracy": spread([r["curve"][-1]["mask_accuracy"] for r in runs[a]]),
                 "nsp_accuracy": trained_spread([r["curve"][-1]["nsp_accuracy"] for r in runs[a]]),
                 "cloze_top1": spread([r["cloze"]["top1"] for r in runs[a]]),
                 "cloze_top5": spread([r["cloze"]["top5"] for r in runs[a]]),
                 "steps": spread([r["steps"] for r in runs[a]]),
                 "tokens_per_s": spread([r["tokens_per_s"] for r in runs[a]]),
                 "time_to_target_s": spread([r["time_to_target_s"] for r in runs[a]])}
             for a in arms}
    print(f"\nafter {args.minutes:g} min of training, median (min-max) over seeds")
    for key in ("mask_accuracy", "nsp_accuracy", "cloze_top1", "cloze_top5", "steps",
                "tokens_per_s", "time_to_target_s"):
        digits = 0 if key in ("steps", "tokens_per_s") else 1 if key.endswith("_s") else 3
        label = f"s to mask acc {TARGET:.2f}" if key == "time_to_target_s" else key
        print(f"{label:>20} " + " ".join(f"{fmt(final[a][key], digits):>26}" for a in arms))

    summary: dict = {"grid_s": grid, "curves": curves, "final": final}
    course = final.get("course", {}).get("time_to_target_s", {}).get("median")
    if course is not None:
        print()
        for a in (a for a in arms if a != "course"):
            t = final[a]["time_to_target_s"]["median"]
            ratio = None if t is None else t / course
            summary[f"time_ratio_{a}_over_course"] = ratio
            print(f"time to {TARGET:.2f}: {a} / course = " +
                  ("never within the budget" if ratio is None else f"{ratio:.2f}x"))
    if "course" in runs:
        print("\nat equal training time: median mask_accuracy")
        summary["at_equal_time"] = {}
        for label, t in ((f"course's time to {TARGET:.2f}", course), ("end of budget", budget)):
            if t is None:
                continue
            at = {a: statistics.median(accuracy_at(r["curve"], t) for r in runs[a]) for a in arms}
            summary["at_equal_time"][f"{t:.1f}s"] = at
            print(f"  at {t:.1f} s ({label}): " + ", ".join(f"{a} {v:.3f}" for a, v in at.items()))
        summary["course_time_to_final_of"] = {}
        for a in (a for a in arms if a != "course"):
            goal = final[a]["mask_accuracy"]["median"]
            need = spread([time_to(r["curve"], goal) for r in runs["course"]])["median"]
            summary["course_time_to_final_of"][a] = {"mask_accuracy": goal, "course_s": need}
            print(f"  the course reaches the {a} arm's final {goal:.3f} after " + (
                "more than the budget" if need is None else
                f"{need:.1f} s: {budget / need:.1f}x sooner than its {budget:.0f} s"))

    print(f"\nthroughput on {torch.get_num_threads()} thread(s): matmul peak "
          f"{peak['fp32'] / 1e9:.1f} GFLOP/s fp32, {peak['bf16'] / 1e9:.1f} GFLOP/s bf16")
    summary["throughput"] = {}
    for a in arms:
        flop_s = final[a]["tokens_per_s"]["median"] * runs[a][0]["flops_per_token"]
        summary["throughput"][a] = {"model_flop_s": flop_s, "flops_per_token":
                                    runs[a][0]["flops_per_token"],
                                    **{f"share_of_{k}_peak": flop_s / v for k, v in peak.items()}}
        print(f"{a:>14}: {runs[a][0]['flops_per_token'] / 1e6:.2f} MFLOP/token, "
              f"{flop_s / 1e9:.2f} GFLOP/s = {100 * flop_s / peak['fp32']:.1f}% of fp32 peak, "
              f"{100 * flop_s / peak['bf16']:.1f}% of bf16 peak")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="training time per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--eval-seconds", type=float, default=30.0,
                        help="training seconds between evaluations (about)")
    parser.add_argument("--eval-batches", type=int, default=20, help="validation batches")
    parser.add_argument("--arms", nargs="+", default=["course", "bert", "transformers"],
                        choices=["course", "bert", "transformers"])
    parser.add_argument("--out", type=Path, default=RESULTS / "time_to_quality.json")
    parser.add_argument("--trace", nargs=2, metavar=("ARM", "SEED"), default=None,
                        help="print the clock-free start of one run as JSON (trace_arm) and run "
                             "nothing else: the reproduce trace in the record "
                             "(tools/record_traces.py)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    docs = bl.load_corpus("bbc")
    tok = bl.train_tokenizer(docs, vocab_size=8192)
    # One yardstick for every arm: BERT's masking (the defaults), fixed batches.
    val = pretraining_loader(docs, tok, split="validation", seed=0,
                             options=LoaderOptions(batch_size=32, max_seq_len=VAL_SEQ_LEN))
    if args.trace:
        print(json.dumps(trace_arm(args.trace[0], int(args.trace[1]), docs, tok, val, args)))
        return 0
    peak = {"fp32": matmul_peak(torch.float32), "bf16": matmul_peak(torch.bfloat16)}
    print(f"preset {args.preset}, {args.minutes:g} min per run, seeds {args.seeds}, "
          f"{torch.get_num_threads()} thread(s), torch {torch.__version__}, transformers "
          f"{transformers.__version__}")
    runs: dict[str, list[dict]] = {a: [] for a in args.arms}
    for seed in args.seeds:
        for arm in args.arms:
            runs[arm].append(run_arm(arm, seed, docs, tok, val, args))
    summary = summarize(runs, args, peak)
    write_record("time_to_quality.py", args, argv, args.out, target_mask_accuracy=TARGET,
                 matmul_peak_flop_s=peak, summary=summary,
                 recipes={a: recipe("bert" if a == "transformers" else a).to_dict()
                          for a in args.arms}, runs=runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
