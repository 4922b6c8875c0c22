"""NSP examples from a stream of documents, with memory bounded however large the corpus.

`iter_documents` reads a corpus one document at a time; `StreamingExampleBuilder` tokenizes them a
batch at a time and builds NSP pairs (`bertlab.pairs.PairBuilder`, the same recipe as
`create_nsp_examples`), drawing NotNext B from the current batch or from a reservoir sample of
earlier documents, or (`segments="single"`) single segments, [CLS] text [SEP], exactly those
`create_single_examples` builds in memory. `bertlab.engine.shards.prepare_shards` writes what it
yields to disk.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from bertlab.corpus import Document
from bertlab.pairs import (
    INPUTS,
    SINGLE,
    Example,
    PairBuilder,
    check_enough_documents,
    check_nsp_settings,
    check_single_settings,
    document_singles,
    other_doc_picker,
    single_pass_rng,
    tokenize_corpus,
)
from bertlab.readers import iter_corpus
from bertlab.tokenizer import special_ids


def iter_documents(
    source: str | Path | Iterable[Any], *, counts: dict[str, int] | None = None,
    errors: str = "strict", **fields: Any,
) -> Iterator[Document]:
    """Return an iterator over Documents, one at a time, without reading the corpus into memory.

    `source`: an iterable of Documents, or anything `bertlab.readers.iter_corpus` reads
    (a named corpus, a folder of `.txt` files streamed file by file, a BERT-format file streamed
    in blocks, rows streamed a row at a time); a path is checked now, `counts` collects what
    reading it cut and skipped, `errors` says what to do with bytes that are not UTF-8, and
    `fields` (text_field, doc_field, label_field, on_bad_row) say how rows are read (see
    `iter_corpus`).
    """
    return iter_corpus(source, counts=counts, errors=errors, **fields)


class _PackedDoc:
    """A document's sentences stored compactly (one int32 array + offsets), list-like for PairBuilder."""

    __slots__ = ("tokens", "offsets")

    def __init__(self, sentences: list[list[int]]) -> None:
        self.offsets = np.cumsum([0] + [len(s) for s in sentences], dtype=np.int64)
        self.tokens = np.fromiter((t for s in sentences for t in s), dtype=np.int32,
                                  count=int(self.offsets[-1]))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> list[int]:
        return self.tokens[self.offsets[i] : self.offsets[i + 1]].tolist()


@dataclass(frozen=True)
class StreamOptions:
    """How `StreamingExampleBuilder` turns a stream of documents into examples, checked when built.

    The example settings are `create_nsp_examples`' (`create_single_examples`' with
    `segments="single"`), plus `include_title` (`tokenize_corpus`); `batch_docs`,
    `reservoir_docs` and `batch_chars` bound the memory (see `StreamingExampleBuilder`).
    """

    max_seq_len: int = 128
    short_seq_prob: float = 0.1
    balance: str = "exact"
    dupe_factor: int = 1
    include_title: bool = False
    batch_docs: int = 256
    reservoir_docs: int = 1000
    batch_chars: int = 4_000_000
    segments: str = "pairs"

    def __post_init__(self) -> None:
        if self.segments not in INPUTS:
            raise ValueError(f"segments={self.segments!r} is not known; choose from "
                             f"{', '.join(INPUTS)} (the CLI's prepare --segments)")
        check = check_single_settings if self.segments == SINGLE else check_nsp_settings
        check(self.max_seq_len, self.short_seq_prob, self.balance, self.dupe_factor)
        if self.batch_docs < 2 or self.reservoir_docs < 1 or self.batch_chars < 1:
            raise ValueError(
                f"batch_docs={self.batch_docs}, reservoir_docs={self.reservoir_docs}, "
                f"batch_chars={self.batch_chars}; pass batch_docs >= 2, reservoir_docs >= 1 "
                f"and batch_chars >= 1"
            )


