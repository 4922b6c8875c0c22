"""The twins: one recipe with NSP beside its MLM-only and SOP twins, trained on any device.

Each arm trains the same recipe with other objectives (`Recipe.with_objectives`): masked LM +
NSP, masked LM alone, masked LM + SOP. The arms share the steps, the seeds (the initial weights
and dropout with `--seed k`, the pairs, order and masks with `--data-seed k`), the corpus and the
schedule, so the objective is the only difference. Every run is one `python -m bertlab pretrain`
command, in its own folder `--runs`/<arm>-seed<k>/, evaluated every `--eval-interval` steps on
the course's yardstick: BERT-masked validation pairs (seed 0, whatever the data seed) at the
run's length and at 64 tokens (`--validate-also`).

Two stages, so a GPU machine only trains and any machine scores:

  train  every arm x seed, `--jobs` at a time. A run cut off (Ctrl-C, SIGTERM, a session that
         ends) resumes exactly from its newest checkpoint when the same command runs again; a
         finished run is skipped. Every sitting of a run is noted in its sittings.json (the
         commit, the minutes, the load average before and after); a run is continued only from
         the commit it started at. A finished run gets summary.json and model/ (a Hugging Face
         folder, fp32, or bf16 where fp32 would pass 16 MiB).
  score  each finished run the record does not hold yet: its last history row at both lengths
         ([MASK] accuracy with the bar; the pair head's accuracy, or "not trained"), the
         word-overlap rule on the same validation pairs (notebook 03's rule, fitted on training
         pairs), cloze, the [CLS] probe with all labels (pooled, raw [CLS], mean of tokens),
         low-label fine-tuning and probe at 8 and 32 labels per class, 3 seeds each. The run is
         appended to the record, benchmarks/results/twins-<cpu|gpu>.json, whose summaries are
         then redone: per arm the mean and sample std over seeds, and each arm minus the MLM-only
         twin paired by seed (mean +- 2 SE). A record holds the runs of one commit and one device;
         a CPU record is a CPU result. `--ship NAME=ARM` writes models/NAME (the arm's seed 0,
         MANIFEST.json with its command, commit, device, minutes, load, scores and, from a CPU,
         a reproduce trace that tests/test_traces.py replays).

Usage (the CPU twins; the GPU session passes its own settings, see tools/gpu_session.py):
  python benchmarks/twins.py train --jobs 2         (hours of CPU; run it again to go on)
  python benchmarks/twins.py score --ship course-nsp=mlm+nsp course-mlm=mlm
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from _record import REPO  # benchmarks/ is on sys.path when run as a script

RESULTS = REPO / "benchmarks" / "results"
ARMS = {"mlm+nsp": ("mlm", "nsp"), "mlm": ("mlm",), "mlm+sop": ("mlm", "sop")}
BASELINE = "mlm"  # the arm every other one is set against
LABEL_BUDGETS = (8, 32)
YARDSTICK = 64  # bertlab.recipes.VAL_SEQ_LEN: the course's validation length
MAX_FILE = 16 * 2**20  # a shipped model's largest file
TRACE_STEPS = 100


def record_path(device: str) -> Path:
    """Return the record of the twins trained on `device`: twins-cpu.json or twins-gpu.json."""
    return RESULTS / f"twins-{'cpu' if torch.device(device).type == 'cpu' else 'gpu'}.json"


# ---------------------------------------------------------------------------------------------
# Stage 1: the runs


def pretrain_command(args: argparse.Namespace, arm: str, seed: int) -> list[str]:
    """Return the `python -m bertlab` arguments of one run (its folder is the last argument)."""
    command = ["pretrain", "--recipe", args.recipe, "--objectives", ",".join(ARMS[arm]),
               "--corpus", _shown(str(args.corpus)), "--preset", args.preset,
               "--max-steps", str(args.steps), "--seed", str(seed), "--data-seed", str(seed),
               "--eval-interval", str(args.eval_interval), "--eval-batches",
               str(args.eval_batches), "--checkpoint-interval", str(args.checkpoint_interval),
               "--device", args.device, "--validate-also", *map(_shown, args.validate_also),
               "--no-progress"]
    for flag, value in (("--threads", args.threads), ("--precision", args.precision),
                        ("--batch-size", args.batch_size), ("--minutes", args.minutes),
                        ("--num-workers", args.num_workers)):
        if value is not None:
            command += [flag, str(value)]
    return command + ["--out", str(args.runs / f"{arm}-seed{seed}")]


def commits_of_runs(args: argparse.Namespace) -> dict[str, str]:
    """Return the commit each run in `--runs` started at, by run name."""
    return {path.parent.name: json.loads(path.read_text())[0]["commit"]
            for path in sorted(args.runs.glob("*/sittings.json"))}


def train_stage(args: argparse.Namespace) -> int:
    """Train every arm x seed that has not finished, `--jobs` at a time; return 0 if all did."""
    from bertlab.course.traces import git_commit

    commit = git_commit(REPO)
    other = {name: c for name, c in commits_of_runs(args).items() if c != commit}
    if other:
        name, started = next(iter(other.items()))
        print(f"twins: {name} in {args.runs} started at commit {started}, this checkout is "
              f"{commit}: another commit's code would continue it. Run this from a checkout "
              f"of {started} (git worktree add ../grid {started.split('+')[0]}), or pass another "
              f"--runs to start over")
        return 2
    todo = [(arm, seed) for seed in args.seeds for arm in args.arms
            if not (args.runs / f"{arm}-seed{seed}" / "summary.json").is_file()]
    print(f"twins: {len(todo)} run(s) to train, {args.jobs} at a time, in {args.runs}: "
          f"{', '.join(f'{a}-seed{s}' for a, s in todo) or 'none'}", flush=True)
    args.runs.mkdir(parents=True, exist_ok=True)
    running: list[tuple[str, int, subprocess.Popen, dict]] = []
    failed: list[str] = []

    stopping: list[int] = []

    def stop(signum, frame):  # pass Ctrl-C / SIGTERM on: each run checkpoints, then exits,
        stopping.append(signum)  # and no run starts after it
        for *_, proc, _ in running:
            proc.send_signal(signum)
    previous = [signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)]
    try:
        while (todo and not stopping) or running:
            while todo and not stopping and len(running) < args.jobs:
                arm, seed = todo.pop(0)
                proc, sitting = start_run(args, arm, seed, commit)
                running.append((arm, seed, proc, sitting))
                if stopping:  # the signal came while it started: it goes to this run too
                    proc.send_signal(stopping[0])
                print(f"  {arm}-seed{seed}: {'resumed' if sitting['resumed'] else 'started'} "
                      f"(pid {proc.pid})", flush=True)
            time.sleep(1)
            for item in [r for r in running if r[2].poll() is not None]:
                running.remove(item)
                arm, seed, proc, sitting = item
                if finish_run(args, arm, seed, proc.returncode, sitting) != 0:
                    failed.append(f"{arm}-seed{seed}")
    finally:
        for s, handler in zip((signal.SIGINT, signal.SIGTERM), previous, strict=True):
            signal.signal(s, handler)
    if failed or stopping:
        left = failed + [f"{a}-seed{s}" for a, s in todo]
        print(f"twins: not finished: {', '.join(left)}; run the same command again to resume "
              f"them (logs: {args.runs}/<run>.log)")
        return 1
    return 0


def start_run(args: argparse.Namespace, arm: str, seed: int,
              commit: str | None) -> tuple[subprocess.Popen, dict]:
    """Start one run's process (resuming its checkpoint if it has one); return it and its
    sitting (what sittings.json notes)."""
    from bertlab.course.doctor import load_average
    from bertlab.engine.checkpoint import latest_checkpoint

    command = pretrain_command(args, arm, seed)
    run_dir = Path(command[-1])
    resume = run_dir.is_dir() and latest_checkpoint(run_dir) is not None
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false",
           **({"OMP_NUM_THREADS": str(args.threads)} if args.threads else {})}
    log = open(args.runs / f"{arm}-seed{seed}.log", "a")  # noqa: SIM115 (closed with the run)
    proc = subprocess.Popen([sys.executable, "-m", "bertlab", *command,
                             *(["--resume"] if resume else [])], stdout=log,
                            stderr=subprocess.STDOUT, env=env, cwd=REPO)
    return proc, {"commit": commit, "command": command, "resumed": resume, "log": log,
                  "train_argv": args.argv,
                  "started": time.strftime("%Y-%m-%d %H:%M:%S"), "clock": time.perf_counter(),
                  "load_average": [load_average()]}


def finish_run(args: argparse.Namespace, arm: str, seed: int, code: int, sitting: dict) -> int:
    """Note the sitting of a run that ended; for a finished run write summary.json and model/."""
    from bertlab.atomic import atomic_write_json
    from bertlab.course.doctor import load_average

    sitting["log"].close()
    run_dir = Path(sitting["command"][-1])
    noted = {k: sitting[k] for k in ("commit", "started", "resumed", "train_argv")}
    noted.update(wall_minutes=round((time.perf_counter() - sitting["clock"]) / 60, 2),
                 load_average=[*sitting["load_average"], load_average()], exit=code)
    path = run_dir / "sittings.json"
    if run_dir.is_dir():
        atomic_write_json(path, [*(json.loads(path.read_text()) if path.is_file() else []),
                                 noted])
    if code != 0:
        print(f"  {arm}-seed{seed}: stopped (exit {code}) after {noted['wall_minutes']} min")
        return code
    summary = write_summary(run_dir, arm, seed, sitting["command"])
    print(f"  {arm}-seed{seed}: done, {summary['steps']} steps, {summary['tokens']:,} tokens, "
          f"{summary['train_minutes']:.1f} min of training in {len(summary['sittings'])} "
          f"sitting(s)", flush=True)
    return 0


def write_summary(run_dir: Path, arm: str, seed: int, command: list[str]) -> dict:
    """Write a finished run's summary.json and model/ (what travels back from a GPU machine)."""
    from bertlab.atomic import atomic_write_json
    from bertlab.engine.checkpoint import latest_checkpoint, read_checkpoint_state
    from bertlab.hf import save_hf
    from bertlab.loading import load_run

    state = read_checkpoint_state(latest_checkpoint(run_dir))
    model, tok = load_run(run_dir)
    fp32_bytes = sum(p.numel() * 4 for p in model.state_dict().values())
    dtype = torch.float32 if fp32_bytes <= MAX_FILE else torch.bfloat16
    save_hf(model.to(dtype), tok, run_dir / "model")
    from bertlab.engine.device import resolve_device

    config = state["train_config"]
    on = resolve_device(config["device"])
    device = torch.cuda.get_device_name(on) if on.type == "cuda" else "cpu"
    sittings = json.loads((run_dir / "sittings.json").read_text())
    summary = {
        "arm": arm, "objectives": list(ARMS[arm]), "seed": seed, "device": device,
        "command": "python -m bertlab " + " ".join(_shown(a) for a in command),
        "commit": sittings[0]["commit"], "steps": state["step"],
        "stopped_by": "max_steps" if state["step"] >= (config["max_steps"] or 0) else
                      "max_minutes",
        "tokens": state["tokens"],  # positions fed to the model, padding included
        "train_minutes": round(state["elapsed_s"] / 60, 2),
        "wall_minutes": round(sum(s["wall_minutes"] for s in sittings), 2),
        "sittings": sittings, "dtype": str(dtype).removeprefix("torch."),
        "run": json.loads((run_dir / "run.json").read_text()),
        "history": json.loads((run_dir / "history.json").read_text()),
    }
    atomic_write_json(run_dir / "summary.json", summary)
    return summary


