"""WordPiece: a vocabulary learnt from a corpus, and the tokenizer that cuts text with it.

Read top to bottom:

- Learning the vocabulary: the text normalized and split into words as Google's BERT does
  (`count_words`), then the merge loop (`wordpiece_vocabulary`). The trainer is bertlab's own,
  deterministic where the `tokenizers` library's trainer breaks ties differently on each run.
- The tokenizer: `train_tokenizer` wraps that vocabulary in a `tokenizers` (Rust) `Tokenizer`
  and caches it on disk (each file renamed into place whole, its digests checked on every read;
  a cache that cannot be written costs a warning, never the call); `load_tokenizer` and
  `tokenizer_from_vocab` (a BERT vocab.txt) read one back, and
  `save_tokenizer` writes one; `special_ids` gives the ids of [PAD] [UNK]
  [CLS] [SEP] [MASK]; `unk_rate` says how much of a text the vocabulary misses.
- Chinese: `chinese_word_ids` maps a gold word segmentation onto the tokens, for whole-word
  masking. Last, the checks that a tokenizer fits a model (`check_tokenizer_fits`) or has
  another's vocabulary (`check_same_vocabulary`).

Taught in notebooks/01_corpus_and_tokenizer.ipynb and notebooks/08_chinese_bert.ipynb.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import json
import os
import secrets
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import tokenizers
from tokenizers import (
    Encoding,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

from bertlab.atomic import atomic_write_text
from bertlab.corpus import Document
from bertlab.errors import BadInput, BadType, check_type

# --------------------------------------------------------------------------------------------
# Learning a WordPiece vocabulary: BERT's text normalization, word counts and the merge loop

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
            raise BadType(f"train_tokenizer(docs_or_texts=[... {item!r:.40} ...])",
                          f"takes Documents or strings, got {type(item).__name__}",
                          "pass a list of Documents (bl.load_corpus) or of texts")


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


# --------------------------------------------------------------------------------------------
# The tokenizer: trained over that vocabulary, cached, saved and loaded

# Bump when the way a tokenizer is built changes, so stale cache entries are not reused.
_CACHE_FORMAT = 5


@dataclass(frozen=True)
class SpecialIds:
    """The ids of the special tokens and the vocabulary size: everything masking needs to know."""

    pad: int
    unk: int
    cls: int
    sep: int
    mask: int
    vocab_size: int

    @property
    def all(self) -> tuple[int, ...]:
        """Every special id (never selected for prediction, never drawn as a random replacement)."""
        return tuple(sorted({self.pad, self.unk, self.cls, self.sep, self.mask}))


def special_ids(tokenizer: Tokenizer | SpecialIds) -> SpecialIds:
    """Return the special-token ids of `tokenizer` (a `SpecialIds` passes through unchanged).

    Taught in notebooks/01_corpus_and_tokenizer.ipynb.
    """
    if isinstance(tokenizer, SpecialIds):
        return tokenizer
    if not isinstance(tokenizer, Tokenizer):
        raise BadType(f"tokenizer={tokenizer!r:.40}", f"expected a tokenizers.Tokenizer or "
                      f"bertlab.tokenizer.SpecialIds, got {type(tokenizer).__name__}",
                      "pass the tokenizer bl.train_tokenizer returns (or load_tokenizer reads)")
    ids = {}
    for token in SPECIAL_TOKENS:
        token_id = tokenizer.token_to_id(token)
        if token_id is None:
            raise ValueError(
                f"tokenizer has no {token} token; BERT needs all of {', '.join(SPECIAL_TOKENS)} "
                f"(train one with bertlab.train_tokenizer, or add them as special tokens)"
            )
        ids[token] = token_id
    return SpecialIds(
        pad=ids[PAD], unk=ids[UNK], cls=ids[CLS], sep=ids[SEP], mask=ids[MASK],
        vocab_size=tokenizer.get_vocab_size(),
    )


def _add_post_processor(tok: Tokenizer) -> None:
    cls_id, sep_id = tok.token_to_id(CLS), tok.token_to_id(SEP)
    # Segment ids: 0 for [CLS] A [SEP], 1 for B [SEP].
    tok.post_processor = processors.TemplateProcessing(
        single=f"{CLS}:0 $A:0 {SEP}:0",
        pair=f"{CLS}:0 $A:0 {SEP}:0 $B:1 {SEP}:1",
        special_tokens=[(CLS, cls_id), (SEP, sep_id)],
    )


def vocab_digest(tokenizer: Tokenizer) -> str:
    """Return the SHA-256 of the vocabulary (tokens in id order): equal digests, equal vocabularies."""
    vocab = tokenizer.get_vocab(with_added_tokens=False)
    tokens = sorted(vocab, key=vocab.__getitem__)
    return hashlib.sha256("\n".join(tokens).encode("utf-8")).hexdigest()


def default_cache_dir() -> Path:
    """Return the folder where trained tokenizers are cached ($BERTLAB_CACHE or ~/.cache/bertlab)."""
    env = os.environ.get("BERTLAB_CACHE")
    if env:
        return Path(env) / "tokenizers"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "bertlab" / "tokenizers"


def _fingerprint(docs_or_texts: Iterable[Document | str], settings: dict) -> str:
    texts = _Tee(iter_texts(docs_or_texts))
    for _ in texts:
        pass
    return texts.digest(settings)


def _load_verified(path: Path) -> Tokenizer | None:
    """Return the cached tokenizer at `path` if its digests check out; None if there is none.

    A damaged or foreign entry (file bytes or vocabulary not matching the digests written beside
    it, or no digests at all) is reported with a warning and removed, so it is retrained.
    """
    sidecar = path.with_suffix(".sha256")
    if not path.is_file():
        return None
    problem = None
    try:
        data = path.read_bytes()
        expected = json.loads(sidecar.read_text(encoding="utf-8"))
        if hashlib.sha256(data).hexdigest() != expected["file_sha256"]:
            problem = "the file's bytes do not match the digest written beside it"
        else:
            tok = Tokenizer.from_str(data.decode("utf-8"))
            if vocab_digest(tok) != expected["vocab_sha256"]:
                problem = "its vocabulary does not match the digest written beside it"
            else:
                special_ids(tok)
                return tok
    except FileNotFoundError:
        problem = f"it has no digest file {sidecar.name}"
    except Exception as exc:  # unreadable JSON, a missing key, a file tokenizers rejects
        problem = f"it cannot be read ({type(exc).__name__}: {exc})"
    warnings.warn(f"cached tokenizer {path} is not trusted ({problem}); training it again",
                  stacklevel=3)
    path.unlink(missing_ok=True)
    sidecar.unlink(missing_ok=True)
    return None


class EmptyCorpus(BadInput):
    """The texts a tokenizer was to learn from hold no word at all."""


def _as_int_hint(value: object) -> str:
    try:
        return str(int(float(str(value))))
    except (TypeError, ValueError, OverflowError):
        return "8192"


def train_tokenizer(
    docs_or_texts: Iterable[Document | str],
    vocab_size: int = 8192,
    lowercase: bool = True,
    *,
    min_frequency: int = 2,
    cache: bool = True,
    cache_dir: str | Path | None = None,
) -> Tokenizer:
    """Return a WordPiece tokenizer trained on the documents (or strings), cached on disk.

    Special tokens come first: [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4. Text is normalized
    as Google's BERT does (control characters dropped, every CJK character made a word of its
    own, lower case and accents stripped when `lowercase`), split on whitespace and punctuation,
    then cut into WordPiece pieces (`##` marks a piece that continues a word). Encoding adds
    [CLS] A [SEP] (B [SEP]) with segment ids 0 for A and 1 for B.

    The vocabulary comes from `wordpiece_vocabulary`: deterministic, so the same text and
    settings give the same file byte for byte on every machine and every run. `vocab_size` is a
    ceiling: every character seen in training enters the vocabulary (however rare;
    `min_frequency` only gates merges into longer pieces), then merges fill the rest. Chinese
    text cannot merge across characters, so on "zh-news" the vocabulary stops near 5,700
    (about 4,550 characters plus digit/Latin pieces) whatever the ceiling.

    Memory: only the distinct words are held, so a one-shot iterator over a large corpus
    (e.g. `bertlab.readers.iter_corpus(path)`) is read once. A list is read twice on the
    first call (fingerprint, then counting), once when the cache answers.

    The cache key is a fingerprint of the text, every setting, this trainer's version and the
    `tokenizers` version. Beside each cached file lies the SHA-256 of its bytes and of its
    vocabulary; both are checked on load, and an entry that fails (damaged, or written by
    something else) is retrained with a warning, never used. A cache that cannot be written (a
    full disk, a read-only folder) is a warning too: the tokenizer is returned all the same.
    `cache_dir` defaults to `default_cache_dir()`.

    Taught in notebooks/01_corpus_and_tokenizer.ipynb.
    """
    if not isinstance(docs_or_texts, str):
        check_type(docs_or_texts, Iterable, "train_tokenizer(docs_or_texts)", "a list of "
                   "Documents or texts", "pass bl.load_corpus(...) or a list of strings")
    check_type(cache, bool, "train_tokenizer(cache)", "True or False",
               "pass cache=True to keep it on disk, cache=False not to")
    if isinstance(docs_or_texts, str):
        raise ValueError(
            "train_tokenizer: got one string; pass a list of texts (or Documents), e.g. [text]"
        )
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise BadInput(f"train_tokenizer(vocab_size={vocab_size!r})",
                       f"is a {type(vocab_size).__name__}, not a whole number",
                       f"pass an int, e.g. vocab_size={_as_int_hint(vocab_size)}")
    if vocab_size < len(SPECIAL_TOKENS) + 1:
        raise ValueError(
            f"vocab_size={vocab_size!r} is too small; it needs room for the "
            f"{len(SPECIAL_TOKENS)} special tokens and some text"
        )
    if isinstance(min_frequency, bool) or not isinstance(min_frequency, int) or min_frequency < 1:
        raise ValueError(f"min_frequency={min_frequency!r}; pass a whole number >= 1")
    settings = {"vocab_size": vocab_size, "lowercase": lowercase, "min_frequency": min_frequency,
                "format": _CACHE_FORMAT, "tokenizers": tokenizers.__version__}
    one_shot = isinstance(docs_or_texts, Iterator)
    counts: Counter[str] | None = None
    if one_shot:  # read once: count the words while fingerprinting the text
        texts = _Tee(iter_texts(docs_or_texts))
        counts = count_words(texts, lowercase)
        key = texts.digest(settings)
    else:
        key = _fingerprint(docs_or_texts, settings)
    folder = Path(cache_dir) / "tokenizers" if cache_dir else default_cache_dir()
    path = folder / f"wordpiece-{key}.json"
    if cache:
        cached = _load_verified(path)
        if cached is not None:
            return cached
    if counts is None:
        counts = count_words(docs_or_texts, lowercase)
    if not counts:
        raise EmptyCorpus("train_tokenizer(docs_or_texts)", "the corpus has no text",
                          "pass documents with sentences")

    tok = build_untrained_tokenizer(lowercase)
    tok.model = wordpiece_model(
        {t: i for i, t in enumerate(wordpiece_vocabulary(counts, vocab_size, min_frequency))})
    tok.add_special_tokens(list(SPECIAL_TOKENS))  # "[MASK]" typed in a text stays one token
    _add_post_processor(tok)
    if cache:
        _write_cache_entry(path, tok)
    return tok


def _write_cache_entry(path: Path, tok: Tokenizer) -> None:
    """Write a trained tokenizer and its digests into the cache; a write that fails only warns.

    The cache is a convenience: failing to fill it must not cost the tokenizer just trained.
    Nothing is flushed to disk: a file that a power cut leaves half written fails its digests on
    the next read and is trained again.
    """
    text = tok.to_str()
    digests = {"file_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
               "vocab_sha256": vocab_digest(tok)}
    target = path.parent
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        target = path
        _replace_file(path, text)
        target = path.with_suffix(".sha256")  # last: until it is in place, the entry is not used
        _replace_file(target, json.dumps(digests, indent=1))
    except OSError as exc:
        with contextlib.suppress(OSError):  # a file without its digests would only warn later
            path.unlink(missing_ok=True)
        warnings.warn(
            f"could not write the tokenizer cache {target} ({exc.strerror or exc}); the "
            f"tokenizer is trained and fine, only not cached, so the next call trains it again: "
            f"free some space on that disk, or set BERTLAB_CACHE (or pass cache_dir=) to a "
            f"folder you may write", stacklevel=3)


def _replace_file(path: Path, text: str) -> None:
    """Write `text` to a temporary file beside `path`, then rename it over `path` in one step,
    so a reader (another process using the same cache) sees the old file or the new one whole."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as handle:
            handle.write(text.encode("utf-8"))
        os.replace(tmp, path)
    except BaseException:  # a full disk, Ctrl-C: leave no temporary file behind
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


