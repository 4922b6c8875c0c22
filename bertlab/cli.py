"""`python -m bertlab ...`: prepare shards, pretrain, export to Hugging Face, fill-mask, demo, doctor.

Every subcommand is a thin layer over package functions. `pretrain` lives in its own module
(`bertlab.commands.pretrain`: its flags, one per `TrainConfig` field and model setting, and its
run); the flags several commands share are in `bertlab.commands.flags`. The checks and their
messages are the library's, which name a setting ("TrainConfig.lr"); `main` adds the flag of each
setting a message names ("TrainConfig.lr (--lr)"), and errors leave as one `error:` line and an
exit code.

Taught in notebooks/05_pretraining.ipynb
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from bertlab.atomic import atomic_write_json
from bertlab.commands import pretrain
from bertlab.commands.flags import (
    THREADS_WHY,
    VOCAB_HELP,
    add_encoding_errors,
    add_row_fields,
    with_flags,
)
from bertlab.commands.pretrain import check_threads, read_options
from bertlab.downstream import compare_downstream
from bertlab.engine.device import resolve_device
from bertlab.engine.folders import writing_into
from bertlab.engine.outputs import check_output
from bertlab.engine.resume import interrupt_on_sigterm
from bertlab.engine.shards import (
    PrepareOptions,
    prepare_command,
)
from bertlab.engine.streaming import StreamOptions
from bertlab.errors import BadInput, run_reporting
from bertlab.export import export_run
from bertlab.finetune import FinetuneConfig, classify, format_table
from bertlab.hf import save_hf
from bertlab.loading import (
    check_model_folder,
    classifier_labels,
    is_classifier_folder,
    load_model,
    model_path,
    pretrained_length,
)
from bertlab.pairs import INPUTS, SINGLE
from bertlab.pretraining import fill_mask
from bertlab.recipes import DEMO_STEPS

# finetune --methods -> the method's name in compare_downstream's table
_METHODS = {"fine-tuned": "fine-tuned", "linear-probe": "linear probe", "tf-idf": "TF-IDF",
            "from-scratch": "from scratch"}


def build_parser() -> argparse.ArgumentParser:
    """Return the argparse parser of `python -m bertlab` (subcommands and their flags)."""
    parser = argparse.ArgumentParser(
        prog="python -m bertlab",
        description="bertlab: BERT pretraining, built step by step. Pretrain on the embedded BBC "
                    "corpus or your own text, export to Hugging Face, try fill-mask.",
        epilog="Several GPUs: torchrun --nproc_per_node=N -m bertlab pretrain ... Exit status: "
               "0 done; 2 bad input (one 'error:' line, nothing written); 1 the run failed "
               "(NaN loss, disk full); 128+N stopped by signal N (130 Ctrl-C, 143 SIGTERM).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add_command in (_add_prepare, pretrain.add_parser, _add_finetune, _add_export_hf,
                        _add_fill_mask, _add_classify, _add_demo, _add_doctor):
        add_command(sub)
    return parser


def _add_prepare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prepare", help="tokenize a corpus into NSP shards on disk",
                       description="Turn a corpus into memory-mapped NSP shards (train and "
                                   "validation splits) plus its tokenizer, for large corpora; "
                                   "--segments single writes single segments instead.")
    p.add_argument("--corpus", required=True,
                   help="a corpus name (bbc), a BERT-format .txt file, a folder of .txt files, "
                        "or rows: a .jsonl, .csv, .tsv or .parquet file (any of them may be .gz)")
    p.add_argument("--out", required=True, help="folder to write the shards into")
    p.add_argument("--tokenizer", help="a saved tokenizer.json (default: train one on the corpus)")
    p.add_argument("--vocab-size", type=int, default=8192, help=VOCAB_HELP)
    p.add_argument("--max-seq-len", type=int, default=128, help="tokens per example (default: 128)")
    p.add_argument("--seed", type=int, default=0, help="seed of the NSP pairing (default: 0)")
    p.add_argument("--shard-size", type=int, default=100_000,
                   help="examples per shard file (default: 100000)")
    p.add_argument("--pair-draws", type=int, default=1, metavar="K",
                   help="cut the training split into pairs K times, with fresh A/B splits and "
                        "NotNext partners each time; a run trains epoch e on draw e %% K, so a "
                        "small corpus repeated many times is not the same pairs every epoch "
                        "(default: 1)")
    p.add_argument("--segments", default="pairs", choices=INPUTS,
                   help="pairs: NSP pairs [CLS] A [SEP] B [SEP]; single: [CLS] text [SEP], "
                        "sentences packed per document, for pretrain --objectives mlm "
                        "--segments single on text of one-sentence documents (default: pairs)")
    add_encoding_errors(p)
    add_row_fields(p)


def _add_finetune(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("finetune", help="fine-tune a pretrained run on a classification task",
                       description="Fine-tune the model on a labelled task and print a table: "
                                   "fine-tuned, [CLS] linear probe, TF-IDF + logistic "
                                   "regression and the same model trained from scratch "
                                   "(accuracy and macro-F1 on the test split).")
    p.add_argument("model_dir", help="a pretraining run folder or a Hugging Face folder")
    p.add_argument("--task", default="bbc-topic",
                   help="bbc-topic, a folder of your labelled text: one sub-folder per label, "
                        "holding its .txt files, or a .jsonl / .csv / .tsv / .parquet file "
                        "with a label field (default: bbc-topic)")
    p.add_argument("--labels-per-class", nargs="+", default=["all"], metavar="K",
                   help="labelled training documents per class, e.g. 8 32 all (default: all)")
    p.add_argument("--seeds", type=int, default=1, help="runs per setting (default: 1)")
    p.add_argument("--methods", nargs="+", metavar="METHOD", default=list(_METHODS),
                   help="any of fine-tuned linear-probe tf-idf from-scratch (default: all)")
    p.add_argument("--epochs", type=float, default=10.0,
                   help="passes over the training set (default: 10)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default: 1e-3, "
                   "for the tiny and mini presets; use 2e-5 to 5e-5 for BERT-base)")
    p.add_argument("--batch-size", type=int, default=32, help="batch size (default: 32)")
    p.add_argument("--max-seq-len", type=int, default=None, help="tokens read per document: "
                   "[CLS] title + first sentences [SEP] (default: the length the model was "
                   "pretrained at, from a run folder's run.json or a course model's "
                   "MANIFEST.json, since positions past it never had a gradient; 128 when "
                   "neither records it)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's own, one per core)")
    p.add_argument("--json", help="also write the results to this JSON file (a folder that "
                                  "does not exist yet is made)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="keep the fine-tuned classifier: a Hugging Face folder (weights, "
                        "tokenizer, label names, the length read) with finetune.json (the "
                        "settings and scores of the run), for classify and transformers; needs "
                        "the fine-tuned method, one --labels-per-class and --seeds 1")
    add_encoding_errors(p)
    add_row_fields(p, labels=True)


def _add_classify(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("classify", help="each label's probability for texts, from a classifier "
                                        "finetune --out kept",
                       description="Print, for each text, every label with its probability, "
                                   "most likely first.")
    p.add_argument("model_dir", help="a classifier folder that finetune --out wrote")
    p.add_argument("texts", nargs="*", metavar="TEXT", help="texts to classify")
    p.add_argument("--file", default=None,
                   help="a UTF-8 text file: one text per line (blank lines skipped)")


def _add_export_hf(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export-hf", help="export a run's model and tokenizer as a Hugging Face "
                                         "folder", description="Write config.json, "
                       "model.safetensors and tokenizer files that transformers can load, and "
                       "README.md, a model card of what the run recorded (unless out_dir holds "
                       "a README.md of yours, which is kept).")
    p.add_argument("run_dir", help="a pretraining run folder (from pretrain)")
    p.add_argument("out_dir", help="folder to write the Hugging Face files into")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier export in out_dir (files of yours there are kept, "
                        "a README.md of yours too; the model card bertlab wrote is replaced)")


def _add_fill_mask(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fill-mask", help="guess the [MASK] words of a sentence",
                       description="Print the top-k guesses for each [MASK] in TEXT.")
    p.add_argument("model_dir", help="a pretraining run folder or a Hugging Face folder")
    p.add_argument("text", help='a sentence with [MASK], e.g. "the [MASK] fell sharply"')
    p.add_argument("--top-k", type=int, default=5, help="guesses per mask (default: 5)")


def _add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="the whole pipeline on BBC news in a few minutes",
                       description="Corpus -> tokenizer -> NSP data -> pretrain (tiny on CPU, "
                                   "small on a GPU) -> fill-mask before/after -> [CLS] "
                                   "fine-tuning on BBC topics against TF-IDF and from-scratch, "
                                   "a results table and plots in runs/demo/. No arguments "
                                   "needed.")
    p.add_argument("--out", default="runs/demo", help="output folder (default: runs/demo)")
    p.add_argument("--steps", type=int, default=DEMO_STEPS,
                   help=f"pretraining steps with the course recipe (default: {DEMO_STEPS}, "
                        f"about 4 minutes on 2 CPU cores)")
    p.add_argument("--finetune-epochs", type=float, default=3.0,
                   help="epochs of [CLS] fine-tuning on BBC topics at the end (default: 3)")
    p.add_argument("--threads", type=int, default=None,
                   help=f"torch CPU threads (default on a CPU: 1, as for every tiny model). "
                        f"{THREADS_WHY}")


def _add_doctor(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="check this machine for the course (make check)",
                       description="Check Python, packages, corpora, tokenizer, training speed, "
                                   "Jupyter widgets, disk, memory, CPU and GPU: one line each. "
                                   "Exit 0 when nothing failed, 1 otherwise.")
    p.add_argument("--seconds", type=float, default=20.0,
                   help="how long to time training for the speed check (default: 20)")


# ---------------------------------------------------------------------------------------------
# Checks shared by the subcommands


# ---------------------------------------------------------------------------------------------
# Subcommands


def cmd_prepare(args: argparse.Namespace) -> int:
    """Write NSP shards (or single segments, --segments single) and the tokenizer for
    `--corpus` into `--out`."""
    out = Path(args.out)
    # Before the tokenizer is trained (minutes on a large corpus), not after.
    check_output(out, "--out", inputs=[("--corpus", args.corpus), ("--tokenizer", args.tokenizer)],
                 folder=True, accept=())
    with writing_into(out, "shard folder"):  # prepare_command checks `out` again, locked
        options = PrepareOptions(
            StreamOptions(max_seq_len=args.max_seq_len, segments=args.segments),
            shard_size=args.shard_size, pair_draws=args.pair_draws,
            errors=args.encoding_errors, read=read_options(args))
        summary = prepare_command(args.corpus, out, args.tokenizer, options, seed=args.seed,
                                  vocab_size=args.vocab_size)
    for split, meta in summary["splits"].items():
        draws = (f" per draw of pairs (draw 0; {meta['pair_draws']} draws)"
                 if meta.get("pair_draws", 1) > 1 else "")
        print(f"{split}: {meta['examples']} examples, {meta['tokens']} tokens{draws}, "
              f"{meta['documents']} documents, {len(meta['shards'])} shard(s)")
        dropped = dropped_line(meta)
        if dropped:
            print(f"  {dropped}")
    single = " --objectives mlm --segments single" if args.segments == SINGLE else ""
    print(f"shards and tokenizer.json written to {out}; next: python -m bertlab pretrain "
          f"--corpus {out} --out runs/NAME{single}")
    return 0


def dropped_line(meta: dict) -> str:
    """Return what preparing a split left out, and why, or "" when it left out nothing: the
    tokens cut from pairs longer than --max-seq-len, and the one-sentence documents an NSP pair
    cannot use (meta.json records both)."""
    parts = []
    cut, kept = meta.get("tokens_dropped", 0), meta.get("tokens", 0)
    if cut:
        parts.append(f"{cut:,} tokens ({cut / (cut + kept):.0%}) cut from "
                     f"{meta.get('truncated', 0):,} pairs longer than --max-seq-len "
                     f"{meta.get('max_seq_len')}")
    one = meta.get("one_sentence_docs_skipped", 0)
    if one:
        parts.append(f"{one:,} one-sentence document(s) skipped: an NSP pair needs two "
                     f"sentences (--segments single keeps them)")
    return "left out: " + "; ".join(parts) if parts else ""


def cmd_export_hf(args: argparse.Namespace) -> int:
    """Export the newest checkpoint of a run as a Hugging Face folder (`export_run`)."""
    out_dir = Path(args.out_dir)
    replaced, yours = export_run(args.run_dir, out_dir, overwrite=args.overwrite)
    print(f"{'replaced the previous export in' if replaced else 'wrote'} {out_dir}: load it "
          f"with transformers.BertForPreTraining.from_pretrained({str(out_dir)!r}) or "
          f"bertlab.load_hf; " + ("your README.md there is kept as it was" if yours else
                                  "README.md is its model card"))
    return 0


def cmd_fill_mask(args: argparse.Namespace) -> int:
    """Print the top-k guesses for each [MASK] in the text."""
    from bertlab.course.demo import format_guesses

    if args.top_k < 1:
        raise ValueError(f"--top-k {args.top_k}: pass how many guesses to show per [MASK] (>= 1)")
    model, tok = load_model(args.model_dir, require_tokenizer=True)
    try:
        guesses = fill_mask(model, tok, args.text, top_k=args.top_k)
    except ValueError as e:
        raise ValueError(f"{args.model_dir}: {e}") from None
    print(args.text)
    for i, options in enumerate(guesses):
        print(f"  [MASK] #{i + 1}: {format_guesses(options)}")
    return 0


def cmd_finetune(args: argparse.Namespace) -> int:
    """Fine-tune a run (or Hugging Face folder) on a task and print the comparison table."""
    unknown = [m for m in args.methods if m not in _METHODS]
    if unknown:
        raise ValueError(f"--methods {' '.join(unknown)}: unknown; choose from "
                         f"{' '.join(_METHODS)}")
    ks = []
    for k in args.labels_per_class:
        if k != "all" and not k.isdigit():
            raise ValueError(f"--labels-per-class {k!r}: give whole numbers or 'all'")
        ks.append(None if k == "all" else int(k))
    if args.seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {args.seeds}")
    if args.json is not None:  # checked now, not after minutes of fine-tuning
        check_output(args.json, "--json", inputs=[("model_dir", args.model_dir),
                                                  ("--task", args.task)], new_folder_ok=True)
    if args.out is not None:
        _check_finetune_out(args, ks)
    check_threads(args.threads)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    resolve_device(args.device)  # a device this machine lacks is refused before any work
    max_seq_len, where, recorded = _finetune_length(args)
    config = FinetuneConfig(epochs=args.epochs, lr=args.lr, batch_size=args.batch_size,
                            max_seq_len=max_seq_len, device=args.device)
    model, tok = load_model(args.model_dir, require_tokenizer=True)
    positions = model.config.max_position_embeddings
    if recorded and max_seq_len > positions:  # a length the folder records, edited since?
        raise BadInput(f"finetune {args.model_dir}", f"reads {max_seq_len} tokens per document "
                       f"from {where}, past the model's {positions} positions",
                       f"pass --max-seq-len {positions} (or fewer), or correct that file "
                       f"(nothing was written)")
    print(f"reading the first {max_seq_len} tokens of each document: {where}")
    corpus_read: dict[str, int] = {}  # filled as a task of your own is read
    results = compare_downstream(model, tok, args.task, config=config, k_per_class=ks,
                                 seeds=range(args.seeds),
                                 methods=[_METHODS[m] for m in args.methods],
                                 read={**read_options(args), "errors": args.encoding_errors,
                                       "counts": corpus_read})
    print(f"{args.task}: test split, {len(results[0].predictions)} documents")
    print(format_table(results))
    if args.json is not None:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(args.json, {"command": " ".join(sys.argv),
                                      "corpus_read": corpus_read or None,
                                      "results": [r.to_dict() for r in results]})
    if args.out is not None:
        kept = next(r for r in results if r.method == "fine-tuned")
        record = {"command": " ".join(sys.argv), "pretrained": str(args.model_dir),
                  "task": str(args.task), "max_seq_len": max_seq_len,
                  "max_chunks": config.max_chunks, "result": kept.to_dict()}
        save_hf(kept.model, tok, args.out, label_names=kept.label_names,
                max_length=max_seq_len,
                extra={"finetune.json": json.dumps(record, indent=1) + "\n"})
        print(f"the fine-tuned classifier and its tokenizer are in {args.out}; next: python -m "
              f"bertlab classify {args.out} \"some text\"")
    return 0


def _check_finetune_out(args: argparse.Namespace, ks: list[int | None]) -> None:
    """Refuse, before any work, a finetune --out that could not keep one classifier."""
    if "fine-tuned" not in args.methods or len(ks) != 1 or args.seeds != 1:
        raise BadInput(f"--out {args.out}", "keeps one fine-tuned classifier, and this command "
                       f"trains {len(ks) * args.seeds if 'fine-tuned' in args.methods else 0}",
                       "pass --methods with fine-tuned, one --labels-per-class and --seeds 1 "
                       "(nothing was written)")
    check_output(args.out, "--out", folder=True, accept=(),
                 inputs=[("model_dir", args.model_dir), ("--task", args.task)])


def cmd_classify(args: argparse.Namespace) -> int:
    """Print each label's probability for each text, from a classifier finetune --out kept."""
    texts = list(args.texts)
    if args.file is not None:
        try:
            lines = Path(args.file).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise BadInput(f"--file {args.file}", f"cannot be read as UTF-8 text ({e})",
                           "pass a UTF-8 text file, one text per line") from None
        texts += [line for line in lines if line.strip()]
    if not texts:
        raise BadInput("classify", "got no text", 'pass texts ("some text") or --file FILE')
    if check_model_folder(args.model_dir) != "hf" or not is_classifier_folder(
            model_path(args.model_dir)):
        raise BadInput(str(args.model_dir), "is no classifier (a pretrained model has no labels "
                       "to give)", "fine-tune one first: python -m bertlab finetune MODEL "
                       "--methods fine-tuned --out DIR, then classify DIR")
    model, tok = load_model(args.model_dir, require_tokenizer=True)
    record = model_path(args.model_dir) / "finetune.json"
    read = json.loads(record.read_text(encoding="utf-8")) if record.is_file() else {}
    labels = classifier_labels(args.model_dir)
    probabilities = classify(model, tok, texts, max_seq_len=read.get(
        "max_seq_len", model.config.max_position_embeddings), max_chunks=read.get("max_chunks", 1))
    for text, row in zip(texts, probabilities, strict=True):
        ranked = sorted(zip(labels, row, strict=True), key=lambda lp: -lp[1])
        shown = text if len(text) <= 60 else text[:57] + "..."
        print(f"{shown}\n  " + ", ".join(f"{label} {p:.3f}" for label, p in ranked))
    return 0


