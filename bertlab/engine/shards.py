"""Prepared NSP examples on disk: memory-mappable .npy shards, written and read back.

`prepare_shards` streams a corpus (`bertlab.engine.streaming`) into per-split folders of shards (the
CLI's `prepare` is `prepare_command`); `ShardExamples` reads them back lazily, as a sequence of
examples that `bertlab.data.PretrainingDataset` takes like the list `create_nsp_examples` returns
(they are `bertlab.data.StoredExamples`), so a loader sees the same items either way.
`shard_loader` is `bertlab.data.pretraining_loader` for a shard folder: it finds the split's
folder, checks what it holds and hands the loader its examples, which stay on disk.
`segments="single"` writes single segments ([CLS] text [SEP], `bertlab.pairs`) in the same
format instead: A is the text, there is no B, and the label is -100 (no pair label); meta.json
says `"segments": "single"` (`shard_segments`).
"""

from __future__ import annotations

import contextlib
import json
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from bertlab.atomic import atomic_write_json, atomic_write_text
from bertlab.corpus import SPLITS, Document
from bertlab.data import (
    EpochLoader,
    LoaderOptions,
    PairDraws,
    check_pair_draws,
    checked_loader_options,
    pretraining_loader,
)
from bertlab.engine.folders import atomic_write_folder
from bertlab.engine.outputs import check_output
from bertlab.engine.streaming import StreamingExampleBuilder, StreamOptions, iter_documents
from bertlab.errors import BadInput
from bertlab.pairs import NOT_NEXT, SINGLE, Example
from bertlab.readers import CORPORA
from bertlab.tokenizer import EmptyCorpus, SpecialIds, load_tokenizer, train_tokenizer

SHARD_FORMAT = 1


class _ShardWriter:
    """Collects examples of one split and writes them as .npy shards of `shard_size` examples."""

    def __init__(self, folder: Path, shard_size: int, vocab_size: int, prefix: str = "") -> None:
        self.folder, self.shard_size, self.prefix = folder, shard_size, prefix
        self.dtype = np.uint16 if vocab_size <= 2**16 else np.int32
        self.shards: list[dict[str, int]] = []
        self.counts = {"examples": 0, "not_next": 0, "truncated": 0, "tokens_dropped": 0, "tokens": 0}
        self._reset()

    def _reset(self) -> None:
        self.tokens = array("i")
        self.lengths = array("i")
        self.a_lens = array("i")
        self.labels = array("b")
        self.doc_index = array("q")

    def add(self, ex: Example) -> None:
        self.tokens.extend(ex.input_ids)
        self.lengths.append(len(ex.input_ids))
        self.a_lens.append(ex.a_len)
        self.labels.append(ex.next_sentence_label)
        self.doc_index.append(ex.doc_index)
        c = self.counts
        c["examples"] += 1
        c["not_next"] += ex.next_sentence_label == NOT_NEXT
        c["truncated"] += ex.truncated
        c["tokens_dropped"] += ex.tokens_dropped
        c["tokens"] += len(ex.input_ids)
        if len(self.lengths) >= self.shard_size:
            self.flush()

    def flush(self) -> None:
        if not self.lengths:
            return
        name = f"{self.prefix}shard-{len(self.shards):05d}"
        offsets = np.zeros(len(self.lengths) + 1, dtype=np.int64)
        np.cumsum(np.frombuffer(self.lengths, dtype=np.int32), out=offsets[1:])
        arrays = {
            "tokens": np.frombuffer(self.tokens, dtype=np.int32).astype(self.dtype),
            "offsets": offsets,
            "a_len": np.frombuffer(self.a_lens, dtype=np.int32),
            "label": np.frombuffer(self.labels, dtype=np.int8),
            "doc_index": np.frombuffer(self.doc_index, dtype=np.int64),
        }
        for key, value in arrays.items():
            np.save(self.folder / f"{name}.{key}.npy", value)
        self.shards.append({"name": name, "examples": len(self.lengths), "tokens": len(self.tokens)})
        self._reset()


