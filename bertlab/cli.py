"""`python -m bertlab ...`: prepare shards, pretrain, export to Hugging Face, fill-mask, demo, doctor.

Every subcommand is a thin layer over package functions; `pretrain` gets one flag per
`TrainConfig` field and per model-size setting, generated from the dataclasses (the argparse
settings of each come from the field's annotation, through `_FLAG_KINDS`). The checks and their
messages are the library's, which name a setting as both readers know it ("TrainConfig.lr
(--lr)"); errors reach `main` as exceptions and leave as one `error:` line and an exit code.

Taught in notebooks/05_pretraining.ipynb
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from bertlab.config import cpu_threads
from bertlab.corpus import split_documents
from bertlab.course.demo import check_demo_folder, format_guesses, history_table, run_demo
from bertlab.course.doctor import load_note, run_doctor
from bertlab.data import LoaderOptions, pretraining_loader
from bertlab.engine.card import model_card, run_facts
from bertlab.engine.checkpoint import list_checkpoints, load_run_checkpoint, read_run_json
from bertlab.engine.device import (
    close_distributed,
    init_distributed,
    rank_world,
    resolve_device,
    resolve_precision,
)
from bertlab.engine.eventlog import check_event_folder
from bertlab.engine.files import (
    atomic_write_json,
    folder_kind,
    in_use_error,
    lock_holder,
    writing_into,
)
from bertlab.engine.loading import check_model_folder, load_model
from bertlab.engine.outputs import check_output
from bertlab.engine.readers import load_corpus
from bertlab.engine.recipes import DEMO_STEPS, RECIPE_TRAIN_FIELDS, RECIPES, Recipe, recipe
from bertlab.engine.records import BAD_ROW_CHOICES
from bertlab.engine.resume import check_run_folder, hold_run_folder, interrupt_on_sigterm
from bertlab.engine.shards import (
    PrepareOptions,
    prepare_command,
    shard_folder,
    shard_pair_length,
    shard_segments,
)
from bertlab.engine.streaming import StreamOptions
from bertlab.errors import BadInput, flag_of, run_reporting
from bertlab.finetune import FinetuneConfig, compare_downstream, format_table
from bertlab.hf import holds_only_users_readme, is_users_readme, save_hf
from bertlab.masking import MaskingConfig
from bertlab.model import BertConfig, BertForPreTraining
from bertlab.pairs import INPUTS, SINGLE, check_objectives, pairs_of
from bertlab.pretraining import check_pretraining_loaders, fill_mask, pretrain
from bertlab.tokenizer import (
    check_same_vocabulary,
    check_tokenizer_fits,
    load_tokenizer,
    save_tokenizer,
    train_tokenizer,
)
from bertlab.train import TrainConfig, TrainResult

# Model settings that a user may override on top of a preset (vocab size comes from the tokenizer).
_MODEL_FLAGS = ("hidden_size", "num_layers", "num_heads", "intermediate_size",
                "max_position_embeddings", "hidden_dropout", "attention_dropout")
# finetune --methods -> the method's name in compare_downstream's table
_METHODS = {"fine-tuned": "fine-tuned", "linear-probe": "linear probe", "tf-idf": "TF-IDF",
            "from-scratch": "from scratch"}
_VOCAB_HELP = "when training a tokenizer (default: 8192)"
_THREADS_WHY = ("A small model does not split well: on 2 cores beside one busy program, the "
                "demo's first 300 steps took 11x as long with 2 threads as with 1 "
                "(benchmarks/threads.py)")


def _optional(kind: type):
    def parse(text: str):
        return None if text.lower() == "none" else kind(text)
    parse.__name__ = kind.__name__
    return parse


# The argparse settings of a generated flag, by its field's annotation (as typing.get_type_hints
# resolves it: `int | None` and `Optional[int]` are one key). "none" reads as None for the
# optional numbers; a bool gets --x / --no-x. A field whose type is missing here stops
# build_parser with a TypeError naming it: add its type here.
_FLAG_KINDS: dict[Any, dict[str, Any]] = {
    bool: {"action": argparse.BooleanOptionalAction},
    bool | None: {"action": argparse.BooleanOptionalAction},  # absent: the default, None
    int: {"type": int, "metavar": "INT"},
    int | None: {"type": _optional(int), "metavar": "INT"},
    float: {"type": float, "metavar": "FLOAT"},
    float | None: {"type": _optional(float), "metavar": "FLOAT"},
    str: {"type": str, "metavar": "STR"},
    str | None: {"type": _optional(str), "metavar": "STR"},
    tuple[float, float]: {"nargs": 2, "type": float, "metavar": ("B1", "B2")},
}


def _flag_kind(cls: type, f: dataclasses.Field, hints: dict[str, Any]) -> dict[str, Any]:
    """Return the argparse settings of field `f`'s flag; raise TypeError for an unmapped type."""
    kind = _FLAG_KINDS.get(hints[f.name])
    if kind is None:
        shown = f.type if isinstance(f.type, str) else repr(f.type)
        raise TypeError(f"{cls.__name__}.{f.name} has type {shown}, which has no command-line "
                        f"flag kind; add it to _FLAG_KINDS in bertlab/cli.py (annotation -> "
                        f"argparse settings), or leave the field out of the flags")
    return kind


