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
    words, freqs, singles = _split_into_characters(word_counts)
    room = vocab_size - len(SPECIAL_TOKENS) - len(singles)  # what merged pieces may fill
    merged = _learn_merges(words, freqs, singles, room, min_frequency)
    chars = sorted(t for t in singles if not t.startswith("##"))
    char_pieces = sorted(t for t in singles if t.startswith("##"))
    base = [*SPECIAL_TOKENS, *chars, *char_pieces]
    return [*base, *_order_by_use(merged, base, word_counts)]


def _split_into_characters(word_counts: Mapping[str, int]
                           ) -> tuple[list[list[str]], list[int], set[str]]:
    """Return (each word as its characters, each word's count, every single-character piece).

    A word "hello" becomes `h ##e ##l ##l ##o`; the singles are every character and the "##" form
    of those seen inside a word. Words in sorted order; longer than `MAX_WORD_CHARS` left out.
    """
    words: list[list[str]] = []
    freqs: list[int] = []
    singles: set[str] = set()
    for word in sorted(word_counts):
        if 0 < len(word) <= MAX_WORD_CHARS:
            words.append([word[0], *("##" + ch for ch in word[1:])])
            freqs.append(word_counts[word])
            singles.update(word)
            singles.update(words[-1][1:])
    return words, freqs, singles


def _learn_merges(words: list[list[str]], freqs: list[int], singles: set[str], room: int,
                  min_frequency: int) -> set[str]:
    """Return the new pieces of at most `room` merges, merging them into `words` as it goes.

    Each round merges the most frequent adjacent pair of pieces (ties by spelling), until `room`
    new pieces are made or no pair occurs `min_frequency` times.
    """
    pairs, where = _count_pairs(words, freqs)
    # A heap of (-count, left, right) picks the most frequent pair, ties by spelling. Entries go
    # stale when counts change: every change pushes a fresh entry, and a popped entry whose count
    # is no longer current is skipped.
    heap = [(-count, left, right) for (left, right), count in pairs.items()]
    heapq.heapify(heap)
    merged: set[str] = set()
    while heap and len(merged) < room:
        negative, left, right = heapq.heappop(heap)
        count = pairs.get((left, right), 0)
        if count != -negative:
            continue  # stale entry
        if count < min_frequency:
            break
        new = left + right[2:]  # right is always a "##" piece
        if new not in singles:  # a merge can spell a piece that is already there
            merged.add(new)
        for pair in _merge_everywhere(words, freqs, pairs, where, (left, right), new):
            if pairs[pair] > 0:
                heapq.heappush(heap, (-pairs[pair], *pair))
            else:
                del pairs[pair]
                where.pop(pair, None)
    return merged


def _count_pairs(words: list[list[str]], freqs: list[int]
                 ) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], set[int]]]:
    """Return (each adjacent pair's count weighted by word frequency, the words it occurs in)."""
    pairs: dict[tuple[str, str], int] = {}
    where: dict[tuple[str, str], set[int]] = {}
    for index, (pieces, freq) in enumerate(zip(words, freqs, strict=True)):
        for pair in pairwise(pieces):
            pairs[pair] = pairs.get(pair, 0) + freq
            where.setdefault(pair, set()).add(index)
    return pairs, where


def _merge_everywhere(words: list[list[str]], freqs: list[int],
                      pairs: dict[tuple[str, str], int], where: dict[tuple[str, str], set[int]],
                      merge: tuple[str, str], new: str) -> set[tuple[str, str]]:
    """Return the pairs whose counts changed after merging `merge` into `new` in every word.

    Only the words that hold the pair are rewritten: their old pairs are uncounted and their new
    ones counted, so `pairs` and `where` stay exact without recounting the whole vocabulary.
    """
    changed: set[tuple[str, str]] = set()
    for index in where.pop(merge):
        pieces, freq = words[index], freqs[index]
        for pair in pairwise(pieces):
            pairs[pair] -= freq
            changed.add(pair)
        words[index] = out = _merge_in_word(pieces, merge, new)
        for pair in pairwise(out):
            pairs[pair] = pairs.get(pair, 0) + freq
            changed.add(pair)
            where.setdefault(pair, set()).add(index)
    return changed


def _merge_in_word(pieces: list[str], merge: tuple[str, str], new: str) -> list[str]:
    """Return `pieces` with every occurrence of the pair `merge` replaced by `new`, left to right."""
    out, i = [], 0
    while i < len(pieces):
        if i + 1 < len(pieces) and (pieces[i], pieces[i + 1]) == merge:
            out.append(new)
            i += 2
        else:
            out.append(pieces[i])
            i += 1
    return out


def _order_by_use(merged: set[str], base: list[str], word_counts: Mapping[str, int]) -> list[str]:
    """Return the merged pieces, most used first when the training words are encoded.

    Encoding uses the whole vocabulary (`base`, the specials and single characters, then the
    merged pieces); ties by spelling.
    """
    model = wordpiece_model({t: i for i, t in enumerate([*base, *merged])})
    uses: Counter[str] = Counter()
    for word, freq in word_counts.items():
        for token in model.tokenize(word):
            uses[token.value] += freq
    return sorted(merged, key=lambda t: (-uses[t], t))
