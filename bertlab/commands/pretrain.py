"""The pretrain command's run: its flags checked, its corpus, tokenizer and loaders built, its
model made, then `bertlab.pretraining.pretrain`, which writes the run folder.

`python -m bertlab pretrain` parses its flags and calls `run_pretraining`; everything between
the flags and the training loop lives here, checked before anything is written (a refused
command leaves `--out` as it was).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bertlab.artefacts import folder_kind
from bertlab.commands.flags import (
    THREADS_WHY,
    VOCAB_HELP,
    add_dataclass_flags,
    add_encoding_errors,
    add_row_fields,
)
from bertlab.config import TrainConfig, cpu_threads, rank_world
from bertlab.corpus import split_documents
from bertlab.data import LoaderOptions, pretraining_loader
from bertlab.engine.checkpoint import latest_checkpoint, read_checkpoint_state, read_run_json
from bertlab.engine.device import (
    close_distributed,
    init_distributed,
    resolve_device,
    resolve_precision,
)
from bertlab.engine.eventlog import check_event_folder
from bertlab.engine.folders import in_use_error, lock_holder
from bertlab.engine.outputs import check_output
from bertlab.engine.resume import check_run_folder
from bertlab.engine.shards import shard_folder, shard_loader, shard_pair_length, shard_segments
from bertlab.errors import BadInput
from bertlab.masking import MaskingConfig
from bertlab.model import BertConfig, BertForPreTraining
from bertlab.pairs import INPUTS, SINGLE, check_objectives, pairs_of
from bertlab.pretraining import check_pretraining_loaders, pretrain
from bertlab.readers import load_corpus
from bertlab.recipes import RECIPE_TRAIN_FIELDS, RECIPES, Recipe, recipe
from bertlab.tokenizer import check_same_vocabulary, load_tokenizer, train_tokenizer
from bertlab.train import TrainResult

# Model settings that a user may override on top of a preset (vocab size comes from the tokenizer).
MODEL_FLAGS = ("hidden_size", "num_layers", "num_heads", "intermediate_size",
                "max_position_embeddings", "hidden_dropout", "attention_dropout")


def check_threads(n: int | None) -> None:
    if n is not None and n < 1:
        raise ValueError(f"--threads {n}: pass a positive number of CPU threads (or leave it "
                         f"out for the default)")


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


def _loader(source: Path | list, tok: Any, **settings: Any) -> Any:
    """Return the loader of `source`: a shard folder's (`shard_loader`) or the documents'."""
    load = shard_loader if isinstance(source, Path) else pretraining_loader
    return load(source, tok, **settings)


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
    train = _loader(source, tok, split="train", seed=args.data_seed,
                    options=dataclasses.replace(
                        common, masking=MaskingConfig(mlm_probability=mlm_probability),
                        pair_draws=_pair_draws(args, shards), group_by_length=args.group_by_length,
                        sampler="distributed" if world > 1 else None))
    # NSP needs at least 2 documents (negatives come from another one); single segments, one.
    has_validation = (folder_kind(corpus / "validation") == "shards" if shards
                      else len(split_documents(docs)["validation"]) >= (1 if pairs == SINGLE
                                                                         else 2))
    # Masked BERT's way (the defaults) whatever the training masking, shuffled in a fixed order
    # (evaluate pins epoch 0; an unshuffled BBC split starts with business), and paired with
    # seed 0 whatever --data-seed: every run is measured on the same pairs and masks.
    val = (_loader(source, tok, split="validation", seed=0, options=common)
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
        extra[str(length)] = _loader(  # seed 0, as the run's own validation pairs
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
    check_threads(args.threads)
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
    overrides = {k: v for k, v in vars(args).items() if k in MODEL_FLAGS}
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
    """Raise BadInput, naming --validate-also, for a token length (or a shard folder's pairs)
    past the model's positions: those pairs could not be scored, and the model would fail on
    them after training began."""
    for item in items or []:
        if item.isdigit() and int(item) > positions:
            raise BadInput(f"--validate-also {item}",
                           f"{item}-token pairs are longer than the model's {positions} "
                           f"positions (--max-position-embeddings {positions})",
                           f"pass a length of at most {positions}, or --max-position-embeddings "
                           f"{item} to grow the position table (nothing was written)")
        if not item.isdigit() and folder_kind(Path(item)) == "shards":
            length = shard_pair_length(item)
            if length > positions:
                raise BadInput(f"--validate-also {item}",
                               f"holds {length}-token pairs (prepared with --max-seq-len "
                               f"{length}), longer than the model's {positions} positions",
                               f"prepare that folder again with --max-seq-len {positions} or "
                               f"less, or pass --max-position-embeddings {length} (nothing was "
                               f"written)")


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
    inputs = [("--corpus", args.corpus), ("--tokenizer", args.tokenizer),
              *(("--validate-also", v) for v in args.validate_also or [])]
    check_output(out, "--out", folder=True, inputs=inputs)
    events = getattr(args, "tensorboard_dir", None)
    if events is not None and not Path(events).resolve().is_relative_to(out.resolve()):
        check_output(events, "--tensorboard", folder=True, inputs=inputs)  # never the corpus
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
    # The segments a run trained on are the checkpoint's to say (run.json may have been
    # edited); run.json answers only for a checkpoint written before they were recorded.
    newest = latest_checkpoint(out) if args.resume else None
    recorded = read_checkpoint_state(newest, verified=True).get("segments") if newest else None
    segments = ("single" if recorded == "single" else "pairs") if recorded else \
        run.get("args", {}).get("segments", "pairs")
    if run and segments != args.segments:
        raise ValueError(f"--resume: the run in {out} was started with --segments {segments}, "
                         f"not --segments {args.segments}; pass --segments {segments} to "
                         f"continue it exactly (nothing was written)")


def _run_pretraining(args: argparse.Namespace, s: _PretrainSettings, tok: Any,
                     model: BertForPreTraining, loaders: tuple[Any, Any],
                     say: Callable[[str], None], device: torch.device,
                     corpus_read: dict[str, int] | None) -> TrainResult:
    """Say what trains; return `pretrain`'s result, which writes the whole run folder.

    `loaders`: (train, validation); `corpus_read`: what reading the corpus cut and skipped
    (`iter_corpus` counts), which run.json keeps beside the flags."""
    train, val = loaders
    n_params = sum(p.numel() for p in model.parameters())
    say(_recipe_line(s))
    say(f"model: {args.preset} ({n_params / 1e6:.2f} M parameters), vocab "
        f"{tok.get_vocab_size()}, {len(train.dataset)} training examples, device "
        f"{device}, {rank_world()[1]} process(es)")
    examples = getattr(train.dataset, "examples", None)
    if isinstance(examples, list) and examples and hasattr(examples[0], "tokens_dropped"):
        # Built from text here (prepare said it when it wrote shards): what the cut left out.
        cut = sum(e.tokens_dropped for e in examples)
        kept = sum(len(e.input_ids) for e in examples)
        if cut:
            say(f"left out: {cut:,} tokens ({cut / (cut + kept):.0%}) cut from "
                f"{sum(1 for e in examples if e.tokens_dropped):,} pairs longer than "
                f"--max-seq-len {s.max_seq_len}")
    return pretrain(model, train, val, s.config, out_dir=args.out, resume=args.resume,
                    objectives=s.objectives,
                    record={"args": vars(args), "corpus_read": corpus_read})


def _pretrain_in_group(args: argparse.Namespace, out: Path, corpus: Path, s: _PretrainSettings,
                       rank: int, world: int) -> TrainResult:
    """Return pretrain's result: check, load and train, once the processes are up."""

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
                                             counts=corpus_read, **read_options(args))
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
    return _run_pretraining(args, s, tok, model, (train, val), say, device,
                            None if s.shards else corpus_read)


