"""Learning a WordPiece vocabulary: BERT's text normalization, word counts and the merge loop.

`wordpiece_vocabulary` is bertlab's own trainer (deterministic, unlike the `tokenizers` trainer
on ties); `bertlab.tokenizer.train_tokenizer` wraps it with a cache on disk.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from itertools import pairwise

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

from bertlab.document import Document

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)  # ids 0..4, in this order, in every bertlab vocabulary

# A longer word becomes [UNK] (Google's tokenizer uses the same limit), so training skips it.
MAX_WORD_CHARS = 200


def iter_texts(docs_or_texts: Iterable[Document | str]) -> Iterator[str]:
    """Yield the texts a tokenizer learns from: each Document's title and sentences, or each string."""
    for item in docs_or_texts:
        if isinstance(item, Document):
            if item.title:
                yield item.title
            yield from item.sentences
        elif isinstance(item, str):
            yield item
        else:
            raise TypeError(
                f"train_tokenizer takes Documents or strings, got {type(item).__name__}"
            )


def wordpiece_model(vocab: dict[str, int] | None = None) -> models.WordPiece:
    """Return BERT's WordPiece model over `vocab` (token -> id): "##" marks a continuing piece."""
    return models.WordPiece(vocab=vocab, unk_token=UNK, continuing_subword_prefix="##",
                            max_input_chars_per_word=MAX_WORD_CHARS)


def build_untrained_tokenizer(lowercase: bool = True) -> Tokenizer:
    """Return an empty WordPiece tokenizer with BERT's normalizer and pre-tokenizer (no vocabulary yet)."""
    tok = Tokenizer(wordpiece_model())
    # Clean text, put spaces around CJK characters (so each becomes its own word), lowercase and
    # strip accents together, as Google's BasicTokenizer does.
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=lowercase, lowercase=lowercase
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def count_words(docs_or_texts: Iterable[Document | str], lowercase: bool = True) -> Counter[str]:
    """Return how often each word occurs: the text normalized and pre-tokenized as BERT does.

    This is all the WordPiece trainer looks at, so training needs memory for the distinct words
    only, however large the corpus.
    """
    tok = build_untrained_tokenizer(lowercase)
    counts: Counter[str] = Counter()
    for text in iter_texts(docs_or_texts):
        counts.update(word for word, _ in tok.pre_tokenizer.pre_tokenize_str(
            tok.normalizer.normalize_str(text)))
    return counts


def wordpiece_vocabulary(word_counts: Mapping[str, int], vocab_size: int,
                         min_frequency: int = 2) -> list[str]:
    """Return a WordPiece vocabulary learnt from word counts, in id order (specials first).

    The trainer is BPE on words, as in the `tokenizers` library's WordPieceTrainer: every word
    starts as its characters (`h ##e ##l ##l ##o`), then the most frequent adjacent pair of
    pieces (counted over all words, weighted by word frequency) is merged into a new piece, again
    and again, until the vocabulary has `vocab_size` entries or no pair occurs `min_frequency`
    times. Every character seen enters the vocabulary, however rare.

    Deterministic by construction: when two pairs are equally frequent, the one that sorts first
    by spelling (code points) wins. The `tokenizers` trainer breaks such ties by internal ids
    assigned in hash-map order (huggingface/tokenizers#1794), which gave a different vocabulary
    on each run for Chinese text, where many rare merges tie. Words longer than
    `MAX_WORD_CHARS` are left out (encoding turns them into [UNK] anyway).

    Ids: specials 0-4, then every single character and its "##" form by code point, then merged
    pieces, most frequent in the training text first (ties by spelling).

    Taught in notebooks/01_corpus_and_tokenizer.ipynb.
    """
    words: list[list[str]] = []
    freqs: list[int] = []
    singles: set[str] = set()  # every character, and the "##" form of those seen inside a word
    for word in sorted(word_counts):
        if 0 < len(word) <= MAX_WORD_CHARS:
            words.append([word[0], *("##" + ch for ch in word[1:])])
            freqs.append(word_counts[word])
            singles.update(word)
            singles.update(words[-1][1:])
    size = len(SPECIAL_TOKENS) + len(singles)
    merged: set[str] = set()

    # Pair counts and, per pair, the words it occurs in; a heap of (-count, left, right) picks
    # the most frequent pair, ties by spelling. Entries go stale when counts change: every change
    # pushes a fresh entry, and a popped entry whose count is no longer current is skipped.
    pairs: dict[tuple[str, str], int] = {}
    where: dict[tuple[str, str], set[int]] = {}
    for index, (pieces, freq) in enumerate(zip(words, freqs, strict=True)):
        for pair in pairwise(pieces):
            pairs[pair] = pairs.get(pair, 0) + freq
            where.setdefault(pair, set()).add(index)
    heap = [(-count, left, right) for (left, right), count in pairs.items()]
    heapq.heapify(heap)
    while heap and size < vocab_size:
        negative, left, right = heapq.heappop(heap)
        count = pairs.get((left, right), 0)
        if count != -negative:
            continue  # stale entry
        if count < min_frequency:
            break
        new = left + right[2:]  # right is always a "##" piece
        if new not in merged and new not in singles:
            merged.add(new)
            size += 1
        changed: set[tuple[str, str]] = set()
        for index in where.pop((left, right)):
            pieces, freq = words[index], freqs[index]
            for pair in pairwise(pieces):
                pairs[pair] -= freq
                changed.add(pair)
            out, i = [], 0
            while i < len(pieces):
                if i + 1 < len(pieces) and pieces[i] == left and pieces[i + 1] == right:
                    out.append(new)
                    i += 2
                else:
                    out.append(pieces[i])
                    i += 1
            words[index] = out
            for pair in pairwise(out):
                pairs[pair] = pairs.get(pair, 0) + freq
                changed.add(pair)
                where.setdefault(pair, set()).add(index)
        for pair in changed:
            if pairs[pair] > 0:
                heapq.heappush(heap, (-pairs[pair], *pair))
            else:
                del pairs[pair]
                where.pop(pair, None)

    # Order the merged pieces by how often they occur when the training words are encoded.
    chars = sorted(t for t in singles if not t.startswith("##"))
    char_pieces = sorted(t for t in singles if t.startswith("##"))
    model = wordpiece_model(
        {t: i for i, t in enumerate([*SPECIAL_TOKENS, *chars, *char_pieces, *merged])})
    uses: Counter[str] = Counter()
    for word, freq in word_counts.items():
        for token in model.tokenize(word):
            uses[token.value] += freq
    by_use = sorted(merged, key=lambda t: (-uses[t], t))
    return [*SPECIAL_TOKENS, *chars, *char_pieces, *by_use]