def _add_dataclass_flags(group: argparse._ArgumentGroup, cls: type, names: Sequence[str] | None,
                         defaults: dict[str, Any], aliases: dict[str, str] | None = None) -> None:
    # One flag per field (or per field in `names`); absent flags stay absent (SUPPRESS), so only
    # what the user typed overrides the dataclass defaults. Every type is looked up first: a
    # field without a flag kind raises TypeError before any flag is added.
    hints = typing.get_type_hints(cls)
    chosen = [f for f in dataclasses.fields(cls) if names is None or f.name in names]
    kinds = [_flag_kind(cls, f, hints) for f in chosen]
    for f, kind in zip(chosen, kinds, strict=True):
        flags = [flag_of(f.name)]
        if aliases and f.name in aliases:
            flags.append(aliases[f.name])
        help_text = f.metadata.get("help", f.name.replace("_", " "))
        group.add_argument(*flags, default=argparse.SUPPRESS, dest=f.name,
                           help=f"{help_text} (default: {defaults.get(f.name)})", **kind)


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
    for add_command in (_add_prepare, _add_pretrain, _add_finetune, _add_export_hf,
                        _add_fill_mask, _add_demo, _add_doctor):
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
    p.add_argument("--vocab-size", type=int, default=8192, help=_VOCAB_HELP)
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
    _add_encoding_errors(p)
    _add_row_fields(p)


_ENCODINGS = ("strict", "replace", "ignore")


def _add_encoding_errors(p: argparse.ArgumentParser) -> None:
    p.add_argument("--encoding-errors", default="strict", choices=_ENCODINGS,
                   help="bytes of the text read that are not UTF-8: strict refuses the file, "
                        "replace reads them as U+FFFD, ignore drops them (default: strict)")


def _add_row_fields(p: argparse.ArgumentParser, labels: bool = False) -> None:
    """Add the flags that say how a file of rows (.jsonl, .csv, .tsv, .parquet) is read."""
    p.add_argument("--text-field", default=None, metavar="NAME",
                   help="the field of each row that holds its text (default: text)")
    if labels:
        p.add_argument("--label-field", default=None, metavar="NAME",
                       help="the field of each row that holds its label (default: label)")
    p.add_argument("--doc-field", default=None, metavar="NAME",
                   help="consecutive rows with the same value of this field form one document, "
                        "in order (default: each row is a document)")
    p.add_argument("--on-bad-row", default=None, choices=BAD_ROW_CHOICES,
                   help="a row that is not JSON or whose field is missing, not text or empty: "
                        "error stops there, naming it; skip skips it and counts it "
                        "(default: error)")


def _read_options(args: argparse.Namespace) -> dict[str, str]:
    """Return the row-reading flags given (`load_corpus` keywords), leaving defaults out."""
    names = ("text_field", "doc_field", "label_field", "on_bad_row")
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def _add_pretrain(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pretrain", help="pretrain a BERT (masked LM, + NSP or SOP) and save "
                                        "checkpoints",
                       description="Pretrain BertForPreTraining on a corpus. Checkpoints, the "
                                   "tokenizer and the metric history go to --out. With "
                                   "--minutes alone, the time budget decides when to stop.")
    p.add_argument("--corpus", default="bbc",
                   help="bbc, a .txt file / folder of .txt files, a .jsonl / .csv / .tsv / "
                        ".parquet file of rows, or a shard folder from prepare (default: bbc)")
    p.add_argument("--out", required=True, help="run folder (checkpoints, history, tokenizer)")
    p.add_argument("--preset", default="tiny", help="model size: tiny, mini, small, medium, base (default: tiny)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out exactly")
    p.add_argument("--recipe", default="course", choices=sorted(RECIPES),
                   help="course: leaves the unigram plateau in minutes on a CPU; bert: the "
                        "paper's recipe (15%% masking, NSP, dropout, AdamW); gpu: BERT's tasks "
                        "for minutes on one GPU (256 x 128-token pairs, drawn afresh each "
                        "epoch). Flags below override its settings (default: course)")
    p.add_argument("--objectives", default=None,
                   help="what the model learns, comma-separated: mlm (always) plus nsp (BERT's "
                        "next-sentence prediction) or sop (ALBERT's sentence order), e.g. "
                        "mlm,sop; with mlm alone the pooler and pair head stay untrained "
                        "(default: from --recipe)")
    p.add_argument("--nsp", action=argparse.BooleanOptionalAction, default=None,
                   help="short for --objectives mlm,nsp; --no-nsp: --objectives mlm")
    p.add_argument("--segments", default="pairs", choices=INPUTS,
                   help="pairs: [CLS] A [SEP] B [SEP] from documents of two or more sentences; "
                        "single: [CLS] text [SEP], sentences packed per document, for masked LM "
                        "alone on text of one-sentence documents (reviews, tweets), or on "
                        "shards from prepare --segments single (default: pairs)")
    p.add_argument("--mlm-probability", type=float, default=None,
                   help="share of training tokens selected as targets, then 80/10/10; "
                        "validation is always masked BERT's way (default: from --recipe)")
    p.add_argument("--tokenizer", help="a saved tokenizer.json (default: the run's, the shard "
                   "folder's, or one trained on the corpus)")
    p.add_argument("--vocab-size", type=int, default=8192, help=_VOCAB_HELP)
    _add_encoding_errors(p)
    _add_row_fields(p)
    p.add_argument("--max-seq-len", type=int, default=None,
                   help="tokens per NSP example (default: from --recipe)")
    p.add_argument("--data-seed", type=int, default=0, help="seed of pairing, order and masks (default: 0)")
    p.add_argument("--pair-draws", type=int, default=None, metavar="K",
                   help="cut the corpus into pairs K times and train epoch e on draw e %% K "
                        "(default: from --recipe for text, 16 for gpu and 1 for the others; a "
                        "shard folder's own draws, from prepare --pair-draws)")
    p.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes (default: 0)")
    p.add_argument("--group-by-length", type=int, default=None, metavar="G",
                   help="batch training pairs of similar length, sorting G batches at a time: "
                        "less padding, and no attention mask on batches without any (default: "
                        "off)")
    p.add_argument("--threads", type=int, default=None,
                   help=f"torch CPU threads (default on a CPU: 1 for the tiny and mini presets, "
                        f"torch's choice for larger ones). {_THREADS_WHY}")
    p.add_argument("--validate-also", nargs="+", default=None, metavar="LEN_OR_SHARDS",
                   help="more validation sets, each a row's val_<length>_ columns: a token "
                        "length (the corpus's validation pairs cut that long, e.g. 64, the "
                        "course's yardstick) or, with shards, a shard folder prepared at another "
                        "length with the same tokenizer (default: none)")
    _add_pretrain_settings(p)


