"""Structured text as `Document`s, streamed a row at a time: JSON Lines, CSV, TSV, Parquet, and rows in Python.

A row's text field (`RowFields.text`, "text" unless told) is one document, split into sentences
exactly as a .txt file of a folder is. With `RowFields.doc`, consecutive rows that share that
field's value form one document, in order (a paragraph each); a value that comes back after
another one is an error, so only one document is ever held. `RowFields.label` names the field
that labels a document (for fine-tuning). Files may be gzip-compressed (`news.jsonl.gz`);
Parquet needs the optional `pyarrow` (`pip install bertlab[parquet]`).

A bad row (invalid JSON, a field that is missing, not a string or empty) is an error that
names its record number, its line and how it begins; with `on_bad_row="skip"` it is skipped
instead, counted in `bad_rows_skipped` and reported in a warning. No row is dropped silently.

Memory: one record (a JSON line, a CSV record, a Parquet batch of rows) and the document being
built; a document longer than `MAX_DOC_CHARS` is yielded in parts at row (or, within one huge
row, paragraph) boundaries, in the split of the whole, as `bertlab.textfiles` does.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import warnings
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertlab.corpus import Document
from bertlab.errors import BadInput
from bertlab.textfiles import (
    MAX_DOC_CHARS,
    decode_utf8,
    document_from_text,
    document_part,
    file_stem,
    open_binary,
)

# File suffixes (before an optional .gz) read as rows, and the format each names.
ROW_FORMATS = {".jsonl": "JSON Lines", ".ndjson": "JSON Lines", ".csv": "CSV", ".tsv": "TSV",
               ".parquet": "Parquet"}
BAD_ROW_CHOICES = ("error", "skip")
_EXCERPT_CHARS = 60  # how much of a bad row's first line an error shows
_PARQUET_BATCH_ROWS = 1024


@dataclass(frozen=True)
class RowFields:
    """Which fields of a row hold the text, the document it belongs to and its label."""

    text: str = "text"
    doc: str | None = None
    label: str | None = None
    on_bad_row: str = "error"

    def check(self) -> None:
        """Raise ValueError, naming the setting and the fix, unless every setting is usable."""
        if self.on_bad_row not in BAD_ROW_CHOICES:
            raise ValueError(f"on_bad_row={self.on_bad_row!r} (--on-bad-row); use 'error' to stop "
                             f"at the first bad row or 'skip' to skip and count bad rows")
        for flag, name in (("text_field", self.text), ("doc_field", self.doc),
                           ("label_field", self.label)):
            if name is not None and (not isinstance(name, str) or not name.strip()):
                raise ValueError(f"{flag}={name!r} (--{flag.replace('_', '-')}): pass the name "
                                 f"of a field of the rows")

    def is_default(self) -> bool:
        """Return True when no field was asked for (what a folder of .txt files can honour)."""
        return self.text == "text" and self.doc is None and self.label is None


def row_format(path: Path) -> str | None:
    """Return the format ("CSV", ...) a file's name says it holds as rows, or None (plain text)."""
    name = path.name.lower()
    name = name[:-3] if name.endswith(".gz") else name
    return ROW_FORMATS.get(Path(name).suffix)


class _BadRow(Exception):
    """A row that cannot be read: `str(exc)` says why."""


@dataclass
class _Row:
    """One record as read: its number (from 1), the line it starts on (or None) and how it begins."""

    number: int
    line: int | None
    first_line: Any  # the record's first line, or the item itself (shown by its repr)
    values: Any  # a mapping of field -> value, a str (the text itself), a Document or a _BadRow

    def where(self) -> str:
        """Return "record N (line L: 'how it begins...')", to find the row by."""
        shown = self.first_line if isinstance(self.first_line, str) else repr(self.first_line)
        first = shown.strip().split("\n", 1)[0]
        cut = first[:_EXCERPT_CHARS] + ("..." if len(first) > _EXCERPT_CHARS else "")
        line = f"line {self.line}: " if self.line is not None else ""
        return f"record {self.number} ({line}{cut!r})"


def _missing_field(label: str, flag: str, name: str, found: Iterable[str]) -> ValueError:
    names = ", ".join(repr(f) for f in found) or "none"
    return ValueError(f"{label} has no field {name!r} ({flag}); the fields it has are {names}: "
                      f"pass {flag} with one of them")


def _check_fields(label: str, fields: RowFields, found: list[str]) -> None:
    """Raise if a field asked for is not among the `found` ones (a header, a schema, a first row)."""
    for flag, name in (("--text-field", fields.text), ("--doc-field", fields.doc),
                       ("--label-field", fields.label)):
        if name is not None and name not in found:
            raise _missing_field(label, flag, name, found)