class _Tee:
    """Passes texts through while fingerprinting them (for one-shot iterators)."""

    def __init__(self, texts: Iterator[str]) -> None:
        self._texts, self._digest = texts, hashlib.blake2b(digest_size=16)

    def __iter__(self) -> Iterator[str]:
        for text in self._texts:
            self._digest.update(text.encode("utf-8"))
            self._digest.update(b"\x00")
            yield text

    def digest(self, settings: dict) -> str:
        final = hashlib.blake2b(digest_size=16)
        final.update(json.dumps(settings, sort_keys=True).encode())
        final.update(self._digest.digest())
        return final.hexdigest()


def save_tokenizer(tokenizer: Tokenizer, path: str | Path) -> Path:
    """Return the path of the JSON file the tokenizer was written to (atomically: temp file, then rename).

    `path` is a file name, or a folder (the file is then `tokenizer.json` inside it). A write
    that fails raises, naming the file (a full disk as one, the old file kept); read the file
    back with `bertlab.tokenizer.load_tokenizer`.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, tokenizer.to_str())


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Return the tokenizer saved at `path`: a tokenizer.json file, or a folder holding one.

    A Hugging Face model folder with only a vocab.txt also works (BERT's normalizer and
    templates are rebuilt around that vocabulary). A vocabulary without all five special tokens
    is an error.
    """
    path = Path(path)
    if path.is_dir():
        if (path / "tokenizer.json").is_file():
            path = path / "tokenizer.json"
        elif (path / "vocab.txt").is_file():
            return tokenizer_from_vocab(path / "vocab.txt")
        else:
            raise ValueError(
                f"folder '{path}' has neither tokenizer.json nor vocab.txt; "
                f"save a tokenizer there first (bertlab.tokenizer.save_tokenizer)"
            )
    if not path.is_file():
        raise ValueError(f"tokenizer file '{path}' does not exist; check the path")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:
        raise ValueError(
            f"'{path}' is not a tokenizers JSON file ({exc}); save one with "
            f"bertlab.tokenizer.save_tokenizer"
        ) from None
    special_ids(tok)  # fail early, with a clear message, if a special token is missing
    return tok