def _shown(arg: str) -> str:
    """Return a command argument with paths inside the repository made relative to it."""
    path = Path(arg)
    return str(path.relative_to(REPO)) if path.is_absolute() and path.is_relative_to(REPO) else arg


# ---------------------------------------------------------------------------------------------
# Stage 2: what each run learned


def overlap(example) -> float:
    """Return the Jaccard overlap of the token sets of A and B (notebook 03's NSP rule)."""
    ids = [int(t) for t in example.input_ids]
    a, b = set(ids[1:1 + example.a_len]), set(ids[2 + example.a_len:-1])
    return len(a & b) / max(len(a | b), 1)


def word_overlap_rule(train, val, fit_pairs: int = 4000) -> dict:
    """Return the rule's pair accuracy on the validation pairs, its threshold fitted on up to
    `fit_pairs` training pairs (label 1, NotNext or swapped, when the overlap is below it). On
    SOP pairs it cannot beat a coin: A and B are the same two segments in either order, and the
    overlap of two sets does not depend on their order."""
    picks = random.Random(0).sample(range(len(train)), min(fit_pairs, len(train)))
    fit = [(overlap(train[i]), train[i].next_sentence_label) for i in picks]
    held = [(overlap(val[i]), val[i].next_sentence_label) for i in range(len(val))]

    def accuracy(pairs, threshold):
        return sum((o < threshold) == bool(label) for o, label in pairs) / len(pairs)

    threshold = max((i / 200 for i in range(1, 60)), key=lambda t: accuracy(fit, t))
    right = accuracy(held, threshold)
    return {"accuracy": right, "se": math.sqrt(right * (1 - right) / len(held)),
            "threshold": threshold, "validation_pairs": len(held),
            "fitted_on_training_pairs": len(fit)}