# --------------------------------------------------------------------------------------------
# Readers: each yields _Row, one record at a time


def _text_stream(path: Path, errors: str, newline: str | None) -> io.TextIOWrapper:
    # utf-8-sig: spreadsheets often start a CSV with a byte-order mark, which is no part of the header.
    return io.TextIOWrapper(open_binary(path), encoding="utf-8-sig", errors=errors, newline=newline)


def _jsonl_rows(path: Path, errors: str) -> Iterator[_Row]:
    number = offset = 0
    with open_binary(path) as handle:
        for line_number, data in enumerate(handle, 1):
            # Decoded line by line, so a byte that is not UTF-8 is named by its offset.
            line = decode_utf8(data, str(path), errors, offset)
            line = line.removeprefix("\ufeff") if line_number == 1 else line  # a byte-order mark
            offset += len(data)
            if not line.strip():
                continue
            number += 1
            try:
                values = json.loads(line)
            except json.JSONDecodeError as exc:
                # json's own message may end in "at" ("Invalid control character at").
                values = _BadRow(f"is not valid JSON ({exc.msg.removesuffix(' at')} at column "
                                 f"{exc.colno})")
            if not isinstance(values, (dict, _BadRow)):
                values = _BadRow(f"is a JSON {type(values).__name__}, not an object with fields")
            yield _Row(number, line_number, line.strip(), values)


class _CountedLines:
    """The lines of a text file, counted, remembering the first line of the record being read."""

    def __init__(self, handle: io.TextIOWrapper) -> None:
        self.handle, self.number, self.first, self.first_number = handle, 0, "", 0

    def __iter__(self) -> _CountedLines:
        return self

    def __next__(self) -> str:
        line = next(self.handle)
        self.number += 1
        if not self.first:
            self.first, self.first_number = line, self.number
        return line


def _csv_error(label: str, lines: _CountedLines, delimiter: str, exc: csv.Error) -> ValueError:
    """Return the error for a record that `csv` cannot read (a field too long, bad quoting)."""
    where = f"{label}: the record from line {lines.first_number} to line {lines.number}"
    if "field limit" in str(exc):
        return ValueError(f"{where} holds a field longer than the csv module's limit of "
                          f"{csv.field_size_limit():,} characters; write texts that long as "
                          f"JSON Lines (.jsonl) or as .txt files")
    return ValueError(f"{where} cannot be read as {delimiter!r}-separated fields ({exc}); fix "
                      f"the quoting there")


def _csv_rows(path: Path, errors: str, delimiter: str, label: str,
              fields: RowFields) -> Iterator[_Row]:
    with _text_stream(path, errors, "") as handle:
        lines = _CountedLines(handle)
        reader = csv.reader(lines, delimiter=delimiter)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{label} is empty: it needs a header row naming its fields "
                             f"(e.g. {fields.text}) and a row per document")
        _check_fields(label, fields, header)
        number = 0
        while True:
            lines.first = ""
            try:
                cells = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                raise _csv_error(label, lines, delimiter, exc) from None
            if not cells:
                continue  # a blank line is no record
            number += 1
            values: Any = dict(zip(header, cells, strict=False))
            if len(cells) != len(header):
                values = _BadRow(f"has {len(cells)} fields where the header has {len(header)} "
                                 f"(a {delimiter!r} in an unquoted field?)")
            yield _Row(number, lines.first_number, lines.first.rstrip("\r\n"), values)


def _parquet_rows(path: Path, label: str, fields: RowFields) -> Iterator[_Row]:
    if path.name.lower().endswith(".gz"):
        raise ValueError(f"{label} is a gzip-compressed Parquet file; Parquet compresses its own "
                         f"columns, so gunzip it and pass the .parquet file")
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(f"{label} is a Parquet file, and reading Parquet needs the optional "
                         f"package pyarrow: install it with `pip install bertlab[parquet]` (or "
                         f"`pip install pyarrow`), or write the rows out as JSON Lines or CSV"
                         ) from None
    from pyarrow import ArrowException

    try:
        table = pq.ParquetFile(path)
        names = table.schema_arrow.names
        _check_fields(label, fields, names)
        wanted = [n for n in (fields.text, fields.doc, fields.label) if n is not None]
        number = 0
        for batch in table.iter_batches(batch_size=_PARQUET_BATCH_ROWS,
                                        columns=sorted(set(wanted))):
            for values in batch.to_pylist():
                number += 1
                yield _Row(number, None, values, values)
    except (ArrowException, OSError) as exc:  # a cut or damaged file: pyarrow does not name it
        raise BadInput(label, f"cannot be read as Parquet ({exc})", "check that the file is "
                       "whole (copy it again), or write the rows out as JSON Lines") from None