def tokenizer_from_vocab(vocab_file: str | Path, lowercase: bool = True) -> Tokenizer:
    """Return a BERT WordPiece tokenizer around an existing vocab.txt (one token per line, id = line)."""
    lines = Path(vocab_file).read_text(encoding="utf-8").splitlines()
    vocab = {token: i for i, token in enumerate(lines) if token}
    missing = [t for t in SPECIAL_TOKENS if t not in vocab]
    if missing:
        raise ValueError(
            f"vocabulary '{vocab_file}' lacks {', '.join(missing)}; BERT needs all of "
            f"{', '.join(SPECIAL_TOKENS)} (add them as lines of the file)"
        )
    tok = build_untrained_tokenizer(lowercase)
    tok.model = wordpiece_model(vocab)
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    _add_post_processor(tok)
    return tok


def encode_sentences(tokenizer: Tokenizer, sentences: Sequence[str]) -> list[list[int]]:
    """Return the token ids of each sentence, without [CLS]/[SEP] (batch-encoded in Rust)."""
    return [enc.ids for enc in tokenizer.encode_batch(list(sentences), add_special_tokens=False)]


def unk_rate(tokenizer: Tokenizer, sentences: Sequence[str]) -> float:
    """Return the share of tokens that are [UNK] when the sentences are encoded.

    Taught in notebooks/01_corpus_and_tokenizer.ipynb.
    """
    unk = tokenizer.token_to_id(UNK)
    total = hits = 0
    for ids in encode_sentences(tokenizer, sentences):
        total += len(ids)
        hits += sum(1 for i in ids if i == unk)
    return hits / max(1, total)


