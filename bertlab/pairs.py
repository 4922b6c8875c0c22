"""Pretraining examples: sentence pairs for NSP and SOP, single segments, and the objectives.

Every builder returns `Example`s: [CLS] A [SEP] B [SEP], or [CLS] A [SEP] for a single segment,
with the label of the pair head on [CLS]. Read top to bottom:

- `Example` and `segment_ids`, the one place that computes segment ids (the loader's batches
  included); the examples read back from shards (`bertlab.engine.shards`) are `Example`s too.
- Next-sentence prediction: `tokenize_corpus` tokenizes the documents once, and
  `create_nsp_examples` builds IsNext / NotNext pairs (`IS_NEXT`, `NOT_NEXT`) from them;
  `format_pair` and `nsp_stats` show what came out.
- Sentence-order prediction (ALBERT): `create_sop_examples`, NSP's IsNext pairs with half of
  them swapped (`IN_ORDER`, `SWAPPED`).
- Single segments for masked LM alone: `create_single_examples`, for text whose documents have
  one sentence each.
- The objectives by name (`OBJECTIVES`: "mlm", "nsp", "sop"): what each adds to the loss and
  which examples it trains on; `check_objectives` checks the list a run trains.

Taught in notebooks/03_nsp_data.ipynb and notebooks/05_pretraining.ipynb.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from bertlab.corpus import Document
from bertlab.errors import BadType, check_type
from bertlab.masking import IGNORE_INDEX, example_seed
from bertlab.tokenizer import SpecialIds, encode_sentences, special_ids

# --------------------------------------------------------------------------------------------
# One pretraining example, whatever built it: a sentence pair or a single segment


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

    `next_sentence_label` is the label of the pair head on [CLS]: `IS_NEXT` / `NOT_NEXT` (NSP),
    `IN_ORDER` / `SWAPPED` (SOP), or -100 for a single segment (no pair label).
    Where the text came from: A is sentences `a_sentences` (first, end; end exclusive)
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


# --------------------------------------------------------------------------------------------
# Next-sentence prediction (NSP): [CLS] A [SEP] B [SEP], labelled IsNext or NotNext
#
# The recipe follows Google's `create_pretraining_data.py` (chunk a document's sentences up to a
# target length, split the chunk at a random sentence boundary into A and B, replace B by text
# from another document half of the time, truncate the pair to fit), with two deliberate changes:
#
# * NotNext B always comes from a *different* document (Google tries 10 random draws and can
#   land on the same document; NVIDIA DeepLearningExamples#421 shows what that costs).
# * `balance="exact"` (the default) makes IsNext and NotNext equally likely. In Google's rule a
#   chunk of one sentence is always NotNext, so real text ends up ~56% NotNext
#   (`balance="google"` keeps that rule, for comparison).

IS_NEXT = 0  # B really follows A (Google and Hugging Face convention: label 0)
NOT_NEXT = 1  # B was taken from another document (label 1)

BALANCES = ("exact", "google")
MIN_SEQ_LEN = 8


@dataclass
class TokenizedCorpus:
    """Token ids per sentence per document, tokenized once: `sentences[d][s]` is a list of ids.

    Sentences that encode to no token at all are dropped (counted in `empty_sentences`), so
    sentence indices in an `Example` refer to this object, not to `Document.sentences`.
    """

    doc_ids: list[str]
    sentences: list[list[list[int]]]
    empty_sentences: int = 0
    include_title: bool = False
    name: str = field(default="corpus")

    def __len__(self) -> int:
        return len(self.doc_ids)


def pad_examples(examples: Sequence[Example], pad: int) -> dict[str, torch.Tensor]:
    """Return unmasked `examples` as one batch padded to the longest: input_ids, token_type_ids
    and attention_mask (1 = real token), each (B, T). For reading pairs as they are (a head's
    verdict, attention maps); training batches come from the masking collator instead."""
    width = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), width), pad, dtype=torch.long)
    segments = torch.zeros_like(ids)
    for row, e in enumerate(examples):
        ids[row, :len(e.input_ids)] = torch.as_tensor([int(t) for t in e.input_ids])
        segments[row, :len(e.input_ids)] = torch.as_tensor(e.token_type_ids)
    return {"input_ids": ids, "token_type_ids": segments, "attention_mask": (ids != pad).long()}


def tokenize_corpus(
    docs: Sequence[Document], tokenizer: Tokenizer, *, include_title: bool = False, name: str = "corpus"
) -> TokenizedCorpus:
    """Return the documents' sentences as token ids (one batch encode in Rust for the whole corpus).

    Titles are left out by default: a headline is not a sentence of the running text, and BERT's
    Wikipedia data skipped headers too. `include_title=True` puts the title first.

    Taught in notebooks/03_nsp_data.ipynb.
    """
    flat: list[str] = []
    counts: list[int] = []
    for doc in docs:
        if not isinstance(doc, Document):
            raise BadType(f"docs=[... {doc!r:.40} ...]", f"holds a {type(doc).__name__}, not "
                          f"Documents", "pass the list bl.load_corpus returns")
        sents = ([doc.title] if include_title and doc.title else []) + list(doc.sentences)
        flat.extend(sents)
        counts.append(len(sents))
    ids = encode_sentences(tokenizer, flat) if flat else []
    out: list[list[list[int]]] = []
    empty = 0
    pos = 0
    for n in counts:
        kept = [s for s in ids[pos : pos + n] if s]
        empty += n - len(kept)
        out.append(kept)
        pos += n
    return TokenizedCorpus(
        doc_ids=[d.id for d in docs], sentences=out, empty_sentences=empty,
        include_title=include_title, name=name,
    )


def as_tokenized(docs: Sequence[Document] | TokenizedCorpus, tokenizer: Tokenizer | SpecialIds,
                 caller: str) -> TokenizedCorpus:
    """Return `docs` as a `TokenizedCorpus` (tokenized here, titles left out, unless it already
    is one); the example builders' first step. `caller` names the builder in the error for a
    bare SpecialIds."""
    if isinstance(docs, TokenizedCorpus):
        return docs
    check_type(docs, Iterable, f"{caller}(docs)", "a list of Documents",
               "pass the list bl.load_corpus returns")
    check_type(tokenizer, Tokenizer, f"{caller}(tokenizer)", "a tokenizers.Tokenizer (it "
               "tokenizes the Documents)", "pass the tokenizer bl.train_tokenizer returns")
    return tokenize_corpus(list(docs), tokenizer)


def pair_draw_seed(seed: int, draw: int) -> int:
    """Return the seed that cuts a corpus into its `draw`-th set of pairs (draw 0: `seed` itself).

    A run that reads several draws (`LoaderOptions(pair_draws=K)`, `prepare --pair-draws
    K`) trains epoch e on draw e % K: the same documents, other A/B splits and other NotNext
    partners, so a model that repeats a small corpus many times cannot memorise each pair's label.
    """
    if draw == 0:
        return seed
    return int(example_seed(seed, draw, 0x9A125)) % 2**31


def check_nsp_settings(max_seq_len: int, short_seq_prob: float, balance: str, dupe_factor: int) -> None:
    """Raise ValueError (naming the setting and a fix) if an NSP setting is out of range."""
    if not isinstance(max_seq_len, int) or max_seq_len < MIN_SEQ_LEN:
        raise ValueError(
            f"max_seq_len={max_seq_len!r} is too small; NSP pairs need [CLS] A [SEP] B [SEP] with "
            f"room for text on both sides: use max_seq_len >= {MIN_SEQ_LEN} (BERT uses 128 and 512)"
        )
    if not 0.0 <= short_seq_prob <= 1.0:
        raise ValueError(f"short_seq_prob={short_seq_prob!r} is a probability; pass a value in [0, 1]")
    if balance not in BALANCES:
        raise ValueError(f"balance={balance!r} is not known; use one of {BALANCES}")
    if not isinstance(dupe_factor, int) or dupe_factor < 1:
        raise ValueError(f"dupe_factor={dupe_factor!r}; pass a whole number >= 1 (passes over the corpus)")


# A function that picks the document NotNext B comes from: (rng, current doc index) ->
# (doc index, its sentences as a sequence of id lists). It must never return the current document.
OtherDocPicker = Callable[[random.Random, int], tuple[int, Sequence[list[int]]]]


def other_doc_picker(pool: Sequence[tuple[int, Sequence[list[int]]]]) -> OtherDocPicker:
    """Return the `OtherDocPicker` that draws NotNext B's document uniformly from `pool`, the
    (doc index, sentences) of the documents on offer, minus A's own (which must be in `pool`)."""
    slot = {d: i for i, (d, _) in enumerate(pool)}

    def pick_other(rng: random.Random, doc_index: int) -> tuple[int, Sequence[list[int]]]:
        # Uniform over the other documents: draw from len-1 slots and skip over our own.
        k = rng.randint(0, len(pool) - 2)
        if k >= slot[doc_index]:
            k += 1
        return pool[k]

    return pick_other