def read_options(args: argparse.Namespace) -> dict[str, str]:
    """Return the row-reading flags given (`load_corpus` keywords), leaving defaults out."""
    names = ("text_field", "doc_field", "label_field", "on_bad_row")
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def run_pretraining(args: argparse.Namespace) -> TrainResult | None:
    """Return the result of the run `python -m bertlab pretrain` asks for with `args` (its parsed
    flags), on one process or under torchrun, where rank 0 speaks and writes and the other
    processes return None.

    Everything is checked (settings, the folder, the tokenizer, the data) before anything is
    written; a refused command leaves `--out` as it was.
    """
    out, corpus = Path(args.out), Path(args.corpus)
    holder = lock_holder(corpus) if corpus.is_dir() else None
    if holder is not None:  # prepare writing shards there: it holds the folder until they land
        raise in_use_error("--corpus", corpus, holder)
    s = _pretrain_settings(args, corpus)
    if s.shards and read_options(args):
        flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in read_options(args).items())
        raise ValueError(f"{flags}: --corpus {corpus} holds prepared shards, whose text was read "
                         f"when they were made; pass these flags to prepare, or the file of rows "
                         f"itself as --corpus")
    rank, world = init_distributed()
    try:
        result = _pretrain_in_group(args, out, corpus, s, rank, world)
    except BaseException:  # refused, failed or stopped: close the group too, without waiting
        close_distributed(together=False)
        raise
    close_distributed()
    return result if rank == 0 else None


