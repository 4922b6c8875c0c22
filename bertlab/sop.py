"""Sentence-pair examples for sentence-order prediction (SOP): are A and B in their order?

ALBERT (Lan et al. 2019) replaced next-sentence prediction by sentence-order prediction. Both
segments come from one document, back to back; the negative is the same two segments swapped.
The topic then gives nothing away (notebook 03: a word-overlap rule that gets three NSP pairs in
four right is exactly at chance on SOP), so the head on [CLS] has to learn how text flows.

The pairs are NSP's IsNext pairs (`create_nsp_examples(negatives=False)`: the same chunking,
split at a sentence boundary and truncation), and half of them become [CLS] B [SEP] A [SEP].
They train the same 2-way head on [CLS] as NSP (the batch key stays `next_sentence_label`,
Hugging Face's name for that head's label): `IN_ORDER = 0`, `SWAPPED = 1`.

Taught in notebooks/03_nsp_data.ipynb.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

from tokenizers import Tokenizer

from bertlab.document import Document
from bertlab.example import Examples
from bertlab.nsp import TokenizedCorpus, create_nsp_examples
from bertlab.tokenizer import SpecialIds

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
