"""Your own text files as `Document`s, read in bounded memory: a folder of .txt files or one BERT-format file.

Any of these files may be gzip-compressed (`name.txt.gz`); it is decompressed as it streams.

Files are read in blocks; a line longer than `MAX_LINE_CHARS` is cut at sentence ends or spaces,
and a document longer than `MAX_DOC_CHARS` is split into parts that keep the whole document's
split. Each cut raises a warning naming the file and counts in `READ_COUNTS`; no text is dropped.
Sub-folders holding bertlab's own output (runs, shards, exports) are skipped, and so are hidden
files and folders (names starting with "."), each with a warning and a count, and so is any other
file that is not .txt or .txt.gz (in any case: .TXT is text), by kind (another extension, a named
pipe). Links are followed, and each real file is read once: one that leads back into what is
being read (a loop, or a second way to a file or folder read already) is an error.
"""

from __future__ import annotations

import gzip
import os
import stat
import warnings
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from bertlab.artefacts import describe_kind, folder_kind
from bertlab.corpus import (
    SENTENCE_END,
    Document,
    paragraph_sentences,
    paragraphs,
    split_of,
    split_sentences,
)
from bertlab.errors import BadInput

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
READ_COUNTS = ("long_lines_split", "documents_split", "folders_skipped", "hidden_skipped",
               "files_skipped", "bad_rows_skipped")
# Sub-folders of a corpus folder that hold bertlab's own output, never training text.
ARTEFACT_KINDS = ("run", "shards", "hf", "checkpoint")


# What a file's first bytes say it is, when that is no UTF-8 text: (magic, what, the command that
# makes it readable; {name} is the file, {stem} its name without the compression suffix).
_NOT_UTF8 = (
    (b"\xff\xfe\x00\x00", "UTF-32 text (its byte-order mark is FF FE 00 00)",
     "iconv -f UTF-32 -t UTF-8 '{name}' > '{stem}.utf8.txt'"),
    (b"\x00\x00\xfe\xff", "UTF-32 text (its byte-order mark is 00 00 FE FF)",
     "iconv -f UTF-32 -t UTF-8 '{name}' > '{stem}.utf8.txt'"),
    (b"\xff\xfe", "UTF-16 text (its byte-order mark is FF FE)",
     "iconv -f UTF-16 -t UTF-8 '{name}' > '{stem}.utf8.txt'"),
    (b"\xfe\xff", "UTF-16 text (its byte-order mark is FE FF)",
     "iconv -f UTF-16 -t UTF-8 '{name}' > '{stem}.utf8.txt'"),
    (b"BZh", "bzip2-compressed", "bunzip2 -k '{name}'"),
    (b"\xfd7zXZ\x00", "xz-compressed", "unxz -k '{name}'"),
    (b"PK\x03\x04", "a zip archive", "unzip '{name}' -d '{stem}'"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed", "unzstd '{name}'"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive", "7z x '{name}'"),
)


def check_text_bytes(head: bytes, name: str) -> None:
    """Raise ValueError when a file's first bytes say it is UTF-16 or UTF-32 text, or compressed
    by anything but gzip (which is read): decoded as UTF-8, even with errors="replace", it would
    be text full of NULs or noise. The message gives the command that converts it."""
    for magic, what, command in _NOT_UTF8:
        if head.startswith(magic):
            stem = Path(name).name.rsplit(".", 1)[0] if "." in Path(name).name else Path(name).name
            fix = command.format(name=name, stem=str(Path(name).with_name(stem)))
            raise ValueError(f"file '{name}' is {what}, not UTF-8 text, and read as UTF-8 (even "
                             f"with --encoding-errors replace) it would be noise; convert it "
                             f"first, e.g. `{fix}`, and pass what that writes")


def decode_utf8(data: bytes, name: str, errors: str, offset: int = 0) -> str:
    """Return `data` decoded as UTF-8; `offset` is where `data` starts in the file (for the error).
    At offset 0 the first bytes are checked first (`check_text_bytes`)."""
    if offset == 0:
        check_text_bytes(data[:8], name)
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"file '{name}' is not valid UTF-8 at byte offset {offset + exc.start} "
            f"(bytes {data[exc.start:exc.start + 4]!r}); convert it to UTF-8, or pass "
            f"errors='replace' (--encoding-errors replace) to load it with U+FFFD in place of "
            f"the bad bytes"
        ) from None


def open_binary(path: Path) -> IO[bytes]:
    """Return `path` opened for reading bytes, decompressed as it is read if its name ends in .gz."""
    if path.name.lower().endswith(".gz"):
        return gzip.open(path, "rb")
    return path.open("rb")