def _add_pretrain_settings(p: argparse.ArgumentParser) -> None:
    # pretrain's generated flags: the model settings, then every TrainConfig field.
    model_group = p.add_argument_group("model overrides (on top of --preset)")
    probe = BertConfig.preset("tiny", vocab_size=8)  # the settings every preset shares
    shared = ("max_position_embeddings",)
    model_defaults = ({n: "from preset" for n in _MODEL_FLAGS}
                      | {k: getattr(probe, k) for k in shared}
                      | {k: "from --recipe" for k in ("hidden_dropout", "attention_dropout")})
    _add_dataclass_flags(model_group, BertConfig, _MODEL_FLAGS, model_defaults)
    train_group = p.add_argument_group("training (bertlab.TrainConfig)")
    train_defaults = TrainConfig().to_dict() | {k: "from --recipe" for k in RECIPE_TRAIN_FIELDS}
    _add_dataclass_flags(train_group, TrainConfig, None, train_defaults,
                         aliases={"max_minutes": "--minutes",
                                  "tensorboard_dir": "--tensorboard"})


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
    p.add_argument("--max-seq-len", type=int, default=128, help="tokens read per document: "
                   "[CLS] title + first sentences [SEP] (default: 128)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    p.add_argument("--json", help="also write the results to this JSON file")
    _add_encoding_errors(p)
    _add_row_fields(p, labels=True)


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
                        f"{_THREADS_WHY}")


def _add_doctor(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="check this machine for the course (make check)",
                       description="Check Python, packages, corpora, tokenizer, training speed, "
                                   "Jupyter widgets, disk, memory, CPU and GPU: one line each. "
                                   "Exit 0 when nothing failed, 1 otherwise.")
    p.add_argument("--seconds", type=float, default=20.0,
                   help="how long to time training for the speed check (default: 20)")


# ---------------------------------------------------------------------------------------------
# Checks shared by the subcommands


def _check_threads(n: int | None) -> None:
    if n is not None and n < 1:
        raise ValueError(f"--threads {n}: pass a positive number of CPU threads (or leave it "
                         f"out for the default)")


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
            errors=args.encoding_errors, read=_read_options(args))
        summary = prepare_command(args.corpus, out, args.tokenizer, options, seed=args.seed,
                                  vocab_size=args.vocab_size)
    for split, meta in summary["splits"].items():
        draws = (f" per draw of pairs (draw 0; {meta['pair_draws']} draws)"
                 if meta.get("pair_draws", 1) > 1 else "")
        print(f"{split}: {meta['examples']} examples, {meta['tokens']} tokens{draws}, "
              f"{meta['documents']} documents, {len(meta['shards'])} shard(s)")
    single = " --objectives mlm --segments single" if args.segments == SINGLE else ""
    print(f"shards and tokenizer.json written to {out}; next: python -m bertlab pretrain "
          f"--corpus {out} --out runs/NAME{single}")
    return 0


