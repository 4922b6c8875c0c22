"""Each real file of a corpus or task folder is read once, in a fixed order, and what is not read
is reported by kind: links to a file read already, other extensions, named pipes, names that
are not UTF-8, label folders without text, cut Parquet files, unordered or column-wise rows,
and the first row of a file skipped like any other. Also: whole-word masking follows the
tokenizer's own continuation mark.

Every case runs the real CLI (`bertlab.cli.main`) or the real API, checks the message, and for a
refusal checks that nothing on disk changed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from faultlib import SMALL, assert_one_clear_error, assert_unchanged, snapshot
from tokenizers import Tokenizer, models, pre_tokenizers

from bertlab.cli import main
from bertlab.corpus import split_of
from bertlab.data import PretrainingCollator
from bertlab.readers import load_corpus

pytestmark = pytest.mark.usefixtures("one_thread")

REPO = Path(__file__).resolve().parents[1]
PREPARE = ["--vocab-size", "300", "--max-seq-len", "64"]
TOPICS = ("business", "sport", "tech")


def _write_docs(folder: Path, docs: list, suffix: str = ".txt") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i, doc in enumerate(docs):
        (folder / f"doc{i:02d}{suffix}").write_text(doc.text, encoding="utf-8")


@pytest.fixture(scope="module")
def bbc():
    return load_corpus("bbc")


@pytest.fixture(scope="module")
def run(tmp_path_factory, bbc) -> Path:
    """A 2-step tiny pretraining run, for `finetune`."""
    root = tmp_path_factory.mktemp("run")
    _write_docs(root / "corpus", bbc[:30])
    assert main(["pretrain", "--corpus", str(root / "corpus"), "--out", str(root / "run"),
                 "--max-steps", "2", *SMALL]) == 0
    return root / "run"


def _corpus(root: Path, bbc: list, n: int = 40) -> Path:
    corpus = root / "corpus"
    _write_docs(corpus, bbc[:n])
    return corpus


def _shard_ids(out: Path) -> list[str]:
    """Return the document ids that `prepare` wrote into `out`, over both splits."""
    return sorted(i for split in ("train", "validation")
                  for i in (out / split / "docs.txt").read_text(encoding="utf-8").split())


def _refused(capsys, command: list[str], watched: list[Path], fragments: list[str]) -> None:
    """Run `command`; assert one clear error holding `fragments`, exit 2, nothing changed."""
    before = snapshot(*watched)
    capsys.readouterr()
    assert main(command) == 2
    assert_one_clear_error(capsys.readouterr().err, fragments)
    assert_unchanged(before, snapshot(*watched))


# --------------------------------------------------------------------------------------------
# One real file, read once


@pytest.mark.parametrize("how", ["symlink", "hard-link", "link-in-sub-folder"])
def test_a_file_reached_twice_through_links_is_refused_naming_both(tmp_path, capsys, bbc, how):
    corpus = _corpus(tmp_path, bbc)
    target = corpus / "doc03.txt"
    if how == "symlink":
        (corpus / "zz-copy.txt").symlink_to("doc03.txt")
        second = corpus / "zz-copy.txt"
    elif how == "hard-link":
        os.link(target, corpus / "zz-copy.txt")
        second = corpus / "zz-copy.txt"
    else:
        (corpus / "more").mkdir()
        (corpus / "more" / "again.txt").symlink_to(target)
        second = corpus / "more" / "again.txt"
    out = tmp_path / "shards"
    _refused(capsys, ["prepare", "--corpus", str(corpus), "--out", str(out), *PREPARE],
             [corpus, out], [str(second), str(target), "same file", "delete the link"])


def test_other_files_are_reported_by_kind_and_TXT_is_read(tmp_path, capsys, bbc):
    corpus = _corpus(tmp_path, bbc, 40)
    (corpus / "upper.TXT").write_text(bbc[50].text, encoding="utf-8")
    (corpus / "notes.md").write_text("# My notes\n\nNot training text.\n")
    (corpus / "rows.jsonl").write_text('{"text": "A row. Of text."}\n')
    os.mkfifo(corpus / "stream.txt")
    out = tmp_path / "shards"
    capsys.readouterr()
    assert main(["prepare", "--corpus", str(corpus), "--out", str(out), *PREPARE]) == 0
    err = capsys.readouterr().err
    # One line per pass over the corpus (prepare reads it twice: the vocabulary, the examples).
    warned = sorted({line for line in err.splitlines() if "skipped 3 file(s)" in line})
    assert len(warned) == 1, err
    for fragment in ("2 with another extension (.jsonl, .md)", "1 named pipe",
                     str(corpus / "stream.txt"), "rename a text file to .txt"):
        assert fragment in warned[0], warned[0]
    expected = [f"doc{i:02d}" for i in range(40)] + ["upper"]  # the test split is not written
    assert _shard_ids(out) == sorted(i for i in expected if split_of(i) != "test")
    meta = json.loads((out / "train" / "meta.json").read_text())
    assert meta["corpus_read"]["files_skipped"] == 3


def test_a_folder_with_no_text_file_lists_what_it_skipped(tmp_path, capsys):
    corpus = tmp_path / "notes"
    corpus.mkdir()
    (corpus / "a.md").write_text("# Title\n\nSome words here.\n")
    (corpus / "b.rtf").write_text("{\\rtf1 Some words.}\n")
    out = tmp_path / "shards"
    _refused(capsys, ["prepare", "--corpus", str(corpus), "--out", str(out), *PREPARE],
             [corpus, out], [str(corpus), "has no .txt files", "2 with another extension",
                             ".md", ".rtf"])


def test_a_file_name_that_is_not_utf8_is_named(tmp_path, capsys, bbc):
    corpus = _corpus(tmp_path, bbc)
    name = b"caf\xe9.txt"
    with open(os.path.join(os.fsencode(corpus), name), "w", encoding="utf-8") as handle:
        handle.write("Cafe talk here. It is plain text.\n")
    out = tmp_path / "shards"
    _refused(capsys, ["prepare", "--corpus", str(corpus), "--out", str(out), *PREPARE],
             [corpus, out], [str(corpus), repr(name), "not valid UTF-8", "rename it"])


# --------------------------------------------------------------------------------------------
# Task folders: no class goes missing


def _task(root: Path, bbc: list, suffixes: dict[str, str]) -> Path:
    task = root / "task"
    for topic in TOPICS:
        _write_docs(task / topic, [d for d in bbc if d.label == topic][:20], suffixes.get(topic, ".txt"))
    return task


def test_a_label_folder_of_TXT_files_keeps_its_class(tmp_path, capsys, bbc, run):
    task = _task(tmp_path, bbc, {"tech": ".TXT"})
    result = tmp_path / "r.json"
    capsys.readouterr()
    assert main(["finetune", str(run), "--task", str(task), "--methods", "tf-idf",
                 "--max-seq-len", "64", "--device", "cpu", "--json", str(result)]) == 0
    assert "skipped" not in capsys.readouterr().err
    report = json.loads(result.read_text())
    assert report["results"][0]["label_names"] == list(TOPICS)
    assert report["corpus_read"]["files_skipped"] == 0


def test_a_label_folder_without_text_is_an_error_naming_it(tmp_path, capsys, bbc, run):
    task = _task(tmp_path, bbc, {"tech": ".md"})
    result = tmp_path / "r.json"
    _refused(capsys, ["finetune", str(run), "--task", str(task), "--methods", "tf-idf",
                      "--device", "cpu", "--json", str(result)],
             [task, run, result], [str(task / "tech"), "class 'tech' would be missing",
                                   "20 with another extension (.md)"])


# --------------------------------------------------------------------------------------------
# Rows


def test_first_record_without_the_text_field_is_skipped_like_any_other(tmp_path, capsys, bbc):
    rows = tmp_path / "rows.jsonl"
    lines = [json.dumps({"title": "no text in this one"})]
    lines += [json.dumps({"text": d.text}) for d in bbc[:40]]
    rows.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "shards"
    capsys.readouterr()
    assert main(["prepare", "--corpus", str(rows), "--out", str(out), "--on-bad-row", "skip",
                 *PREPARE]) == 0
    err = capsys.readouterr().err
    assert "skipped 1 bad row(s)" in err and "record 1 (line 1" in err, err
    assert _shard_ids(out) == sorted(f"rows/{i}" for i in range(1, 41)
                                     if split_of(f"rows/{i}") != "test")


def test_every_record_bad_under_skip_is_one_error(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"title": "one"}\n{"title": "two"}\n', encoding="utf-8")
    out = tmp_path / "shards"
    _refused(capsys, ["prepare", "--corpus", str(rows), "--out", str(out), "--on-bad-row", "skip",
                      *PREPARE], [rows, out],
             [str(rows), "every record is bad (2 skipped)", "no field 'text'", "--text-field"])


def test_a_cut_parquet_file_is_named(tmp_path, capsys, bbc):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    whole = tmp_path / "whole.parquet"
    pq.write_table(pa.table({"text": [d.text for d in bbc[:40]]}), whole)
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    out = tmp_path / "shards"
    _refused(capsys, ["prepare", "--corpus", str(cut), "--out", str(out), *PREPARE], [cut, out],
             [str(cut), "cannot be read as Parquet", "whole"])


def test_a_dataframe_is_refused_not_read_as_its_column_names(bbc):
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"text": [d.text for d in bbc[:5]], "label": [d.label for d in bbc[:5]]})
    with pytest.raises(ValueError, match=r"DataFrame .*column names.*to_dict\('records'\)"):
        load_corpus(frame)
    docs = load_corpus(frame.to_dict("records"), label_field="label")  # the fix works
    assert [d.text for d in docs] == [d.text for d in bbc[:5]]


_SPLITS_OF_A_SET = """
import sys
from bertlab.readers import load_corpus
texts = {f"Text number {i} is here. It has two sentences." for i in range(40)}
try:
    docs = load_corpus(texts)