# --------------------------------------------------------------------------------------------
# Chinese: gold word segmentation -> one word id per token (for whole-word masking)

WordIds = list[int | None]


def _word_ids_one(encoding: Encoding, words: Sequence[Sequence[str]]) -> tuple[WordIds, int]:
    # Per sequence (A, and B for a pair): the gold word that owns each character of the text.
    char_word: list[list[int]] = []
    for seq_words in words:
        owner: list[int] = []
        for index, word in enumerate(seq_words):
            owner.extend([index] * len(word))
        char_word.append(owner)
    # Group the tokens of each WordPiece word (a pre-token: one CJK character, or a run of
    # letters/digits); its pieces are never separated.
    offsets = encoding.offsets  # each attribute access copies the list out of Rust: read once
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (special, seq, word) in enumerate(
        zip(encoding.special_tokens_mask, encoding.sequence_ids, encoding.word_ids, strict=True)
    ):
        if not special and seq is not None and word is not None:
            groups.setdefault((seq, word), []).append(i)
    keys: list[tuple[str, int, int] | None] = [None] * len(offsets)
    n_fallback = 0
    for (seq, word), tokens in groups.items():
        if seq >= len(char_word):
            raise ValueError(
                f"chinese_word_ids: the encoding has sequence {seq} but only {len(char_word)} "
                f"word list(s) were given; pass (words_a, words_b) for a pair"
            )
        start = min(offsets[i][0] for i in tokens)
        end = max(offsets[i][1] for i in tokens)
        if end > len(char_word[seq]):
            raise ValueError(
                f"chinese_word_ids: a token ends at character {end} but the words join to "
                f"{len(char_word[seq])} characters; encode exactly ''.join(words)"
            )
        gold = set(char_word[seq][start:end])
        if len(gold) == 1:
            key = ("gold", seq, gold.pop())
        else:  # the gold segmentation cuts through this WordPiece word: it becomes its own word
            key = ("wordpiece", seq, word)
            n_fallback += len(tokens)
        for i in tokens:
            keys[i] = key
    # Number the words 0, 1, 2, ... in order of appearance, continuing from A into B.
    numbering: dict[tuple[str, int, int], int] = {}
    ids: WordIds = [None if key is None else numbering.setdefault(key, len(numbering)) for key in keys]
    return ids, n_fallback