@dataclass(frozen=True)
class PrepareOptions:
    """Every setting of `prepare_shards` but the seed, checked when built: how the examples are
    built from the stream (`stream`, a `StreamOptions`: sequence length, pairs or single
    segments, memory bounds), how they are laid out on disk (`shard_size` examples per shard,
    `splits`, `pair_draws`), and how the corpus is read (`errors` for bytes that are not UTF-8;
    `read`: text_field, doc_field, on_bad_row, see `iter_corpus`)."""

    stream: StreamOptions = field(default_factory=StreamOptions)
    shard_size: int = 100_000
    splits: Sequence[str] | None = ("train", "validation")
    pair_draws: int = 1
    errors: str = "strict"
    read: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.stream, StreamOptions):
            raise ValueError(f"stream={self.stream!r}; pass a bertlab.engine.streaming.StreamOptions, "
                             f"e.g. StreamOptions(max_seq_len=128)")
        _check_layout(self.shard_size, self.splits)
        check_pair_draws(self.pair_draws, self.stream.dupe_factor)

    def draws(self, split: str | None) -> int:
        """Return how many draws of pairs `split` gets: `pair_draws` for training (or for
        everything, split None), one for validation and test (always scored on the same pairs)."""
        return self.pair_draws if split in ("train", None) else 1


def prepare_shards(
    corpus: str | Path | Iterable[Document],
    tokenizer: Tokenizer | str | Path,
    out_dir: str | Path,
    options: PrepareOptions | None = None,
    *,
    seed: int = 0,
) -> dict[str, Any]:
    """Return a summary after writing NSP examples of a corpus to memory-mappable shards in `out_dir`.

    `options` (`PrepareOptions`) holds every setting but the `seed`. Streams documents
    (`iter_documents`: a BERT-format .txt file, a folder of .txt files, a corpus name or an
    iterable of Documents), tokenizes them in batches and writes, per split
    (`options.splits`), a sub-folder `out_dir/<split>/` with `meta.json`, `docs.txt` (document
    ids, one per line, in index order) and per shard
    `shard-NNNNN.{tokens,offsets,a_len,label,doc_index}.npy`: the examples' [CLS] A [SEP] B
    [SEP] ids back to back, where each starts (n + 1 offsets), the length of A, the NSP label
    and the document index. `splits=None` writes every document to `out_dir` itself.
    `out_dir/tokenizer.json` is the tokenizer the ids refer to. `pair_draws=K` cuts the
    training split into pairs K times, each with fresh random choices, and keeps the draws
    apart: draw 0's shards are those under meta "shards", draw k's are named
    `draw-k-shard-NNNNN` and listed under meta "draws"; a loader trains epoch e on draw e % K
    (validation keeps one draw, so it is always scored on the same pairs). Each split has its
    own negatives pool (`StreamingExampleBuilder`), so validation text never appears in training
    examples. Memory stays bounded by one batch of documents (`StreamOptions.batch_docs`,
    `batch_chars`), the reservoir and one shard; long lines and huge documents are cut as the
    corpus is read (`bertlab.load_corpus`), and the summary and each meta.json count them under
    "corpus_read" (long_lines_split, documents_split, folders_skipped, hidden_skipped,
    bad_rows_skipped). `tokenizer` may be a path to a saved tokenizer.
    `StreamOptions(segments="single")` writes single segments instead of pairs (for masked LM
    alone, on text whose documents may have one sentence each), in the same files: the ids are
    [CLS] text [SEP], a_len the text's length, the label -100 (no pair label), and meta.json
    has `"segments": "single"`; a split needs one document with text, not two.

    Everything is checked before anything is written: the settings, the corpus path, and
    `out_dir`, which must be new or empty (a run, a Hugging Face export, earlier shards or other
    files are refused) and must not lie inside the corpus folder (its docs.txt would be read as
    text next time). The shards are written into a hidden sibling folder and moved to `out_dir`
    only when complete, so a failure midway leaves `out_dir` as it was.
    """
    options = PrepareOptions() if options is None else options
    if not isinstance(options, PrepareOptions):
        raise ValueError(f"options={options!r}; pass a bertlab.engine.shards.PrepareOptions, e.g. "
                         f"PrepareOptions(StreamOptions(max_seq_len=128), shard_size=100_000)")
    if isinstance(tokenizer, (str, Path)):
        tokenizer = load_tokenizer(tokenizer)
    out = Path(out_dir)
    check_output(out, "out_dir", folder=True, accept=())
    _check_not_inside_corpus(out, corpus, "out_dir")
    counts: dict[str, int] = {}
    docs = iter_documents(corpus, counts=counts, errors=options.errors, **(options.read or {}))
    names = list(options.splits) if options.splits is not None else [None]
    label = f"corpus '{corpus}'" if isinstance(corpus, (str, Path)) else "the corpus"
    # The training split's builder makes one pass over each batch of documents per draw, and
    # each pass's pairs (their `draw`) go to that draw's shards.
    stream = options.stream
    builders = {
        name: StreamingExampleBuilder(
            tokenizer, replace(stream, dupe_factor=stream.dupe_factor * options.draws(name)),
            seed=seed + 1_000_003 * k, name=f"{label} ({name or 'all'} split)")
        for k, name in enumerate(names)
    }
    summary: dict[str, Any] = {}

    def write(staging: Path) -> None:
        summary.update(_write_shards(docs, builders, staging, options, seed=seed,
                                     vocab_size=tokenizer.get_vocab_size(), counts=counts))
        _check_some_pairs(summary["splits"], label)
        atomic_write_text(staging / "tokenizer.json", tokenizer.to_str())
        # nothing may have appeared there in the meantime
        check_output(out, "out_dir", folder=True, accept=())

    # Built in a hidden sibling and moved into place whole; an empty `out` (made by hand, or
    # holding the CLI's lock) stays, and meta.json and train/ arrive last.
    atomic_write_folder(out.resolve(), write, fill_empty=True, last=("meta.json", "train"))
    summary["out_dir"] = str(out)
    summary["tokenizer"] = str(out / "tokenizer.json")
    return summary