def pair_examples(run: dict, tok, length: int) -> tuple[Any, Any]:
    """Return (training pairs, validation pairs) at `length` tokens, as the run's command built
    them: its corpus (text or shards), its pair kind, draw 0 of its data seed, seed 0 for
    validation."""
    from bertlab.artefacts import folder_kind
    from bertlab.data import LoaderOptions, pretraining_loader
    from bertlab.engine.shards import shard_loader, shard_pair_length
    from bertlab.pairs import pairs_of
    from bertlab.readers import load_corpus

    pairs = pairs_of(run["objectives"]) if len(run["objectives"]) > 1 else "nsp"
    args = run["run"]["args"]
    corpus = REPO / args["corpus"] if not Path(args["corpus"]).is_absolute() else \
        Path(args["corpus"])
    if folder_kind(corpus) == "shards":  # NSP pairs at the length each shard folder was cut at
        folders = [corpus, *(REPO / p for p in args.get("validate_also") or []
                             if folder_kind(REPO / p) == "shards")]
        source = next(f for f in folders if shard_pair_length(f) == length)
        loaders = [shard_loader(source, tok, split=s, seed=0) for s in ("train", "validation")]
    else:
        docs = load_corpus(args["corpus"])
        loaders = [pretraining_loader(docs, tok, split=s,
                                      seed=args["data_seed"] if s == "train" else 0,
                                      options=LoaderOptions(max_seq_len=length, pairs=pairs))
                   for s in ("train", "validation")]
    return tuple(loader.dataset.examples for loader in loaders)


def at_length(history: list[dict], prefix: str, pair: str | None) -> dict:
    """Return the last history row's yardstick at one length: [MASK] accuracy and the bar, and
    the pair head's accuracy ("not trained" for masked LM alone)."""
    last = history[-1]
    accuracy = (last.get(f"{prefix}{pair}_accuracy", last.get(f"{prefix}nsp_accuracy"))
                if pair else "not trained")
    return {"mask_accuracy": last[f"{prefix}mask_accuracy"],
            "mask_unigram_accuracy": last[f"{prefix}mask_unigram_accuracy"],
            "mask_targets": last[f"{prefix}mask_targets"], "pair_accuracy": accuracy}


def curve(history: list[dict], prefix: str, pair: str | None) -> list[dict]:
    """Return the validation history at one length, one row per evaluation."""
    rows = []
    for row in history:
        point = {"step": row["step"], "tokens": row["tokens"],
                 "mask_accuracy": row[f"{prefix}mask_accuracy"]}
        if pair:
            point["pair_accuracy"] = row.get(f"{prefix}{pair}_accuracy",
                                             row.get(f"{prefix}nsp_accuracy"))
        rows.append(point)
    return rows