class StreamingExampleBuilder:
    """Turns a stream of documents into NSP examples, holding only a bounded window in memory.

    Documents are tokenized a batch at a time: `batch_docs` documents, or fewer once they hold
    `batch_chars` characters of sentences. The tokenizer's memory grows with the characters of a
    batch; 256 news articles or web pages hold well under the default 4 million, so the
    character limit only cuts batches of long documents (books, up to
    `bertlab.textfiles.MAX_DOC_CHARS` each), keeping one batch's tokenization to a few
    hundred MB.
    NotNext B comes from the other documents of the current batch or from a reservoir of at
    most `reservoir_docs` earlier documents (kept by reservoir sampling, so it is a uniform
    sample of everything seen so far; a reservoir entry keeps at most `16 * max_seq_len` tokens
    of its document, a random window of whole sentences). B never comes from A's own document.
    Memory: one batch plus the reservoir (and the ids of documents not yet taken with
    `take_doc_ids`).

    `segments="single"` yields single segments instead (`bertlab.pairs`: a document's sentences
    packed into [CLS] text [SEP], no pair label), the examples `create_single_examples` gives for
    the same documents and seed: they need no other document, so there is no reservoir, and
    one document with text is enough. `options` (`StreamOptions`) holds every setting but the
    `seed`; `name` names the stream in errors.
    """

    def __init__(self, tokenizer: Tokenizer, options: StreamOptions | None = None, *,
                 seed: int = 0, name: str = "corpus") -> None:
        options = StreamOptions() if options is None else options
        if not isinstance(options, StreamOptions):
            raise ValueError(f"options={options!r}; pass a bertlab.engine.streaming.StreamOptions, e.g. "
                             f"StreamOptions(max_seq_len=128)")
        self.tokenizer, self.options, self.name = tokenizer, options, name
        self.dupe_factor = options.dupe_factor
        self.special = special_ids(tokenizer)
        # Single segments: one random source per pass, as create_single_examples has.
        self.single_rngs = [single_pass_rng(seed, k) for k in range(options.dupe_factor)]
        self.window_tokens = 16 * options.max_seq_len
        self.rng = random.Random(seed)
        self.builder = PairBuilder(self.special, max_seq_len=options.max_seq_len,
                                   short_seq_prob=options.short_seq_prob,
                                   balance=options.balance, rng=self.rng)
        self.reservoir: list[tuple[int, _PackedDoc]] = []
        self.seen = 0  # documents with text so far; also the next document index
        self.doc_ids: list[str] = []  # ids of the documents indexed since the last take_doc_ids
        self.pending: list[Document] = []
        self.pending_chars = 0

    def add(self, doc: Document) -> Iterator[Example]:
        """Queue a document; yield the examples of a batch when one is full."""
        self.pending.append(doc)
        self.pending_chars += sum(len(s) for s in doc.sentences)
        if self.options.include_title and doc.title:
            self.pending_chars += len(doc.title)
        if (len(self.pending) >= self.options.batch_docs
                or self.pending_chars >= self.options.batch_chars):
            yield from self._flush()

    def take_doc_ids(self) -> list[str]:
        """Return the ids of the documents indexed since the last call, in index order, and forget them.

        Document index i of the examples is the i-th id over all calls (what docs.txt lists).
        """
        ids, self.doc_ids = self.doc_ids, []
        return ids

    def finish(self) -> Iterator[Example]:
        """Yield the examples of the last, partial batch; raise if the stream had < 2 documents
        (pairs) or none (single segments)."""
        yield from self._flush(final=True)

    def _window(self, sents: list[list[int]]) -> list[list[int]]:
        total = sum(len(s) for s in sents)
        if total <= self.window_tokens:
            return sents
        first = self.rng.randint(0, len(sents) - 1)
        end, size = first, 0
        while end < len(sents) and (size == 0 or size + len(sents[end]) <= self.window_tokens):
            size += len(sents[end])
            end += 1
        return sents[first:end]

    def _tokenized_batch(self) -> list[tuple[int, str, list[list[int]]]]:
        """Return the pending documents tokenized, as (index, id, sentence ids) for each one
        with text (indexed here, in order), and forget them."""
        docs, self.pending, self.pending_chars = self.pending, [], 0
        corpus = tokenize_corpus(docs, self.tokenizer, include_title=self.options.include_title)
        batch: list[tuple[int, str, list[list[int]]]] = []
        for doc_id, sents in zip(corpus.doc_ids, corpus.sentences, strict=True):
            if sents:
                batch.append((self.seen, doc_id, sents))
                self.doc_ids.append(doc_id)
                self.seen += 1
        return batch

    def _flush(self, final: bool = False) -> Iterator[Example]:
        batch = self._tokenized_batch()
        single = self.options.segments == SINGLE
        if final:
            check_enough_documents(self.seen, self.name, negatives=not single)
        if single:
            for draw, rng in enumerate(self.single_rngs):
                for d, doc_id, sents in batch:
                    yield from document_singles(self.special, d, doc_id, sents, rng=rng,
                                                max_seq_len=self.options.max_seq_len,
                                                short_seq_prob=self.options.short_seq_prob,
                                                draw=draw)
            return
        # NotNext B: from the reservoir of earlier documents or the rest of this batch.
        pick_other = other_doc_picker(self.reservoir + [(d, sents) for d, _, sents in batch])
        for draw in range(self.dupe_factor):
            for d, doc_id, sents in batch:
                yield from self.builder.document(d, doc_id, sents, pick_other, draw)
        for d, _, sents in batch:  # reservoir sampling (Algorithm R) over all documents so far
            if len(self.reservoir) < self.options.reservoir_docs:
                self.reservoir.append((d, _PackedDoc(self._window(sents))))
            else:
                j = self.rng.randint(0, d)
                if j < self.options.reservoir_docs:
                    self.reservoir[j] = (d, _PackedDoc(self._window(sents)))


def __getattr__(name: str):
    """The old name of `StreamingExampleBuilder` (it builds single segments too), for one
    release, with a DeprecationWarning that names the new one."""
    if name == "StreamingNspBuilder":
        import warnings
        warnings.warn("bertlab.engine.streaming.StreamingNspBuilder is now StreamingExampleBuilder "
                      "(it builds NSP, SOP and single-segment examples); the old name goes in the "
                      "next release", DeprecationWarning, stacklevel=2)
        return StreamingExampleBuilder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