def _pretraining_tokenizer(args: argparse.Namespace, out: Path, corpus: Path, shards: bool,
                           docs: list | None) -> Any:
    """Return the tokenizer of the pretrain subcommand: the run's when resuming, else --tokenizer,
    else the shard folder's, else one trained on the corpus."""
    given = load_tokenizer(args.tokenizer) if args.tokenizer is not None else None
    shard_tok = None
    if shards and (corpus / "tokenizer.json").is_file():
        shard_tok = load_tokenizer(corpus / "tokenizer.json")
    elif shards and given is None:
        raise ValueError(f"--corpus {corpus}: the shard folder has no tokenizer.json; pass "
                         f"--tokenizer with the tokenizer the shards were prepared with")
    run_file = out / "tokenizer.json"
    if args.resume and run_file.is_file():
        tok = load_tokenizer(run_file)
        if given is not None:
            check_same_vocabulary(given, f"--tokenizer {args.tokenizer}", tok,
                                  f"the run ({run_file})", "drop --tokenizer to continue with "
                                  "the run's own, or start a new run in another folder "
                                  "(nothing was written)")
    elif given is not None:
        tok = given
    elif shard_tok is not None:
        tok = shard_tok
    elif args.resume:
        raise ValueError(f"--resume: {out} has no tokenizer.json, so the vocabulary the run was "
                         f"trained with is unknown; pass --tokenizer with that tokenizer.json")
    else:
        tok = train_tokenizer(docs, vocab_size=args.vocab_size)
    if shard_tok is not None and tok is not shard_tok:
        # The shards hold token ids: read with another vocabulary they are other words.
        check_same_vocabulary(tok, f"the tokenizer ({args.tokenizer or run_file})", shard_tok,
                              f"the shards in {corpus} ({corpus / 'tokenizer.json'})",
                              "use the tokenizer the shards were prepared with, or prepare "
                              "them again with this one")
    return tok


def _pair_draws(args: argparse.Namespace, shards: bool) -> int | None:
    """Return the run's draws of pairs: --pair-draws, else a shard folder's own (None), else the
    recipe's."""
    if args.pair_draws is not None or shards:
        return args.pair_draws
    return recipe(args.recipe).pair_draws