def task(args: argparse.Namespace) -> tuple[list, list[str]]:
    """Return the downstream task's (documents, labels): BBC topics, or `--task-docs` of them
    drawn at random (small scoring runs, e.g. in tests)."""
    from bertlab.downstream import load_task

    docs, labels = load_task("bbc-topic")
    if args.task_docs and args.task_docs < len(docs):
        keep = sorted(random.Random(0).sample(range(len(docs)), args.task_docs))
        docs, labels = [docs[i] for i in keep], [labels[i] for i in keep]
    return docs, labels


def cls_scores(model, tok, args: argparse.Namespace) -> dict:
    """Return the [CLS] probe (pooled, raw [CLS], mean) with all labels, and low-label
    fine-tuning and probe (pooled) at `--label-budgets` labels per class over
    `--finetune-seeds` seeds; each reading of the encoder is computed once."""
    from bertlab.finetune import (
        POOLINGS,
        FinetuneConfig,
        ProbeConfig,
        cls_features,
        finetune_classifier,
        linear_probe,
        summarize,
    )

    docs, labels = task(args)
    features = {p: cls_features(model, docs, tok, pooling=p) for p in POOLINGS}
    probes = {p: linear_probe(model, docs, labels, tokenizer=tok, config=ProbeConfig(pooling=p),
                              features=features[p]) for p in POOLINGS}
    results = []
    for k in args.label_budgets:
        for seed in range(args.finetune_seeds):
            tuned = finetune_classifier(model, docs, labels, tokenizer=tok, k_per_class=k,
                                        config=FinetuneConfig(seed=seed))
            tuned.model = None  # keep memory flat over many runs
            results += [tuned, linear_probe(model, docs, labels, tokenizer=tok,
                                            config=ProbeConfig(seed=seed), k_per_class=k,
                                            features=features["pooled"])]
    rows = {f"{r['method']} @ {r['k_per_class']}": {
        "accuracy_mean": r["accuracy_mean"], "accuracy_std": r["accuracy_std"],
        "macro_f1_mean": r["macro_f1_mean"], "runs": r["runs"]} for r in summarize(results)}
    return {"cls_probe_all_labels": {p: {"accuracy": r.accuracy, "macro_f1": r.macro_f1}
                                     for p, r in probes.items()},
            "low_label": rows, "finetune_seeds": args.finetune_seeds,
            "task_documents": len(docs)}


def pair_predictions(model, tok, examples, masking) -> list[int]:
    """Return the pair head's prediction (0 or 1) for each example, in order, the inputs masked
    with `masking` (a MaskingConfig; one fixed mask per example)."""
    from bertlab.data import LoaderOptions, pretraining_loader

    loader = pretraining_loader(examples, tok, split=None, seed=0, options=LoaderOptions(
        batch_size=64, max_seq_len=max(len(e.input_ids) for e in examples), masking=masking,
        mask_schedule="static", shuffle=False))
    found: list[int] = []
    model.eval()
    with torch.no_grad():
        for batch in loader:
            found += model(**batch).nsp_logits.argmax(-1).tolist()
    return found


def pair_limits(model, tok, summary: dict) -> dict:
    """Return what the pair head's accuracy depends on, measured on the run's length: the
    validation pairs unmasked, BERT-masked and masked as the run trained; pairs it trained on
    (draw 0 of its data seed, up to 4,000); and for NSP, IsNext and NotNext by whether B's
    document has A's topic (a head that only told topics apart would get every same-topic
    NotNext wrong: `topic_only_ceiling`)."""
    from bertlab.corpus import split_documents
    from bertlab.masking import BERT_MASKING, MaskingConfig
    from bertlab.pairs import IS_NEXT
    from bertlab.readers import load_corpus

    length = summary["run"]["max_seq_len"]
    train, val = pair_examples(summary, tok, length)
    truth = [e.next_sentence_label for e in val]
    maskings = {"unmasked": MaskingConfig(mask_replace_prob=0.0, random_replace_prob=0.0),
                "bert_masked": BERT_MASKING,
                "masked_as_trained": MaskingConfig(mlm_probability=summary["run"]["mlm_probability"])}
    guesses = {name: pair_predictions(model, tok, val, m) for name, m in maskings.items()}
    out = {"length": length, "validation_pairs": len(val),
           "validation": {name: sum(map(int.__eq__, g, truth)) / len(val)
                          for name, g in guesses.items()}}
    seen = [train[i] for i in sorted(random.Random(0).sample(range(len(train)),
                                                             min(4000, len(train))))]
    right = map(int.__eq__, pair_predictions(model, tok, seen, BERT_MASKING),
                [e.next_sentence_label for e in seen])
    out["trained_pairs_bert_masked"] = {"pairs": len(seen), "accuracy": sum(right) / len(seen)}
    args = summary["run"]["args"]
    if summary["objectives"][1:] != ["nsp"] or Path(REPO / args["corpus"]).is_dir():
        return out
    docs = split_documents(load_corpus(args["corpus"]))["validation"]
    kinds = {"is_next": [], "not_next_same_topic": [], "not_next_other_topic": []}
    for e, guess in zip(val, guesses["bert_masked"], strict=True):
        same = docs[e.doc_index].label == docs[e.b_doc_index].label
        kind = ("is_next" if e.next_sentence_label == IS_NEXT else
                "not_next_same_topic" if same else "not_next_other_topic")
        kinds[kind].append(guess == e.next_sentence_label)
    out["by_partner_bert_masked"] = {k: {"pairs": len(v), "accuracy": sum(v) / max(len(v), 1)}
                                     for k, v in kinds.items()}
    out["topic_only_ceiling"] = 1 - len(kinds["not_next_same_topic"]) / len(val)
    return out


