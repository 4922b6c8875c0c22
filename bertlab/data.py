"""Pretraining batches: the NSP dataset, the padding + masking collate, samplers and loaders.

A batch is a dict with exactly the names the model takes: `input_ids`, `token_type_ids`,
`attention_mask`, `labels` (-100 = not predicted) and `next_sentence_label`.

Masks are made in the collate, per row, from a seed that depends only on (seed, epoch, example
index) (`bertlab.masking.example_seed`). So an example gets the same mask whatever batch, worker
or process it lands in, a new one every epoch (dynamic masking, RoBERTa), or one of
`mask_copies` fixed ones (static masking: Google's data generator writes `dupe_factor` copies to disk).
The pairs themselves can be drawn afresh too: with `pair_draws=K` the corpus is cut into pairs
K times and epoch e trains on draw e % K (`PairDraws`), so a small corpus repeated many times
does not show a model the same A with the same B (and the same NSP label) every epoch.
Whole-word masking takes the words from the WordPiece "##" marks, or from word ids that come
with the examples (Chinese, where words come from a segmentation: `bertlab.zh`).

Taught in notebooks/03_nsp_data.ipynb.
"""

from __future__ import annotations

import hashlib
import math
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
import torch.distributed as dist
from tokenizers import Tokenizer
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from bertlab.config import TrainConfig, rank_world
from bertlab.corpus import SPLITS, Document, split_documents
from bertlab.errors import BadInput, check_type
from bertlab.masking import (
    BERT_MASKING,
    MaskingConfig,
    continuing_prefix,
    example_seed,
    mask_tokens,
    wordpiece_word_ids,
)
from bertlab.pairs import (
    Example,
    pair_builder,
    pair_draw_seed,
    tokenize_corpus,
)
from bertlab.tokenizer import SpecialIds, special_ids, vocab_digest

# A batch: the model's inputs by name, each a (B, T) tensor, the pair labels (B,).
Batch = dict[str, torch.Tensor]
BATCH_KEYS = ("input_ids", "token_type_ids", "attention_mask", "labels", "next_sentence_label")
MASK_SCHEDULES = ("dynamic", "static")


def _check_epoch(epoch: object) -> None:
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"set_epoch: epoch={epoch!r}; pass a whole number >= 0")


# --------------------------------------------------------------------------------------------
# Dataset


@runtime_checkable
class StoredExamples(Protocol):
    """Examples that stay on disk: a sequence of `Example`s read when asked for, which
    `PretrainingDataset` keeps as they are instead of listing them in memory.

    Beyond `len` and indexing they state what a loader and a resume need without reading every
    token: each example's length, the length they were cut at (`max_seq_len`), what they hold
    (`pairs`: "nsp" for sentence pairs with NSP labels, "single" for single segments) and what
    tells them apart from other examples (`update_digest`). A prepared shard folder's are
    `bertlab.engine.shards.ShardExamples`; `bertlab.engine.shards.shard_loader` gives their batches.
    """

    max_seq_len: int
    pairs: str

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Example: ...

    def lengths(self) -> np.ndarray:
        """Return every example's token count (int64), without reading their tokens."""
        ...

    def update_digest(self, h: Any) -> None:
        """Feed what identifies these examples into the hashlib object `h`, in place of their
        tokens (`PretrainingDataset.digest`, which a resume compares)."""
        ...


def check_pair_draws(pair_draws: object, dupe_factor: int = 1) -> None:
    """Raise ValueError (naming the fix) unless `pair_draws` is a whole number >= 1 that does not
    come with a dupe factor."""
    if isinstance(pair_draws, bool) or not isinstance(pair_draws, int) or pair_draws < 1:
        raise ValueError(f"pair_draws={pair_draws!r}; pass a whole number >= 1 (how many times "
                         f"the corpus is cut into pairs; epoch e trains on draw e % pair_draws)")
    if pair_draws > 1 and dupe_factor != 1:
        raise ValueError(f"pair_draws={pair_draws} with dupe_factor={dupe_factor}: both repeat the "
                         f"corpus with fresh pairs (dupe_factor mixes the passes into one epoch, "
                         f"pair_draws gives each epoch its own); choose one")


class PairDraws:
    """K cuts of one corpus into pair examples (each a list, or `StoredExamples` of one draw):
    the same documents with other A/B splits and other NotNext partners. `PretrainingDataset` trains
    epoch e on draw e % K."""

    def __init__(self, draws: Sequence[Sequence[Example] | StoredExamples]) -> None:
        self.draws = [d if isinstance(d, StoredExamples) else list(d) for d in draws]
        if not self.draws or not all(len(d) for d in self.draws):
            sizes = [len(d) for d in self.draws]
            raise ValueError(f"PairDraws: every draw needs examples; got draws of sizes {sizes}")

    def __len__(self) -> int:
        return len(self.draws)


# The most memory that draws of pairs built from Documents may take (they are all built before
# the first step): beyond it they belong in shards on disk (`prepare --pair-draws K`).
MAX_DRAWS_BYTES = 2 << 30
_EXAMPLE_BYTES = 120  # an Example beside its token list: the object and its small fields