def _check_layout(shard_size: object, splits: Sequence[str] | None) -> None:
    """Raise ValueError (naming the fix) on a bad `prepare_shards` shard size or splits."""
    if not isinstance(shard_size, int) or shard_size < 1:
        raise ValueError(f"shard_size={shard_size!r}; pass the number of examples per shard (>= 1)")
    if splits is not None:
        unknown = sorted(set(splits) - set(SPLITS))
        if unknown or not splits:
            raise ValueError(f"splits={tuple(splits)!r}; choose from {SPLITS}, or pass None for all")


def _check_some_pairs(splits: dict[str, dict[str, Any]], label: str) -> None:
    """Refuse shards without a single training pair (nothing is written): say why."""
    train = splits.get("train", splits.get("all", {}))
    if train.get("examples", 1) > 0:
        return
    seen, one = train.get("documents", 0), train.get("one_sentence_docs_skipped", 0)
    why = (f"all {seen} of its documents have one sentence, and an NSP pair needs a document of "
           f"at least two (A, then the B that follows it)" if seen and one == seen else
           f"its {seen} documents gave no [CLS] A [SEP] B [SEP] pair")
    one_each = bool(seen) and one == seen
    fix = ("; to train masked LM alone on such text, prepare single segments instead "
           "(prepare --segments single) and pretrain on them with --objectives mlm --segments "
           "single" if one_each else "")
    raise ValueError(f"{label} has no training pairs: {why}; give documents of several "
                     f"sentences (a blank line separates documents in a .txt file, so check "
                     f"that one is not put after every sentence){fix} (nothing was written)")