def score_run(folder: Path, args: argparse.Namespace) -> dict:
    """Return one finished run's entry of the record."""
    from bertlab.course.cloze import CLOZE_SET, cloze_score
    from bertlab.loading import load_model

    summary = json.loads((folder / "summary.json").read_text())
    pair = summary["objectives"][1] if len(summary["objectives"]) > 1 else None
    model, tok = load_model(folder / "model", require_tokenizer=True)
    model = model.float()
    length = summary["run"]["max_seq_len"]
    rules = {}
    for n in sorted({length, YARDSTICK}):
        train, val = pair_examples(summary, tok, n)
        rules[str(n)] = word_overlap_rule(train, val)
    try:
        cloze = cloze_score(model, tok, CLOZE_SET)
    except ValueError as e:  # a tokenizer of another corpus: the course's items do not fit it
        cloze = {"top1": None, "top5": None, "skipped": f"{e}".split(";")[0]}
        print(f"{folder.name}: cloze skipped, its items cannot be scored with this run's "
              f"tokenizer ({cloze['skipped']}); every other measure is scored", flush=True)
    keep = ("arm", "objectives", "seed", "device", "command", "commit", "steps", "stopped_by",
            "tokens", "train_minutes", "wall_minutes", "sittings", "dtype")
    entry = {k: summary[k] for k in keep}
    entry.update({
        "recipe": summary["run"]["args"]["recipe"],
        "pair_objective": pair, "max_seq_len": length,
        "load_average": [x for s in summary["sittings"] for x in s["load_average"]],
        "at": {str(length): at_length(summary["history"], "val_", pair),
               str(YARDSTICK): at_length(summary["history"], f"val_{YARDSTICK}_", pair)},
        "history": {str(length): curve(summary["history"], "val_", pair),
                    str(YARDSTICK): curve(summary["history"], f"val_{YARDSTICK}_", pair)},
        "word_overlap_rule": rules,
        "cloze": {"items": len(CLOZE_SET), "top1": cloze["top1"], "top5": cloze["top5"],
                  **({"skipped": cloze["skipped"]} if "skipped" in cloze else {})},
        **cls_scores(model, tok, args),
    })
    if pair is not None:
        entry["pair_limits"] = pair_limits(model, tok, summary)
    return entry


def random_init(runs: list[dict], args: argparse.Namespace, held: dict) -> dict:
    """Return the [CLS] probe of untrained models (each seed's initial weights): the floor; the
    seeds in `held` (a record's earlier ones) are kept as they are."""
    from bertlab.finetune import POOLINGS, ProbeConfig, linear_probe
    from bertlab.loading import load_model
    from bertlab.model import BertForPreTraining

    docs, labels = task(args)
    folder = args.runs / f"{runs[0]['arm']}-seed{runs[0]['seed']}"
    trained, tok = load_model(folder / "model", require_tokenizer=True)
    out = dict(held)
    for seed in sorted({r["seed"] for r in runs} - {int(k) for k in held}):
        model = BertForPreTraining(trained.config,
                                   generator=torch.Generator().manual_seed(seed))
        out[str(seed)] = {p: linear_probe(model, docs, labels, tokenizer=tok,
                                          config=ProbeConfig(pooling=p)).accuracy
                          for p in POOLINGS}
    return out


def summarise(runs: list[dict]) -> dict:
    """Return per arm the mean and sample std over seeds of each measure, and each arm minus
    the MLM-only twin paired by seed (mean, 2 SE, the per-seed differences)."""
    measures = measures_of(runs[0])
    by = {(r["arm"], r["seed"]): r for r in runs}
    arms = sorted({r["arm"] for r in runs}, key=list(ARMS).index)
    per_arm, paired = {}, {}
    for arm in arms:
        mine = [r for r in runs if r["arm"] == arm]
        per_arm[arm] = {name: _spread([get(r) for r in mine]) for name, get in measures.items()
                        if all(get(r) is not None for r in mine)}
        if arm == BASELINE:
            continue
        seeds = sorted(s for a, s in by if a == arm and (BASELINE, s) in by)
        paired[f"{arm} - {BASELINE}"] = {
            name: _spread([get(by[(arm, s)]) - get(by[(BASELINE, s)]) for s in seeds], seeds)
            for name, get in measures.items()
            if seeds and all(get(by[(a, s)]) is not None for s in seeds for a in (arm, BASELINE))}
    steps = {r["steps"] for r in runs}
    return {"per_arm": per_arm, "paired_by_seed": paired, "same_steps": len(steps) == 1}