def _item_rows(items: Iterable[Any]) -> Iterator[_Row]:
    for number, item in enumerate(items, 1):
        if isinstance(item, (str, Document)):
            values = item
        elif isinstance(item, Mapping):
            values = dict(item)
        else:
            values = _BadRow(f"is {_kind(item)}; pass strings, or mappings (dicts) with a "
                             f"text field")
        yield _Row(number, None, item, values)


def _rows(source: Path | Iterable[Any], label: str, fields: RowFields, errors: str) -> Iterator[_Row]:
    if not isinstance(source, Path):
        return _item_rows(source)
    kind = row_format(source)
    if kind == "JSON Lines":
        return _jsonl_rows(source, errors)
    if kind in ("CSV", "TSV"):
        return _csv_rows(source, errors, "," if kind == "CSV" else "\t", label, fields)
    return _parquet_rows(source, label, fields)


def _read(rows: Iterator[_Row], label: str) -> Iterator[_Row]:
    """Yield `rows`, turning a file that is not UTF-8 or not gzip into one clear error."""
    try:
        yield from rows
    except UnicodeDecodeError as exc:
        raise ValueError(f"{label} is not valid UTF-8 (bytes {exc.object[exc.start:exc.start + 4]!r}); "
                         f"convert it to UTF-8, or pass errors='replace' (--encoding-errors "
                         f"replace) to read it with U+FFFD in place of the bad bytes") from None
    except (OSError, EOFError, zlib.error) as exc:
        raise ValueError(f"{label} cannot be read ({exc}); if it is gzip-compressed, check "
                         f"that the file is whole (`gzip -t`)") from None


# --------------------------------------------------------------------------------------------
# Rows -> documents


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, (bool, int, float)):
        return "a boolean" if isinstance(value, bool) else "a number"
    return {list: "a list", dict: "an object"}.get(type(value), f"a {type(value).__name__}")


def _field(values: Mapping[str, Any], name: str, flag: str, keys: bool) -> str:
    """Return field `name` of a row as text; raise _BadRow if it is missing, not text, or empty."""
    if name not in values:
        found = ", ".join(repr(f) for f in values) or "none"
        raise _BadRow(f"has no field {name!r} ({flag}); its fields are {found}")
    value = values[name]
    allowed = (str, int) if keys else (str,)  # ids and labels may be numbers, text may not
    if isinstance(value, bool) or not isinstance(value, allowed):
        raise _BadRow(f"holds {_kind(value)} in field {name!r}, not a string")
    value = str(value)
    if not value.strip():
        raise _BadRow(f"has an empty field {name!r}")
    _check_no_surrogate(value, f"field {name!r}")
    return value


def _check_no_surrogate(text: str, where: str) -> None:
    """Raise _BadRow if `text` holds a lone surrogate (a JSON escape such as \\ud800 that is half
    of a UTF-16 pair): it is no character, and no UTF-8 file, tokenizer or digest can hold it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise _BadRow(f"holds a lone surrogate {text[e.start]!r} in {where} at character "
                      f"{e.start}: half of a UTF-16 pair, which is no text") from None


def _row_values(row: _Row, fields: RowFields) -> tuple[str, str | None, str | None]:
    """Return a row's (text, document key, label); raise _BadRow if the row cannot give them."""
    values = row.values
    if isinstance(values, _BadRow):
        raise values
    if isinstance(values, str):
        if not values.strip():
            raise _BadRow("is an empty string")
        _check_no_surrogate(values, "its text")
        return values, None, None
    text = _field(values, fields.text, "--text-field", keys=False)
    key = _field(values, fields.doc, "--doc-field", keys=True) if fields.doc else None
    label = _field(values, fields.label, "--label-field", keys=True) if fields.label else None
    return text, key, label