def check_enough_documents(documents: int, name: str, negatives: bool = True) -> None:
    """Raise ValueError (naming the fix) unless `documents`, the documents with text of the
    corpus called `name`, are enough: one, or two when NotNext B comes from another document."""
    if documents == 0:
        raise ValueError(f"{name} (docs) is empty: no document has a sentence with text; pass documents "
                         f"with sentences (bertlab.load_corpus)")
    if documents < 2 and negatives:
        raise ValueError(f"{name} has 1 document; NSP needs at least 2 (negatives come from other "
                         f"documents): add documents, or split a long text into several")


class PairBuilder:
    """Turns one tokenized document into NSP examples (shared by the in-memory and streaming paths)."""

    def __init__(
        self, special: SpecialIds, *, max_seq_len: int, short_seq_prob: float, balance: str,
        rng: random.Random, negatives: bool = True,
    ) -> None:
        self.cls, self.sep = special.cls, special.sep
        self.negatives = negatives  # False: IsNext pairs only (what sentence order swaps)
        self.max_tokens = max_seq_len - 3  # room for [CLS] and two [SEP]
        self.short_seq_prob = short_seq_prob
        self.exact = balance == "exact"
        self.rng = rng
        self.one_sentence_docs_skipped = 0

    def document(
        self, doc_index: int, doc_id: str, sents: Sequence[list[int]], pick_other: OtherDocPicker,
        draw: int = 0,
    ) -> Iterator[Example]:
        """Yield the examples of pass `draw` over one document."""
        rng, n = self.rng, len(sents)
        if n == 0:
            return
        if n == 1 and self.exact:
            # A one-sentence document has no IsNext pair; using it only as NotNext A would tilt the
            # labels, so under exact balance it is skipped (it still serves as NotNext B material).
            self.one_sentence_docs_skipped += 1
            return
        # One target length per document and pass, as in Google's script; short targets teach the
        # model sequences shorter than those it will be fine-tuned on.
        target = self.max_tokens
        if rng.random() < self.short_seq_prob:
            target = rng.randint(2, self.max_tokens)

        start = 0
        while start < n:
            is_random_next = (self.negatives and rng.random() < 0.5) if self.exact else False
            end, length = start, 0
            while end < n and length < target:  # grow the chunk to the target or the document end
                length += len(sents[end])
                end += 1
            if self.exact:
                if not is_random_next and end - start == 1 and end < n:
                    end += 1  # one long sentence: pull in the next one so an IsNext split exists
                if end == n - 1:
                    end = n  # never leave the document's last sentence alone in a chunk of its own
            size = end - start
            a_split = rng.randint(1, size - 1) if size >= 2 else 1
            if not self.exact:
                is_random_next = size == 1 or rng.random() < 0.5

            if is_random_next:
                if self.exact and start + a_split == n - 1:
                    a_split = size  # A takes the last sentence rather than strand it
                a_end = start + a_split
                tokens_a = [t for s in sents[start:a_end] for t in s]
                target_b = target - len(tokens_a)
                b_doc, other = pick_other(rng, doc_index)
                b_start = rng.randint(0, len(other) - 1)
                b_end, tokens_b = b_start, []
                while b_end < len(other):
                    tokens_b.extend(other[b_end])
                    b_end += 1
                    if len(tokens_b) >= target_b:
                        break
                next_start = a_end  # the chunk's unused sentences start the next chunk
            else:
                a_end = start + a_split
                tokens_a = [t for s in sents[start:a_end] for t in s]
                tokens_b = [t for s in sents[a_end:end] for t in s]
                b_doc, b_start, b_end = doc_index, a_end, end
                next_start = end

            yield self.pair(tokens_a, tokens_b, NOT_NEXT if is_random_next else IS_NEXT,
                            doc_index=doc_index, doc_id=doc_id, draw=draw,
                            a_sentences=(start, a_end), b_doc_index=b_doc,
                            b_sentences=(b_start, b_end))
            start = next_start

    def pair(self, tokens_a: list[int], tokens_b: list[int], label: int, **where: Any) -> Example:
        """Return `[CLS] A [SEP] B [SEP]` with `label`, A and B cut to the builder's length
        (`_truncate`); `where` names the pair's place (doc_index, doc_id, draw, a_sentences,
        b_doc_index, b_sentences), kept on the Example."""
        a_cut, b_cut = self._truncate(len(tokens_a), len(tokens_b))
        tokens_a = tokens_a[a_cut[0] : len(tokens_a) - a_cut[1]]
        tokens_b = tokens_b[b_cut[0] : len(tokens_b) - b_cut[1]]
        return Example(input_ids=[self.cls, *tokens_a, self.sep, *tokens_b, self.sep],
                       a_len=len(tokens_a), next_sentence_label=label, a_cut=a_cut, b_cut=b_cut,
                       **where)

    def _truncate(self, len_a: int, len_b: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """Return ((A front, A back), (B front, B back)) cuts that bring len_a + len_b to max_tokens.

        Google's rule: cut one token at a time from the longer side (B on a tie), from its
        front or back with equal odds; cutting both ends keeps the model from always seeing
        sentence starts at the same places.
        """
        rng = self.rng
        af = ab = bf = bb = 0
        while len_a + len_b > self.max_tokens:
            if len_a > len_b:
                len_a -= 1
                if rng.random() < 0.5:
                    af += 1
                else:
                    ab += 1
            else:
                len_b -= 1
                if rng.random() < 0.5:
                    bf += 1
                else:
                    bb += 1
        return (af, ab), (bf, bb)


def _check_corpus(corpus: TokenizedCorpus, negatives: bool = True) -> list[int]:
    """Return the indices of documents with text; raise if there are fewer than 2 (NotNext B
    comes from another document; without negatives one is enough)."""
    usable = [d for d, sents in enumerate(corpus.sentences) if sents]
    check_enough_documents(len(usable), corpus.name, negatives)
    return usable


def create_nsp_examples(
    docs: Sequence[Document] | TokenizedCorpus,
    tokenizer: Tokenizer | SpecialIds,
    *,
    max_seq_len: int = 128,
    short_seq_prob: float = 0.1,
    seed: int = 0,
    balance: str = "exact",
    dupe_factor: int = 1,
    negatives: bool = True,
) -> Examples:
    """Return NSP examples ([CLS] A [SEP] B [SEP], IsNext/NotNext) built from the documents.

    Per document and pass (`dupe_factor` passes, each with fresh random choices): pick a target
    length (`max_seq_len - 3`, or with probability `short_seq_prob` a random length in
    [2, target]); grow a chunk of whole sentences up to it; split the chunk at a random sentence
    boundary into A and the rest. IsNext: B is the rest. NotNext: B is a run of sentences from a
    random *other* document (never the same one), and the chunk's unused sentences go back to
    start the next chunk, so no text is wasted. Finally cut the longer side, one token at a time
    from front or back, until the pair fits.

    `balance="exact"` draws each label first with odds 1/2 and shapes the chunk to allow it: a
    one-sentence chunk pulls in the next sentence when IsNext is drawn, and a document's last
    sentence is never left alone in a chunk. One-sentence documents (no IsNext pair exists) are
    skipped; `examples.info["one_sentence_docs_skipped"]` counts them. `balance="google"` keeps
    Google's rule (one-sentence chunks are always NotNext; ~56% NotNext on ordinary text) and
    uses one-sentence documents as NotNext A.

    `docs` are Documents (tokenized here, titles left out) or a `TokenizedCorpus` from
    `tokenize_corpus` (`include_title=True` there puts each title first). Examples come in
    document order; the same seed gives the same examples. Randomness: `random.Random(seed)`.
    `negatives=False` (with `balance="exact"`) makes every pair IsNext: the in-order pairs that
    sentence-order prediction swaps (`create_sop_examples`).

    Taught in notebooks/03_nsp_data.ipynb.
    """
    check_type(seed, int, "create_nsp_examples(seed)", "a whole number", "pass e.g. seed=0")
    check_type(max_seq_len, int, "create_nsp_examples(max_seq_len)", "a whole number",
               "pass e.g. max_seq_len=128")
    check_nsp_settings(max_seq_len, short_seq_prob, balance, dupe_factor)
    if not negatives and balance != "exact":
        raise ValueError(f"negatives=False needs balance='exact' (Google's rule makes every "
                         f"one-sentence chunk NotNext); got balance={balance!r}")
    corpus = as_tokenized(docs, tokenizer, "create_nsp_examples")
    special = special_ids(tokenizer)
    usable = _check_corpus(corpus, negatives)
    rng = random.Random(seed)
    builder = PairBuilder(special, max_seq_len=max_seq_len, short_seq_prob=short_seq_prob,
                          balance=balance, rng=rng, negatives=negatives)
    pick_other = other_doc_picker([(d, corpus.sentences[d]) for d in usable])
    examples = Examples()
    for draw in range(dupe_factor):
        for d in usable:
            examples.extend(builder.document(d, corpus.doc_ids[d], corpus.sentences[d],
                                             pick_other, draw))
    long_limit = max_seq_len - 3
    examples.info = {
        "balance": balance,
        "max_seq_len": max_seq_len,
        "documents": len(usable),
        "one_sentence_docs": sum(1 for d in usable if len(corpus.sentences[d]) == 1),
        "one_sentence_docs_skipped": builder.one_sentence_docs_skipped // dupe_factor,
        "sentences": sum(len(corpus.sentences[d]) for d in usable),
        "long_sentences": sum(1 for d in usable for s in corpus.sentences[d] if len(s) > long_limit),
        "empty_sentences": corpus.empty_sentences,
    }
    return examples


def format_pair(example: Example, tokenizer: Tokenizer, width: int = 96) -> str:
    """Return the example as text: its tokens, with each token's segment id printed underneath.

    Taught in notebooks/03_nsp_data.ipynb.
    """
    tokens = [tokenizer.id_to_token(i) or "?" for i in example.input_ids]
    label = {IS_NEXT: "IsNext", NOT_NEXT: "NotNext"}.get(example.next_sentence_label)
    if label is None:  # a single segment (create_single_examples): no pair, no label
        lines = [f"one segment, no pair label (next_sentence_label="
                 f"{example.next_sentence_label}), len(text)={example.a_len}"]
    else:
        lines = [f"{label} (next_sentence_label={example.next_sentence_label}), "
                 f"len(A)={example.a_len}, len(B)={example.b_len}"]
    top, bottom = "", ""
    for token, segment in zip(tokens, example.token_type_ids, strict=True):
        cell = max(len(token), 1) + 1
        if top and len(top) + cell > width:
            lines += [top.rstrip(), bottom.rstrip()]
            top, bottom = "", ""
        top += token.ljust(cell)
        bottom += str(segment).ljust(cell)
    return "\n".join(lines + [top.rstrip(), bottom.rstrip()])


def _seam_broken(example: Example) -> bool:
    """Return True for an IsNext pair whose truncation cut the end of A or the start of B: then
    B no longer starts right where A stops (google-research/bert#627)."""
    return example.next_sentence_label == IS_NEXT and (example.a_cut[1] > 0
                                                       or example.b_cut[0] > 0)


def nsp_stats(examples: Sequence[Example]) -> dict[str, float]:
    """Return counts and shares: examples, IsNext/NotNext, truncation, tokens dropped, mean lengths.

    Includes the corpus facts in `examples.info` when present (skipped documents, long sentences).

    Taught in notebooks/03_nsp_data.ipynb.
    """
    n = len(examples)
    not_next = sum(1 for e in examples if e.next_sentence_label == NOT_NEXT)
    truncated = sum(1 for e in examples if e.truncated)
    is_next = n - not_next
    stats: dict[str, float] = {
        "examples": n,
        "is_next": is_next,
        "not_next": not_next,
        "not_next_share": not_next / n if n else 0.0,
        "truncated": truncated,
        "truncated_share": truncated / n if n else 0.0,
        "tokens_dropped": sum(e.tokens_dropped for e in examples),
        "seam_broken": sum(1 for e in examples if _seam_broken(e)),
        "mean_a_len": sum(e.a_len for e in examples) / n if n else 0.0,
        "mean_b_len": sum(e.b_len for e in examples) / n if n else 0.0,
        "mean_len": sum(len(e.input_ids) for e in examples) / n if n else 0.0,
    }
    stats.update(getattr(examples, "info", {}))
    return stats


# --------------------------------------------------------------------------------------------
# Sentence-order prediction (SOP): are A and B in their order?
#
# ALBERT (Lan et al. 2019) replaced next-sentence prediction by sentence-order prediction. Both
# segments come from one document, back to back; the negative is the same two segments swapped.
# The topic then gives nothing away (notebook 03: a word-overlap rule that gets three NSP pairs in
# four right is exactly at chance on SOP), so the head on [CLS] has to learn how text flows.
#
# The pairs are NSP's IsNext pairs (`create_nsp_examples(negatives=False)`: the same chunking,
# split at a sentence boundary and truncation), and half of them become [CLS] B [SEP] A [SEP].
# They train the same 2-way head on [CLS] as NSP (the batch key stays `next_sentence_label`,
# Hugging Face's name for that head's label).

IN_ORDER = 0  # A, then B: the order of the document
SWAPPED = 1  # B, then A


def create_sop_examples(
    docs: Sequence[Document] | TokenizedCorpus,
    tokenizer: Tokenizer | SpecialIds,
    *,
    max_seq_len: int = 128,
    short_seq_prob: float = 0.1,
    seed: int = 0,
    balance: str = "exact",
    dupe_factor: int = 1,
) -> Examples:
    """Return SOP examples: two consecutive segments of one document, swapped half the time.

    The segments are those of NSP's IsNext pairs with the same settings and `seed`; whether a
    pair is swapped is drawn from a generator of its own (seeded by `seed`), so the same seed
    gives the same examples. A swapped example's A is the document's B (its `a_sentences` and
    `a_cut` say so). `balance` must be "exact" (the order is a fair coin). Documents of one
    sentence have no pair and are skipped (`examples.info`).

    Taught in notebooks/03_nsp_data.ipynb.
    """
    if balance != "exact":
        raise ValueError(f"sentence-order pairs are swapped with odds 1/2, so balance must be "
                         f"'exact'; got balance={balance!r}")
    in_order = create_nsp_examples(docs, tokenizer, max_seq_len=max_seq_len,
                                   short_seq_prob=short_seq_prob, seed=seed,
                                   dupe_factor=dupe_factor, negatives=False)
    rng = random.Random(f"sop:{seed}")
    examples = Examples(info=in_order.info)
    for e in in_order:
        if rng.random() >= 0.5:
            examples.append(replace(e, next_sentence_label=IN_ORDER))
            continue
        cls, sep = e.input_ids[0], e.input_ids[-1]
        a, b = e.input_ids[1:1 + e.a_len], e.input_ids[2 + e.a_len:-1]
        examples.append(replace(e, input_ids=[cls, *b, sep, *a, sep], a_len=len(b),
                                next_sentence_label=SWAPPED, a_sentences=e.b_sentences,
                                b_sentences=e.a_sentences, a_cut=e.b_cut, b_cut=e.a_cut))
    return examples


# --------------------------------------------------------------------------------------------
# Single segments for masked LM alone: [CLS] text [SEP], built from any document
#
# NSP and SOP pairs need documents of at least two sentences. Much of the text people bring
# does not have them: reviews, tweets, one line per Chinese sentence. A run that trains masked
# LM alone needs no pair, so it can read such text as single segments instead: consecutive
# sentences of one document packed up to the sequence length, never across a document boundary.
# RoBERTa (Liu et al. 2019, section 4.2) calls this input DOC-SENTENCES and found it slightly
# better than sentence pairs for masked LM.
#
# The examples carry no pair label (`next_sentence_label` is -100, "not predicted"): the pair
# head has nothing to learn or be scored on, and `bertlab.evaluate` reports no NSP figure.


def _chunks(sents: Sequence[list[int]], max_tokens: int, short_seq_prob: float,
            rng: random.Random) -> Iterator[tuple[int, int]]:
    """Yield (first, end) sentence ranges of one document, each up to one target length."""
    start = 0
    while start < len(sents):
        target = rng.randint(2, max_tokens) if rng.random() < short_seq_prob else max_tokens
        end, length = start + 1, len(sents[start])
        while end < len(sents) and length + len(sents[end]) <= target:
            length += len(sents[end])
            end += 1
        yield start, end
        start = end


def single_pass_rng(seed: int, draw: int) -> random.Random:
    """Return the random source of pass `draw` over the corpus (its own per pass, so a stream of
    documents, `bertlab.engine.streaming`, makes the passes batch by batch and gets the same examples;
    pass k is what pass 0 of seed `pair_draw_seed(seed, k)` is)."""
    return random.Random(f"single:{pair_draw_seed(seed, draw)}")


def document_singles(special: SpecialIds, doc_index: int, doc_id: str,
                     sents: Sequence[list[int]], *, max_seq_len: int, short_seq_prob: float,
                     rng: random.Random, draw: int = 0) -> Iterator[Example]:
    """Yield the single segments of one pass over one tokenized document (shared by
    `create_single_examples` and the streaming path): [CLS] text [SEP] with no pair label
    (-100, so no pair loss reads it); the text is whole sentences `a_sentences`, less `a_cut[1]`
    tokens at the end when one sentence alone is longer than the sequence."""
    max_tokens = max_seq_len - 2  # room for [CLS] and [SEP]
    for start, end in _chunks(sents, max_tokens, short_seq_prob, rng):
        text = [t for s in sents[start:end] for t in s]
        cut = max(len(text) - max_tokens, 0)
        text = text[:max_tokens]
        yield Example(input_ids=[special.cls, *text, special.sep], a_len=len(text),
                      next_sentence_label=IGNORE_INDEX, doc_index=doc_index, doc_id=doc_id,
                      a_sentences=(start, end), a_cut=(0, cut), draw=draw)


def check_single_settings(max_seq_len: int, short_seq_prob: float, balance: str,
                          dupe_factor: int) -> None:
    """Raise ValueError (naming the setting and a fix) if a single-segment setting is wrong."""
    check_nsp_settings(max_seq_len, short_seq_prob, balance, dupe_factor)
    if balance != "exact":
        raise ValueError(f"single segments have no pair label to balance; leave balance at "
                         f"'exact' (got balance={balance!r})")


def create_single_examples(
    docs: Sequence[Document] | TokenizedCorpus,
    tokenizer: Tokenizer | SpecialIds,
    *,
    max_seq_len: int = 128,
    short_seq_prob: float = 0.1,
    seed: int = 0,
    balance: str = "exact",
    dupe_factor: int = 1,
) -> Examples:
    """Return single-segment examples: each document's sentences packed into [CLS] text [SEP].

    Per document and pass (`dupe_factor` passes): a target length (`max_seq_len - 2`, or with
    probability `short_seq_prob` a random one, as for pairs), then whole consecutive sentences
    while they fit. A sentence longer than the sequence on its own is cut at the end (counted
    in `examples.info["tokens_cut"]`). Every document with text gives at least one example, so a
    corpus of one-sentence documents loses nothing. `balance` has no meaning here and must stay
    "exact" (the signature is the pair builders', so `pretraining_loader` can call any of them).
    Examples come in document order; the same seed gives the same examples, and each pass
    draws from its own random source (`single_pass_rng`), so `prepare --segments single`, which
    streams the documents, writes these same examples.

    Taught in notebooks/03_nsp_data.ipynb.
    """
    check_single_settings(max_seq_len, short_seq_prob, balance, dupe_factor)
    corpus = as_tokenized(docs, tokenizer, "create_single_examples")
    check_enough_documents(sum(1 for sents in corpus.sentences if sents), corpus.name,
                           negatives=False)
    special = special_ids(tokenizer)
    examples = Examples(info={"documents": len(corpus), "tokens_cut": 0})
    for draw in range(dupe_factor):
        rng = single_pass_rng(seed, draw)
        for d, sents in enumerate(corpus.sentences):
            for ex in document_singles(special, d, corpus.doc_ids[d], sents,
                                       max_seq_len=max_seq_len, short_seq_prob=short_seq_prob,
                                       rng=rng, draw=draw):
                examples.info["tokens_cut"] += ex.tokens_dropped
                examples.append(ex)
    return examples


# --------------------------------------------------------------------------------------------
# The pretraining objectives, by name: what each adds to the loss and which pairs it trains on
#
# A run trains a list of them, `("mlm",)`, `("mlm", "nsp")` (BERT) or `("mlm", "sop")` (ALBERT's
# sentence order). Masked LM is always in; at most one pair objective trains the 2-way head on
# [CLS] (the model has one). A new objective is a pair builder and one entry in `OBJECTIVES`:
# the loader builds its pairs (`bertlab.data.LoaderOptions(pairs=...)`), the loss adds its
# term (`bertlab.pretraining.pretraining_loss`), and the CLI accepts it (`--objectives`).


@dataclass(frozen=True)
class ObjectiveSpec:
    """One pretraining objective: the loss term it adds, and the pairs it needs.

    Its loss is the model's summed cross-entropy `loss_sum` (a key of `loss_sums`) over the
    step's `count` (a key of `bertlab.model.loss_counts`). A pair objective has a `pairs`
    builder (documents -> examples, `create_nsp_examples`' signature) and names the parameters
    only it trains (`trains`: prefixes): without it they get no gradient and sit the run out.
    """

    name: str
    summary: str
    loss_sum: str
    count: str
    pairs: Callable | None = None
    trains: tuple[str, ...] = ()


_PAIR_HEAD = ("bert.pooler.", "nsp.")  # the pooler on [CLS] and the 2-way head on it

OBJECTIVES: dict[str, ObjectiveSpec] = {
    "mlm": ObjectiveSpec("mlm", "masked LM: predict the original token at each target",
                         loss_sum="mlm", count="targets"),
    "nsp": ObjectiveSpec("nsp", "next-sentence prediction: does B follow A, or come from "
                         "another document? (BERT)", loss_sum="nsp", count="sequences",
                         pairs=create_nsp_examples, trains=_PAIR_HEAD),
    "sop": ObjectiveSpec("sop", "sentence-order prediction: are A and B in their order, or "
                         "swapped? (ALBERT)", loss_sum="nsp", count="sequences",
                         pairs=create_sop_examples, trains=_PAIR_HEAD),
}
PAIRS_FOR_MLM_ONLY = "nsp"  # masked LM alone still reads [CLS] A [SEP] B [SEP] pairs, built as NSP's
# Masked LM alone may instead read single segments, [CLS] text [SEP] (`create_single_examples`):
# the input for text whose documents have one sentence each, where no pair exists.
SINGLE = "single"
INPUTS = ("pairs", SINGLE)  # what --segments chooses between


def check_objectives(objectives: Sequence[str] | str, where: str = "objectives") -> tuple[str, ...]:
    """Return `objectives` as a tuple of names after checking it is a list this model can train.

    A string is split at commas ("mlm,sop"). Refused, naming `where` and the fix: an unknown
    name, a repeat, a list without "mlm", or two pair objectives (the model has one pair head).
    """
    names = tuple(n.strip() for n in objectives.split(",")) if isinstance(objectives, str) \
        else tuple(objectives)
    unknown = [n for n in names if n not in OBJECTIVES]
    if unknown:
        raise ValueError(f"{where}: unknown objective {unknown[0]!r}; choose from "
                         f"{', '.join(OBJECTIVES)} (e.g. mlm,nsp)")
    if len(set(names)) != len(names):
        raise ValueError(f"{where}: {','.join(names)} names an objective twice; list each once")
    if "mlm" not in names:
        raise ValueError(f"{where}: {','.join(names) or 'nothing'} leaves out mlm; every run "
                         f"trains masked LM (add mlm, e.g. mlm,{','.join(names) or 'nsp'})")
    pairs = [n for n in names if OBJECTIVES[n].pairs is not None]
    if len(pairs) > 1:
        raise ValueError(f"{where}: {' and '.join(pairs)} both train the one pair head on [CLS]; "
                         f"choose one of them")
    return names


def pair_objective(objectives: Sequence[str]) -> str | None:
    """Return the pair objective of a (checked) list ("nsp", "sop"), or None for masked LM only."""
    return next((n for n in objectives if OBJECTIVES[n].pairs is not None), None)


def pairs_of(objectives: Sequence[str], segments: str = "pairs") -> str:
    """Return how the examples of a run with these objectives are built: "nsp", "sop" (keys of
    OBJECTIVES) or "single", for masked LM alone with `segments="single"`."""
    if segments not in INPUTS:
        raise ValueError(f"segments={segments!r} is not known; choose from {', '.join(INPUTS)}")
    pair = pair_objective(objectives)
    if segments == SINGLE:
        if pair is not None:
            raise ValueError(f"{pair} trains on sentence pairs, so its input cannot be single "
                             f"segments; train masked LM alone (objectives mlm) on single "
                             f"segments, or keep pairs")
        return SINGLE
    return pair or PAIRS_FOR_MLM_ONLY


def pair_builder(pairs: str) -> Callable:
    """Return the function that builds the examples of `pairs` ("nsp", "sop" or "single")."""
    if pairs == SINGLE:
        return create_single_examples
    if pairs not in OBJECTIVES or OBJECTIVES[pairs].pairs is None:
        choices = ", ".join([*(n for n, spec in OBJECTIVES.items() if spec.pairs is not None),
                             SINGLE])
        raise ValueError(f"pairs={pairs!r} is not a pair objective; choose from {choices}")
    return OBJECTIVES[pairs].pairs
