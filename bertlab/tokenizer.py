"""WordPiece tokenizers trained with the `tokenizers` library (Rust), cached on disk.

Taught in notebooks/01_corpus_and_tokenizer.ipynb.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from bertlab.corpus import Document

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)  # ids 0..4, in this order, in every bertlab vocabulary

# Bump when the way a tokenizer is built changes, so stale cache entries are not reused.
_CACHE_FORMAT = 1


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
    """Return the special-token ids of `tokenizer` (a `SpecialIds` passes through unchanged)."""
    if isinstance(tokenizer, SpecialIds):
        return tokenizer
    if not isinstance(tokenizer, Tokenizer):
        raise TypeError(
            f"expected a tokenizers.Tokenizer or bertlab.SpecialIds, got {type(tokenizer).__name__}"
        )
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


def _texts(docs_or_texts: Iterable[Document | str]) -> Iterator[str]:
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


def build_untrained_tokenizer(lowercase: bool = True) -> Tokenizer:
    """Return an empty WordPiece tokenizer with BERT's normalizer, pre-tokenizer and templates."""
    tok = Tokenizer(models.WordPiece(unk_token=UNK, continuing_subword_prefix="##", max_input_chars_per_word=200))
    # Clean text, put spaces around CJK characters (so each becomes its own word), lowercase and
    # strip accents together, as Google's BasicTokenizer does.
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=lowercase, lowercase=lowercase
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def _add_post_processor(tok: Tokenizer) -> None:
    cls_id, sep_id = tok.token_to_id(CLS), tok.token_to_id(SEP)
    # Segment ids: 0 for [CLS] A [SEP], 1 for B [SEP].
    tok.post_processor = processors.TemplateProcessing(
        single=f"{CLS}:0 $A:0 {SEP}:0",
        pair=f"{CLS}:0 $A:0 {SEP}:0 $B:1 {SEP}:1",
        special_tokens=[(CLS, cls_id), (SEP, sep_id)],
    )


def default_cache_dir() -> Path:
    """Return the folder where trained tokenizers are cached ($BERTLAB_CACHE or ~/.cache/bertlab)."""
    env = os.environ.get("BERTLAB_CACHE")
    if env:
        return Path(env) / "tokenizers"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "bertlab" / "tokenizers"


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

    Special tokens come first: [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4. The cache key is a
    fingerprint of the text plus every setting, so the same corpus and settings load in a
    fraction of a second the second time, and any change retrains.

    Taught in notebooks/01_corpus_and_tokenizer.ipynb.
    """
    if vocab_size < len(SPECIAL_TOKENS) + 1:
        raise ValueError(f"vocab_size={vocab_size} is too small; it needs room for the special tokens and text")
    texts = list(_texts(docs_or_texts))
    if not any(t.strip() for t in texts):
        raise ValueError("train_tokenizer: the corpus has no text; pass documents with sentences")

    fingerprint = hashlib.blake2b(digest_size=16)
    settings = {"vocab_size": vocab_size, "lowercase": lowercase, "min_frequency": min_frequency,
                "format": _CACHE_FORMAT}
    fingerprint.update(json.dumps(settings, sort_keys=True).encode())
    for text in texts:
        fingerprint.update(text.encode("utf-8"))
        fingerprint.update(b"\x00")
    path = Path(cache_dir) / "tokenizers" if cache_dir else default_cache_dir()
    path = path / f"wordpiece-{fingerprint.hexdigest()}.json"
    if cache and path.is_file():
        try:
            return Tokenizer.from_file(str(path))
        except Exception:  # a damaged cache entry is retrained, never trusted
            path.unlink(missing_ok=True)

    tok = build_untrained_tokenizer(lowercase)
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        continuing_subword_prefix="##",
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    _add_post_processor(tok)
    if cache:
        save_tokenizer(tok, path)
    return tok


def save_tokenizer(tokenizer: Tokenizer, path: str | Path) -> Path:
    """Write the tokenizer as one JSON file (atomically: a temp file, then rename); return the path."""
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    os.close(fd)
    try:
        tokenizer.save(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Return the tokenizer saved at `path`: a tokenizer.json file, or a folder holding one.

    A Hugging Face model folder with only a vocab.txt also works (BERT's normalizer and
    templates are rebuilt around that vocabulary).
    """
    path = Path(path)
    if path.is_dir():
        if (path / "tokenizer.json").is_file():
            path = path / "tokenizer.json"
        elif (path / "vocab.txt").is_file():
            return tokenizer_from_vocab(path / "vocab.txt")
        else:
            raise ValueError(f"folder '{path}' has neither tokenizer.json nor vocab.txt; save a tokenizer there first")
    if not path.is_file():
        raise ValueError(f"tokenizer file '{path}' does not exist")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:
        raise ValueError(f"'{path}' is not a tokenizers JSON file ({exc})") from None
    special_ids(tok)  # fail early, with a clear message, if a special token is missing
    return tok


def tokenizer_from_vocab(vocab_file: str | Path, lowercase: bool = True) -> Tokenizer:
    """Return a BERT WordPiece tokenizer around an existing vocab.txt (one token per line, id = line)."""
    lines = Path(vocab_file).read_text(encoding="utf-8").splitlines()
    vocab = {token: i for i, token in enumerate(lines) if token}
    tok = build_untrained_tokenizer(lowercase)
    tok.model = models.WordPiece(vocab=vocab, unk_token=UNK, continuing_subword_prefix="##", max_input_chars_per_word=200)
    tok.add_special_tokens([t for t in SPECIAL_TOKENS if t in vocab])
    _add_post_processor(tok)
    return tok


def encode_sentences(tokenizer: Tokenizer, sentences: Sequence[str]) -> list[list[int]]:
    """Return the token ids of each sentence, without [CLS]/[SEP] (batch-encoded in Rust)."""
    return [enc.ids for enc in tokenizer.encode_batch(list(sentences), add_special_tokens=False)]


def unk_rate(tokenizer: Tokenizer, sentences: Sequence[str]) -> float:
    """Return the share of tokens that are [UNK] when the sentences are encoded."""
    unk = tokenizer.token_to_id(UNK)
    total = hits = 0
    for ids in encode_sentences(tokenizer, sentences):
        total += len(ids)
        hits += sum(1 for i in ids if i == unk)
    return hits / max(1, total)
