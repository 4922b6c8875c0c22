"""One pretraining example, whatever built it: a sentence pair or a single segment.

NSP pairs (`bertlab.nsp`), sentence-order pairs (`bertlab.sop`), single segments
(`bertlab.single`) and the examples read back from shards (`bertlab.shards`) are all an
`Example`: [CLS] A [SEP] B [SEP], or [CLS] A [SEP] for a single segment, with the label of the
pair head on [CLS]. Their segment ids come from `segment_ids`, the one place that computes
them (the loader's batches included).

Taught in notebooks/03_nsp_data.ipynb.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np


def segment_ids(length: int, a_len: int) -> np.ndarray:
    """Return the segment ids (token_type_ids, int64) of an example of `length` tokens whose A
    has `a_len`: 0 for [CLS], A and the first [SEP]; 1 for B and the last [SEP] (a single
    segment, [CLS] A [SEP], has no B: all 0)."""
    ids = np.ones(length, dtype=np.int64)
    ids[: a_len + 2] = 0
    return ids


@dataclass(frozen=True, slots=True)
class Example:
    """One example, no padding: `input_ids` = [CLS] A [SEP] B [SEP], or [CLS] A [SEP] for a
    single segment (B is then empty).

    `next_sentence_label` is the label of the pair head on [CLS]: `bertlab.nsp.IS_NEXT` /
    `NOT_NEXT`, `bertlab.sop.IN_ORDER` / `SWAPPED`, or -100 for a single segment (no pair
    label). Where the text came from: A is sentences `a_sentences` (first, end; end exclusive)
    of tokenized document `doc_index` (id `doc_id`), B sentences `b_sentences` of document
    `b_doc_index` (None without B); `a_cut` / `b_cut` are the (front, back) token counts that
    truncation removed from each side; `draw` is the pass over the corpus that built it.
    Examples read from shards carry the ids, A's length, the label, `doc_index` and `draw`
    only (`ShardExamples.doc_id(i)` gives the id; their `input_ids` is a numpy array).
    """

    input_ids: Sequence[int]
    a_len: int
    next_sentence_label: int
    doc_index: int
    doc_id: str | None = None
    a_sentences: tuple[int, int] = (0, 0)
    b_doc_index: int | None = None
    b_sentences: tuple[int, int] = (0, 0)
    a_cut: tuple[int, int] = (0, 0)
    b_cut: tuple[int, int] = (0, 0)
    draw: int = 0

    @property
    def b_len(self) -> int:
        """Return the length of B (0 for a single segment)."""
        return max(len(self.input_ids) - self.a_len - 3, 0)

    @property
    def token_type_ids(self) -> list[int]:
        """Return the segment ids (`segment_ids`) as a list."""
        return segment_ids(len(self.input_ids), self.a_len).tolist()

    @property
    def tokens_dropped(self) -> int:
        """Return how many tokens truncation removed from A and B together."""
        return sum(self.a_cut) + sum(self.b_cut)

    @property
    def truncated(self) -> bool:
        """Return True if truncation removed any token."""
        return self.tokens_dropped > 0


class Examples(list):
    """A list of `Example`s plus `info`: how the corpus was used (skipped documents, long
    sentences, tokens cut), as the builders report it."""

    def __init__(self, examples: Iterable[Example] = (), info: dict | None = None) -> None:
        super().__init__(examples)
        self.info: dict = dict(info or {})