def file_stem(path: Path) -> str:
    """Return a file's name without its format suffix and a .gz after it ("news.jsonl.gz" -> "news")."""
    name = path.name[:-3] if path.name.lower().endswith(".gz") else path.name
    return Path(name).stem


def _read_text(path: Path, errors: str) -> str:
    return decode_utf8(path.read_bytes(), str(path), errors)


def document_from_text(doc_id: str, raw: str, label: str | None, title_first_line: bool) -> Document:
    """Return the `Document` of one whole file's text (any line ends; the first line as title if asked)."""
    raw = raw.replace("\r\n", "\n").replace("\r", "\n").strip()
    title = None
    body = raw
    if title_first_line:
        first, _, rest = raw.partition("\n")
        title, body = first.strip() or None, rest.strip()
    return Document(id=doc_id, text=body, sentences=split_sentences(body), label=label, title=title)


def document_part(
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


def _cut_point(line: str, start: int, limit: int) -> int:
    """Return where to end the piece of `line` that begins at `start` (at most `limit` characters).

    After the last sentence end in the second half of the window, else at its last space, else
    (no space: a run of Chinese without punctuation, a base64 blob) right at the limit.
    """
    low, end = start + limit // 2, start + limit
    cut = 0
    # endpos one past the window lets the lookahead see the space after a final full stop.
    for match in SENTENCE_END.finditer(line, low, end + 1):
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
    too (as `document_from_text` reads a whole file). A line longer than `MAX_LINE_CHARS` comes
    in pieces of at most that many characters (`_cut_point`), each with cut=True, and counts in
    `report.lines_cut`. So the memory held is one block plus one piece, however long the line.
    """
    limit = MAX_LINE_CHARS
    pending = ""  # the start of a line whose end has not been read yet
    pending_cut = False  # pieces of the pending line were yielded already
    carry = b""  # the first bytes of a character that the block boundary split
    offset = 0  # where `carry` starts in the file
    with open_binary(path) as handle:
        while True:
            try:
                block = handle.read(_BLOCK_BYTES)
            except (OSError, EOFError, zlib.error) as exc:  # a damaged or cut-off .gz
                raise ValueError(f"file '{path}' cannot be read ({exc}); if it is gzip-"
                                 f"compressed, check that it is whole (`gzip -t`)") from None
            final = not block
            data = carry + block
            keep = 0 if final else _utf8_tail(data)
            text = pending + decode_utf8(data[: len(data) - keep], str(path), errors, offset)
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


@dataclass
class _Walk:
    """What walking a corpus folder met: what it skipped, by kind, and what it read."""

    skipped: list[str] = field(default_factory=list)  # bertlab folders, as "'path' (kind)"
    hidden: list[str] = field(default_factory=list)
    hidden_count: int = 0
    read: dict[str, Path] = field(default_factory=dict)  # real path of each folder -> as read
    files: dict[object, str] = field(default_factory=dict)  # identity of each file read -> path
    other: dict[str, list[str]] = field(default_factory=dict)  # kind of file skipped -> paths
    suffixes: set[str] = field(default_factory=set)  # of the files skipped for their name


def is_text_name(name: str) -> bool:
    """Return True for a name a folder reads as text: .txt or .txt.gz, in any case (.TXT)."""
    return name.lower().endswith((".txt", ".txt.gz"))


def _enter(path: Path, walk: _Walk) -> None:
    """Note that folder `path` is read; raise if a link made it a folder that is read already."""
    real = os.path.realpath(path)
    if real in walk.read:
        raise ValueError(
            f"corpus folder: '{path}' leads to '{real}', which is already read as "
            f"'{walk.read[real]}' (a link that loops back, or a second way to the same text, "
            f"which would be read twice); remove the link or move the text"
        )
    walk.read[real] = path


def _check_name(folder: Path, name: str) -> None:
    """Raise if `name` (in `folder`) is not UTF-8: it would become a document id or a label."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise BadInput(
            f"corpus folder '{folder}'", f"the name {os.fsencode(name)!r} is not valid UTF-8, and "
            f"file and folder names become document ids and labels",
            "rename it in UTF-8 (e.g. `convmv -f latin1 -t utf-8 --notest -r FOLDER`)") from None


def _claim(path: Path, info: os.stat_result, walk: _Walk) -> None:
    """Note that file `path` is read; raise if a link (or a hard link) reached it already."""
    # The device and inode say which real file a path reaches, through symbolic and hard links.
    key: object = (info.st_dev, info.st_ino) if info.st_ino else os.path.realpath(path)
    if key in walk.files:
        raise BadInput(
            f"corpus folder: '{path}'", f"it is the same file as '{walk.files[key]}' (reached "
            f"through a link), and reading it twice could put one text in both train and "
            f"validation", "delete the link, or keep one copy of the text")
    walk.files[key] = str(path)


