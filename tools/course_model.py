"""Pretrain the course model that notebooks load where a lesson needs more than a live run.

Runs `python -m bertlab pretrain` with the course recipe on the embedded BBC corpus, exports the
result as a Hugging Face folder (config.json, model.safetensors, tokenizer files) into
models/course-tiny/, and writes MANIFEST.json beside it: the exact commands, the recipe, a digest
of the corpus text and of every file written, and the model's held-out scores ([MASK]
accuracy on BERT-masked 64-token pairs with the no-context bar, the cloze set); README.md, the
model card, is made from that MANIFEST (`bertlab.export`). A notebook that
loads the model reads MANIFEST.json too, so it can say what it loaded and how it was made.

Usage: python tools/course_model.py [--steps 8000] [--threads 1]     (make course-model)
A killed run resumes where its last checkpoint left it when started again.
`--trace-only COMMIT` adds the reproduce trace to a model made before traces existed (COMMIT:
the code that made it), without training it again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch

import bertlab
from bertlab.atomic import atomic_write_json
from bertlab.cli import main as cli
from bertlab.course.cloze import CLOZE_SET, cloze_score
from bertlab.course.doctor import load_average
from bertlab.course.traces import git_commit, make_trace
from bertlab.data import LoaderOptions, pretraining_loader
from bertlab.engine.checkpoint import latest_checkpoint
from bertlab.export import write_manifest_card
from bertlab.loading import load_model
from bertlab.pretraining import evaluate
from bertlab.readers import corpus_digest, load_corpus
from bertlab.recipes import VAL_SEQ_LEN, recipe

ROOT = Path(__file__).resolve().parents[1]
TRACE_STEPS = 300  # the reproduce trace: the command's first steps (about 20 s on one core)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def shown(path: Path) -> str:
    """Return a path as a command should show it: relative to the repository when inside it."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=8000)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--run", type=Path, default=ROOT / "runs" / "course-model")
    p.add_argument("--out", type=Path, default=ROOT / "models" / "course-tiny")
    p.add_argument("--trace-only", metavar="COMMIT", help="add the reproduce trace (and COMMIT, "
                   "the code that made the model) to the MANIFEST in --out; train nothing")
    args = p.parse_args(argv)
    if args.trace_only:
        return add_trace(args.out, args.trace_only)
    start, load_start, commit = time.perf_counter(), load_average(), git_commit(ROOT)
    pretrain = ["pretrain", "--recipe", "course", "--corpus", "bbc", "--max-steps",
                str(args.steps), "--threads", str(args.threads), "--eval-interval", "1000",
                "--checkpoint-interval", "1000", "--no-progress", "--out", str(args.run)]
    if latest_checkpoint(args.run) is not None:
        pretrain.append("--resume")
    if cli(pretrain) != 0:
        return 1
    staging = args.out.with_name(args.out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    if cli(["export-hf", str(args.run), str(staging)]) != 0:
        return 1

    torch.set_num_threads(args.threads)
    model, tok = load_model(staging, require_tokenizer=True)
    docs = load_corpus("bbc")
    val = pretraining_loader(docs, tok, split="validation", seed=0,
                             options=LoaderOptions(batch_size=32, max_seq_len=VAL_SEQ_LEN))
    scores = evaluate(model, val, max_batches=50)
    cloze = cloze_score(model, tok, CLOZE_SET)
    count, digest = corpus_digest(docs)
    manifest = {
        "what": "a tiny BERT pretrained by bertlab with the course recipe on BBC News",
        "commands": [
            "python -m bertlab " + " ".join(shown(args.run) if a == str(args.run) else a
                                            for a in pretrain if a != "--resume"),
            f"python -m bertlab export-hf {shown(args.run)} {shown(args.out)}"],
        "made_by": "python tools/course_model.py " + " ".join(argv or sys.argv[1:]),
        "commit": commit,
        "device": "cpu",
        "recipe": recipe("course").to_dict(),
        "steps": args.steps,
        "corpus": {"name": "bbc", "documents": count, "sha256": digest},
        "versions": {"bertlab": bertlab.__version__, "torch": torch.__version__.split("+")[0]},
        "validation": {"pairs": f"BERT-masked {VAL_SEQ_LEN}-token validation pairs, 50 batches "
                                f"of 32, seed 0",
                       **{k: scores[k] for k in ("mask_accuracy", "mask_loss",
                                                 "mask_unigram_accuracy", "mask_unigram_loss",
                                                 "mlm_accuracy", "kept_accuracy",
                                                 "random_accuracy")}},
        "cloze": {"items": len(CLOZE_SET), "top1": cloze["top1"], "top5": cloze["top5"]},
        "files": {f.name: sha256(f) for f in sorted(staging.iterdir())
                  if f.is_file() and f.name != "README.md"},  # the card is made from this file
        "minutes": round((time.perf_counter() - start) / 60, 1),
        # beside the minutes, how busy the machine was: a load above the cores means the run
        # shared them, and its minutes are longer than a free machine's
        "load_average": {"start": load_start, "end": load_average()},
        "cpus": os.cpu_count(),
    }
    # The command's first steps, replayed by tests/test_traces.py: a code change that moves the
    # training stream fails there, naming this model, instead of going unnoticed.
    manifest["trace"] = make_trace([a for a in pretrain if a != "--resume"], TRACE_STEPS)
    atomic_write_json(staging / "MANIFEST.json", manifest)
    write_manifest_card(staging, shown(args.out))  # README.md: the model card of this MANIFEST
    shutil.rmtree(args.out, ignore_errors=True)
    staging.rename(args.out)
    size = sum(f.stat().st_size for f in args.out.iterdir()) / 2**20
    print(f"wrote {args.out} ({size:.1f} MiB): [MASK] accuracy {scores['mask_accuracy']:.3f} "
          f"(bar {scores['mask_unigram_accuracy']:.3f}), cloze top-1 {cloze['top1']:.2f}, "
          f"top-5 {cloze['top5']:.2f}")
    return 0


def add_trace(out: Path, commit: str) -> int:
    """Add the commit that made the model in `out` and its reproduce trace to its MANIFEST."""
    path = out / "MANIFEST.json"
    manifest = json.loads(path.read_text(encoding="utf-8"))
    command = manifest["commands"][0].split()[3:]  # after "python -m bertlab"
    manifest.update(commit=commit, device="cpu", trace=make_trace(command, TRACE_STEPS))
    atomic_write_json(path, manifest)
    print(f"{path}: trace of {TRACE_STEPS} steps added (recorded at {manifest['trace']['commit']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
