"""`Document`, the record every corpus is made of, and its stable train / validation / test split."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

SPLITS = ("train", "validation", "test")


@dataclass
class Document:
    """One document: a body split into sentences, with an optional title and label.

    `words` holds a gold word segmentation per sentence where the corpus has one (Chinese news):
    `"".join(words[i]) == sentences[i]`. `split` is train / validation / test, fixed by a stable
    hash of `id` (see `split_of`).
    """

    id: str
    text: str
    sentences: list[str]
    label: str | None = None
    title: str | None = None
    words: list[list[str]] | None = None
    split: str = field(default="")

    def __post_init__(self) -> None:
        if not self.split:
            self.split = split_of(self.id)


def split_of(doc_id: str, fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)) -> str:
    """Return "train", "validation" or "test" for a document id, stable across runs and machines.

    The id is hashed (blake2b, not Python's salted `hash`), so the split never depends on the
    order in which documents were loaded or on which other documents exist.
    """
    digest = hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest()
    u = int.from_bytes(digest, "big") / 2**64
    if u < fractions[0]:
        return "train"
    if u < fractions[0] + fractions[1]:
        return "validation"
    return "test"


def split_documents(docs: Sequence[Document]) -> dict[str, list[Document]]:
    """Return the documents grouped by their `split` field: {"train": [...], "validation": [...], "test": [...]}."""
    out: dict[str, list[Document]] = {name: [] for name in SPLITS}
    for doc in docs:
        out[doc.split].append(doc)
    return out