def _skip_kind(name: str, mode: int) -> str | None:
    """Return why a folder entry that is not a folder is not read (None: it is read as text)."""
    if stat.S_ISREG(mode):
        return None if is_text_name(name) else "with another extension"
    if stat.S_ISFIFO(mode):
        return "named pipe"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "device or other special file"


def _txt_files(folder: Path, walk: _Walk, counts: dict[str, int]) -> Iterator[Path]:
    """Yield the .txt (and .txt.gz) files under `folder` in sorted path order, each real file once.

    The walk visits each folder's entries sorted by name, which is exactly the order of
    `sorted(folder.rglob("*.txt"))`, without holding the whole tree's listing. Links to folders
    and files are followed; a folder or a file reached a second time (`_enter`, `_claim`) and a
    link to nothing are errors. Hidden entries (".ipynb_checkpoints", ".DS_Store") are skipped
    and counted, and so is every other file that is not text (another extension, a named pipe),
    by kind in `walk`. A sub-folder that `folder_kind` recognises as a run, shards, a Hugging
    Face export or a checkpoint is skipped with a warning: its files (docs.txt, vocab.txt) are
    bertlab's output, and reading them back would make them training text.
    """
    with os.scandir(folder) as scan:
        entries = sorted(scan, key=lambda entry: os.path.normcase(entry.name))
    for entry in entries:
        path = Path(entry.path)
        if entry.name.startswith("."):
            if len(walk.hidden) < 3:  # the first few are named, all are counted
                walk.hidden.append(str(path))
            walk.hidden_count += 1
            counts["hidden_skipped"] += 1
        elif entry.is_dir():
            kind = folder_kind(path)
            if kind in ARTEFACT_KINDS:
                walk.skipped.append(f"'{path}' ({describe_kind(kind)})")
                counts["folders_skipped"] += 1
                warnings.warn(f"corpus folder: skipped '{path}': it holds {describe_kind(kind)}, "
                              f"not text; move it out of the corpus folder to silence this",
                              stacklevel=2)
                continue
            _check_name(folder, entry.name)
            _enter(path, walk)
            yield from _txt_files(path, walk, counts)
        elif entry.is_symlink() and not path.exists():
            raise ValueError(f"corpus folder: '{path}' is a link to '{os.readlink(path)}', which "
                             f"does not exist; fix the link or delete it")
        else:
            info = entry.stat()
            skip = _skip_kind(entry.name, info.st_mode)
            if skip is None:
                _check_name(folder, entry.name)
                _claim(path, info, walk)
                yield path
                continue
            walk.other.setdefault(skip, []).append(str(path))
            if skip == "with another extension":
                walk.suffixes.add(_suffix(entry.name))
            counts["files_skipped"] += 1


def _suffix(name: str) -> str:
    """Return a file's extension as shown in a report: ".md", ".jsonl.gz", "no extension"."""
    gz = name.lower().endswith(".gz") and name.count(".") > 1
    suffix = Path(name[:-3] if gz else name).suffix
    return (suffix + name[-3:] if gz else suffix) or "no extension"


def skipped_files(walk: _Walk) -> str:
    """Return what `walk` skipped that was neither hidden nor bertlab output, by kind ("" if none).

    E.g. "3 file(s): 2 with another extension (.md, .jsonl), 1 named pipe ('c/p.txt')".
    """
    total = sum(len(paths) for paths in walk.other.values())
    if not total:
        return ""
    parts = []
    for kind, paths in sorted(walk.other.items()):
        if kind == "with another extension":
            shown = ", ".join(sorted(walk.suffixes)[:5]) + (", ..." if len(walk.suffixes) > 5 else "")
        else:
            shown = ", ".join(f"'{p}'" for p in paths[:3]) + (", ..." if len(paths) > 3 else "")
        parts.append(f"{len(paths)} {kind} ({shown})")
    return f"{total} file(s): " + ", ".join(parts)


def _note_skipped(folder: Path, walk: _Walk) -> None:
    if walk.other:
        warnings.warn(f"corpus folder '{folder}': skipped {skipped_files(walk)}; a folder reads "
                      f".txt and .txt.gz files as text: rename a text file to .txt to read it (a "
                      f".jsonl, .csv or .parquet file of rows is a corpus of its own: pass it as "
                      f"--corpus FILE)", stacklevel=3)