def _pretraining_data(args: argparse.Namespace, s: _PretrainSettings, tok: Any,
                      docs: list | None, world: int, device_type: str) -> tuple[Any, Any]:
    """Return (train_loader, val_loader, or None when the corpus has no validation split).

    Both read the pairs the objectives train on, so the history's pair accuracy is measured on
    the task the head learns."""
    corpus, shards, max_seq_len = Path(args.corpus), s.shards, s.max_seq_len
    mlm_probability, pairs = s.mlm_probability, s.pairs
    # Each process loads its share of the global batch. A batch that does not split is refused
    # by check_pretraining_loaders, naming --batch-size; at least 1 here, so that a batch
    # smaller than the processes reaches that check rather than the DataLoader's.
    per_rank_batch = max(1, s.config.batch_size // (s.config.grad_accum * world))
    on_gpu = device_type == "cuda"
    common = LoaderOptions(batch_size=per_rank_batch, max_seq_len=max_seq_len,
                           num_workers=args.num_workers, pad_to_multiple_of=8 if on_gpu else None,
                           pin_memory=on_gpu, pairs=pairs)
    source = corpus if shards else docs
    train = pretraining_loader(source, tok, split="train", seed=args.data_seed,
                               options=dataclasses.replace(
                                   common, masking=MaskingConfig(mlm_probability=mlm_probability),
                                   pair_draws=_pair_draws(args, shards),
                                   group_by_length=args.group_by_length,
                                   sampler="distributed" if world > 1 else None))
    # NSP needs at least 2 documents (negatives come from another one); single segments, one.
    has_validation = (folder_kind(corpus / "validation") == "shards" if shards
                      else len(split_documents(docs)["validation"]) >= (1 if pairs == SINGLE
                                                                         else 2))
    # Masked BERT's way (the defaults) whatever the training masking, shuffled in a fixed order
    # (evaluate pins epoch 0; an unshuffled BBC split starts with business), and paired with
    # seed 0 whatever --data-seed: every run is measured on the same pairs and masks.
    val = (pretraining_loader(source, tok, split="validation", seed=0, options=common)
           if has_validation else None)
    extra = _extra_validation(args, tok, source, max_seq_len, common) if has_validation else {}
    return train, ({"": val, **extra} if extra else val)


def _extra_validation(args: argparse.Namespace, tok: Any, source: Any, max_seq_len: int,
                      common: LoaderOptions) -> dict[str, Any]:
    """Return the validation loaders --validate-also asks for, keyed by their pair length."""
    extra: dict[str, Any] = {}
    for item in args.validate_also or []:
        if item.isdigit():
            if not isinstance(source, list):
                raise ValueError(f"--validate-also {item}: --corpus is a shard folder, whose "
                                 f"pairs prepare cut at one length; pass a shard folder "
                                 f"prepared at {item} tokens with the same tokenizer (prepare "
                                 f"--max-seq-len {item} --tokenizer TOKENIZER.json)")
            length, pairs_from = int(item), source
        elif folder_kind(Path(item)) == "shards":
            length, pairs_from = shard_pair_length(item), Path(item)
            check_same_vocabulary(load_tokenizer(pairs_from / "tokenizer.json"),
                                  f"--validate-also {item}", tok, "the run's tokenizer",
                                  "prepare those shards with --tokenizer set to the run's")
        else:
            raise ValueError(f"--validate-also {item}: neither a token length (e.g. 64) nor a "
                             f"shard folder from prepare; pass one of those")
        problem = ("the run's own validation pairs" if length == max_seq_len else
                   "asked for twice" if str(length) in extra else
                   "too short for a pair" if length < 8 else None)
        if problem:
            raise ValueError(f"--validate-also {item}: {length}-token pairs are {problem}; pass "
                             f"each other length once (at least 8)")
        extra[str(length)] = pretraining_loader(  # seed 0, as the run's own validation pairs
            pairs_from, tok, split="validation", seed=0,
            options=dataclasses.replace(common, max_seq_len=length))
    return extra


@dataclasses.dataclass(frozen=True)
class _PretrainSettings:
    """pretrain's settings: its flags over the recipe's, checked before anything is written."""
    recipe: Recipe
    config: TrainConfig
    shards: bool  # --corpus is a shard folder: prepare cut its pairs, that length rules
    max_seq_len: int
    mlm_probability: float
    objectives: tuple[str, ...]
    pairs: str  # how examples are built: nsp, sop or single (bertlab.pairs.pairs_of)
    model: dict[str, Any]  # BertConfig settings over --preset's (the vocabulary comes later)


def _pretrain_settings(args: argparse.Namespace, corpus: Path) -> _PretrainSettings:
    """Return pretrain's settings from its flags and --recipe; raise ValueError on a bad one."""
    _check_threads(args.threads)
    if args.group_by_length is not None and args.group_by_length < 1:
        raise ValueError(f"--group-by-length {args.group_by_length}: pass how many batches are "
                         f"sorted by length together (8 is a good start), or leave it out")
    if args.num_workers < 0:
        raise ValueError(f"--num-workers {args.num_workers}: pass 0 (load in the main process) "
                         f"or a positive number of worker processes")
    train_fields = {f.name for f in dataclasses.fields(TrainConfig)}
    given = {k: v for k, v in vars(args).items() if k in train_fields}
    if "max_minutes" in given and "max_steps" not in given:
        given["max_steps"] = None  # --minutes alone: the time budget decides
    if given.get("progress") is False and "log_interval" not in given:
        given["log_interval"] = 0  # --no-progress is silent; --log-interval N asks for lines
    chosen = recipe(args.recipe)
    config = chosen.train_config(**given)
    shards = folder_kind(corpus) == "shards"
    max_seq_len = (shard_pair_length(corpus, args.max_seq_len) if shards else
                   chosen.max_seq_len if args.max_seq_len is None else args.max_seq_len)
    mlm_probability = (chosen.mlm_probability if args.mlm_probability is None
                       else args.mlm_probability)
    objectives = _objectives(args, chosen)
    MaskingConfig(mlm_probability=mlm_probability)  # a bad rate is refused before any work
    if mlm_probability == 0:
        raise ValueError("--mlm-probability 0 selects no targets, so masked LM, which every run "
                         "trains, would learn nothing; pass a rate above 0 (BERT: 0.15)")
    overrides = {k: v for k, v in vars(args).items() if k in _MODEL_FLAGS}
    # The position table keeps the preset's 512 rows unless --max-position-embeddings says
    # otherwise: a long --max-seq-len alone never grows the model behind the user's back.
    settings = {"hidden_dropout": chosen.dropout, "attention_dropout": chosen.dropout,
                **overrides}
    # The vocabulary size comes from the tokenizer later; every other model setting is checked now.
    probe = BertConfig.preset(args.preset, vocab_size=8, **settings)
    if max_seq_len > probe.max_position_embeddings:
        raise ValueError(f"--max-seq-len {max_seq_len} is longer than "
                         f"--max-position-embeddings {probe.max_position_embeddings}: the model "
                         f"has no position for the tokens beyond; lower --max-seq-len, or pass "
                         f"--max-position-embeddings {max_seq_len} to grow the position table "
                         f"(BERT's is 512)")
    _check_validate_also_lengths(args.validate_also, probe.max_position_embeddings)
    try:
        pairs = pairs_of(objectives, args.segments)
    except ValueError:
        raise ValueError(f"--segments single with --objectives {','.join(objectives)}: a pair "
                         f"objective trains on [CLS] A [SEP] B [SEP]; pass --objectives mlm to "
                         f"train masked LM alone on single segments, or drop --segments "
                         f"single") from None
    if shards:
        _check_shard_segments(corpus, objectives, args.segments, pairs)
    return _PretrainSettings(chosen, config, shards, max_seq_len, mlm_probability, objectives,
                             pairs, settings)


def _check_validate_also_lengths(items: list[str] | None, positions: int) -> None:
    """Raise BadInput, naming --validate-also, for a token length past the model's positions:
    those pairs could not be scored, and the model would fail on them after training began."""
    for item in items or []:
        if item.isdigit() and int(item) > positions:
            raise BadInput(f"--validate-also {item}",
                           f"{item}-token pairs are longer than the model's {positions} "
                           f"positions (--max-position-embeddings {positions})",
                           f"pass a length of at most {positions}, or --max-position-embeddings "
                           f"{item} to grow the position table (nothing was written)")


def _check_shard_segments(corpus: Path, objectives: tuple[str, ...], segments: str,
                          pairs: str) -> None:
    """Raise ValueError, naming the fix, unless the shards in `corpus` hold what the run trains
    on: NSP pairs for pairs (nsp, or masked LM alone), single segments for --segments single."""
    asked = f"--objectives {','.join(objectives)} --segments {segments}"
    if shard_segments(shard_folder(corpus, "train")) == SINGLE:
        if pairs != SINGLE:
            raise ValueError(f"{asked}: the shards in {corpus} hold single segments (prepare "
                             f"--segments single), which have no sentence pairs or pair "
                             f"labels; pass --objectives mlm --segments single to train masked "
                             f"LM on them, or prepare the corpus again without --segments "
                             f"single for NSP pairs")
        return
    if pairs == SINGLE:
        raise ValueError(f"{asked}: the shards in {corpus} hold NSP pairs (prepare's default); "
                         f"single segments are built from the text: prepare it again with "
                         f"--segments single, pass the corpus itself as --corpus, or drop "
                         f"--segments single to train on these pairs")
    if pairs != "nsp":
        raise ValueError(f"{asked}: the shards in {corpus} hold NSP pairs (prepare builds "
                         f"those); sentence-order pairs are built from the text: pass the "
                         f"corpus itself as --corpus")


def _objectives(args: argparse.Namespace, chosen: Recipe) -> tuple[str, ...]:
    """Return the run's objectives: --objectives, else --nsp/--no-nsp, else the recipe's."""
    if args.objectives is not None and args.nsp is not None:
        raise ValueError(f"--objectives {args.objectives} and --{'' if args.nsp else 'no-'}nsp "
                         f"both say what to train; pass --objectives alone")
    if args.objectives is not None:
        return check_objectives(args.objectives, "--objectives")
    if args.nsp is not None:
        return ("mlm", "nsp") if args.nsp else ("mlm",)
    return chosen.objectives


def _read_run_json(path: Path) -> dict[str, Any]:
    """Return a run's run.json; a file that is not the JSON object pretrain wrote is named in
    the error."""
    return read_run_json(path.parent, "--resume reads the run's --recipe and --segments there, "
                         "so it cannot be continued exactly: restore the file, or start a new "
                         "run in another folder (nothing was written)")


def _trains(objectives: tuple[str, ...]) -> str:
    """Return what a run learns, in words: "MLM only", "MLM + NSP", "MLM + SOP"."""
    return " + ".join(n.upper() for n in objectives) if len(objectives) > 1 else "MLM only"


def _recipe_line(s: _PretrainSettings) -> str:
    """Return pretrain's first line: what the run trains, then the recipe's summary, or, when
    flags changed what that summary describes, which ones (so the line never contradicts itself)."""
    r = s.recipe
    what = (f"recipe: {r.name} ({s.mlm_probability:.0%} masked, {_trains(s.objectives)}"
            f"{' on single segments' if s.pairs == SINGLE else ''}, {s.config.optimizer})")
    changed = [f"{flag} {now:g}" if isinstance(now, float) else f"{flag} {now}"
               for flag, now, own in (
                   ("--objectives", ",".join(s.objectives), ",".join(r.objectives)),
                   ("--mlm-probability", s.mlm_probability, r.mlm_probability),
                   ("--optimizer", s.config.optimizer, r.optimizer),
                   ("--batch-size", s.config.batch_size, r.batch_size),
                   ("--max-seq-len", s.max_seq_len, s.max_seq_len if s.shards else
                    r.max_seq_len)) if now != own]  # the shards' own length gets its own note
    if not changed:
        return f"{what}; {r.summary}"
    return f"{what}; the {r.name} recipe with {', '.join(changed)} in place of its own"


def _check_pretrain_folder(args: argparse.Namespace, out: Path) -> None:
    """Raise ValueError unless --out takes a new run, or resumes one started with the same
    --recipe and --segments (what run.json alone records), before anything is read. The
    settings a checkpoint records (objectives, batch, data seed, masking...) are checked by
    `pretrain` against it, before it writes."""
    check_run_folder(out, args.resume, flag="--out")
    check_event_folder(getattr(args, "tensorboard_dir", None), out, args.resume,
                       flag="--tensorboard")  # an absent flag is absent from args
    check_output(out, "--out", folder=True,
                 inputs=[("--corpus", args.corpus), ("--tokenizer", args.tokenizer),
                         *(("--validate-also", v) for v in args.validate_also or [])])
    holder = lock_holder(out)
    if holder is not None:  # another process is writing there: say so before anything else
        raise in_use_error("run folder", out, holder)
    if not args.resume and folder_kind(out) == "run":  # the files of a start that never saved
        raise ValueError(f"--out {out} holds a run that stopped before its first checkpoint "
                         f"({', '.join(sorted(p.name for p in out.iterdir()))}): nothing in it "
                         f"can be resumed, and a new run would replace those files; delete the "
                         f"folder, or choose another one (nothing was written)")
    first = out / "run.json"
    run = _read_run_json(first) if args.resume and first.is_file() else {}
    started = run.get("args", {}).get("recipe")
    if started is not None and started != args.recipe:
        raise ValueError(f"--resume: the run in {out} was started with --recipe {started}, not "
                         f"--recipe {args.recipe}; pass --recipe {started} (and its other flags) "
                         f"to continue it exactly (nothing was written)")
    segments = run.get("args", {}).get("segments", "pairs")
    if run and segments != args.segments:
        raise ValueError(f"--resume: the run in {out} was started with --segments {segments}, "
                         f"not --segments {args.segments}; pass --segments {segments} to "
                         f"continue it exactly (nothing was written)")


def _run_pretraining(args: argparse.Namespace, s: _PretrainSettings, tok: Any,
                     model: BertForPreTraining, loaders: tuple[Any, Any],
                     say: Callable[[str], None], device: torch.device,
                     corpus_read: dict[str, int] | None) -> TrainResult:
    """Hold --out, write the run's files (a new run), say what trains; return pretrain's result.

    `loaders`: (train, validation); `corpus_read`: what reading the corpus cut and skipped
    (`iter_corpus` counts), for run.json."""
    out, (train, val) = Path(args.out), loaders
    rank, world = rank_world()
    with hold_run_folder(out, args.resume, rank, world, flag="--out"):
        if rank == 0 and not args.resume:  # a resumed run keeps its own files
            save_tokenizer(tok, out / "tokenizer.json")
            atomic_write_json(out / "run.json", {"args": vars(args),
                                                 "objectives": list(s.objectives),
                                                 "mlm_probability": s.mlm_probability,
                                                 "max_seq_len": s.max_seq_len,
                                                 "model": model.config.to_dict(),
                                                 "train": s.config.to_dict(),
                                                 "corpus_read": corpus_read})
        n_params = sum(p.numel() for p in model.parameters())
        say(_recipe_line(s))
        say(f"model: {args.preset} ({n_params / 1e6:.2f} M parameters), vocab "
            f"{tok.get_vocab_size()}, {len(train.dataset)} training examples, device "
            f"{device}, {world} process(es)")
        try:
            return pretrain(model, train, val, s.config, out_dir=out, resume=args.resume,
                            objectives=s.objectives)
        except BaseException:
            if rank == 0 and not args.resume:
                _clear_untrained_start(out)
            raise


def _clear_untrained_start(out: Path) -> None:
    """Remove the files a new run wrote if it failed before it trained a step or saved a
    checkpoint (a refusal in the loop, a divergence at step 1), so that the same command, once
    fixed, finds --out as it was; a run with a checkpoint or a trained step keeps its files."""
    if list_checkpoints(out):
        return
    history = out / "history.json"
    try:
        rows = json.loads(history.read_text()) if history.is_file() else []
    except (OSError, ValueError):
        return
    if any(row.get("step", 0) > 0 for row in rows):
        return
    for name in ("tokenizer.json", "run.json", "history.json", "history.csv"):
        (out / name).unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # only an empty one
        (out / "checkpoints").rmdir()


def cmd_pretrain(args: argparse.Namespace) -> int:
    """Pretrain on `--corpus` into `--out` (single process or under torchrun).

    Everything is checked (settings, the folder, the tokenizer, the data) before anything is
    written; a refused command leaves `--out` as it was.
    """
    out, corpus = Path(args.out), Path(args.corpus)
    s = _pretrain_settings(args, corpus)
    if s.shards and _read_options(args):
        flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in _read_options(args).items())
        raise ValueError(f"{flags}: --corpus {corpus} holds prepared shards, whose text was read "
                         f"when they were made; pass these flags to prepare, or the file of rows "
                         f"itself as --corpus")
    rank, world = init_distributed()
    try:
        code = _pretrain_in_group(args, out, corpus, s, rank, world)
    except BaseException:  # refused, failed or stopped: close the group too, without waiting
        close_distributed(together=False)
        raise
    close_distributed()
    return code