def _finetune_length(args: argparse.Namespace) -> tuple[int, str, bool]:
    """Return finetune's tokens per document, where that number came from, and whether a file
    of the model folder recorded it: --max-seq-len when given, else the length the model was
    pretrained at, else FinetuneConfig's default."""
    if args.max_seq_len is not None:
        return args.max_seq_len, "as --max-seq-len asks", False
    found = pretrained_length(args.model_dir)
    if found is not None:
        return found[0], f"the length the model was pretrained at ({found[1]})", True
    default = FinetuneConfig.max_seq_len
    return default, (f"the default; {args.model_dir} records no pretraining length (no "
                     f"run.json or MANIFEST.json with one), pass --max-seq-len to choose"), False


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the whole pipeline on BBC news (`bertlab.course.demo`), writing a table and plots to `--out`."""
    from bertlab.course.demo import check_demo_folder, run_demo

    out = Path(args.out)
    if args.steps < 1:
        raise ValueError(f"--steps {args.steps}: pass a positive number of pretraining steps "
                         f"(or leave it out: {DEMO_STEPS})")
    try:
        FinetuneConfig(epochs=args.finetune_epochs)  # refused now, not after the pretraining
    except ValueError:
        raise ValueError(f"--finetune-epochs {args.finetune_epochs:g}: pass a positive number "
                         f"of fine-tuning epochs (fractions such as 0.5 work)") from None
    check_threads(args.threads)
    check_demo_folder(out)
    check_output(out, "--out", folder=True)
    with writing_into(out, "demo folder"):
        run_demo(out, steps=args.steps, finetune_epochs=args.finetune_epochs,
                 threads=args.threads)
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    """Check this machine for the course (`bertlab.course.doctor`)."""
    from bertlab.course.doctor import run_doctor

    return run_doctor(args.seconds)


# ---------------------------------------------------------------------------------------------
# Entry point: one error line and an exit code


COMMANDS = {"prepare": cmd_prepare, "pretrain": pretrain.command, "finetune": cmd_finetune,
            "export-hf": cmd_export_hf, "fill-mask": cmd_fill_mask, "classify": cmd_classify,
            "demo": cmd_demo, "doctor": cmd_doctor}


def refuse_empty_values(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Raise `BadInput` for a flag or argument given as an empty string: an unset shell variable
    (`--out "$OUT"`) would otherwise become the current folder, read or written."""
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for action in commands.choices[args.command]._actions:
        value = getattr(args, action.dest, None)
        values = value if isinstance(value, list) else [value]
        if any(isinstance(v, str) and not v.strip() for v in values):
            name = action.option_strings[0] if action.option_strings else action.dest.upper()
            raise BadInput(f"{name} {value!r}", "is empty (an unset shell variable?)",
                           "pass the path or value it stands for (nothing was read or written)")


def main(argv: Sequence[str] | None = None) -> int:
    """Return the exit code of `python -m bertlab ARGS`: 0 success, 2 bad input (one `error:`
    line), 1 a failure of the run or the machine (NaN loss, disk full), 128 + N when stopped by
    signal N (130 for Ctrl-C, 143 for SIGTERM); see `bertlab.errors`."""
    parser = build_parser()
    args = parser.parse_args(argv)

    def command() -> int:
        refuse_empty_values(parser, args)
        # SIGTERM (kill, docker stop, a scheduler) stops every command as Ctrl-C does: the
        # `finally` blocks remove what it had begun (staging folders, locks, new folders), and
        # the exit says so (143), instead of dying silently with its half-work left behind.
        with interrupt_on_sigterm():
            return COMMANDS[args.command](args)

    chosen = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return run_reporting(command, with_flags(chosen.choices[args.command]))