def _check_words(words: object) -> None:
    if isinstance(words, str) or not all(isinstance(w, str) for w in words):  # type: ignore[union-attr]
        raise ValueError(
            "chinese_word_ids: words must be a list of strings (one segmented sentence), "
            "e.g. ['我', '爱', '华中科技大学']"
        )


def chinese_word_ids(
    encoding: Encoding | Sequence[Encoding],
    words: Sequence[str] | tuple[Sequence[str], Sequence[str]] | Sequence[Sequence[str]],
) -> tuple[WordIds, int] | tuple[list[WordIds], int]:
    """Return (word id per token, number of fallback tokens): a gold segmentation mapped onto tokens.

    `encoding` comes from `tokenizer.encode("".join(words))`; its character offsets say which
    gold word each token lies in, so every character of 华中科技大学 gets the same id and
    whole-word masking masks the word at once. Ids count 0, 1, 2, ... in order of appearance;
    special tokens and padding get None. Robust to [UNK] tokens (they keep their offsets), to
    Latin/digit runs (all pieces of "2019" or "iphone" stay one word) and to gold words holding
    several pieces ("1998年"). Where the segmentation cuts through a WordPiece word (gold "P" +
    "30" but tokens "p ##30"), that WordPiece word becomes a word of its own: this is the
    fallback, and its tokens are counted in the second value (0 when everything lines up).

    A pair encoding takes `words=(words_a, words_b)` (a tuple). A batch takes a list of
    encodings and a list of word lists (or of tuples); it returns the list of id lists, which is
    what `mask_tokens(word_ids=...)` takes, and the total fallback count.

    Taught in notebooks/08_chinese_bert.ipynb.
    """
    if isinstance(encoding, Encoding):
        per_sequence = list(words) if isinstance(words, tuple) else [words]
        for seq_words in per_sequence:
            _check_words(seq_words)
        return _word_ids_one(encoding, per_sequence)
    encodings = list(encoding)
    batch_words = list(words)
    if len(encodings) != len(batch_words):
        raise ValueError(
            f"chinese_word_ids: {len(encodings)} encodings but {len(batch_words)} word lists; "
            f"pass one word list per encoding"
        )
    all_ids: list[WordIds] = []
    total = 0
    for enc, seq_words in zip(encodings, batch_words, strict=True):
        if not isinstance(enc, Encoding):
            raise ValueError(
                f"chinese_word_ids: expected tokenizers.Encoding objects, got {type(enc).__name__}"
            )
        ids, n_fallback = chinese_word_ids(enc, seq_words)
        all_ids.append(ids)
        total += n_fallback
    return all_ids, total