def check_draws_fit(first: Sequence[Example], pair_draws: int) -> None:
    """Raise ValueError when `pair_draws` draws of the size of `first` (draw 0) would take more
    than `MAX_DRAWS_BYTES` of memory, naming the estimate, the most that fit and the fix."""
    per_draw = sum(sys.getsizeof(e.input_ids) + _EXAMPLE_BYTES for e in first)
    if per_draw * pair_draws <= MAX_DRAWS_BYTES:
        return
    fit = max(1, MAX_DRAWS_BYTES // max(per_draw, 1))
    raise ValueError(f"pair_draws={pair_draws} would build {pair_draws} draws of "
                     f"{len(first)} pairs in memory before the first step, about "
                     f"{per_draw * pair_draws / 2**30:,.1f} GiB ({per_draw / 2**20:.1f} MiB "
                     f"each); pass pair_draws <= {fit} (up to {MAX_DRAWS_BYTES / 2**30:g} GiB), "
                     f"or write the draws to disk with prepare --pair-draws K and train on "
                     f"those shards")


class PretrainingDataset(Dataset):
    """Return dicts (input_ids, token_type_ids, next_sentence_label, index, row_seed) per example.

    `examples`: `Example`s in memory (`create_nsp_examples`, or the sop / single builders) or
    on disk (`StoredExamples`, such as a prepared shard folder's); both give the same items.
    `PairDraws` gives several cuts of the corpus into pairs: epoch e reads draw e % K, so `len`
    is the current draw's.
    `word_ids` (one list per example, from `bertlab.zh.nsp_word_ids`; None at special tokens)
    adds "word_ids" (an int64 array, -1 at specials) to each item, for whole-word masking by
    those words.

    `mask_schedule="dynamic"`: the row seed changes with the epoch (`set_epoch`); `"static"`:
    epoch e uses mask copy e % `mask_copies` (1 = one fixed mask per example forever).
    """

    def __init__(
        self, examples: Sequence[Example] | StoredExamples | PairDraws, *,
        word_ids: Sequence[Sequence[int | None]] | None = None, seed: int = 0,
        mask_schedule: str = "dynamic", mask_copies: int = 1,
    ) -> None:
        # Stored examples stay on disk; anything else is held as a list.
        self.draws = (examples.draws if isinstance(examples, PairDraws) else
                      [examples if isinstance(examples, StoredExamples) else list(examples)])
        self.examples = self.draws[0]
        self._lengths: dict[int, np.ndarray] = {}
        if word_ids is not None and len(self.draws) > 1:
            raise ValueError("PretrainingDataset: word_ids belong to one set of examples; pass one draw "
                             "of pairs with them, not PairDraws")
        if mask_schedule not in MASK_SCHEDULES:
            raise ValueError(f"mask_schedule={mask_schedule!r} is not known; use 'dynamic' or "
                             f"'static'")
        if not isinstance(mask_copies, int) or mask_copies < 1:
            raise ValueError(f"mask_copies={mask_copies!r}; pass a whole number >= 1")
        if mask_schedule == "dynamic" and mask_copies != 1:
            raise ValueError(
                f"mask_copies={mask_copies} only applies to mask_schedule='static' (the number "
                f"of fixed masks cycled over epochs); dynamic masking draws a new mask every epoch"
            )
        self.seed, self.mask_schedule, self.mask_copies = seed, mask_schedule, mask_copies
        self.epoch = 0
        self.word_ids = None if word_ids is None else self._word_id_arrays(word_ids)

    def _word_id_arrays(self, word_ids: Sequence[Sequence[int | None]]) -> list[np.ndarray]:
        if len(word_ids) != len(self.examples):
            raise ValueError(f"PretrainingDataset: {len(self.examples)} examples but {len(word_ids)} "
                             f"word-id lists; pass one list per example")
        arrays = []
        for index, ids in enumerate(word_ids):
            length = len(self.examples[index].input_ids)
            if len(ids) != length:
                raise ValueError(f"PretrainingDataset: example {index} has {length} tokens but {len(ids)} "
                                 f"word ids; build them with nsp_word_ids(example, corpus)")
            arrays.append(np.array([-1 if w is None else w for w in ids], dtype=np.int64))
        return arrays

    def set_epoch(self, epoch: int) -> None:
        """Use `epoch` for the masks (dynamic: a new mask per epoch) and the pairs (draw
        epoch % K) from now on."""
        _check_epoch(epoch)
        self.epoch = epoch
        self.examples = self.draws[epoch % len(self.draws)]

    @property
    def pair_draws(self) -> int:
        """Return how many cuts of the corpus into pairs the epochs cycle through."""
        return len(self.draws)

    def lengths(self) -> np.ndarray:
        """Return the token count of every example of the current draw (stored examples say it
        without reading their tokens); computed once per draw."""
        draw = self.epoch % len(self.draws)
        if draw not in self._lengths:
            examples = self.draws[draw]
            self._lengths[draw] = (examples.lengths() if isinstance(examples, StoredExamples) else
                                   np.array([len(e.input_ids) for e in examples], dtype=np.int64))
        return self._lengths[draw]

    def __len__(self) -> int:
        return len(self.examples)

    def digest(self) -> str:
        """Return a short SHA-256 of the examples (their ids, segments and labels), not of the masks.

        What a resume compares: two corpora that give as many examples still differ here. Stored
        examples add their own identity (`StoredExamples.update_digest`; a shard folder's
        meta.json and document list) instead of every token.
        """
        h = hashlib.sha256()
        for draw in self.draws:
            if isinstance(draw, StoredExamples):
                draw.update_digest(h)
                continue
            for ex in draw:
                h.update(np.asarray(ex.input_ids, dtype=np.int64).tobytes())
                h.update(bytes((ex.a_len % 256, ex.next_sentence_label % 256)))
        return h.hexdigest()[:16]

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """Return the items of `indices`: what a DataLoader asks for, a batch at a time.

        An item's `row_seed` is its masking seed in the current epoch: dynamic masking seeds by
        the epoch, static by the mask copy (`bertlab.masking.example_seed`, the whole batch in
        one call). Its `token_type_ids` are 0 up to A's [SEP] and 1 after
        (what `bertlab.pairs.segment_ids` gives).
        """
        copy = self.epoch if self.mask_schedule == "dynamic" else self.epoch % self.mask_copies
        seeds = example_seed(self.seed, copy, np.asarray(indices, dtype=np.int64)).tolist()
        items = []
        for index, seed in zip(indices, seeds, strict=True):
            ex = self.examples[index]
            input_ids = np.asarray(ex.input_ids, dtype=np.int64)
            positions = np.arange(len(input_ids))
            items.append({"input_ids": input_ids,
                          "token_type_ids": (positions >= ex.a_len + 2).astype(np.int64),
                          "next_sentence_label": ex.next_sentence_label,
                          "index": index, "row_seed": seed})
            if self.word_ids is not None:
                items[-1]["word_ids"] = self.word_ids[index]
        return items


# --------------------------------------------------------------------------------------------
# Collate


class PretrainingCollator:
    """Pads a list of dataset items and masks them; returns the model's batch dict.

    Pads to the longest row (or up to a multiple of `pad_to_multiple_of`, which tensor cores
    like), builds `attention_mask` (1 = real token), masks with `bertlab.mask_tokens` using each
    row's seed, and returns exactly `input_ids, token_type_ids, attention_mask, labels,
    next_sentence_label` (LongTensors; labels -100 where nothing is predicted, padding included).

    `masking` holds every masking setting (`bertlab.masking.MaskingConfig`; BERT's by default),
    checked when it was built, not on the first batch inside a worker. `whole_word=True` masks
    whole words: the items' "word_ids" when they carry them (see
    `PretrainingDataset`), else words read from the WordPiece "##" marks. `False` masks token by token
    from the same row seeds, so two loaders that differ only in this flag see the same examples
    in the same order. `return_word_ids=True` adds those word ids as "word_ids" (B, T), -1 on
    specials and padding (for `bertlab.zh.whole_word_scores`; the model does not take it, so
    leave it off for training). Picklable, so DataLoader workers can use it.

    Rows of a `datasets.Dataset` (what `transformers.Trainer` hands its `data_collator`) work
    too: an item needs only `input_ids`; `token_type_ids` (zeros when absent),
    `next_sentence_label` (returned only when the items carry it, so `BertForMaskedLM` takes the
    batch) and `word_ids` (-1 or None at specials) are optional. An item without the
    `row_seed` that `PretrainingDataset` gives needs an `index` (its row number): its mask then comes
    from (`seed`, epoch, index), as in `PretrainingDataset`, whatever batch or worker it lands in;
    `set_epoch` moves the epoch on (`bertlab.hf.mask_epoch_callback` does it per
    Trainer epoch).

    Taught in notebooks/08_chinese_bert.ipynb.
    """

    def __init__(
        self,
        tokenizer: Tokenizer | SpecialIds,
        masking: MaskingConfig = BERT_MASKING,
        *,
        whole_word: bool = False,
        pad_to_multiple_of: int | None = None,
        return_word_ids: bool = False,
        seed: int = 0,
    ) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed={seed!r}; pass a whole number (the masks of rows without a "
                             f"'row_seed' come from seed, epoch and the row's 'index')")
        self.seed, self.epoch = seed, 0
        if pad_to_multiple_of is not None and (
            not isinstance(pad_to_multiple_of, int) or pad_to_multiple_of < 1
        ):
            raise ValueError(f"pad_to_multiple_of={pad_to_multiple_of!r}; pass a positive int or None")
        self.special = special_ids(tokenizer)
        # The vocabulary itself, which a run folder keeps (None: the collator was given ids only).
        self.tokenizer = tokenizer if isinstance(tokenizer, Tokenizer) else None
        # Which vocabulary the ids come from: a run records it, and a resume checks it.
        self.tokenizer_digest = (vocab_digest(tokenizer)[:16] if isinstance(tokenizer, Tokenizer)
                                 else None)
        if not isinstance(masking, MaskingConfig):
            raise ValueError(f"masking={masking!r}; pass a bertlab.masking.MaskingConfig, e.g. "
                             f"MaskingConfig(mlm_probability=0.4)")
        self.masking = masking
        self.pad_to_multiple_of = pad_to_multiple_of
        self.whole_word, self.return_word_ids = whole_word, return_word_ids
        self.vocab: np.ndarray | None = None  # token strings by id, for the "##" words
        self.prefix = "##"  # the mark of a piece that continues a word
        if whole_word or return_word_ids:
            if not isinstance(tokenizer, Tokenizer):
                option = "whole_word" if whole_word else "return_word_ids"
                raise ValueError(
                    f"{option}=True needs the tokenizers.Tokenizer (to read the '##' pieces), "
                    f"not SpecialIds"
                )
            tokens = [""] * self.special.vocab_size
            for token, token_id in tokenizer.get_vocab().items():
                tokens[token_id] = token
            self.vocab = np.array(tokens)
            self.prefix = continuing_prefix(tokenizer)  # the tokenizer's own, "@@" in some

    def set_epoch(self, epoch: int) -> None:
        """Mask rows that carry an `index` (not a `row_seed`) with `epoch`'s masks from now on."""
        _check_epoch(epoch)
        self.epoch = epoch

    def _row_seed(self, item: dict[str, Any]) -> int:
        """Return the masking seed of an item without a `row_seed`: from (seed, epoch, index)."""
        if "index" not in item:
            raise ValueError(
                "PretrainingCollator: an item has neither 'row_seed' nor 'index', so its mask "
                "cannot be the same in every worker and batch; give each row its number, e.g. "
                "dataset.add_column('index', range(len(dataset))), and keep that column in "
                "transformers.Trainer with TrainingArguments(remove_unused_columns=False)")
        return int(example_seed(self.seed, self.epoch, int(item["index"])))

    def _word_ids(self, items: Sequence[dict[str, Any]], ids: np.ndarray) -> torch.Tensor:
        """Word index per token (B, T), -1 on specials and padding: the items' own, or from "##"."""
        if all("word_ids" in item for item in items):
            words = np.full(ids.shape, -1, dtype=np.int64)
            for row, item in enumerate(items):
                given = item["word_ids"]
                if not isinstance(given, np.ndarray):  # a datasets row: None at the specials
                    given = [-1 if w is None else w for w in given]
                words[row, : len(given)] = given
            return torch.from_numpy(words)
        if any("word_ids" in item for item in items):
            raise ValueError("PretrainingCollator: some items carry 'word_ids' and some do not; "
                             "give word ids for every example or for none")
        # padding is [PAD]: -1
        return torch.from_numpy(wordpiece_word_ids(self.vocab[ids], self.prefix))

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
            types[row, :n] = item.get("token_type_ids", 0)
            attention[row, :n] = 1
        word_ids = self._word_ids(items, ids) if self.vocab is not None else None
        attention_mask = torch.from_numpy(attention)
        # Each row's masking seed: its own (`PretrainingDataset` gives one), else its index's.
        row_seeds = torch.tensor([item["row_seed"] if "row_seed" in item else self._row_seed(item)
                                  for item in items], dtype=torch.int64)
        # Padding is never selected (attention_mask), so its labels are -100 too.
        masked, labels = mask_tokens(
            torch.from_numpy(ids), self.special, self.masking, attention_mask=attention_mask,
            row_seeds=row_seeds, word_ids=word_ids if self.whole_word else None,
        )
        batch = {
            "input_ids": masked,
            "token_type_ids": torch.from_numpy(types),
            "attention_mask": attention_mask,
            "labels": labels,
        }
        labelled = sum("next_sentence_label" in item for item in items)
        if 0 < labelled < len(items):
            raise ValueError(f"PretrainingCollator: {labelled} of {len(items)} items carry a "
                             f"'next_sentence_label'; give one to every pair or to none")
        if labelled:
            batch["next_sentence_label"] = torch.tensor(
                [item["next_sentence_label"] for item in items], dtype=torch.int64)
        if self.return_word_ids:
            batch["word_ids"] = word_ids
        return batch


# --------------------------------------------------------------------------------------------
# Samplers and loaders


class EpochShuffleSampler(Sampler[int]):
    """Yields 0..n-1 in an order fixed by (seed, epoch): reproducible, reshuffled each epoch.

    `n` is a count, or a dataset whose length is read at each pass (an `PretrainingDataset` of
    `PairDraws` has as many examples as the current epoch's draw).
    """

    def __init__(self, n: int | Sized, seed: int = 0) -> None:
        self.size, self.seed, self.epoch = n, seed, 0

    @property
    def n(self) -> int:
        return self.size if isinstance(self.size, int) else len(self.size)

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
    every rank gets the same number of examples. The dataset's length is read again at each
    epoch (an `PretrainingDataset` of `PairDraws` changes it with the draw).
    """

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        n, world = len(self.dataset), self.num_replicas  # DistributedSampler's own arithmetic
        self.num_samples = (math.ceil((n - world) / world) if self.drop_last and n % world
                            else math.ceil(n / world))
        self.total_size = self.num_samples * world

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


class LengthGroupedBatchSampler(Sampler[list[int]]):
    """Yields batches of pairs of similar length, in an order fixed by (seed, epoch).

    Each epoch takes `EpochShuffleSampler`'s order, cuts it into groups of `group_batches`
    global batches, sorts each group by length (longest first), cuts it into batches and
    shuffles the batches. A batch then pads only to its own longest pair, and most batches of
    full-length pairs have no padding at all, so attention runs with no mask, the form in which
    its flash kernel may run. Sorting within groups, not over the whole epoch, keeps each batch
    a random draw of the corpus rather than one slice of the length range.

    `world` > 1 (DDP): global batches of `batch_size * world`, of which rank `rank` takes
    positions rank, rank + world, ...; so N processes see one process's global batches. The
    epoch's order is filled up to a multiple of `world` from its start, as `DistributedSampler`
    does, so every rank gets as many examples. `dataset` is an `PretrainingDataset` (the current
    draw's lengths are read at each epoch).
    """

    def __init__(self, dataset: PretrainingDataset, batch_size: int, *, seed: int = 0,
                 group_batches: int = 8, world: int = 1, rank: int = 0) -> None:
        if isinstance(group_batches, bool) or not isinstance(group_batches, int) or (
                group_batches < 1):
            raise ValueError(f"group_by_length={group_batches!r}; pass how many batches are "
                             f"sorted by length together (8 is a good start), or None")
        self.dataset, self.batch_size, self.seed = dataset, batch_size, seed
        self.group_batches, self.world, self.rank, self.epoch = group_batches, world, rank, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def global_batches(self) -> list[list[int]]:
        """Return this epoch's global batches (example indices), in the order they are used."""
        single = EpochShuffleSampler(len(self.dataset), self.seed)
        single.set_epoch(self.epoch)
        order = list(single)
        order += order[: -len(order) % self.world]  # up to a multiple of the ranks
        lengths = self.dataset.lengths()
        size = self.batch_size * self.world
        group = size * self.group_batches
        batches = []
        for start in range(0, len(order), group):
            chunk = sorted(order[start:start + group], key=lambda i: -lengths[i])  # stable
            batches += [chunk[b:b + size] for b in range(0, len(chunk), size)]
        g = torch.Generator().manual_seed(int(example_seed(self.seed, self.epoch, 1)))
        return [batches[i] for i in torch.randperm(len(batches), generator=g).tolist()]

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.global_batches():
            yield batch[self.rank::self.world]

    def __len__(self) -> int:
        n = len(self.dataset) + (-len(self.dataset) % self.world)
        size = self.batch_size * self.world
        groups, rest = divmod(n, size * self.group_batches)
        return groups * self.group_batches + math.ceil(rest / size)


class EpochLoader(DataLoader):
    """A DataLoader whose passes move the epoch on: each `for batch in loader` is the next epoch.

    Takes what a DataLoader takes, plus `seed`: the data seed its order (and masks) come from,
    which a training run records so a resume can check it (None: the dataset's `seed`, if any),
    and `pairs`: how its examples were built ("nsp", "sop" or "single"; None when not known),
    so that `bertlab.pretraining.pretrain` can refuse a pair objective on other pairs, and
    `max_seq_len`: the length its examples were cut at (a run's run.json records it).
    `run_data()` gives what a pretraining run needs from it (`RunData`).
    Before each pass the epoch (0, 1, 2, ...) goes to the dataset and the sampler (and a batch
    sampler), each that has `set_epoch`: `PretrainingDataset` draws new masks (dynamic masking),
    `EpochShuffleSampler` a new order. `loader.set_epoch(e)` chooses the next pass's epoch
    (resuming, DDP).
    """

    def __init__(self, dataset: Dataset, *args: Any, seed: int | None = None,
                 pairs: str | None = None, max_seq_len: int | None = None,
                 **kwargs: Any) -> None:
        super().__init__(dataset, *args, **kwargs)
        self._data_seed = seed
        self.pairs, self.max_seq_len = pairs, max_seq_len
        self._epoch = 0
        self._epoch_chosen = False  # set_epoch was called since the last pass began
        self._passes = 0

    @property
    def seed(self) -> int | None:
        """Return the data seed (the one given, else the dataset's `seed`, else None)."""
        return self._data_seed if self._data_seed is not None else getattr(self.dataset, "seed", None)

    @property
    def epoch(self) -> int:
        """Return the epoch of the current (or last started) pass."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Use `epoch` for the next pass (masks and order, where the dataset and sampler use it)."""
        _check_epoch(epoch)
        self._epoch = epoch
        self._epoch_chosen = True

    def run_data(self) -> RunData | None:
        """Return what a pretraining run needs from this loader (`RunData`), or None when its
        batches are not `PretrainingCollator`'s (fine-tuning, a collator of your own)."""
        collate = self.collate_fn
        if not isinstance(collate, PretrainingCollator):
            return None
        grouped = self.batch_sampler if isinstance(self.batch_sampler,
                                                   LengthGroupedBatchSampler) else None
        return RunData(special=collate.special, masking=collate.masking,
                       tokenizer=collate.tokenizer, tokenizer_digest=collate.tokenizer_digest,
                       pairs=self.pairs, seed=self.seed, max_seq_len=self.max_seq_len,
                       dataset=self.dataset if isinstance(self.dataset, PretrainingDataset) else None,
                       group_by_length=0 if grouped is None else grouped.group_batches)

    def __iter__(self) -> Iterator[Any]:
        if self._passes > 0 and not self._epoch_chosen:
            self._epoch += 1
        self._epoch_chosen = False
        self._passes += 1
        for part in (self.dataset, self.sampler, self.batch_sampler):
            if hasattr(part, "set_epoch"):
                part.set_epoch(self._epoch)
        return super().__iter__()


@dataclass(frozen=True)
class RunData:
    """What a pretraining run needs from its training data, said in one place.

    A bertlab loader gives it (`EpochLoader.run_data`), and `bertlab.pretraining.pretrain` hands
    it to the loop, which checks, records and resumes with it. A loader that cannot say (any
    other iterable of batches) has none: such a run checks and records less.
    """

    special: SpecialIds              # [MASK] for the metrics by kind, and the vocabulary's size
    masking: MaskingConfig           # the training masking: sizes a compiled model's MLM rows
    tokenizer: Tokenizer | None      # the run folder keeps it (None: the collator got ids only)
    tokenizer_digest: str | None     # which vocabulary the ids come from (a resume compares it)
    pairs: str | None                # "nsp", "sop" or "single" (None: ready-made examples)
    seed: int | None                 # the data seed: the order and the masks come from it
    max_seq_len: int | None          # the examples' length, as the loader was asked for
    dataset: PretrainingDataset | None       # its size, pair draws and digest: what a resume must see
    group_by_length: int = 0         # batches sorted by length together (0: off)


def run_data_of(loader: object) -> RunData | None:
    """Return what `loader` states of its data (`EpochLoader.run_data`, or a wrapper's that passes
    it on); None for any other iterable of batches."""
    states = getattr(loader, "run_data", None)
    return states() if callable(states) else None


def check_loader_batch(loader: Iterable, config: TrainConfig, world: int | None = None) -> None:
    """Refuse a loader whose batches do not add up to `config.batch_size` per optimizer step
    over `world` processes (None: those of this run's process group)."""
    world = rank_world()[1] if world is None else world
    per_batch = getattr(loader, "batch_size", None)
    if per_batch is None:  # a loader built on a batch sampler (batches grouped by length)
        per_batch = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
    if per_batch is not None and per_batch * config.grad_accum * world != config.batch_size:
        raise ValueError(
            f"the loader gives batches of {per_batch}, but TrainConfig.batch_size="
            f"{config.batch_size} with grad_accum={config.grad_accum} on {world} "
            f"process(es) needs {config.batch_size / (config.grad_accum * world):g} per batch; "
            f"pass a batch_size that is a multiple of {config.grad_accum * world} (grad_accum x "
            f"processes), and build the loader with batch_size=batch_size // (grad_accum x "
            f"processes)")


@dataclass(frozen=True)
class LoaderOptions:
    """Every setting of `pretraining_loader` but the data, the split and the seed, with its
    default. `bertlab.recipes.Recipe.loader_options()` gives a recipe's; change a few with
    `dataclasses.replace(options, batch_size=8)`.

    The examples built from Documents: `max_seq_len`, `pairs` ("nsp", "sop" or "single",
    `bertlab.pairs`), `short_seq_prob`, `balance` (as `create_nsp_examples`) and
    `pair_draws` (K cuts of the corpus into pairs, epoch e trains on draw e % K; None: one, or
    every draw a shard folder holds). The masks: `masking` (a `MaskingConfig`, BERT's by
    default), `mask_schedule` ("dynamic": a new mask each epoch; "static": epoch e uses mask
    copy e % `mask_copies`; None: dynamic for the train split, static otherwise, so a
    validation loss is always measured on the same masks), `whole_word` and `return_word_ids`
    (`PretrainingCollator`). The batches: `batch_size`, `shuffle` (a (seed, epoch)
    permutation), `sampler` (a Sampler, a function dataset -> Sampler, or "distributed" under
    torchrun for a `ShardedEpochSampler`), `group_by_length` (G: batches of pairs of similar
    length, sorting G batches at a time, `LengthGroupedBatchSampler`), `drop_last`,
    `pad_to_multiple_of`, `num_workers`, `pin_memory` (on a GPU: the copy to the device
    overlaps compute).
    """

    batch_size: int = 32
    max_seq_len: int = 128
    pairs: str = "nsp"
    short_seq_prob: float = 0.1
    balance: str = "exact"
    pair_draws: int | None = None
    masking: MaskingConfig = BERT_MASKING
    mask_schedule: str | None = None
    mask_copies: int = 1
    whole_word: bool = False
    return_word_ids: bool = False
    shuffle: bool = True
    sampler: Sampler | Callable[[Dataset], Sampler] | str | None = None
    group_by_length: int | None = None
    drop_last: bool = False
    pad_to_multiple_of: int | None = None
    num_workers: int = 0
    pin_memory: bool = False


def pretraining_loader(
    source: Sequence[Document] | Sequence[Example] | StoredExamples | PairDraws,
    tokenizer: Tokenizer | SpecialIds,
    *,
    split: str | None = "train",
    seed: int = 0,
    options: LoaderOptions | None = None,
    word_ids: Sequence[Sequence[int | None]] | None = None,
) -> EpochLoader:
    """Return an `EpochLoader` of pretraining batches (dicts of the five model inputs) for one split.

    `source`: Documents (those whose `split` matches are turned into examples with `seed`;
    `split=None` takes all), `Example`s (used as given; pass `split=None`), or examples that
    stay on disk (`StoredExamples`, or `PairDraws` of them, one per draw; `split` names the
    split they hold). `options` (`LoaderOptions`, its defaults when None) holds every other
    setting: `options.pairs` says how examples are built from Documents: "nsp" (B follows A,
    or comes from another document), "sop" (A and B back to back, swapped half the time) or
    "single" ([CLS] text [SEP] with no pair label, for masked LM alone: `bertlab.pairs`);
    stored examples must hold what it names. `word_ids`: with given examples, one word-id
    list per example (`bertlab.zh.nsp_word_ids`), so `whole_word=True` masks those words (the
    Chinese path) instead of "##" words. A folder of shards from `prepare` is read by
    `bertlab.engine.shards.shard_loader`, which checks what it holds and passes its stored
    examples here; a path given here is refused with that fix.

    `pair_draws=K`: cut the documents into pairs K times (draw k with `pair_draw_seed(seed, k)`;
    draw 0 is the one `pair_draws=1` gives) and train epoch e on draw e % K. Each pass over the
    loader moves to the next epoch; `loader.set_epoch(e)` chooses it (do that when resuming).

    Taught in notebooks/03_nsp_data.ipynb.
    """
    if isinstance(source, (str, Path)):
        raise BadInput(f"pretraining_loader: source '{source}'",
                       "a path; the loader takes Documents or examples, not files",
                       "pass a shard folder from prepare to bertlab.engine.shards.shard_loader"
                       "(folder, tokenizer, split=..., seed=..., options=...), which checks what "
                       "it holds and reads its examples from disk, or a corpus's Documents "
                       "(bertlab.load_corpus(path))")
    check_type(seed, int, "pretraining_loader(seed)", "a whole number", "pass e.g. seed=0")
    check_type(source, Sized, "pretraining_loader(source)", "a list of Documents or examples",
               "pass bl.load_corpus(...) or bl.create_nsp_examples(...)")
    options = checked_loader_options(options, split)
    schedule = options.mask_schedule or ("dynamic" if split in ("train", None) else "static")
    examples = _examples(source, tokenizer, split, options, seed, word_ids is not None)
    dataset = PretrainingDataset(examples, word_ids=word_ids, seed=seed, mask_schedule=schedule,
                         mask_copies=options.mask_copies)
    if len(dataset) == 0:
        info = getattr(examples, "info", {})
        if info.get("documents") and info.get("one_sentence_docs") == info["documents"]:
            raise ValueError(
                f"pretraining_loader: no examples to load: all {info['documents']} documents "
                f"have one sentence, and a sentence pair needs a document of at least two; to "
                f"train masked LM alone on such text, pass LoaderOptions(pairs='single') "
                f"([CLS] text [SEP]; the CLI's --objectives mlm --segments single)")
        raise ValueError("pretraining_loader: no examples to load; check the corpus and split")

    collate = PretrainingCollator(tokenizer, options.masking, whole_word=options.whole_word,
                                  pad_to_multiple_of=options.pad_to_multiple_of,
                                  return_word_ids=options.return_word_ids)
    built = _built_pairs(source, options)
    loading = dict(collate_fn=collate, num_workers=options.num_workers,
                   pin_memory=options.pin_memory, seed=seed, pairs=built,
                   max_seq_len=_pair_length(dataset, options, built))
    if options.group_by_length:
        return EpochLoader(dataset, batch_sampler=_grouped_batches(dataset, options, seed),
                           **loading)
    return EpochLoader(dataset, batch_size=options.batch_size, drop_last=options.drop_last,
                       sampler=_sampler(dataset, options, seed), **loading)


def checked_loader_options(options: LoaderOptions | None, split: str | None) -> LoaderOptions:
    """Return `options` (`LoaderOptions()` when None) once it and `split` are checked, as
    `pretraining_loader` (and `bertlab.engine.shards.shard_loader`) first do; raise ValueError
    naming the fix otherwise."""
    options = LoaderOptions() if options is None else options
    if not isinstance(options, LoaderOptions):
        raise ValueError(f"options={options!r}; pass a bertlab.data.LoaderOptions, e.g. "
                         f"LoaderOptions(batch_size=16), or a recipe's loader_options()")
    if split is not None and split not in SPLITS:
        raise ValueError(f"split={split!r} is not known; use one of {SPLITS} or None")
    pair_builder(options.pairs)  # an unknown kind of pairs is refused whatever the source
    if options.pair_draws is not None:
        check_pair_draws(options.pair_draws)
    return options


def _built_pairs(source: Sequence[Document] | Sequence[Example] | StoredExamples | PairDraws,
                 options: LoaderOptions) -> str | None:
    """Return how the loader's examples were built: `options.pairs` from Documents, what stored
    examples hold (checked to be the same), None for ready-made examples (not known here)."""
    first = source.draws[0] if isinstance(source, PairDraws) else source
    if isinstance(first, StoredExamples):
        return first.pairs
    return options.pairs if isinstance(first[0], Document) else None


def _pair_length(dataset: PretrainingDataset, options: LoaderOptions, built: str | None) -> int | None:
    """Return the length the loader's examples were cut at: stored examples' own, the one asked
    for from Documents, or None for ready-made examples (their builder's)."""
    if isinstance(dataset.examples, StoredExamples):
        return dataset.examples.max_seq_len
    return options.max_seq_len if built else None


def _sampler(dataset: PretrainingDataset, options: LoaderOptions, seed: int) -> Sampler | None:
    """Return `pretraining_loader`'s sampler from `options.sampler` (see `LoaderOptions`)."""
    sampler, shuffle = options.sampler, options.shuffle
    if sampler == "distributed":
        return ShardedEpochSampler(dataset, shuffle=shuffle, seed=seed,
                                   drop_last=options.drop_last)
    if isinstance(sampler, str):
        raise ValueError(f"sampler={sampler!r}; pass a Sampler, a function, 'distributed' or None")
    if callable(sampler) and not isinstance(sampler, Sampler):
        return sampler(dataset)
    if sampler is None:
        return EpochShuffleSampler(dataset, seed) if shuffle else None
    return sampler


def _grouped_batches(dataset: PretrainingDataset, options: LoaderOptions,
                     seed: int) -> LengthGroupedBatchSampler:
    """Return `pretraining_loader`'s batch sampler for `options.group_by_length` (this
    process's share of each global batch under torchrun, with `sampler="distributed"`)."""
    if not options.shuffle or options.drop_last or options.sampler not in (None, "distributed"):
        raise ValueError("group_by_length orders the batches itself: it takes shuffle=True, "
                         "drop_last=False and no sampler other than 'distributed'")
    rank, world = 0, 1
    if options.sampler == "distributed":
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("sampler='distributed' needs the process group torchrun starts "
                             "(bertlab.engine.device.init_distributed); leave it out on one process")
        rank, world = dist.get_rank(), dist.get_world_size()
    return LengthGroupedBatchSampler(dataset, options.batch_size, seed=seed,
                                     group_batches=options.group_by_length, world=world,
                                     rank=rank)


def _examples(
    source: Sequence[Document] | Sequence[Example] | StoredExamples | PairDraws,
    tokenizer: Tokenizer | SpecialIds, split: str | None, options: LoaderOptions, seed: int,
    with_word_ids: bool,
) -> Sequence[Example] | StoredExamples | PairDraws:
    """Return the examples `pretraining_loader` reads: built from Documents, given, or stored."""
    pair_draws = options.pair_draws
    if isinstance(source, (StoredExamples, PairDraws)):
        return _stored(source, options, with_word_ids)
    items = list(source)
    if items and isinstance(items[0], Example):
        if pair_draws not in (None, 1):
            raise ValueError(f"pretraining_loader got ready-made pair examples and "
                             f"pair_draws={pair_draws}; those are one draw: pass the documents "
                             f"(or a shard folder prepared with --pair-draws) to draw pairs "
                             f"afresh, or leave pair_draws out")
        if split is not None:
            raise ValueError(
                f"pretraining_loader got ready-made examples and split={split!r}; examples are "
                f"already built from a chosen set of documents, so pass split=None"
            )
        return items
    if with_word_ids:
        raise ValueError(_WORD_IDS_GO_WITH_EXAMPLES)
    if items and isinstance(items[0], Document):
        chosen = items if split is None else split_documents(items)[split]
        if not chosen:
            raise ValueError(
                f"the corpus has no {split!r} documents ({len(items)} documents in all); "
                f"pass split=None to use them all"
            )
        return _built_examples(chosen, tokenizer, options, seed)
    kind = type(items[0]).__name__ if items else "nothing"
    raise ValueError(f"pretraining_loader(source) takes Documents, Examples (bertlab.pairs) or a "
                     f"shard folder's stored examples (bertlab.engine.shards.shard_loader "
                     f"reads them); got {kind}")


_WORD_IDS_GO_WITH_EXAMPLES = ("pretraining_loader: word_ids go with the NSP examples they were "
                              "built for (nsp_word_ids); pass those examples, not Documents or "
                              "shards")


def _stored(source: StoredExamples | PairDraws, options: LoaderOptions,
            with_word_ids: bool) -> StoredExamples | PairDraws:
    """Return stored examples (or their draws) as given, once they agree with `options`."""
    if with_word_ids:
        raise ValueError(_WORD_IDS_GO_WITH_EXAMPLES)
    draws = source.draws if isinstance(source, PairDraws) else [source]
    if options.pair_draws not in (None, len(draws)):
        raise ValueError(f"pretraining_loader got {len(draws)} draw(s) of examples and "
                         f"pair_draws={options.pair_draws}; leave pair_draws out to train on "
                         f"the draws given, or give {options.pair_draws} of them")
    held = {d.pairs for d in draws if isinstance(d, StoredExamples)}
    if held - {options.pairs}:
        raise ValueError(f"pretraining_loader: the stored examples hold {'/'.join(sorted(held))} "
                         f"examples, not the {options.pairs} pairs LoaderOptions asks for; pass "
                         f"LoaderOptions(pairs={min(held)!r}), or build {options.pairs} pairs "
                         f"from the documents")
    return source


def _built_examples(docs: list[Document], tokenizer: Tokenizer | SpecialIds,
                    options: LoaderOptions, seed: int) -> Sequence[Example] | PairDraws:
    """Return the examples `options.pairs` builds from `docs`: one draw, or `PairDraws`."""
    if not isinstance(tokenizer, Tokenizer):
        raise ValueError("pretraining_loader needs a tokenizers.Tokenizer to tokenize Documents")
    build = pair_builder(options.pairs)
    settings = dict(max_seq_len=options.max_seq_len, short_seq_prob=options.short_seq_prob,
                    balance=options.balance)
    pair_draws = options.pair_draws
    if pair_draws in (None, 1):
        return build(docs, tokenizer, seed=seed, **settings)
    corpus = tokenize_corpus(docs, tokenizer)  # once, for every draw
    draws = [build(corpus, tokenizer, seed=pair_draw_seed(seed, 0), **settings)]
    check_draws_fit(draws[0], pair_draws)  # before the other draws are built, not after
    draws += [build(corpus, tokenizer, seed=pair_draw_seed(seed, k), **settings)
              for k in range(1, pair_draws)]
    return PairDraws(draws)
