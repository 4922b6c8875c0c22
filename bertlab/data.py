"""Pretraining batches: NSP datasets, a padding + masking collate, loaders and on-disk shards.

A batch is a dict with exactly the names the model takes: `input_ids`, `token_type_ids`,
`attention_mask`, `labels` (-100 = not predicted) and `next_sentence_label`.

Masks are made in the collate, per row, from a seed that depends only on (seed, epoch, example
index) (`bertlab.masking.example_seed`). So an example gets the same mask whatever batch, worker
or process it lands in, a new one every epoch (dynamic masking, RoBERTa), or one of
`dupe_factor` fixed ones (static masking, as Google's data generator writes them to disk).

Taught in notebooks/03_nsp_data.ipynb.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shutil
import tempfile
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from bertlab.corpus import CORPORA, SPLITS, Document, iter_corpus, split_documents
from bertlab.masking import IGNORE_INDEX, example_seed, mask_tokens
from bertlab.nsp import (
    NOT_NEXT,
    NspExample,
    PairBuilder,
    check_nsp_settings,
    create_nsp_examples,
)
from bertlab.tokenizer import SpecialIds, encode_sentences, special_ids
from bertlab.util import atomic_write_json, atomic_write_text, check_output_folder

BATCH_KEYS = ("input_ids", "token_type_ids", "attention_mask", "labels", "next_sentence_label")
MASKINGS = ("dynamic", "static")
SHARD_FORMAT = 1


# --------------------------------------------------------------------------------------------
# Datasets


class _EpochMasked:
    """The epoch bookkeeping shared by the datasets: which row seed each example gets."""

    def _init_masking(self, seed: int, masking: str, dupe_factor: int) -> None:
        if masking not in MASKINGS:
            raise ValueError(f"masking={masking!r} is not known; use 'dynamic' or 'static'")
        if not isinstance(dupe_factor, int) or dupe_factor < 1:
            raise ValueError(f"dupe_factor={dupe_factor!r}; pass a whole number >= 1")
        if masking == "dynamic" and dupe_factor != 1:
            raise ValueError(
                f"dupe_factor={dupe_factor} only applies to masking='static' (the number of fixed "
                f"masks cycled over epochs); dynamic masking draws a new mask every epoch"
            )
        self.seed, self.masking, self.dupe_factor = seed, masking, dupe_factor
        self.epoch = 0
        self._explicit_epoch = False
        self._passes = 0

    def set_epoch(self, epoch: int) -> None:
        """Use `epoch` for the masks of the next pass (dynamic: a new mask per epoch)."""
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"set_epoch: epoch={epoch!r}; pass a whole number >= 0")
        self.epoch = epoch
        self._explicit_epoch = True

    def _begin_pass(self) -> None:
        # Without an explicit set_epoch, each new pass over a loader moves to the next epoch.
        if self._passes > 0 and not self._explicit_epoch:
            self.epoch += 1
        self._explicit_epoch = False
        self._passes += 1

    def row_seed(self, index: int) -> int:
        """Return the masking seed of example `index` in the current epoch."""
        copy = self.epoch if self.masking == "dynamic" else self.epoch % self.dupe_factor
        return int(example_seed(self.seed, copy, index))


def _item(index: int, row_seed: int, input_ids: np.ndarray, a_len: int, label: int) -> dict[str, Any]:
    token_type_ids = np.ones(len(input_ids), dtype=np.int64)
    token_type_ids[: a_len + 2] = 0  # [CLS] A [SEP] -> 0, B [SEP] -> 1
    return {
        "input_ids": input_ids,
        "token_type_ids": token_type_ids,
        "next_sentence_label": label,
        "index": index,
        "row_seed": row_seed,
    }


class NspDataset(Dataset, _EpochMasked):
    """Return dicts (input_ids, token_type_ids, next_sentence_label, index, row_seed) per NSP example.

    `masking="dynamic"`: the row seed changes with the epoch (`set_epoch`); `"static"`: epoch e
    uses mask copy e % `dupe_factor` (1 = one fixed mask per example forever).

    Taught in notebooks/03_nsp_data.ipynb.
    """

    def __init__(
        self, examples: Sequence[NspExample], *, seed: int = 0, masking: str = "dynamic",
        dupe_factor: int = 1,
    ) -> None:
        self.examples = list(examples)
        self._init_masking(seed, masking, dupe_factor)

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> dict[str, Any]:
        ex = self.examples[index]
        ids = np.asarray(ex.input_ids, dtype=np.int64)
        return _item(index, self.row_seed(index), ids, ex.a_len, ex.next_sentence_label)


# --------------------------------------------------------------------------------------------
# Collate


class PretrainingCollator:
    """Pads a list of dataset items and masks them; returns the model's batch dict.

    Pads to the longest row (or up to a multiple of `pad_to_multiple_of`, which tensor cores
    like), builds `attention_mask` (1 = real token), masks with `bertlab.mask_tokens` using each
    row's seed, and returns exactly `input_ids, token_type_ids, attention_mask, labels,
    next_sentence_label` (LongTensors; labels -100 where nothing is predicted, padding included).
    `whole_word=True` gives `mask_tokens` word ids from the WordPiece "##" marks. Picklable, so
    DataLoader workers can use it.

    Taught in notebooks/03_nsp_data.ipynb.
    """

    def __init__(
        self,
        tokenizer: Tokenizer | SpecialIds,
        *,
        mlm_probability: float = 0.15,
        mask_replace_prob: float = 0.8,
        random_replace_prob: float = 0.1,
        selection: str = "bernoulli",
        max_predictions: int | None = None,
        whole_word: bool = False,
        per_word_decision: bool = True,
        pad_to_multiple_of: int | None = None,
    ) -> None:
        if pad_to_multiple_of is not None and (
            not isinstance(pad_to_multiple_of, int) or pad_to_multiple_of < 1
        ):
            raise ValueError(f"pad_to_multiple_of={pad_to_multiple_of!r}; pass a positive int or None")
        self.special = special_ids(tokenizer)
        self.mask_options = {
            "mlm_probability": mlm_probability, "mask_replace_prob": mask_replace_prob,
            "random_replace_prob": random_replace_prob, "selection": selection,
            "max_predictions": max_predictions, "per_word_decision": per_word_decision,
        }
        self.pad_to_multiple_of = pad_to_multiple_of
        self.continues_word: np.ndarray | None = None
        if whole_word:
            if not isinstance(tokenizer, Tokenizer):
                raise ValueError(
                    "whole_word=True needs the tokenizers.Tokenizer (to read the '##' pieces), "
                    "not SpecialIds"
                )
            self.continues_word = np.zeros(self.special.vocab_size, dtype=bool)
            for token, token_id in tokenizer.get_vocab().items():
                if token.startswith("##"):
                    self.continues_word[token_id] = True
        # Check the options once, here, rather than on the first batch inside a worker.
        mask_tokens(torch.tensor([self.special.cls, self.special.sep]), self.special,
                    row_seeds=torch.zeros(1, dtype=torch.int64), **self.mask_options)

    def _word_ids(self, ids: np.ndarray, is_word: np.ndarray) -> torch.Tensor:
        """Word index per token, -1 on specials and padding; "##" pieces join the word before."""
        continues = self.continues_word[ids]
        continues[:, 1:] &= is_word[:, :-1]  # a piece right after [SEP] or [CLS] starts a word
        starts = is_word & ~continues
        starts[:, 0] |= is_word[:, 0]
        word = np.cumsum(starts, axis=1) - 1  # (B, T)
        return torch.from_numpy(np.where(is_word, word, -1))

    def __call__(self, items: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if not items:
            raise ValueError("PretrainingCollator got an empty batch")
        length = max(len(item["input_ids"]) for item in items)
        if self.pad_to_multiple_of:
            length = -(-length // self.pad_to_multiple_of) * self.pad_to_multiple_of
        ids = np.full((len(items), length), self.special.pad, dtype=np.int64)  # (B, T)
        types = np.zeros((len(items), length), dtype=np.int64)
        attention = np.zeros((len(items), length), dtype=np.int64)
        for row, item in enumerate(items):
            n = len(item["input_ids"])
            ids[row, :n] = item["input_ids"]
            types[row, :n] = item["token_type_ids"]
            attention[row, :n] = 1
        word_ids = None
        if self.continues_word is not None:
            is_word = (attention == 1) & ~np.isin(ids, self.special.all)
            word_ids = self._word_ids(ids, is_word)
        input_ids = torch.from_numpy(ids)
        attention_mask = torch.from_numpy(attention)
        row_seeds = torch.tensor([item["row_seed"] for item in items], dtype=torch.int64)
        masked, labels = mask_tokens(
            input_ids, self.special, attention_mask=attention_mask, row_seeds=row_seeds,
            word_ids=word_ids, **self.mask_options,
        )
        labels = labels.masked_fill(attention_mask == 0, IGNORE_INDEX)
        return {
            "input_ids": masked,
            "token_type_ids": torch.from_numpy(types),
            "attention_mask": attention_mask,
            "labels": labels,
            "next_sentence_label": torch.tensor(
                [item["next_sentence_label"] for item in items], dtype=torch.int64
            ),
        }


# --------------------------------------------------------------------------------------------
# Loaders


class EpochShuffleSampler(Sampler[int]):
    """Yields 0..n-1 in an order fixed by (seed, epoch): reproducible, reshuffled each epoch."""

    def __init__(self, n: int, seed: int = 0) -> None:
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(int(example_seed(self.seed, self.epoch, 0)))
        return iter(torch.randperm(self.n, generator=g).tolist())


class ShardedEpochSampler(DistributedSampler):
    """This process's share of `EpochShuffleSampler`'s order, for DDP (what
    `sampler="distributed"` builds).

    Rank r takes positions r, r + world, r + 2 world, ... of the single-process order, so with a
    per-rank batch of b the ranks' k-th batches together are exactly the single-process k-th
    batch of b x world: one process and N processes see the same global batches. As in
    `DistributedSampler`, the order is padded by wrapping around (or cut, with `drop_last`) so
    every rank gets the same number of examples.
    """

    def __iter__(self) -> Iterator[int]:
        n = len(self.dataset)
        order = list(range(n))
        if self.shuffle:
            single = EpochShuffleSampler(n, self.seed)
            single.set_epoch(self.epoch)
            order = list(single)
        if self.drop_last:
            order = order[: self.total_size]
        else:
            order += (order * math.ceil(self.total_size / n))[: self.total_size - n]
        return iter(order[self.rank : self.total_size : self.num_replicas])


class PretrainingLoader(DataLoader):
    """A DataLoader whose passes move the epoch on: new masks (dynamic) and a new order each pass.

    Each `for batch in loader` uses the next epoch (0, 1, 2, ...). Call `loader.set_epoch(e)`
    before a pass to choose the epoch yourself (resuming, DDP): it sets the dataset and the
    sampler, when the sampler has `set_epoch`.

    Taught in notebooks/03_nsp_data.ipynb.
    """

    def set_epoch(self, epoch: int) -> None:
        """Use `epoch` for the next pass (masks and, where the sampler supports it, order)."""
        self.dataset.set_epoch(epoch)
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        """Return the epoch of the current (or last started) pass."""
        return self.dataset.epoch

    def __iter__(self):
        self.dataset._begin_pass()
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(self.dataset.epoch)
        return super().__iter__()


def pretraining_loader(
    docs_or_examples: Sequence[Document] | Sequence[NspExample] | str | Path,
    tokenizer: Tokenizer | SpecialIds,
    *,
    split: str | None = "train",
    batch_size: int = 32,
    max_seq_len: int = 128,
    seed: int = 0,
    shuffle: bool = True,
    masking: str | None = None,
    dupe_factor: int = 1,
    mlm_probability: float = 0.15,
    pad_to_multiple_of: int | None = None,
    num_workers: int = 0,
    sampler: Sampler | Callable[[Dataset], Sampler] | str | None = None,
    drop_last: bool = False,
    short_seq_prob: float = 0.1,
    balance: str = "exact",
    **mask_options: Any,
) -> PretrainingLoader:
    """Return a DataLoader of pretraining batches (dicts of the five model inputs) for one split.

    `docs_or_examples`: Documents (those whose `split` matches are turned into NSP examples
    with `seed`; `split=None` takes all), NSP examples (used as given; pass `split=None`), or a
    shard folder from `prepare_shards` (its `split` sub-folder, or the folder itself).

    `masking`: "dynamic" (a new mask each epoch) or "static" (epoch e uses mask copy
    e % `dupe_factor`); None picks dynamic for the train split and static otherwise, so a
    validation loss is always measured on the same masks. `mask_options` go to
    `PretrainingCollator` (mask_replace_prob, random_replace_prob, selection, max_predictions,
    whole_word, per_word_decision).

    Order: `shuffle` uses a (seed, epoch) permutation; `sampler` replaces it: a Sampler, a
    function dataset -> Sampler, or "distributed" under torchrun for a `ShardedEpochSampler`
    (this rank's share of the same order, so N processes see one process's global batches).
    Each pass over the loader moves to the next epoch; `loader.set_epoch(e)` chooses it (do
    that when resuming).

    Taught in notebooks/03_nsp_data.ipynb.
    """
    if split is not None and split not in SPLITS:
        raise ValueError(f"split={split!r} is not known; use one of {SPLITS} or None")
    if masking is None:
        masking = "dynamic" if split in ("train", None) else "static"
    if isinstance(docs_or_examples, (str, Path)):
        dataset: NspDataset | ShardDataset = ShardDataset(
            shard_folder(docs_or_examples, split), seed=seed, masking=masking,
            dupe_factor=dupe_factor,
        )
    else:
        items = list(docs_or_examples)
        if items and isinstance(items[0], NspExample):
            if split is not None:
                raise ValueError(
                    f"pretraining_loader got NSP examples and split={split!r}; examples are "
                    f"already built from a chosen set of documents, so pass split=None"
                )
            examples = items
        elif items and isinstance(items[0], Document):
            chosen = items if split is None else split_documents(items)[split]
            if not chosen:
                raise ValueError(
                    f"the corpus has no {split!r} documents ({len(items)} documents in all); "
                    f"pass split=None to use them all"
                )
            if not isinstance(tokenizer, Tokenizer):
                raise ValueError("pretraining_loader needs a tokenizers.Tokenizer to tokenize Documents")
            examples = create_nsp_examples(
                chosen, tokenizer, max_seq_len=max_seq_len, short_seq_prob=short_seq_prob,
                seed=seed, balance=balance,
            )
        else:
            kind = type(items[0]).__name__ if items else "nothing"
            raise ValueError(
                f"pretraining_loader takes Documents, NspExamples or a shard folder; got {kind}"
            )
        dataset = NspDataset(examples, seed=seed, masking=masking, dupe_factor=dupe_factor)
    if len(dataset) == 0:
        raise ValueError("pretraining_loader: no examples to load; check the corpus and split")

    collate = PretrainingCollator(
        tokenizer, mlm_probability=mlm_probability, pad_to_multiple_of=pad_to_multiple_of,
        **mask_options,
    )
    if sampler == "distributed":
        sampler = ShardedEpochSampler(dataset, shuffle=shuffle, seed=seed, drop_last=drop_last)
    elif isinstance(sampler, str):
        raise ValueError(f"sampler={sampler!r}; pass a Sampler, a function, 'distributed' or None")
    elif callable(sampler) and not isinstance(sampler, Sampler):
        sampler = sampler(dataset)
    elif sampler is None:
        sampler = EpochShuffleSampler(len(dataset), seed) if shuffle else None
    return PretrainingLoader(
        dataset, batch_size=batch_size, sampler=sampler, collate_fn=collate,
        num_workers=num_workers, drop_last=drop_last,
    )


# --------------------------------------------------------------------------------------------
# Streaming: documents -> NSP examples with a bounded pool of negatives


def iter_documents(
    source: str | Path | Iterable[Document], *, counts: dict[str, int] | None = None
) -> Iterator[Document]:
    """Return an iterator over Documents, one at a time, without reading the corpus into memory.

    `source`: an iterable of Documents, or anything `bertlab.iter_corpus` reads (a named corpus,
    a folder of `.txt` files streamed file by file, a BERT-format file streamed in blocks); a
    path is checked now, and `counts` collects what reading it cut (see `iter_corpus`).
    """
    if isinstance(source, (str, Path)):
        return iter_corpus(source, counts=counts)
    return iter(source)


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


class StreamingNspBuilder:
    """Turns a stream of documents into NSP examples, holding only a bounded window in memory.

    Documents are tokenized a batch at a time: `batch_docs` documents, or fewer once they hold
    `batch_chars` characters of sentences. The tokenizer's memory grows with the characters of a
    batch; 256 news articles or web pages hold well under the default 4 million, so the
    character limit only cuts batches of long documents (books, up to
    `bertlab.corpus.MAX_DOC_CHARS` each), keeping one batch's tokenization to a few hundred MB.
    NotNext B comes from the other documents of the current batch or from a reservoir of at
    most `reservoir_docs` earlier documents (kept by reservoir sampling, so it is a uniform
    sample of everything seen so far; a reservoir entry keeps at most `16 * max_seq_len` tokens
    of its document, a random window of whole sentences). B never comes from A's own document.
    Memory: one batch plus the reservoir (and the ids of documents not yet taken with
    `take_doc_ids`).
    """

    def __init__(
        self, tokenizer: Tokenizer, *, max_seq_len: int = 128, short_seq_prob: float = 0.1,
        seed: int = 0, balance: str = "exact", dupe_factor: int = 1, include_title: bool = False,
        batch_docs: int = 256, reservoir_docs: int = 1000, batch_chars: int = 4_000_000,
        name: str = "corpus",
    ) -> None:
        check_nsp_settings(max_seq_len, short_seq_prob, balance, dupe_factor)
        if batch_docs < 2 or reservoir_docs < 1 or batch_chars < 1:
            raise ValueError(
                f"batch_docs={batch_docs}, reservoir_docs={reservoir_docs}, "
                f"batch_chars={batch_chars}; pass batch_docs >= 2, reservoir_docs >= 1 and "
                f"batch_chars >= 1"
            )
        self.tokenizer, self.include_title, self.name = tokenizer, include_title, name
        self.batch_docs, self.reservoir_docs, self.dupe_factor = batch_docs, reservoir_docs, dupe_factor
        self.batch_chars = batch_chars
        self.window_tokens = 16 * max_seq_len
        self.rng = random.Random(seed)
        self.builder = PairBuilder(special_ids(tokenizer), max_seq_len=max_seq_len,
                                   short_seq_prob=short_seq_prob, balance=balance, rng=self.rng)
        self.reservoir: list[tuple[int, _PackedDoc]] = []
        self.seen = 0  # documents with text so far; also the next document index
        self.doc_ids: list[str] = []  # ids of the documents indexed since the last take_doc_ids
        self.pending: list[Document] = []
        self.pending_chars = 0

    def add(self, doc: Document) -> Iterator[NspExample]:
        """Queue a document; yield the examples of a batch when one is full."""
        self.pending.append(doc)
        self.pending_chars += sum(len(s) for s in doc.sentences)
        if self.include_title and doc.title:
            self.pending_chars += len(doc.title)
        if len(self.pending) >= self.batch_docs or self.pending_chars >= self.batch_chars:
            yield from self._flush()

    def take_doc_ids(self) -> list[str]:
        """Return the ids of the documents indexed since the last call, in index order, and forget them.

        Document index i of the examples is the i-th id over all calls (what docs.txt lists).
        """
        ids, self.doc_ids = self.doc_ids, []
        return ids

    def finish(self) -> Iterator[NspExample]:
        """Yield the examples of the last, partial batch; raise if the stream had < 2 documents."""
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

    def _flush(self, final: bool = False) -> Iterator[NspExample]:
        docs, self.pending, self.pending_chars = self.pending, [], 0
        texts, counts = [], []
        for doc in docs:
            sents = ([doc.title] if self.include_title and doc.title else []) + list(doc.sentences)
            texts.extend(sents)
            counts.append(len(sents))
        ids = encode_sentences(self.tokenizer, texts) if texts else []
        batch: list[tuple[int, str, list[list[int]]]] = []
        pos = 0
        for doc, n in zip(docs, counts, strict=True):
            sents = [s for s in ids[pos : pos + n] if s]
            pos += n
            if sents:
                batch.append((self.seen, doc.id, sents))
                self.doc_ids.append(doc.id)
                self.seen += 1
        if final and self.seen < 2:
            what = "no document with text" if self.seen == 0 else "1 document"
            raise ValueError(
                f"{self.name} has {what}; NSP needs at least 2 (negatives come from other documents)"
            )
        pool = self.reservoir + [(d, sents) for d, _, sents in batch]
        slot = {d: i for i, (d, _) in enumerate(pool)}

        def pick_other(rng: random.Random, doc_index: int) -> tuple[int, Any]:
            k = rng.randint(0, len(pool) - 2)  # uniform over the pool minus A's own document
            if k >= slot[doc_index]:
                k += 1
            return pool[k]

        for _ in range(self.dupe_factor):
            for d, doc_id, sents in batch:
                yield from self.builder.document(d, doc_id, sents, pick_other)
        for d, _, sents in batch:  # reservoir sampling (Algorithm R) over all documents so far
            if len(self.reservoir) < self.reservoir_docs:
                self.reservoir.append((d, _PackedDoc(self._window(sents))))
            else:
                j = self.rng.randint(0, d)
                if j < self.reservoir_docs:
                    self.reservoir[j] = (d, _PackedDoc(self._window(sents)))


def stream_nsp_examples(
    source: str | Path | Iterable[Document], tokenizer: Tokenizer, **options: Any
) -> Iterator[NspExample]:
    """Yield NSP examples from a stream of documents (`StreamingNspBuilder` options), memory bounded.

    Taught in notebooks/03_nsp_data.ipynb.
    """
    builder = StreamingNspBuilder(tokenizer, **options)
    for doc in iter_documents(source):
        yield from builder.add(doc)
    yield from builder.finish()


# --------------------------------------------------------------------------------------------
# Shards on disk


class _ShardWriter:
    """Collects examples of one split and writes them as .npy shards of `shard_size` examples."""

    def __init__(self, folder: Path, shard_size: int, vocab_size: int) -> None:
        self.folder, self.shard_size = folder, shard_size
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

    def add(self, ex: NspExample) -> None:
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
        name = f"shard-{len(self.shards):05d}"
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


def prepare_shards(
    corpus: str | Path | Iterable[Document],
    tokenizer: Tokenizer | str | Path,
    out_dir: str | Path,
    *,
    max_seq_len: int = 128,
    seed: int = 0,
    shard_size: int = 100_000,
    splits: Sequence[str] | None = ("train", "validation"),
    short_seq_prob: float = 0.1,
    balance: str = "exact",
    dupe_factor: int = 1,
    include_title: bool = False,
    batch_docs: int = 256,
    reservoir_docs: int = 1000,
    batch_chars: int = 4_000_000,
) -> dict[str, Any]:
    """Return a summary after writing NSP examples of a corpus to memory-mappable shards in `out_dir`.

    Streams documents (`iter_documents`: a BERT-format .txt file, a folder of .txt files, a
    corpus name or an iterable of Documents), tokenizes them in batches and writes, per split, a
    sub-folder `out_dir/<split>/` with `meta.json`, `docs.txt` (document ids, one per line, in
    index order) and per shard `shard-NNNNN.{tokens,offsets,a_len,label,doc_index}.npy`: the
    examples' [CLS] A [SEP] B [SEP] ids back to back, where each starts (n + 1 offsets), the
    length of A, the NSP label and the document index. `splits=None` writes every document to
    `out_dir` itself. `out_dir/tokenizer.json` is the tokenizer the ids refer to. Each split has
    its own negatives pool (`StreamingNspBuilder`), so validation text never appears in training
    examples. Memory stays bounded by one batch of documents (`batch_docs`, `batch_chars`), the
    reservoir and one shard; long lines and huge documents are cut as the corpus is read
    (`bertlab.load_corpus`), and the summary and each meta.json count them under "corpus_read"
    (long_lines_split, documents_split, folders_skipped). `tokenizer` may be a path to a saved
    tokenizer.

    Everything is checked before anything is written: the settings, the corpus path, and
    `out_dir`, which must be new or empty (a run, a Hugging Face export, earlier shards or other
    files are refused) and must not lie inside the corpus folder (its docs.txt would be read as
    text next time). The shards are written into a hidden sibling folder and moved to `out_dir`
    only when complete, so a failure midway leaves `out_dir` as it was.

    Taught in notebooks/03_nsp_data.ipynb.
    """
    if isinstance(tokenizer, (str, Path)):
        from bertlab.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(tokenizer)
    if not isinstance(shard_size, int) or shard_size < 1:
        raise ValueError(f"shard_size={shard_size!r}; pass the number of examples per shard (>= 1)")
    if splits is not None:
        unknown = sorted(set(splits) - set(SPLITS))
        if unknown or not splits:
            raise ValueError(f"splits={tuple(splits)!r}; choose from {SPLITS}, or pass None for all")
    out = Path(out_dir)
    check_output_folder(out, "out_dir")
    _check_not_inside_corpus(out, corpus, "out_dir")
    counts: dict[str, int] = {}
    docs = iter_documents(corpus, counts=counts)
    names = list(splits) if splits is not None else [None]
    settings = dict(max_seq_len=max_seq_len, short_seq_prob=short_seq_prob, balance=balance,
                    dupe_factor=dupe_factor, include_title=include_title, batch_docs=batch_docs,
                    reservoir_docs=reservoir_docs, batch_chars=batch_chars)
    label = f"corpus '{corpus}'" if isinstance(corpus, (str, Path)) else "the corpus"
    builders = {
        name: StreamingNspBuilder(tokenizer, seed=seed + 1_000_003 * k,
                                  name=f"{label} ({name or 'all'} split)", **settings)
        for k, name in enumerate(names)
    }
    target = out.resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        summary = _write_shards(docs, builders, staging, shard_size=shard_size, seed=seed,
                                vocab_size=tokenizer.get_vocab_size(), settings=settings,
                                counts=counts)
        atomic_write_text(staging / "tokenizer.json", tokenizer.to_str())
        _publish(staging, out, "out_dir")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    summary["out_dir"] = str(out)
    summary["tokenizer"] = str(out / "tokenizer.json")
    return summary


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


def _write_shards(
    docs: Iterator[Document], builders: dict[str | None, StreamingNspBuilder], folder: Path, *,
    shard_size: int, seed: int, vocab_size: int, settings: dict[str, Any],
    counts: dict[str, int],
) -> dict[str, Any]:
    """Return the summary after writing each split's shards, docs.txt and (last) meta.json."""
    writers: dict[str | None, _ShardWriter] = {}
    with contextlib.ExitStack() as stack:
        doc_files = {}
        for name in builders:
            split_folder = folder / name if name else folder
            split_folder.mkdir(exist_ok=True)
            writers[name] = _ShardWriter(split_folder, shard_size, vocab_size)
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
            builder = builders[name]
            for ex in builder.add(doc):
                writers[name].add(ex)
            doc_files[name].writelines(i + "\n" for i in builder.take_doc_ids())
        summary: dict[str, Any] = {"documents_not_in_splits": skipped, "corpus_read": dict(counts),
                                   "splits": {}}
        for k, (name, builder) in enumerate(builders.items()):
            writer = writers[name]
            for ex in builder.finish():
                writer.add(ex)
            writer.flush()
            doc_files[name].writelines(i + "\n" for i in builder.take_doc_ids())
            doc_files[name].close()
            meta = {
                "format": SHARD_FORMAT, "split": name, "seed": seed + 1_000_003 * k,
                "vocab_size": vocab_size, "dtype": np.dtype(writer.dtype).name,
                "documents": builder.seen,
                "one_sentence_docs_skipped": builder.builder.one_sentence_docs_skipped,
                **settings, **writer.counts, "shards": writer.shards,
                "corpus_read": dict(counts),
            }
            atomic_write_json(writer.folder / "meta.json", meta)
            summary["splits"][name or "all"] = meta
    return summary


def _publish(staging: Path, out: Path, flag: str) -> None:
    """Move the finished shard folder `staging` to `out` (missing or empty), meta.json last."""
    check_output_folder(out, flag)  # nothing may have appeared there while the shards were written
    if not out.exists():
        os.replace(staging, out)
        return
    # An existing empty folder (made by hand, or holding a lock) stays: the content moves in,
    # meta.json and train/ last, so the folder never looks like complete shards too early.
    for entry in sorted(staging.iterdir(), key=lambda e: (e.name in ("meta.json", "train"), e.name)):
        os.replace(entry, out / entry.name)
    staging.rmdir()


def prepare_command(
    corpus: str | Path,
    out: str | Path,
    tokenizer: str | Path | None = None,
    *,
    max_seq_len: int = 128,
    seed: int = 0,
    vocab_size: int = 8192,
    **options: Any,
) -> dict[str, Any]:
    """Return the `prepare_shards` summary after writing shards and `out/tokenizer.json` (for the CLI).

    `tokenizer`: a saved tokenizer (file or folder), or None to train a WordPiece vocabulary of
    `vocab_size` on the corpus first (see `bertlab.train_tokenizer` for what that reads; pass a
    trained tokenizer for corpora of many GB). The tokenizer used is saved next to the shards, so
    later steps (pretraining, export) find the vocabulary the ids refer to. `out` and the corpus
    path are checked before the tokenizer is trained, so a wrong `--out` fails at once.
    `options` go to `prepare_shards` (shard_size, splits, short_seq_prob, balance, ...).

    Taught in notebooks/03_nsp_data.ipynb.
    """
    from bertlab.tokenizer import load_tokenizer, train_tokenizer

    out = Path(out)
    check_output_folder(out, "--out")
    _check_not_inside_corpus(out, corpus, "--out")
    if tokenizer is None:
        tok = train_tokenizer(iter_documents(corpus), vocab_size=vocab_size)
    else:
        iter_documents(corpus)  # checks the corpus path before any work
        tok = load_tokenizer(tokenizer)
    return prepare_shards(corpus, tok, out, max_seq_len=max_seq_len, seed=seed, **options)


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
        f"bertlab.data.prepare_shards or `python -m bertlab prepare`"
    )


class ShardDataset(Dataset, _EpochMasked):
    """Return the same items as `NspDataset`, read lazily from shards written by `prepare_shards`.

    Arrays are memory-mapped on first use in each process (DataLoader workers open their own),
    so the dataset costs almost no memory however large the corpus.

    Taught in notebooks/03_nsp_data.ipynb.
    """

    def __init__(self, folder: str | Path, *, seed: int = 0, masking: str = "dynamic",
                 dupe_factor: int = 1) -> None:
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
        self.starts = np.cumsum([0] + [s["examples"] for s in self.meta["shards"]])
        self._arrays: list[dict[str, np.ndarray]] | None = None
        self._doc_ids: list[str] | None = None
        self._init_masking(seed, masking, dupe_factor)

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
                for s in self.meta["shards"]
            ]
        return self._arrays

    def __len__(self) -> int:
        return int(self.starts[-1])

    def _locate(self, index: int) -> tuple[dict[str, np.ndarray], int]:
        if not 0 <= index < len(self):
            raise IndexError(f"example {index} is out of range; the shards hold {len(self)}")
        shard = int(np.searchsorted(self.starts, index, side="right")) - 1
        return self._open()[shard], index - int(self.starts[shard])

    def __getitem__(self, index: int) -> dict[str, Any]:
        arrays, i = self._locate(index)
        ids = np.asarray(arrays["tokens"][arrays["offsets"][i] : arrays["offsets"][i + 1]], dtype=np.int64)
        return _item(index, self.row_seed(index), ids, int(arrays["a_len"][i]), int(arrays["label"][i]))

    def doc_id(self, index: int) -> str:
        """Return the id of the document example `index` came from."""
        if self._doc_ids is None:
            self._doc_ids = (self.folder / "docs.txt").read_text(encoding="utf-8").splitlines()
        arrays, i = self._locate(index)
        return self._doc_ids[int(arrays["doc_index"][i])]