def check_tokenizer_fits(tokenizer: Tokenizer, vocab_size: int, where: str) -> None:
    """Raise ValueError unless `tokenizer` has exactly the model's `vocab_size` tokens.

    The one check for every place that pairs a model with a tokenizer: with fewer tokens the
    ids mean other words (silently wrong answers), with more they index past the embedding
    table. `where` names the input in the message.
    """
    check_type(tokenizer, Tokenizer, f"{where}(tokenizer)", "a tokenizers.Tokenizer",
               "pass the tokenizer the model was trained with")
    size = tokenizer.get_vocab_size()
    if size != vocab_size:
        raise ValueError(f"{where}: the tokenizer has {size} tokens but the model's vocabulary "
                         f"has {vocab_size}, so it is not the tokenizer the model was trained "
                         f"with; use that one (bertlab.load_model returns the model with its own)")


def check_same_vocabulary(tok: Tokenizer, name: str, reference: Tokenizer, reference_name: str,
                          fix: str) -> None:
    """Raise a ValueError naming both tokenizers unless they have the same vocabulary."""
    if tok.get_vocab() == reference.get_vocab():
        return
    size, other = tok.get_vocab_size(), reference.get_vocab_size()
    detail = (f"{size} vs {other} tokens" if size != other
              else f"both have {size} tokens, but not the same ones")
    raise ValueError(f"{name} is not the vocabulary of {reference_name}: {detail}; {fix}")