def measures_of(run: dict) -> dict:
    """Return the record's measures: name -> how to read it from a run (None: not measured)."""
    lengths = list(run["at"])

    def pair(n):
        return lambda r: (None if isinstance(r["at"][n]["pair_accuracy"], str)
                          else r["at"][n]["pair_accuracy"])
    out = {f"mask_accuracy_{n}": (lambda r, n=n: r["at"][n]["mask_accuracy"]) for n in lengths}
    out.update({f"pair_accuracy_{n}": pair(n) for n in lengths})
    out["cloze_top1"] = lambda r: r["cloze"]["top1"]
    out.update({f"cls_probe_{p}": (lambda r, p=p: r["cls_probe_all_labels"][p]["accuracy"])
                for p in run["cls_probe_all_labels"]})
    out.update({name: (lambda r, name=name: r["low_label"][name]["accuracy_mean"])
                for name in run["low_label"]})
    return out


def _spread(values: list[float], seeds: list[int] | None = None) -> dict:
    n = len(values)
    std = statistics.stdev(values) if n > 1 else None
    out = {"mean": statistics.fmean(values), "std": std, "n": n,
           "two_se": 2 * std / math.sqrt(n) if std is not None else None}
    if seeds is not None:
        out["per_seed"] = dict(zip(map(str, seeds), values, strict=True))
    return out


def score_stage(args: argparse.Namespace) -> int:
    """Score every finished run the record lacks, append it, redo the summaries; ship models."""
    from bertlab.course.traces import git_commit

    if args.threads:
        torch.set_num_threads(args.threads)
    # Sittings may score with other threads or code: each run names what scored it.
    args.scored_by = {"command": "python benchmarks/twins.py score " + " ".join(args.argv),
                      "commit": git_commit(REPO)}
    path = args.record or record_path(args.device)
    record = read_record(path)
    held = {(r["arm"], r["seed"]) for r in record["runs"]}
    folders = sorted(p for p in args.runs.glob("*/summary.json"))
    if not folders and not record["runs"]:
        raise SystemExit(f"twins score: no finished run in {args.runs} (train first)")
    for summary_file in folders:
        summary = json.loads(summary_file.read_text())
        if (summary["arm"], summary["seed"]) in held:
            continue
        check_same_origin(record, summary, path)
        try:
            entry = {**score_run(summary_file.parent, args), "scored_by": args.scored_by}
        except ValueError as e:  # its data or tokenizer cannot give a measure
            from bertlab.errors import BadInput

            raise BadInput(f"twins score: run {summary_file.parent}", f"cannot be scored ({e})",
                           f"the record {path} keeps the runs scored before it; move this run "
                           f"out of --runs, or train it again on a corpus that gives every "
                           f"measure") from None
        record["runs"].append(entry)
        record["runs"].sort(key=lambda r: (r["seed"], list(ARMS).index(r["arm"])))
        write_twins_record(path, record, args)  # after every run: a later sitting skips it
        at = entry["at"][str(YARDSTICK)]
        pair = at["pair_accuracy"]  # a number, or "not trained"
        print(f"{entry['arm']}-seed{entry['seed']}: [MASK] {at['mask_accuracy']:.3f} at "
              f"{YARDSTICK} (bar {at['mask_unigram_accuracy']:.3f}), pair "
              f"{pair if isinstance(pair, str) else f'{pair:.3f}'}"
              f", overlap rule {entry['word_overlap_rule'][str(YARDSTICK)]['accuracy']:.3f}, "
              f"cloze {_share(entry['cloze']['top1'])}, probe "
              f"{entry['cls_probe_all_labels']['pooled']['accuracy']:.3f}", flush=True)
    held = record.get("random_init", {})
    if {str(r["seed"]) for r in record["runs"]} - set(held):  # a new seed: its initial weights
        record["random_init"] = random_init(record["runs"], args, held)
        write_twins_record(path, record, args)
    for name, arm in (s.split("=", 1) for s in args.ship):
        ship(args, record, name, arm, path)
    return 0


def _share(value: float | None) -> str:
    return "skipped" if value is None else f"{value:.2f}"


def read_record(path: Path) -> dict:
    """Return the twins record at `path` ({"runs": []} where there is none yet), after checking
    it is one: a JSON object whose "runs" is a list of scored runs. Anything else (an empty or
    cut file, a JSON list) is refused before any run is scored, since scoring would replace it."""
    from bertlab.errors import BadInput

    if not path.exists():
        return {"runs": []}
    fix = (f"restore it (git checkout -- {_shown(str(path))} for the committed record) or pass "
           f"another --record; twins.py writes a record whole, so this one was cut or edited "
           f"elsewhere (nothing was scored or written)")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(f"--record {path}", f"cannot be read ({e})", fix) from None
    if not text.strip():
        raise BadInput(f"--record {path}", "is empty, not a twins record",
                       f"delete it to start a new record, or {fix}")
    try:
        record = json.loads(text)
    except ValueError as e:
        raise BadInput(f"--record {path}", f"is not complete JSON ({e}; it may be cut off)",
                       fix) from None
    runs = record.get("runs") if isinstance(record, dict) else None
    if not isinstance(runs, list) or not all(
            isinstance(r, dict) and {"arm", "seed"} <= r.keys() for r in runs):
        kind = type(record).__name__.replace("dict", "JSON object").replace("list", "JSON list")
        raise BadInput(f"--record {path}", f"is a {kind} without a list of scored runs "
                       f"(\"runs\", each with its arm and seed), not a twins record", fix)
    return record