except ValueError as exc:
    print("error:", exc)
else:
    print([(d.text, d.split) for d in docs])
"""


def test_a_set_of_texts_is_refused_as_its_split_would_change_per_process():
    outputs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-c", _SPLITS_OF_A_SET], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=120, check=True)
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1], "the split of a set changed with PYTHONHASHSEED"
    assert outputs[0].startswith("error: corpus: a set of 40 item(s)"), outputs[0]
    assert "sorted(texts)" in outputs[0]


# --------------------------------------------------------------------------------------------
# Whole words follow the tokenizer's own continuation mark


def test_whole_word_masking_follows_an_at_at_continuation_prefix():
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    pieces = ["un", "@@believ", "@@able", "cat", "s", "@@s"]
    vocab = {token: i for i, token in enumerate(specials + pieces)}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="@@"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    ids = tokenizer.encode("unbelievable cats").ids
    assert [tokenizer.id_to_token(i) for i in ids] == ["un", "@@believ", "@@able", "cat", "@@s"]
    collator = PretrainingCollator(tokenizer, whole_word=True, return_word_ids=True)
    row = [vocab["[CLS]"], *ids, vocab["[SEP]"]]
    batch = collator([{"input_ids": row, "token_type_ids": [0] * len(row), "index": 0}])
    assert np.asarray(batch["word_ids"][0]).tolist() == [-1, 0, 0, 0, 1, 1, -1]


# ---------------------------------------------------------------------------------------------
# A file known by its bytes as well as its name (round 5)


def _bbc_text(n: int = 30) -> str:
    return "\n\n".join(d.text for d in load_corpus("bbc")[:n])


def _compressed(kind: str, text: str, path: Path) -> None:
    import bz2
    import lzma
    import zipfile

    data = text.encode("utf-8")
    if kind == "bz2":
        path.write_bytes(bz2.compress(data))
    elif kind == "xz":
        path.write_bytes(lzma.compress(data))
    else:
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("news.txt", text)


@pytest.mark.parametrize("kind, words", [
    ("utf-16", ["UTF-16 text", "byte-order mark is FF FE", "iconv -f UTF-16 -t UTF-8"]),
    ("utf-32", ["UTF-32 text", "iconv -f UTF-32 -t UTF-8"]),
    ("bz2", ["bzip2-compressed", "bunzip2 -k"]),
    ("xz", ["xz-compressed", "unxz -k"]),
    ("zip", ["a zip archive", "unzip"]),
])
def test_a_file_that_is_not_utf8_is_named_by_its_bytes_even_with_replace(tmp_path, capsys, kind,
                                                                        words):
    path = tmp_path / "news.txt"
    if kind.startswith("utf-"):
        path.write_bytes(_bbc_text().encode(kind))  # Python writes the byte-order mark
    else:
        _compressed(kind, _bbc_text(), path)
    before = snapshot(tmp_path)
    code = main(["prepare", "--corpus", str(path), "--out", str(tmp_path / "shards"), *PREPARE,
                 "--encoding-errors", "replace"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert_one_clear_error(err, [str(path), *words, "even with --encoding-errors replace"])
    assert_unchanged(before, snapshot(tmp_path))


def test_the_offered_iconv_command_makes_a_utf16_file_readable(tmp_path, capsys):
    path = tmp_path / "news.txt"
    path.write_bytes(_bbc_text().encode("utf-16"))
    assert main(["prepare", "--corpus", str(path), "--out", str(tmp_path / "a"), *PREPARE]) == 2
    command = capsys.readouterr().err.split("e.g. `")[1].split("`")[0]
    done = subprocess.run(command, shell=True, cwd=tmp_path, capture_output=True)
    if done.returncode == 127:
        pytest.skip("iconv is not installed here")
    assert done.returncode == 0, done.stderr
    converted = tmp_path / "news.utf8.txt"
    assert main(["prepare", "--corpus", str(converted), "--out", str(tmp_path / "b"),
                 *PREPARE]) == 0, capsys.readouterr().err
    assert "\x00" not in converted.read_text(encoding="utf-8")


@pytest.mark.parametrize("suffix", [".xhtml", ".svg", ".rss"])
def test_markup_files_are_refused_as_markup(tmp_path, capsys, suffix):
    path = tmp_path / f"page{suffix}"
    path.write_text("<?xml version='1.0'?><root><p>The shares rose.</p></root>\n", encoding="utf-8")
    assert main(["prepare", "--corpus", str(path), "--out", str(tmp_path / "s"), *PREPARE]) == 2
    assert_one_clear_error(capsys.readouterr().err, [str(path), "file, and its syntax would be "
                                                                "read as sentences", ".jsonl"])


def test_a_txt_link_to_rows_is_read_as_the_rows_it_leads_to(tmp_path):
    docs = load_corpus("bbc")[:12]
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"text": d.text}) + "\n" for d in docs), encoding="utf-8")
    (tmp_path / "news.txt").symlink_to(rows)
    read = load_corpus(tmp_path / "news.txt")
    assert [d.text for d in read] == [d.text for d in load_corpus(rows)]
    assert not any('{"text"' in d.text for d in read)  # never the raw JSON
