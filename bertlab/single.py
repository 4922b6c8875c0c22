"""Single-segment examples for masked LM alone: [CLS] text [SEP], built from any document.

NSP and SOP pairs need documents of at least two sentences. Much of the text people bring
does not have them: reviews, tweets, one line per Chinese sentence. A run that trains masked
LM alone needs no pair, so it can read such text as single segments instead: consecutive
sentences of one document packed up to the sequence length, never across a document boundary.
RoBERTa (Liu et al. 2019, section 4.2) calls this input DOC-SENTENCES and found it slightly
better than sentence pairs for masked LM.

The examples carry no pair label (`next_sentence_label` is -100, "not predicted"): the pair
head has nothing to learn or be scored on, and `bertlab.evaluate` reports no NSP figure.

Taught in notebooks/03_nsp_data.ipynb.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

from tokenizers import Tokenizer

from bertlab.document import Document
from bertlab.example import Example, Examples
from bertlab.labels import IGNORE_INDEX
from bertlab.nsp import (
    TokenizedCorpus,
    as_tokenized,
    check_enough_documents,
    check_nsp_settings,
    pair_draw_seed,
)
from bertlab.tokenizer import SpecialIds, special_ids


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
    documents, `bertlab.streaming`, makes the passes batch by batch and gets the same examples;
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
