"""Chinese BERT: whole-word masking from a real word segmentation, end to end.

A character vocabulary cuts 华中科技大学 into six tokens. With character masking the model may
see 华中_技大学 and only has to fill in 科, which the rest of the word nearly gives away.
Whole-word masking (Cui et al. 2019, "Pre-Training with Whole Word Masking for Chinese BERT")
hides every character of a word at once, so the model has to use the sentence around it.
Chinese has no spaces and no "##" marks, so the word boundaries must come from a segmentation;
here they come from the gold segmentation of the People's Daily corpus ("zh-news").

The glue between that segmentation and the pretraining pipeline:

* `segment_corpus`: token ids per sentence (what `create_nsp_examples` takes) plus one word
  index per token, from the same encodings;
* `nsp_word_ids`: the word ids of one NSP example, [CLS] A [SEP] B [SEP], truncation included;
* `bertlab.data.pretraining_loader(examples, tok, split=None, word_ids=...)` with
  `LoaderOptions(whole_word=...)` then masks by these words, or character by character with the
  same data and seeds for a fair comparison;
* `whole_word_counts` / `whole_word_scores`: the whole-word masked-LM accuracy.

Taught in notebooks/08_chinese_bert.ipynb.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from tokenizers import Tokenizer
from torch import nn

from bertlab.corpus import Document
from bertlab.masking import IGNORE_INDEX
from bertlab.pairs import Example, TokenizedCorpus
from bertlab.tokenizer import chinese_word_ids

# --------------------------------------------------------------------------------------------
# Word ids for the corpus and for NSP examples


@dataclass
class SegmentedCorpus(TokenizedCorpus):
    """A `TokenizedCorpus` (pass it to `create_nsp_examples`) that also knows the words.

    `word_ids[d][s][t]` is the word index of token t of sentence s of document d, counted from
    0 within the sentence; `fallback_tokens` counts tokens whose WordPiece word the gold
    segmentation cuts through (see `bertlab.tokenizer.chinese_word_ids`).
    """

    word_ids: list[list[list[int]]] = field(default_factory=list)
    fallback_tokens: int = 0


def segment_corpus(docs: Sequence[Document], tokenizer: Tokenizer, *,
                   name: str = "corpus") -> SegmentedCorpus:
    """Return the documents' sentences as token ids, with one gold word index per token.

    Every document needs `words` (a segmentation per sentence, as "zh-news" has). Titles are
    left out (they have no gold words), as `tokenize_corpus` leaves them out by default;
    sentences that encode to nothing are dropped the same way, so sentence indices in the NSP
    examples built from the result refer to it.

    Taught in notebooks/08_chinese_bert.ipynb.
    """
    sentences: list[str] = []
    words: list[list[str]] = []
    counts: list[int] = []
    for doc in docs:
        if not isinstance(doc, Document):
            raise TypeError(f"segment_corpus takes Documents, got {type(doc).__name__}")
        if doc.words is None:
            raise ValueError(
                f"document {doc.id!r} has no word segmentation (Document.words is None); "
                f"use a segmented corpus such as load_corpus('zh-news'), or segment the "
                f"sentences first and pass Document(..., words=...)"
            )
        sentences.extend(doc.sentences)
        words.extend(doc.words)
        counts.append(len(doc.sentences))
    encodings = tokenizer.encode_batch(sentences, add_special_tokens=False) if sentences else []
    word_ids, fallback = chinese_word_ids(encodings, words) if encodings else ([], 0)
    out_ids: list[list[list[int]]] = []
    out_words: list[list[list[int]]] = []
    empty = pos = 0
    for n in counts:
        kept = [(e.ids, w) for e, w in zip(encodings[pos : pos + n], word_ids[pos : pos + n],
                                           strict=True) if e.ids]
        empty += n - len(kept)
        out_ids.append([ids for ids, _ in kept])
        out_words.append([w for _, w in kept])
        pos += n
    return SegmentedCorpus(doc_ids=[d.id for d in docs], sentences=out_ids, empty_sentences=empty,
                           name=name, word_ids=out_words, fallback_tokens=fallback)


def _side_word_ids(corpus: SegmentedCorpus, doc: int, span: tuple[int, int],
                   cut: tuple[int, int]) -> list[int]:
    """Word ids of one side (A or B): its sentences joined, words numbered on across sentences."""
    ids: list[int] = []
    base = 0
    for s in range(*span):
        local = corpus.word_ids[doc][s]
        ids.extend(base + w for w in local)
        base += max(local) + 1  # the next sentence starts a new word
    return ids[cut[0] : len(ids) - cut[1]]  # the tokens truncation removed, front and back


def nsp_word_ids(example: Example, corpus: SegmentedCorpus) -> list[int | None]:
    """Return one word index per token of the example ([CLS] A [SEP] B [SEP]); None at specials.

    A comes from sentences `a_sentences` of document `doc_index`, B from `b_sentences` of
    `b_doc_index` (another document for NotNext), both cut as truncation cut them. Words are
    numbered 0, 1, 2, ... in order, continuing from A into B, so the two segments never share
    a word; a word cut in half by truncation keeps its remaining characters together. This is
    what `mask_tokens(word_ids=...)` takes.

    Taught in notebooks/08_chinese_bert.ipynb.
    """
    if not isinstance(corpus, SegmentedCorpus):
        raise TypeError(f"nsp_word_ids needs the SegmentedCorpus the example was built from "
                        f"(segment_corpus), got {type(corpus).__name__}")
    if not (0 <= example.doc_index < len(corpus.doc_ids)
            and corpus.doc_ids[example.doc_index] == example.doc_id):
        raise ValueError(
            f"nsp_word_ids: the example comes from document {example.doc_id!r}, which is not "
            f"document {example.doc_index} of this corpus; pass the SegmentedCorpus the examples "
            f"were built from"
        )
    sides = [_side_word_ids(corpus, example.doc_index, example.a_sentences, example.a_cut),
             _side_word_ids(corpus, example.b_doc_index, example.b_sentences, example.b_cut)]
    if (len(sides[0]), len(sides[1])) != (example.a_len, example.b_len):
        raise ValueError(
            f"nsp_word_ids: example from {example.doc_id!r} has A/B lengths "
            f"{example.a_len}/{example.b_len} but the corpus gives {len(sides[0])}/{len(sides[1])} "
            f"tokens; build the examples with create_nsp_examples(corpus, ...) from this corpus"
        )
    numbering: dict[tuple[int, int], int] = {}
    out: list[int | None] = [None]  # [CLS]
    for side, ids in enumerate(sides):
        out.extend(numbering.setdefault((side, w), len(numbering)) for w in ids)
        out.append(None)  # [SEP]
    return out


# --------------------------------------------------------------------------------------------
# Whole-word masked-LM accuracy


def whole_word_counts(predictions: torch.Tensor, labels: torch.Tensor, word_ids: torch.Tensor,
                      *, min_tokens: int = 1) -> dict[str, int]:
    """Return counts over the wholly masked words: words, words_correct, tokens, tokens_correct.

    All inputs are (B, T): predicted ids, labels (-100 = not a target) and word ids (-1 = no
    word). A word counts when every one of its tokens is a target and it has at least
    `min_tokens` tokens; it is correct when every one of its tokens is predicted right.
    `tokens` / `tokens_correct` count the characters inside the counted words.

    Taught in notebooks/08_chinese_bert.ipynb.
    """
    if not predictions.shape == labels.shape == word_ids.shape or labels.dim() != 2:
        raise ValueError(f"whole_word_counts: predictions {tuple(predictions.shape)}, labels "
                         f"{tuple(labels.shape)} and word_ids {tuple(word_ids.shape)} must all "
                         f"be the same (B, T) shape")
    in_word = word_ids >= 0
    n_words = int(word_ids.max()) + 1 if bool(in_word.any()) else 1
    rows = torch.arange(labels.shape[0], device=labels.device)[:, None]  # (B, 1)
    key = (rows * n_words + word_ids)[in_word]  # (n,) one slot per (row, word)
    slots = labels.shape[0] * n_words
    target = (labels != IGNORE_INDEX)[in_word].long()
    right = ((labels != IGNORE_INDEX) & (predictions == labels))[in_word].long()
    size = torch.bincount(key, minlength=slots)  # tokens per word
    hidden = torch.bincount(key, weights=target, minlength=slots).long()
    hits = torch.bincount(key, weights=right, minlength=slots).long()
    whole = (size >= max(min_tokens, 1)) & (hidden == size)
    return {"words": int(whole.sum()), "words_correct": int((whole & (hits == size)).sum()),
            "tokens": int(size[whole].sum()), "tokens_correct": int(hits[whole].sum())}


def _word_batches(loader: Any, max_batches: int | None, caller: str) -> Iterator[dict]:
    """Yield the batches of epoch 0 of `loader` (at most `max_batches`), each checked to carry
    "word_ids"."""
    if hasattr(loader, "set_epoch"):
        loader.set_epoch(0)
    for i, batch in enumerate(loader):
        if max_batches is not None and i >= max_batches:
            return
        if "word_ids" not in batch:
            raise ValueError(f"{caller}: batches need 'word_ids'; build the loader with "
                             f"pretraining_loader(..., word_ids=..., "
                             f"options=LoaderOptions(return_word_ids=True))")
        yield batch


@torch.no_grad()
def whole_word_scores(model: nn.Module, loader: Any, max_batches: int | None = None
                      ) -> dict[str, float]:
    """Return masked-LM accuracies on batches that carry "word_ids" (`return_word_ids=True`).

    char_accuracy: targets predicted right, over all targets. word_accuracy: wholly masked words
    with every character right; multi_char_word_accuracy: the same over words of 2+ characters
    (where one character could give another away). Counts ("targets", "words",
    "multi_char_words") come along. The model runs in eval mode on epoch 0 of the loader.

    Taught in notebooks/08_chinese_bert.ipynb.
    """
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    totals = dict.fromkeys(("targets", "correct", "words", "words_correct", "multi",
                            "multi_correct"), 0)
    try:
        for batch in _word_batches(loader, max_batches, "whole_word_scores"):
            labels = batch["labels"]
            out = model(batch["input_ids"].to(device), batch["attention_mask"].to(device),
                        batch["token_type_ids"].to(device), labels=labels.to(device))
            where = labels != IGNORE_INDEX
            predictions = torch.full_like(labels, IGNORE_INDEX)
            predictions[where] = out.target_logits.argmax(-1).cpu()  # (N,) in row-major order
            totals["targets"] += int(where.sum())
            totals["correct"] += int((predictions[where] == labels[where]).sum())
            for prefix, min_tokens in (("words", 1), ("multi", 2)):
                counts = whole_word_counts(predictions, labels, batch["word_ids"],
                                           min_tokens=min_tokens)
                totals[prefix] += counts["words"]
                totals[f"{prefix}_correct"] += counts["words_correct"]
    finally:
        model.train(was_training)
    if totals["targets"] == 0:
        raise ValueError("whole_word_scores: the loader gave no masked-LM targets")
    return {"char_accuracy": totals["correct"] / totals["targets"],
            "word_accuracy": totals["words_correct"] / max(totals["words"], 1),
            "multi_char_word_accuracy": totals["multi_correct"] / max(totals["multi"], 1),
            "targets": totals["targets"], "words": totals["words"],
            "multi_char_words": totals["multi"]}


def second_character_batches(loader: Any, reveal: bool, max_batches: int | None = None
                             ) -> list[dict[str, torch.Tensor]]:
    """Return whole-word evaluation batches whose only targets are the second characters of
    wholly hidden two-character words; with `reveal=True` the first character of each such
    word is shown again (its original token put back), so the partner is visible.

    Scored with `whole_word_scores`, the two settings say how much a model copies from the
    other half of a word: a character-masked model learns to, a whole-word model is never
    shown half a word in training. `loader` is a whole-word loader built with
    `return_word_ids=True` and every target shown as [MASK].

    Taught in notebooks/08_chinese_bert.ipynb.
    """
    out = []
    for batch in _word_batches(loader, max_batches, "second_character_batches"):
        labels, ids, words = batch["labels"].clone(), batch["input_ids"].clone(), batch["word_ids"]
        keep = torch.zeros_like(labels, dtype=torch.bool)
        for row in range(len(labels)):
            for w in words[row][words[row] >= 0].unique():
                cols = (words[row] == w).nonzero().flatten()
                if len(cols) == 2 and bool((labels[row, cols] != IGNORE_INDEX).all()):
                    keep[row, cols[1]] = True
                    if reveal:
                        ids[row, cols[0]] = labels[row, cols[0]]
        labels[~keep] = IGNORE_INDEX
        out.append({**batch, "input_ids": ids, "labels": labels})
    return out