def _check_not_inside_corpus(out: Path, corpus: object, flag: str) -> None:
    """Raise if `out` is, or lies inside, the corpus folder being read."""
    if not isinstance(corpus, (str, Path)) or corpus in CORPORA or not str(corpus).strip():
        return
    root = Path(corpus).resolve()
    target = out.resolve()
    if root.is_dir() and (target == root or target.is_relative_to(root)):
        raise ValueError(
            f"{flag} {out} is inside the corpus folder '{corpus}'; its docs.txt would be read as "
            f"text the next time the corpus is read: choose a folder outside the corpus "
            f"(nothing was written)"
        )


def _settings(stream: StreamOptions) -> dict[str, Any]:
    """Return the stream settings a meta.json records (a folder of pairs does not name its
    segments: those written before single segments existed do not either)."""
    settings = asdict(stream)
    if stream.segments != SINGLE:
        del settings["segments"]
    return settings


def _write_shards(
    docs: Iterator[Document], builders: dict[str | None, StreamingExampleBuilder], folder: Path,
    options: PrepareOptions, *, seed: int, vocab_size: int, counts: dict[str, int],
) -> dict[str, Any]:
    """Return the summary after writing each split's shards, docs.txt and (last) meta.json."""
    writers: dict[str | None, list[_ShardWriter]] = {}
    with contextlib.ExitStack() as stack:
        doc_files = {}
        for name in builders:
            split_folder = folder / name if name else folder
            split_folder.mkdir(exist_ok=True)
            writers[name] = [_ShardWriter(split_folder, options.shard_size, vocab_size,
                                          f"draw-{k}-" if k else "")
                             for k in range(options.draws(name))]
            # Streamed as documents come (ids are not held in memory); the file only becomes
            # visible when the finished folder is moved into place.
            doc_files[name] = stack.enter_context(
                open(split_folder / "docs.txt", "w", encoding="utf-8"))  # noqa: SIM115
        skipped = 0
        for doc in docs:
            name = doc.split if None not in builders else None
            if name not in builders:
                skipped += 1
                continue
            builder, split_writers = builders[name], writers[name]
            for ex in builder.add(doc):
                split_writers[ex.draw % len(split_writers)].add(ex)
            doc_files[name].writelines(i + "\n" for i in builder.take_doc_ids())
        summary: dict[str, Any] = {"documents_not_in_splits": skipped, "corpus_read": dict(counts),
                                   "splits": {}}
        for k, (name, builder) in enumerate(builders.items()):
            split_writers = writers[name]
            for ex in builder.finish():
                split_writers[ex.draw % len(split_writers)].add(ex)
            for writer in split_writers:
                writer.flush()
            doc_files[name].writelines(i + "\n" for i in builder.take_doc_ids())
            doc_files[name].close()
            meta = _split_meta(name, builder, split_writers, _settings(options.stream),
                               seed + 1_000_003 * k, vocab_size, counts)
            atomic_write_json(split_writers[0].folder / "meta.json", meta)
            summary["splits"][name or "all"] = meta
    return summary