def _pretrain_in_group(args: argparse.Namespace, out: Path, corpus: Path, s: _PretrainSettings,
                       rank: int, world: int) -> int:
    """Return pretrain's exit code: check, load, train and report, once the processes are up."""

    def say(text: str) -> None:  # under torchrun, rank 0 speaks for all
        if rank == 0:
            print(text, flush=True)

    device = resolve_device(s.config.device)
    resolve_precision(s.config.precision, device)  # fp16 on a CPU: refused before any reading
    _check_pretrain_folder(args, out)
    threads = args.threads if args.threads is not None else (
        cpu_threads(args.preset) if device.type == "cpu" else None)
    if threads is not None:
        torch.set_num_threads(threads)
    if s.shards and s.max_seq_len != s.recipe.max_seq_len:
        say(f"note: the shards hold {s.max_seq_len}-token pairs, not the {s.recipe.max_seq_len} "
            f"of --recipe {args.recipe}; prepare with --max-seq-len {s.recipe.max_seq_len} to "
            f"match it")
    corpus_read: dict[str, int] = {}
    docs = None if s.shards else load_corpus(args.corpus, errors=args.encoding_errors,
                                             counts=corpus_read, **_read_options(args))
    tok = _pretraining_tokenizer(args, out, corpus, s.shards, docs)
    train, val = _pretraining_data(args, s, tok, docs, world, device.type)
    # Before the folder is made; this also refuses a batch that does not split over the
    # processes, and a resume with other settings is refused by pretrain before it writes.
    check_pretraining_loaders(train, val, s.config, s.objectives)
    if val is None:
        say(f"note: {args.corpus} has fewer than 2 validation documents; training without "
            f"evaluation")
    model_config = BertConfig.preset(args.preset, vocab_size=tok.get_vocab_size(), **s.model)
    model = BertForPreTraining(model_config, generator=torch.Generator().manual_seed(s.config.seed))
    result = _run_pretraining(args, s, tok, model, (train, val), say, device,
                              None if s.shards else corpus_read)
    say(history_table(result.history))
    say(f"done: {result.steps} steps, {result.tokens} tokens, {result.elapsed_s / 60:.1f} "
        f"min (stopped by {result.stopped_by}; {load_note()}); checkpoint {result.checkpoint}")
    return 0