def check_same_origin(record: dict, summary: dict, path: Path) -> None:
    """Refuse a run of another commit or device than the record's runs (one grid per record)."""
    if not record["runs"]:
        return
    first = record["runs"][0]
    for key in ("commit", "device", "recipe"):
        mine = summary["run"]["args"]["recipe"] if key == "recipe" else summary[key]
        if mine != first[key]:
            raise SystemExit(f"twins score: {summary['arm']}-seed{summary['seed']} was trained "
                             f"with {key} {mine}, the runs in {path} with {first[key]}: "
                             f"one record holds one grid; write this one elsewhere (--record)")


def write_twins_record(path: Path, record: dict, args: argparse.Namespace) -> None:
    """Write the record: what made it, the runs so far and their summaries."""
    from bertlab.atomic import atomic_write_json
    from bertlab.recipes import recipe

    runs = record["runs"]
    first = runs[0]
    record.update({
        "what": "one recipe's twins: MLM + NSP, MLM alone, MLM + SOP (the objective is the only "
                "difference); pair accuracy is NSP for the NSP arm, SOP for the SOP arm",
        "device": first["device"], "commit": first["commit"],
        "train_command": "python benchmarks/twins.py train " + " ".join(args.train_argv),
        # the latest scoring's command and code; each run's own is its "scored_by"
        "score_command": args.scored_by["command"], "scored_with": args.scored_by["commit"],
        "recipe": recipe(first["recipe"]).to_dict(), "steps": sorted({r["steps"] for r in runs}),
        "yardstick": f"BERT-masked validation pairs (15%, 80/10/10, seed 0) at "
                     f"{first['max_seq_len']} and {YARDSTICK} tokens, every pair",
        "runs": runs, "summary": summarise(runs)})
    atomic_write_json(path, record)


def ship(args: argparse.Namespace, record: dict, name: str, arm: str, path: Path) -> None:
    """Write models/NAME: the arm's first seed as a Hugging Face folder, with MANIFEST.json and
    the model card it makes (README.md)."""
    import shutil

    from bertlab.atomic import atomic_write_json
    from bertlab.course.traces import make_trace
    from bertlab.export import write_manifest_card

    runs = [r for r in record["runs"] if r["arm"] == arm]
    if not runs:
        raise SystemExit(f"twins score --ship {name}={arm}: the record holds no {arm} run yet")
    run = min(runs, key=lambda r: r["seed"])
    out = args.models / name
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(args.runs / f"{arm}-seed{run['seed']}" / "model", staging)
    manifest = manifest_of(record, run, f"python benchmarks/twins.py score --ship {name}={arm}",
                           path)
    manifest["files"] = {f.name: f.stat().st_size for f in sorted(staging.iterdir())
                         if f.is_file()}
    if run["device"] == "cpu":  # the command's first steps, replayed by tests/test_traces.py
        manifest["trace"] = make_trace(run["command"].split()[3:], TRACE_STEPS)
    atomic_write_json(staging / "MANIFEST.json", manifest)
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    write_manifest_card(out, f"models/{name}")
    biggest = max(f.stat().st_size for f in out.iterdir()) / 2**20
    print(f"model written: {out.relative_to(REPO) if out.is_relative_to(REPO) else out} "
          f"(largest file {biggest:.1f} MiB)")


def _corpus_facts(corpus: str) -> tuple[str, int, str, str]:
    """Return (title, documents, SHA-256, what was hashed) of the corpus a run was trained on.
    A built-in corpus goes by its title. Text is hashed by its documents' ids, splits and texts;
    prepared shards, whose text is no longer there to read, by each split's meta.json and
    docs.txt (the document list)."""
    import hashlib

    from bertlab.artefacts import folder_kind
    from bertlab.engine.shards import hash_listing
    from bertlab.export import KNOWN_CORPORA
    from bertlab.readers import corpus_digest, load_corpus

    folder = Path(corpus) if Path(corpus).is_absolute() else REPO / corpus
    shards = folder_kind(folder) == "shards"
    title = (KNOWN_CORPORA[corpus][0] if corpus in KNOWN_CORPORA
             else f"{'the prepared shards' if shards else 'the corpus'} {corpus}")
    if not shards:
        return (title, *corpus_digest(load_corpus(corpus)), "their ids, splits and texts in order")
    metas = sorted(folder.glob("*/meta.json")) or [folder / "meta.json"]
    h, count = hashlib.sha256(), 0
    for meta in metas:
        count += json.loads(meta.read_text())["documents"]
        hash_listing(h, meta.parent)
    return title, count, h.hexdigest(), "each split's meta.json and docs.txt, the prepared shards"