class _DocumentBuilder:
    """Collects consecutive rows of one document; yields it (in parts past MAX_DOC_CHARS)."""

    def __init__(self, stem: str, label: str, fields: RowFields) -> None:
        self.stem, self.label, self.fields = stem, label, fields
        self.seen: set[bytes] = set()  # digests of the keys read, so a returning key is caught
        self.key: str | None = None
        self.doc_label: str | None = None
        self.texts: list[str] = []
        self.sentences: list[str] = []
        self.chars = self.part = 0

    def add(self, row: _Row, text: str, key: str | None, doc_label: str | None) -> Iterator[Document]:
        """Yield the documents that row `row` completes, then hold its text."""
        key = key if key is not None else str(row.number - 1)
        if self.fields.doc is None or key != self.key:
            digest = hashlib.blake2b(key.encode("utf-8"), digest_size=16).digest()
            if digest in self.seen:
                raise ValueError(
                    f"{self.label}: {row.where()} has {self.fields.doc}={key!r} (--doc-field) "
                    f"again, after rows of other documents; put the rows of each document "
                    f"together (sort or group the file by that field), so that a document is "
                    f"read whole without holding the corpus in memory")
            yield from self.finish()
            if self.fields.doc is not None:
                self.seen.add(digest)
            self.key, self.doc_label = key, doc_label
        elif doc_label != self.doc_label:
            raise _BadRow(f"has label {doc_label!r}, but the earlier rows of document {key!r} "
                          f"have {self.doc_label!r}")
        # One huge row comes in paragraphs, so that it too can be cut into parts.
        for piece in text.split("\n") if len(text) > MAX_DOC_CHARS else [text]:
            doc = document_from_text("", piece, None, title_first_line=False)
            if not doc.sentences:
                continue
            if self.chars >= MAX_DOC_CHARS:
                self.part += 1
                yield self._document(self.part)
                self.texts, self.sentences, self.chars = [], [], 0
            self.texts.append(doc.text)
            self.sentences.extend(doc.sentences)
            self.chars += len(doc.text)

    def _document(self, part: int) -> Document:
        doc_id = f"{self.stem}/{self.key}"
        return document_part(doc_id, part, self.sentences, "\n".join(self.texts), self.doc_label)

    def finish(self) -> Iterator[Document]:
        """Yield what is held of the current document, and forget it."""
        if self.sentences:
            yield self._document(self.part + 1 if self.part else 0)
        self.texts, self.sentences, self.chars, self.part = [], [], 0, 0


def iter_rows(
    source: Path | Iterable[Any], fields: RowFields, *, errors: str = "strict",
    counts: dict[str, int] | None = None,
) -> Iterator[Document]:
    """Yield the documents of a file of rows (`row_format`) or of an iterable of rows, one at a time.

    An iterable may hold strings (each a document), mappings with the fields of `fields` (a
    `datasets.Dataset` iterates as such dicts) and Documents (passed through). Ids are
    "stem/N" for the N-th row (from 0), or "stem/KEY" with a document field; the stem is the
    file's name, "rows" for an iterable. `counts["bad_rows_skipped"]` counts skipped rows.
    """
    counts = counts if counts is not None else {}
    counts.setdefault("bad_rows_skipped", 0)
    label = f"corpus '{source}'" if isinstance(source, Path) else "the corpus (rows)"
    builder = _DocumentBuilder(file_stem(source) if isinstance(source, Path) else "rows", label,
                               fields)
    first_bad: str | None = None
    checked = read = False
    for row in _read(_rows(source, label, fields, errors), label):
        if isinstance(row.values, Document):
            yield from builder.finish()
            yield row.values
            read = True
            continue
        if isinstance(row.values, str) and (fields.doc or fields.label):
            raise ValueError(f"{label}: {row.where()} is a string, which has no fields for "
                             f"doc_field or label_field; pass dicts (mappings) with those fields")
        # A field missing from the first record is most likely a wrong field name, so stop
        # there; when bad rows are skipped, a first record without it is one bad row like others.
        if not checked and isinstance(row.values, dict) and fields.on_bad_row == "error":
            _check_fields(f"{label} (its first record)", fields, list(row.values))
            checked = True
        try:
            text, key, doc_label = _row_values(row, fields)
            yield from builder.add(row, text, key, doc_label)
            read = True
        except _BadRow as bad:
            if fields.on_bad_row == "error":
                raise ValueError(f"{label}: {row.where()} {bad}; fix or delete that row, or pass "
                                 f"--on-bad-row skip (on_bad_row='skip') to skip bad rows and "
                                 f"count them") from None
            counts["bad_rows_skipped"] += 1
            first_bad = first_bad or f"{row.where()} {bad}"
    yield from builder.finish()
    if first_bad and not read:
        raise BadInput(label, f"every record is bad ({counts['bad_rows_skipped']:,} skipped); "
                       f"the first: {first_bad}", "check --text-field (and the other fields) "
                       "against the rows, or fix the rows")
    if first_bad:
        warnings.warn(f"{label}: skipped {counts['bad_rows_skipped']:,} bad row(s) (on_bad_row="
                      f"'skip'); the first: {first_bad}", stacklevel=2)
