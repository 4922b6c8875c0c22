"""The corpus: `Document`, the record every corpus is made of, its split, and its sentences.

Read top to bottom:

- `Document`: one document's body split into sentences, with an optional title, label and gold
  word segmentation. Its train / validation / test split comes from `split_of`, a stable hash of
  its id, so a document keeps its split whatever else is loaded; `split_documents` groups a list
  of documents by split.
- `split_sentences`: English and Chinese sentence splitting by rules, not a model.
  `paragraphs` and `paragraph_sentences` are the same steps for a stream of lines.

Reading text into Documents (the named corpora "bbc", "zh-news" and "zh-reviews", or your own
files) is `bertlab.load_corpus`, in `bertlab.readers`.

Taught in notebooks/01_corpus_and_tokenizer.ipynb.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

# --------------------------------------------------------------------------------------------
# Documents and their train / validation / test split

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


# --------------------------------------------------------------------------------------------
# Sentence splitting: `split_sentences` and the rules behind it
#
# A sentence ends at . ! ? (English, with exceptions for abbreviations, initials and numbers) or
# at 。！？ (Chinese); paragraphs that a lost line break cut in two are joined again.
# `bertlab.textfiles` reads files larger than memory through `paragraphs` and
# `paragraph_sentences`, the same steps for a stream of lines.

# Words after which a full stop does not end a sentence.
_ABBREVIATIONS = {
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "vs", "inc", "ltd", "co",
    "corp", "gov", "gen", "col", "lt", "sgt", "capt", "rev", "hon", "approx",
    "dept", "est", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov",
    "dec", "mon", "tue", "wed", "thu", "fri", "sat", "sun", "e.g", "i.e", "cf", "al", "ave",
}
# Abbreviations only when a number follows: "No. 10", but "He said: No. Then he left."
_NUMBER_ABBREVIATIONS = {"no", "nos", "fig", "vol", "pp"}
_CLOSERS = "\"'”’)]}»"
_OPENERS = "\"'“‘([{«"
# A candidate boundary: . ! ? (possibly repeated), then closing quotes/brackets, then whitespace.
_EN_BOUNDARY = re.compile(r"[.!?]+[" + re.escape(_CLOSERS) + r"]*(?=\s+)")


def _ends_with_abbreviation(text_before: str, rest: str) -> bool:
    word = re.search(r"([A-Za-z][A-Za-z.]*)\.$", text_before)
    if word is None:
        return False
    token = word.group(1).lower()
    if token in _NUMBER_ABBREVIATIONS:
        return rest[:1].isdigit()
    # "U.S." and "p.m." style initialisms, single capital initials ("J. Smith"), known abbreviations.
    return token in _ABBREVIATIONS or "." in token or len(token) == 1


def _split_english(text: str) -> list[str]:
    sentences: list[str] = []
    start = 0
    for match in _EN_BOUNDARY.finditer(text):
        end = match.end()
        rest = text[end:].lstrip()
        if match.group().rstrip(_CLOSERS) == ".":
            if _ends_with_abbreviation(text[start : match.start() + 1], rest):
                continue
        # The next sentence must start like one: a capital, a digit or an opening quote/bracket.
        if rest and not (rest[0].isupper() or rest[0].isdigit() or rest[0] in _OPENERS):
            continue
        sentences.append(text[start:end].strip())
        start = end
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return _merge_fragments(sentences)


def _merge_fragments(sentences: list[str]) -> list[str]:
    # A piece with no letter or digit (a stray closing quote, a lone ".") belongs to the sentence
    # before it; it is never a sentence of its own.
    out: list[str] = []
    for sentence in sentences:
        if out and not any(ch.isalnum() for ch in sentence):
            out[-1] = f"{out[-1]} {sentence}"
        else:
            out.append(sentence)
    return out


_ZH_FINAL = "。！？!?"
ZH_CLOSERS = "”’」』）)》"
_ZH_BOUNDARY = re.compile(f"[{_ZH_FINAL}]+[{ZH_CLOSERS}]*")
# A note in full-width brackets at the very end of a paragraph: a dateline, a photo credit.
ZH_TRAILING_NOTE = re.compile(r"（[^（）]*）$")


def _split_chinese(text: str) -> list[str]:
    sentences: list[str] = []
    start = 0
    for match in _ZH_BOUNDARY.finditer(text):
        piece = text[start : match.end()].strip()
        if piece:
            sentences.append(piece)
        start = match.end()
    tail = text[start:].strip()
    if tail:
        # "谢谢！（新华社北京１２月３１日电）": a closing bracketed note stays with its sentence.
        if sentences and ZH_TRAILING_NOTE.fullmatch(tail):
            sentences[-1] += tail
        else:
            sentences.append(tail)
    return _merge_fragments(sentences)


_CJK_CHAR = re.compile("[\u4e00-\u9fff]")
_SPACE_CHAR = re.compile(r"\s")  # in a str pattern: exactly the characters where str.isspace()


def _looks_chinese(text: str) -> bool:
    # Counted by regex, not per character in Python: this runs on every line of every corpus.
    cjk = len(_CJK_CHAR.findall(text))
    return cjk > 0.3 * max(1, len(text) - len(_SPACE_CHAR.findall(text)))


def _continues_previous(paragraph: str) -> bool:
    # Some BBC paragraphs break mid-sentence where the web page had a link (the linked name is
    # gone): "... medallist" / "rounded off a useful weekend". Such a paragraph starts with a
    # lower-case letter or with punctuation, which a real paragraph never does.
    return paragraph[0].islower() or paragraph[0] in ".,;:!?)]"


def split_sentences(text: str, lang: str = "auto") -> list[str]:
    """Return the sentences of `text`, each stripped, in order.

    English: a sentence ends at . ! ? followed by space and a capital, digit or opening quote,
    except after abbreviations ("Mr.", "U.S.", "e.g.", "No. 10"), initials ("J. Smith") and
    inside numbers ("3.5%"). Closing quotes and brackets stay with their sentence; a piece with
    no letter or digit joins the sentence before it. A paragraph that starts in lower case or
    with punctuation continues the previous one. Chinese: a sentence ends at 。！？ plus any
    closing quotes or brackets; a bracketed note at the end of a paragraph stays with the last
    sentence. `lang` is "en", "zh" or "auto" (decided per paragraph by the share of CJK
    characters). Known limit: "in the U.S. The ..." stays one sentence.

    Taught in notebooks/01_corpus_and_tokenizer.ipynb.
    """
    if lang not in ("en", "zh", "auto"):
        raise ValueError(f"split_sentences: lang={lang!r} is not supported; use 'en', 'zh' or 'auto'")
    return [s for paragraph, use_zh in paragraphs(text.split("\n"), lang)
            for s in paragraph_sentences(paragraph, use_zh)]


def paragraphs(
    lines: Iterable[str], lang: str, max_chars: int | None = None
) -> Iterator[tuple[str, bool]]:
    """Yield (paragraph, is Chinese) for lines of text, as `split_sentences` groups them.

    A line that continues the one before (`_continues_previous`) joins it, unless `max_chars`
    is given and the joined paragraph would be longer: streamed files pass it, so a paragraph
    stays bounded even when every line starts in lower case. One paragraph is held back (the
    next line may continue it), so the lines may be a stream.
    """
    held: tuple[str, bool] | None = None
    for raw in lines:
        use_zh = lang == "zh" or (lang == "auto" and _looks_chinese(raw))
        paragraph = raw.strip() if use_zh else " ".join(raw.split())
        if not paragraph:
            continue
        if (held is not None and not use_zh and not held[1] and _continues_previous(paragraph)
                and (max_chars is None or len(held[0]) + 1 + len(paragraph) <= max_chars)):
            joiner = "" if not paragraph[0].isalnum() else " "
            held = (held[0] + joiner + paragraph, False)
            continue
        if held is not None:
            yield held
        held = (paragraph, use_zh)
    if held is not None:
        yield held


def paragraph_sentences(paragraph: str, use_zh: bool) -> list[str]:
    """Return the sentences of one paragraph from `paragraphs`, by the Chinese or English rules."""
    return _split_chinese(paragraph) if use_zh else _split_english(paragraph)


# Where a sentence may end, English (a space must follow) or Chinese: a long line is cut there.
SENTENCE_END = re.compile(
    r"[.!?]+[" + re.escape(_CLOSERS) + r"]*(?=\s)|[" + _ZH_FINAL + "]+[" + ZH_CLOSERS + "]*"
)