# ---------------------------------------------------------------------------------------------
# The command: its flags, and what it prints


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add the pretrain command and all its flags to `python -m bertlab`'s subcommands."""
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
    p.add_argument("--vocab-size", type=int, default=8192, help=VOCAB_HELP)
    add_encoding_errors(p)
    add_row_fields(p)
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
                        f"torch's choice for larger ones). {THREADS_WHY}")
    p.add_argument("--validate-also", nargs="+", default=None, metavar="LEN_OR_SHARDS",
                   help="more validation sets, each a row's val_<length>_ columns: a token "
                        "length (the corpus's validation pairs cut that long, e.g. 64, the "
                        "course's yardstick) or, with shards, a shard folder prepared at another "
                        "length with the same tokenizer (default: none)")
    _add_run_settings(p)


def _add_run_settings(p: argparse.ArgumentParser) -> None:
    """Add pretrain's generated flags to `p`: the model settings, then every TrainConfig field."""
    model_group = p.add_argument_group("model overrides (on top of --preset)")
    probe = BertConfig.preset("tiny", vocab_size=8)  # the settings every preset shares
    shared = ("max_position_embeddings",)
    model_defaults = ({n: "from preset" for n in MODEL_FLAGS}
                      | {k: getattr(probe, k) for k in shared}
                      | {k: "from --recipe" for k in ("hidden_dropout", "attention_dropout")})
    add_dataclass_flags(model_group, BertConfig, MODEL_FLAGS, model_defaults)
    train_group = p.add_argument_group("training (bertlab.TrainConfig)")
    train_defaults = TrainConfig().to_dict() | {k: "from --recipe" for k in RECIPE_TRAIN_FIELDS}
    add_dataclass_flags(train_group, TrainConfig, None, train_defaults,
                         aliases={"max_minutes": "--minutes",
                                  "tensorboard_dir": "--tensorboard"})


def command(args: argparse.Namespace) -> int:
    """Pretrain on `--corpus` into `--out` (`run_pretraining`), then print the
    history and where the run ended."""
    from bertlab.course.demo import history_table
    from bertlab.course.doctor import load_note

    result = run_pretraining(args)
    if result is not None:  # rank 0 speaks for all
        print(history_table(result.history))
        print(f"done: {result.steps} steps, {result.tokens} tokens, {result.elapsed_s / 60:.1f} "
              f"min (stopped by {result.stopped_by}; {load_note()}); checkpoint "
              f"{result.checkpoint}")
    return 0