def _split_meta(name: str | None, builder: StreamingExampleBuilder, writers: list[_ShardWriter],
                settings: dict[str, Any], seed: int, vocab_size: int,
                counts: dict[str, int]) -> dict[str, Any]:
    """Return the meta.json of one split: format, settings, counts and shards (per draw too)."""
    writer = writers[0]
    meta = {
        "format": SHARD_FORMAT, "split": name, "seed": seed,
        "vocab_size": vocab_size, "dtype": np.dtype(writer.dtype).name,
        "documents": builder.seen,
        "one_sentence_docs_skipped": (builder.builder.one_sentence_docs_skipped
                                      // builder.dupe_factor),
        **settings, **writer.counts, "shards": writer.shards,
        "corpus_read": dict(counts),
    }
    if len(writers) > 1:
        meta["pair_draws"] = len(writers)
        meta["draws"] = [{"draw": d, **w.counts, "shards": w.shards}
                         for d, w in enumerate(writers)]
    return meta


def prepare_command(
    corpus: str | Path,
    out: str | Path,
    tokenizer: str | Path | None = None,
    options: PrepareOptions | None = None,
    *,
    seed: int = 0,
    vocab_size: int = 8192,
) -> dict[str, Any]:
    """Return the `prepare_shards` summary after writing shards and `out/tokenizer.json` (for the CLI).

    `tokenizer`: a saved tokenizer (file or folder), or None to train a WordPiece vocabulary of
    `vocab_size` on the corpus first (see `bertlab.train_tokenizer` for what that reads; pass a
    trained tokenizer for corpora of many GB). The tokenizer used is saved next to the shards, so
    later steps (pretraining, export) find the vocabulary the ids refer to. `out` and the corpus
    path are checked before the tokenizer is trained, so a wrong `--out` fails at once.
    `options` and `seed` go to `prepare_shards`.
    """
    options = PrepareOptions() if options is None else options
    out = Path(out)
    check_output(out, "--out", folder=True, accept=())
    _check_not_inside_corpus(out, corpus, "--out")
    errors, read = options.errors, options.read or {}
    if tokenizer is None:
        try:
            tok = train_tokenizer(iter_documents(corpus, errors=errors, **read),
                                  vocab_size=vocab_size)
        except EmptyCorpus:
            raise BadInput(f"--corpus {corpus}", "holds no text (an empty file, or documents "
                           "without a sentence)", "pass a file or folder with text in it "
                           "(nothing was written)") from None
    else:
        iter_documents(corpus, errors=errors, **read)  # checks the corpus path before any work
        tok = load_tokenizer(tokenizer)
    return prepare_shards(corpus, tok, out, options, seed=seed)


def hash_listing(h: Any, folder: str | Path) -> None:
    """Feed a prepared split's meta.json and docs.txt (its document list) into the hash `h`.

    What tells two prepared corpora apart without reading every token: a resume's data digest
    (`PretrainingDataset.digest`) and a shipped model's corpus hash both use it.
    """
    for name in ("meta.json", "docs.txt"):
        if (Path(folder) / name).is_file():
            h.update((Path(folder) / name).read_bytes())


def shard_folder(path: str | Path, split: str | None) -> Path:
    """Return the folder holding the shards of `split` under `path` (see `prepare_shards`)."""
    path = Path(path)
    if split is not None and (path / split / "meta.json").is_file():
        return path / split
    if (path / "meta.json").is_file():
        held = json.loads((path / "meta.json").read_text(encoding="utf-8"))["split"]
        # A folder prepared with splits=None holds every document: fine for training, but it
        # has no held-out part to offer as validation.
        if split is None or held == split or (held is None and split == "train"):
            return path
        raise ValueError(
            f"shard folder '{path}' holds the {held or 'whole corpus (no split)'} part, "
            f"not {split!r}; pass the parent folder or the matching split"
        )
    raise ValueError(
        f"'{path}' has no shards for split {split!r} (no meta.json); write them with "
        f"bertlab.engine.shards.prepare_shards or `python -m bertlab prepare`"
    )


def shard_pair_length(path: str | Path, asked: int | None = None) -> int:
    """Return the pair length (`max_seq_len`) the training shards under `path` were prepared with.

    The pairs are cut when the shards are written, so a run on them trains on that length
    whatever it asks for; `asked` (a run's `--max-seq-len`) other than it is a ValueError that
    says how to get the length asked for.
    """
    folder = shard_folder(path, "train")
    held = json.loads((folder / "meta.json").read_text(encoding="utf-8"))["max_seq_len"]
    if asked is not None and asked != held:
        raise ValueError(f"--max-seq-len {asked}: the shards in '{path}' hold {held}-token pairs "
                         f"(cut when they were prepared); leave --max-seq-len out to train on "
                         f"them, or prepare again with --max-seq-len {asked}")
    return held


def pair_draws_in(folder: str | Path) -> int:
    """Return how many draws of pairs a shard folder holds (`prepare_shards(pair_draws=)`; 1 for
    folders written before draws existed)."""
    meta = json.loads((Path(folder) / "meta.json").read_text(encoding="utf-8"))
    return int(meta.get("pair_draws", 1))


def shard_segments(folder: str | Path) -> str:
    """Return what a shard folder holds: "pairs" ([CLS] A [SEP] B [SEP] with NSP labels) or
    "single" (single segments, `StreamOptions(segments="single")`)."""
    meta = json.loads((Path(folder) / "meta.json").read_text(encoding="utf-8"))
    return str(meta.get("segments", "pairs"))


class ShardExamples(Sequence):
    """Return `Example`s, read lazily from a shard folder written by `prepare_shards`: their
    ids (a numpy array), the length of A, the label (-100 for a single segment: no pair label),
    the document index and the draw.

    A sequence like the list `create_nsp_examples` returns (give it to `bertlab.data.PretrainingDataset`).
    Arrays are memory-mapped on first use in each process (DataLoader workers open their own),
    so it costs almost no memory however large the corpus. `meta` is the folder's meta.json.
    `draw`: which of the folder's `pair_draws` cuts of the corpus into pairs to read (see
    `prepare_shards`; `pair_draws_in(folder)` says how many it holds). As
    `bertlab.data.StoredExamples` they state `max_seq_len` (the length prepare cut them at),
    `pairs` ("nsp", or "single" for single segments), `lengths()` and `update_digest(h)`.
    """

    def __init__(self, folder: str | Path, draw: int = 0) -> None:
        self.folder = Path(folder)
        meta_path = self.folder / "meta.json"
        if not meta_path.is_file():
            raise ValueError(f"'{folder}' has no meta.json; it is not a shard folder from prepare_shards")
        self.meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if self.meta.get("format") != SHARD_FORMAT:
            raise ValueError(
                f"shard folder '{folder}' has format {self.meta.get('format')!r}; this bertlab "
                f"reads format {SHARD_FORMAT}: prepare the shards again"
            )
        held = self.meta.get("pair_draws", 1)
        if isinstance(draw, bool) or not isinstance(draw, int) or not 0 <= draw < held:
            raise ValueError(f"shard folder '{folder}' holds {held} pair draw(s); draw={draw!r} "
                             f"is not one of them: pass 0 to {held - 1}")
        self.draw = draw
        self.max_seq_len = int(self.meta["max_seq_len"])
        self.pairs = SINGLE if self.meta.get("segments") == SINGLE else "nsp"
        self.shards = self.meta["shards"] if draw == 0 else self.meta["draws"][draw]["shards"]
        self.starts = np.cumsum([0] + [s["examples"] for s in self.shards])
        self._arrays: list[dict[str, np.ndarray]] | None = None
        self._doc_ids: list[str] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_arrays"] = None  # memory maps are reopened in the worker, never pickled
        state["_doc_ids"] = None
        return state

    def _open(self) -> list[dict[str, np.ndarray]]:
        if self._arrays is None:
            self._arrays = [
                {key: np.load(self.folder / f"{s['name']}.{key}.npy", mmap_mode="r")
                 for key in ("tokens", "offsets", "a_len", "label", "doc_index")}
                for s in self.shards
            ]
        return self._arrays

    def __len__(self) -> int:
        return int(self.starts[-1])

    def lengths(self) -> np.ndarray:
        """Return every example's token count, from the offsets alone (no token is read)."""
        if not self.shards:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([np.diff(np.asarray(a["offsets"])) for a in self._open()])

    def update_digest(self, h: Any) -> None:
        """Feed the draw (past the first) and the folder's meta.json and docs.txt into the hash
        `h`: what tells these examples apart without reading every token."""
        if self.draw:
            h.update(f"draw {self.draw}".encode())
        hash_listing(h, self.folder)

    def _locate(self, index: int) -> tuple[dict[str, np.ndarray], int]:
        if not 0 <= index < len(self):
            raise IndexError(f"example {index} is out of range; the shards hold {len(self)}")
        shard = int(np.searchsorted(self.starts, index, side="right")) - 1
        return self._open()[shard], index - int(self.starts[shard])

    def __getitem__(self, index: int) -> Example:
        arrays, i = self._locate(index)
        return Example(arrays["tokens"][arrays["offsets"][i] : arrays["offsets"][i + 1]],
                       a_len=int(arrays["a_len"][i]),
                       next_sentence_label=int(arrays["label"][i]),
                       doc_index=int(arrays["doc_index"][i]), draw=self.draw)

    def doc_id(self, index: int) -> str:
        """Return the id of the document example `index` came from."""
        if self._doc_ids is None:
            self._doc_ids = (self.folder / "docs.txt").read_text(encoding="utf-8").splitlines()
        return self._doc_ids[self[index].doc_index]


def shard_examples(folder: str | Path, split: str | None,
                   options: LoaderOptions) -> ShardExamples | PairDraws:
    """Return the examples of `split` prepared under `folder` (its `split` sub-folder, or the
    folder itself): one draw's `ShardExamples`, or `PairDraws` of the first `options.pair_draws`
    draws it holds (None: all). Raise ValueError naming the fix when the folder holds other
    examples than `options.pairs` asks for, or fewer draws."""
    folder = _checked_shard_folder(folder, split, options.pairs)
    pair_draws, held = options.pair_draws, pair_draws_in(folder)
    if pair_draws is not None and pair_draws > held:
        raise ValueError(f"pretraining_loader: pair_draws={pair_draws}, but the shards in "
                         f"'{folder}' hold {held} draw(s) of pairs; prepare them again with "
                         f"--pair-draws {pair_draws}, or pass pair_draws <= {held}")
    count = held if pair_draws is None else pair_draws
    if count == 1:
        return ShardExamples(folder)
    return PairDraws([ShardExamples(folder, draw=k) for k in range(count)])


def _checked_shard_folder(source: str | Path, split: str | None, pairs: str) -> Path:
    """Return the folder of `split`'s shards under `source` after checking that they hold the
    examples `pairs` asks for (NSP pairs for "nsp", `prepare --segments single` for "single";
    no shards hold other pairs); raise ValueError naming the fix otherwise."""
    if pairs not in ("nsp", SINGLE):
        raise ValueError(f"pretraining_loader: {source} is a shard folder, and shards hold NSP "
                         f"pairs or single segments (what prepare builds); {pairs} pairs are "
                         f"built from documents: pass the corpus itself, not prepared shards")
    folder = shard_folder(source, split)
    held = shard_segments(folder)
    if held == SINGLE and pairs != SINGLE:
        raise ValueError(f"pretraining_loader: the shards in {folder} hold single segments "
                         f"(prepare --segments single), which have no {pairs} pairs; pass "
                         f"LoaderOptions(pairs='single') to train masked LM alone on them, or "
                         f"prepare the "
                         f"corpus again without --segments single for NSP pairs")
    if held != SINGLE and pairs == SINGLE:
        raise ValueError(f"pretraining_loader: the shards in {folder} hold NSP pairs; single "
                         f"segments are built from documents: pass the corpus itself, not "
                         f"prepared shards, or prepare them with --segments single")
    return folder


def shard_loader(
    folder: str | Path,
    tokenizer: Tokenizer | SpecialIds,
    *,
    split: str | None = "train",
    seed: int = 0,
    options: LoaderOptions | None = None,
) -> EpochLoader:
    """Return `bertlab.data.pretraining_loader`'s batches of the examples prepared in a shard folder.

    `folder`: what `prepare_shards` (the CLI's `prepare`) wrote; `split`'s sub-folder is read,
    or the folder itself (one split's folder, or one prepared with `splits=None`). The examples
    stay on disk (`shard_examples`), cut at the length they were prepared with. `options.pairs`
    must name what the folder holds: "nsp" for pairs, "single" for single segments (`prepare
    --segments single`); other pairs are built from documents. `options.pair_draws`: None
    reads every draw the folder holds (`prepare --pair-draws K`), a smaller K the first K.
    Every other setting, `seed` and `split` (which picks the default mask schedule) mean what
    they mean for `pretraining_loader`.
    """
    options = checked_loader_options(options, split)
    examples = shard_examples(folder, split, options)
    return pretraining_loader(examples, tokenizer, split=split, seed=seed, options=options)