def cmd_export_hf(args: argparse.Namespace) -> int:
    """Export the newest checkpoint of a run as a Hugging Face folder."""
    run_dir, out_dir = Path(args.run_dir), Path(args.out_dir)
    check_model_folder(run_dir, ("run",))
    if not (run_dir / "tokenizer.json").is_file():
        raise ValueError(f"run folder {run_dir} has no tokenizer.json, and a Hugging Face folder "
                         f"without its tokenizer is of no use; copy in the tokenizer the run was "
                         f"trained with (e.g. from its shard folder), then export again")
    readme_only = out_dir.is_dir() and holds_only_users_readme(out_dir)  # kept, not replaced
    replacing = check_output(out_dir, "out_dir", inputs=[("run_dir", run_dir)], folder=True,
                             accept=("hf", "other") if readme_only else ("hf",)) == "hf"
    if out_dir.resolve().is_relative_to(run_dir.resolve()):
        raise ValueError(f"export-hf: {out_dir} is inside the run folder {run_dir}; an export "
                         f"there would break the run (fill-mask and --resume read that folder): "
                         f"pass a folder outside it (nothing was written)")
    if replacing and not args.overwrite:
        raise ValueError(f"export-hf: {out_dir} already holds a Hugging Face export; pass "
                         f"--overwrite to replace it (files of yours there, such as a README.md, "
                         f"are kept), or choose another folder (nothing was written)")
    # Everything is read and checked before save_hf writes: the weights and the card's facts
    # from one checkpoint (a run still writing here may delete old ones meanwhile).
    model, state = load_run_checkpoint(run_dir)
    tok = load_tokenizer(run_dir / "tokenizer.json")
    check_tokenizer_fits(tok, model.config.vocab_size, f"run folder {run_dir}")
    card = model_card(run_facts(run_dir, out_dir, state=state))
    yours = (replacing or readme_only) and is_users_readme(out_dir / "README.md")
    save_hf(model, tok, out_dir, card=card)
    print(f"{'replaced the previous export in' if replacing else 'wrote'} {out_dir}: load it "
          f"with transformers.BertForPreTraining.from_pretrained({str(out_dir)!r}) or "
          f"bertlab.load_hf; " + ("your README.md there is kept as it was" if yours else
                                  "README.md is its model card"))
    return 0