def folder_contents(folder: Path) -> tuple[int, str]:
    """Return how many text files the walk of `folder` reads, and what it skips (`skipped_files`)."""
    walk = _Walk()
    _enter(folder, walk)
    counts = dict.fromkeys(READ_COUNTS, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the corpus's own walk warns about the same entries
        found = sum(1 for _ in _txt_files(folder, walk, counts))
    return found, skipped_files(walk)


def _note_hidden(folder: Path, walk: _Walk) -> None:
    if walk.hidden_count:
        names = ", ".join(f"'{Path(p).relative_to(folder)}'" for p in walk.hidden)
        more = f" and {walk.hidden_count - len(walk.hidden)} more" if walk.hidden_count > 3 else ""
        warnings.warn(f"corpus folder '{folder}': skipped {walk.hidden_count} hidden file(s) or "
                      f"folder(s) ({names}{more}): names starting with '.' are editor, notebook "
                      f"or system files, not text; rename one without the '.' to read it",
                      stacklevel=3)


def iter_folder(folder: Path, errors: str, counts: dict[str, int]) -> Iterator[Document]:
    """Yield one document per .txt file under `folder` (id: the relative path without .txt).

    The label of a file is the sub-folder of `folder` it lies under, however deep
    (`tech/2004/a.txt` is labelled "tech"); a file directly in `folder` has none. A file of
    more than MAX_DOC_CHARS bytes, and any .txt.gz, streams and may come in parts
    (`_iter_long_file`). A file without a sentence, and a folder without a .txt file, are errors;
    what the walk skipped (`_txt_files`) is reported in one warning at the end.
    """
    walk = _Walk()
    _enter(folder, walk)
    found = False
    for path in _txt_files(folder, walk, counts):
        found = True
        rel = (path.parent / file_stem(path)).relative_to(folder).as_posix()
        label = rel.split("/", 1)[0] if "/" in rel else None
        report = _FileReport()
        if not path.name.lower().endswith(".gz") and path.stat().st_size <= MAX_DOC_CHARS:
            # n bytes of UTF-8 are at most n characters
            docs: Iterable[Document] = [
                document_from_text(rel, _read_text(path, errors), label, title_first_line=False)
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
    _note_hidden(folder, walk)
    _note_skipped(folder, walk)
    if not found:
        also = [*walk.skipped, *(f"'{p}' (hidden)" for p in walk.hidden)]
        if walk.other:
            also.append(skipped_files(walk))
        also_text = f" (skipped {', '.join(also)})" if also else ""
        raise ValueError(
            f"corpus folder '{folder}' has no .txt files{also_text}; put one document per .txt "
            f"file in it"
        )


def _iter_long_file(
    path: Path, rel: str, label: str | None, errors: str, report: _FileReport
) -> Iterator[Document]:
    """Yield the documents of a folder file too large to read whole (more than MAX_DOC_CHARS bytes).

    The file streams line by line (`_iter_lines`); paragraphs (`paragraphs`) collect into a
    document until it holds MAX_DOC_CHARS characters, which is then yielded as a part (ids
    "rel#1", "rel#2", ..., all in the split of "rel"). Cutting between paragraphs gives the same
    sentences as splitting the whole text. Text that fits in one document after all (multi-byte
    characters) gives exactly the document `document_from_text` makes of the whole file.
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
    for paragraph, use_zh in paragraphs(lines(), "auto", MAX_LINE_CHARS):
        if chars >= MAX_DOC_CHARS:
            part += 1
            yield document_part(rel, part, sentences, "\n".join(texts), label)
            texts, sentences, chars = [], [], 0
            keep_raw = False
            raw_lines.clear()
        texts.append(paragraph)
        sentences.extend(paragraph_sentences(paragraph, use_zh))
        chars += len(paragraph)
    if part:
        report.documents_split += 1
        yield document_part(rel, part + 1, sentences, "\n".join(texts), label)
    elif keep_raw and not report.lines_cut:
        yield document_from_text(rel, "\n".join(raw_lines), label, title_first_line=False)
    else:
        yield document_part(rel, 0, sentences, "\n".join(texts), label)


def iter_bert_file(path: Path, errors: str, counts: dict[str, int]) -> Iterator[Document]:
    """Yield the documents of a file in BERT's pretraining format, with ids "name/0", "name/1", ...

    The format of Google's create_pretraining_data.py: one sentence per line, a blank line
    between documents. Read in blocks (`_iter_lines`), so a file larger than memory streams; documents are numbered
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
                yield document_part(f"{file_stem(path)}/{index}", part + 1 if part else 0, sentences,
                                     "\n".join(sentences))
                sentences, chars, index, part = [], 0, index + 1, 0
            continue
        for sentence in split_sentences(line) if cut else [line]:
            if chars >= MAX_DOC_CHARS:
                part += 1
                if part == 1:
                    report.documents_split += 1
                yield document_part(f"{file_stem(path)}/{index}", part, sentences, "\n".join(sentences))
                sentences, chars = [], 0
            sentences.append(sentence)
            chars += len(sentence)
    if sentences:
        yield document_part(f"{file_stem(path)}/{index}", part + 1 if part else 0, sentences,
                             "\n".join(sentences))
    _note_cuts(path, report, counts)
