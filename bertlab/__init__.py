"""bertlab: BERT pretraining, built step by step.

Importing bertlab never trains, downloads, prints or plots; it only defines things.
"""

from bertlab.corpus import Document, load_corpus, split_documents, split_of, split_sentences
from bertlab.tokenizer import (
    SPECIAL_TOKENS,
    SpecialIds,
    load_tokenizer,
    save_tokenizer,
    special_ids,
    train_tokenizer,
)

__version__ = "0.1.0"

__all__ = [
    "Document",
    "SPECIAL_TOKENS",
    "SpecialIds",
    "load_corpus",
    "load_tokenizer",
    "save_tokenizer",
    "special_ids",
    "split_documents",
    "split_of",
    "split_sentences",
    "train_tokenizer",
]