def manifest_of(record: dict, run: dict, shipped_by: str, path: Path) -> dict:
    """Return a shipped run's MANIFEST: what it is, how it was made (command, commit, device,
    minutes, load), its corpus, and its scores, with the 64-token yardstick as `validation`."""
    from dataclasses import replace

    from bertlab.recipes import Recipe

    made = Recipe.from_dict(record["recipe"])
    if list(made.objectives) != run["objectives"]:  # a twin: the recipe with its own objectives
        made = replace(made.with_objectives(run["objectives"]), summary=(
            f"the {made.name} recipe trained with {','.join(run['objectives'])} in place of its "
            f"objectives ({made.summary})"))
    words = run["command"].split()
    corpus, preset = (words[words.index(flag) + 1] for flag in ("--corpus", "--preset"))
    title, count, digest, hashed = _corpus_facts(corpus)
    at = run["at"][str(YARDSTICK)]
    pair = run["pair_objective"]
    return {
        "what": f"a {preset} BERT pretrained by bertlab on {title} with "
                f"{' + '.join(o.upper() for o in run['objectives'])} ({record['recipe']['name']} "
                f"recipe): the {run['arm']} arm of {_shown(str(path))}, seed {run['seed']}",
        "objectives": run["objectives"], "device": run["device"], "command": run["command"],
        "commands": [run["command"], shipped_by], "commit": run["commit"],
        "made_by": record["train_command"],
        "scored_by": run["scored_by"]["command"],
        "steps": run["steps"], "tokens": run["tokens"],
        "minutes": {"training": run["train_minutes"], "wall": run["wall_minutes"]},
        "load_average": run["load_average"], "recipe": made.to_dict(), "dtype": run["dtype"],
        "corpus": {"name": corpus, "documents": count, "sha256": digest, "sha256_of": hashed},
        "validation": {"pairs": f"BERT-masked {YARDSTICK}-token validation pairs (every pair, "
                                f"seed 0)", "mask_accuracy": at["mask_accuracy"],
                       "mask_unigram_accuracy": at["mask_unigram_accuracy"],
                       **({f"{pair}_accuracy": at["pair_accuracy"]} if pair else {})},
        "cloze": run["cloze"],
        "scores": {k: run[k] for k in ("at", "word_overlap_rule", "cloze",
                                       "cls_probe_all_labels", "low_label", "pair_limits")
                   if k in run},
    }


# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="stage", required=True)
    for name in ("train", "score"):
        p = sub.add_parser(name)
        p.add_argument("--runs", type=Path, default=None,
                       help="the run folders (default: runs/twins-<cpu|gpu>)")
        p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N (score: where the "
                       "runs were trained, which names the record)")
        p.add_argument("--threads", type=int, default=None, help="torch CPU threads per run "
                       "(train on a CPU: the cores / --jobs)")
        if name == "score":
            p.add_argument("--finetune-seeds", type=int, default=3)
            p.add_argument("--label-budgets", type=int, nargs="+", default=list(LABEL_BUDGETS),
                           help="labelled documents per class for fine-tuning and the probe")
            p.add_argument("--task-docs", type=int, default=None,
                           help="score on this many BBC documents drawn at random (default: "
                                "all 2,225; fewer for a quick check)")
            p.add_argument("--record", type=Path, default=None,
                           help="default: benchmarks/results/twins-<cpu|gpu>.json")
            p.add_argument("--ship", nargs="*", default=[], metavar="NAME=ARM",
                           help="write models/NAME from the arm's first seed")
            p.add_argument("--models", type=Path, default=REPO / "models")
            p.add_argument("--train-argv", default="", help=argparse.SUPPRESS)
            continue
        p.add_argument("--recipe", default="nsp", help="the recipe every arm trains")
        p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
        p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
        p.add_argument("--jobs", type=int, default=2, help="runs at once")
        p.add_argument("--corpus", default="bbc", help="bbc, text, or shards from prepare")
        p.add_argument("--validate-also", nargs="+", default=[str(YARDSTICK)],
                       help="pretrain --validate-also (a length, or shards at another length)")
        p.add_argument("--preset", default="tiny")
        p.add_argument("--steps", type=int, default=None, help="default: the recipe's budget")
        p.add_argument("--minutes", type=float, default=None, help="a deadline as well")
        p.add_argument("--batch-size", type=int, default=None, help="default: the recipe's")
        p.add_argument("--precision", default=None, help="default: the recipe's")
        p.add_argument("--eval-interval", type=int, default=500)
        p.add_argument("--eval-batches", type=int, default=100)
        p.add_argument("--checkpoint-interval", type=_steps_or_none, default=250,
                       help="steps between checkpoints (none: only at the end)")
        p.add_argument("--num-workers", type=int, default=None)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)[1:]
    args.runs = args.runs or REPO / "runs" / record_path(args.device).stem
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.stage == "score":
        args.train_argv = args.train_argv.split() if args.train_argv else _train_argv(args)
        return score_stage(args)
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        print("twins: no CUDA GPU here, nothing trained (pass --device cpu for the CPU twins)")
        return 0
    from bertlab.recipes import recipe

    chosen = recipe(args.recipe)
    if args.threads is None and torch.device(args.device).type == "cpu":
        # Torch's default is every core per process: N runs at once would then fight over
        # them. Each run gets its share instead (one core each for --jobs 2 on 2 cores).
        args.threads = max(1, (os.cpu_count() or 1) // args.jobs)
    args.steps = args.steps or chosen.steps
    if args.steps is None:
        parser.error(f"--recipe {args.recipe} names no step budget: pass --steps")
    return train_stage(args)


def _steps_or_none(text: str) -> int | None:
    return None if text.lower() == "none" else int(text)


def _train_argv(args: argparse.Namespace) -> list[str]:
    """Return the train command's arguments, as the runs' sittings noted them (first sitting)."""
    for sittings in sorted(args.runs.glob("*/sittings.json")):
        return json.loads(sittings.read_text())[0].get("train_argv") or []
    return []


if __name__ == "__main__":
    from bertlab.errors import run_reporting

    # Bad input ends in one `error:` line (exit 2), as in `python -m bertlab`.
    sys.exit(run_reporting(main))