def cmd_fill_mask(args: argparse.Namespace) -> int:
    """Print the top-k guesses for each [MASK] in the text."""
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
                                                  ("--task", args.task)])
    resolve_device(args.device)  # a device this machine lacks is refused before any work
    config = FinetuneConfig(epochs=args.epochs, lr=args.lr, batch_size=args.batch_size,
                            max_seq_len=args.max_seq_len, device=args.device)
    model, tok = load_model(args.model_dir, require_tokenizer=True)
    corpus_read: dict[str, int] = {}  # filled as a task of your own is read
    results = compare_downstream(model, tok, args.task, config=config, k_per_class=ks,
                                 seeds=range(args.seeds),
                                 methods=[_METHODS[m] for m in args.methods],
                                 read={**_read_options(args), "errors": args.encoding_errors,
                                       "counts": corpus_read})
    print(f"{args.task}: test split, {len(results[0].predictions)} documents")
    print(format_table(results))
    if args.json is not None:
        atomic_write_json(args.json, {"command": " ".join(sys.argv),
                                      "corpus_read": corpus_read or None,
                                      "results": [r.to_dict() for r in results]})
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the whole pipeline on BBC news (`bertlab.course.demo`), writing a table and plots to `--out`."""
    out = Path(args.out)
    if args.steps < 1:
        raise ValueError(f"--steps {args.steps}: pass a positive number of pretraining steps "
                         f"(or leave it out: {DEMO_STEPS})")
    try:
        FinetuneConfig(epochs=args.finetune_epochs)  # refused now, not after the pretraining
    except ValueError:
        raise ValueError(f"--finetune-epochs {args.finetune_epochs:g}: pass a positive number "
                         f"of fine-tuning epochs (fractions such as 0.5 work)") from None
    _check_threads(args.threads)
    check_demo_folder(out)
    check_output(out, "--out", folder=True)
    with writing_into(out, "demo folder"):
        run_demo(out, steps=args.steps, finetune_epochs=args.finetune_epochs,
                 threads=args.threads)
    return 0


# ---------------------------------------------------------------------------------------------
# Entry point: one error line and an exit code


COMMANDS = {"prepare": cmd_prepare, "pretrain": cmd_pretrain, "finetune": cmd_finetune,
            "export-hf": cmd_export_hf, "fill-mask": cmd_fill_mask, "demo": cmd_demo,
            "doctor": lambda args: run_doctor(args.seconds)}


def main(argv: Sequence[str] | None = None) -> int:
    """Return the exit code of `python -m bertlab ARGS`: 0 success, 2 bad input (one `error:`
    line), 1 a failure of the run or the machine (NaN loss, disk full), 128 + N when stopped by
    signal N (130 for Ctrl-C, 143 for SIGTERM); see `bertlab.errors`."""
    args = build_parser().parse_args(argv)

    def command() -> int:
        # SIGTERM (kill, docker stop, a scheduler) stops every command as Ctrl-C does: the
        # `finally` blocks remove what it had begun (staging folders, locks, new folders), and
        # the exit says so (143), instead of dying silently with its half-work left behind.
        with interrupt_on_sigterm():
            return COMMANDS[args.command](args)

    return run_reporting(command)
