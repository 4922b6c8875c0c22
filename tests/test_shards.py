"""Streaming preparation (pairs, single segments) and on-disk shards: round trips, splits, memory."""

from __future__ import annotations

import json
import pickle
from dataclasses import replace

import numpy as np
import pytest
import torch

import bertlab as bl
from bertlab.cli import main
from bertlab.corpus import Document, split_documents
from bertlab.data import (
    BATCH_KEYS,
    LoaderOptions,
    PairDraws,
    PretrainingCollator,
    PretrainingDataset,
    StoredExamples,
    pretraining_loader,
)
from bertlab.engine.shards import (
    PrepareOptions,
    ShardExamples,
    prepare_command,
    prepare_shards,
    shard_loader,
)
from bertlab.engine.streaming import (
    StreamingExampleBuilder,
    StreamOptions,
    iter_documents,
)
from bertlab.errors import BadInput
from bertlab.pairs import NOT_NEXT, Example, create_single_examples, pair_draw_seed
from bertlab.textfiles import MAX_DOC_CHARS
from bertlab.tokenizer import encode_sentences, load_tokenizer, save_tokenizer


@pytest.fixture(scope="module")
def tok():
    return bl.train_tokenizer(bl.load_corpus("bbc"))


WORDS = ("market growth team match film award policy vote phone network price share season "
         "player album band minister election software users bank rate goal coach").split()


def synthetic_docs(n: int, seed: int = 0) -> list[Document]:
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(n):
        sentences = [" ".join(rng.choice(WORDS, size=rng.integers(3, 25))).capitalize() + "."
                     for _ in range(rng.integers(1, 9))]
        docs.append(Document(id=f"syn/{i}", text=" ".join(sentences), sentences=sentences))
    return docs


def test_shards_round_trip_exactly(tok, tmp_path):
    docs = synthetic_docs(90)
    stream = StreamOptions(max_seq_len=32, batch_docs=16, reservoir_docs=10)
    summary = prepare_shards(docs, tok, tmp_path, PrepareOptions(stream, splits=None,
                                                                 shard_size=50), seed=5)
    builder = StreamingExampleBuilder(tok, stream, seed=5)  # the same stream, in memory
    expected = [ex for doc in iter_documents(docs) for ex in builder.add(doc)] + list(builder.finish())
    shards = ShardExamples(tmp_path)
    ds = PretrainingDataset(shards)
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert len(meta["shards"]) > 2 and summary["splits"]["all"]["examples"] == len(expected)
    assert shards.meta == meta and len(ds) == len(shards) == len(expected)
    for i, ex in enumerate(expected):
        item = ds[i]
        assert item["input_ids"].tolist() == ex.input_ids
        assert item["token_type_ids"].tolist() == ex.token_type_ids
        assert item["next_sentence_label"] == ex.next_sentence_label
        assert shards.doc_id(i) == ex.doc_id and shards[i].doc_index == ex.doc_index
        assert isinstance(shards[i], Example) and shards[i].b_len == ex.b_len
    with pytest.raises(IndexError, match="out of range"):
        shards[len(shards)]
    # Examples from shards batch exactly like the same examples in memory.
    collate = PretrainingCollator(tok)
    memory = PretrainingDataset(expected)
    for epoch in (0, 2):
        ds.set_epoch(epoch)
        memory.set_epoch(epoch)
        on_disk = collate([ds[i] for i in range(0, 60, 7)])
        in_memory = collate([memory[i] for i in range(0, 60, 7)])
        assert all(torch.equal(on_disk[k], in_memory[k]) for k in BATCH_KEYS)
    assert pickle.loads(pickle.dumps(ds))[3]["input_ids"].tolist() == expected[3].input_ids


def test_streaming_negatives_come_from_other_documents_and_memory_is_bounded(tok):
    builder = StreamingExampleBuilder(tok,
                                  StreamOptions(max_seq_len=32, batch_docs=8, reservoir_docs=5))
    examples = []
    for doc in synthetic_docs(120, seed=1):
        examples.extend(builder.add(doc))
        assert len(builder.reservoir) <= 5 and len(builder.pending) < 8
    examples.extend(builder.finish())
    random_next = [e for e in examples if e.next_sentence_label == NOT_NEXT]
    assert random_next and all(e.b_doc_index != e.doc_index for e in random_next)
    share = len(random_next) / len(examples)
    assert 0.4 < share < 0.6
    assert {e.b_doc_index for e in random_next} - set(range(100)) != set()  # late docs used too


def test_prepare_splits_from_a_bert_format_file_and_load_by_split(tok, tmp_path):
    docs = synthetic_docs(150, seed=2)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join("\n".join(d.sentences) for d in docs) + "\n", encoding="utf-8")
    read = list(iter_documents(corpus))
    assert [d.sentences for d in read] == [d.sentences for d in docs]
    assert read[0].id == "corpus/0" and read[-1].id == f"corpus/{len(docs) - 1}"
    assert [d.id for d in read] == [d.id for d in bl.load_corpus(corpus)]
    out = tmp_path / "shards"
    summary = prepare_shards(corpus, tok, out, PrepareOptions(StreamOptions(max_seq_len=48)))
    groups = split_documents(read)
    for split in ("train", "validation"):
        assert summary["splits"][split]["documents"] == len(groups[split])
        ids = {d.id for d in groups[split]}
        shards = ShardExamples(out / split)
        assert {shards.doc_id(i) for i in range(len(shards))} <= ids
    assert summary["documents_not_in_splits"] == len(groups["test"])
    loader = shard_loader(out, tok, split="validation", options=LoaderOptions(batch_size=8))
    assert loader.dataset.mask_schedule == "static" and len(loader.dataset) > 0
    batch = next(iter(loader))
    assert tuple(batch) == BATCH_KEYS and batch["input_ids"].shape[1] <= 48


def test_prepare_and_shard_errors(tok, tmp_path):
    with pytest.raises(ValueError, match="has 1 document; NSP needs at least 2"):
        prepare_shards(synthetic_docs(1), tok, tmp_path / "one", PrepareOptions(splits=None))
    prepare_shards(synthetic_docs(10), tok, tmp_path / "all",
                   PrepareOptions(StreamOptions(max_seq_len=32), splits=None))
    with pytest.raises(ValueError, match="already holds prepared NSP shards"):
        prepare_shards(synthetic_docs(10), tok, tmp_path / "all", PrepareOptions(splits=None))
    assert len(shard_loader(tmp_path / "all", tok).dataset) > 0
    with pytest.raises(ValueError, match="has no held-out|holds the whole corpus"):
        shard_loader(tmp_path / "all", tok, split="validation")
    with pytest.raises(ValueError, match="no meta.json"):
        shard_loader(tmp_path, tok)
    with pytest.raises(ValueError, match="splits="):
        prepare_shards(synthetic_docs(4), tok, tmp_path / "x", PrepareOptions(splits=("dev",)))
    with pytest.raises(ValueError, match="shard_size"):
        prepare_shards(synthetic_docs(4), tok, tmp_path / "y", PrepareOptions(shard_size=0))


def test_prepare_command_trains_or_loads_a_tokenizer_and_saves_it(tok, tmp_path):
    docs = synthetic_docs(40, seed=3)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join("\n".join(d.sentences) for d in docs) + "\n", encoding="utf-8")
    summary = prepare_command(corpus, tmp_path / "trained", None,
                              PrepareOptions(StreamOptions(max_seq_len=32), splits=None),
                              vocab_size=200)
    trained = load_tokenizer(summary["tokenizer"])
    assert trained.get_vocab_size() <= 200
    assert len(shard_loader(tmp_path / "trained", trained).dataset) > 0
    saved = save_tokenizer(tok, tmp_path / "tok.json")
    summary = prepare_command(corpus, tmp_path / "given", saved,
                              PrepareOptions(StreamOptions(max_seq_len=32), splits=None))
    assert load_tokenizer(summary["tokenizer"]).get_vocab() == tok.get_vocab()



# --- prepare: bounded memory, output folder checks, failures ---------------------------------------


def folder_bytes(root) -> dict[str, bytes]:
    """Every file under `root` with its bytes, so a test can see that nothing was touched."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def write_text_corpus(folder, n: int = 30) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for d in synthetic_docs(n, seed=4):
        (folder / f"{d.id.replace('/', '_')}.txt").write_text(" ".join(d.sentences), encoding="utf-8")


def test_prepare_cuts_a_long_line_and_keeps_all_of_it(tok, tmp_path):

    # A BERT-format file that is one 1.2 MB line becomes two documents of many sentences (not one
    # "sentence", which NSP would drop as a one-sentence document), and the cut is reported.
    sentences = [f"Sentence {i} tells how the {WORDS[i % len(WORDS)]} moved today." for i in
                 range(25_000)]
    corpus = tmp_path / "dump.txt"
    corpus.write_text(" ".join(sentences), encoding="utf-8")
    assert corpus.stat().st_size > MAX_DOC_CHARS
    with pytest.warns(UserWarning, match="1 line"):
        summary = prepare_shards(corpus, tok, tmp_path / "out",
                                 PrepareOptions(StreamOptions(max_seq_len=64), splits=None))
    meta = summary["splits"]["all"]
    assert summary["corpus_read"] == {"long_lines_split": 1, "documents_split": 1,
                                      "folders_skipped": 0, "hidden_skipped": 0,
                                      "files_skipped": 0, "bad_rows_skipped": 0}
    assert json.loads((tmp_path / "out" / "meta.json").read_text())["corpus_read"] == \
        summary["corpus_read"]
    assert meta["documents"] == 2 and meta["one_sentence_docs_skipped"] == 0
    assert (tmp_path / "out" / "docs.txt").read_text().split() == ["dump/0#1", "dump/0#2"]
    # Nearly every token reaches an example (only the pairs' truncation drops a few).
    text_tokens = sum(len(ids) for ids in encode_sentences(tok, sentences))
    assert meta["tokens"] - 3 * meta["examples"] + meta["tokens_dropped"] >= 0.9 * text_tokens


def test_streaming_batches_are_bounded_by_characters(tok):
    builder = StreamingExampleBuilder(tok,
                                  StreamOptions(max_seq_len=32, batch_docs=100, batch_chars=2_000))
    for doc in synthetic_docs(60, seed=6):
        list(builder.add(doc))
        assert builder.pending_chars < 2_000 and len(builder.pending) < 100
    assert builder.seen > 0  # batches were flushed on characters, long before 100 documents


@pytest.mark.parametrize("kind", ["run", "hf", "other", "inside_corpus"])
def test_prepare_refuses_an_occupied_or_unsafe_out_folder_and_changes_nothing(tok, tmp_path, kind):
    corpus = tmp_path / "corpus"
    write_text_corpus(corpus)
    out = {"run": tmp_path / "run", "hf": tmp_path / "hf", "other": tmp_path / "mine",
           "inside_corpus": corpus / "shards"}[kind]
    out.mkdir(exist_ok=True)
    if kind == "run":
        (out / "checkpoints").mkdir()
        (out / "run.json").write_text('{"step": 10}', encoding="utf-8")
    elif kind == "hf":
        (out / "config.json").write_text("{}", encoding="utf-8")
        (out / "vocab.txt").write_text("[PAD]\n", encoding="utf-8")
    elif kind == "other":
        (out / "notes.md").write_text("my notes", encoding="utf-8")
    message = {"run": "already holds a pretraining run", "hf": "already holds a Hugging Face",
               "other": "already holds other files", "inside_corpus": "is inside the corpus folder"}
    before = folder_bytes(tmp_path)
    for call in (lambda: prepare_shards(corpus, tok, out,
                                        PrepareOptions(StreamOptions(max_seq_len=32))),
                 lambda: prepare_command(corpus, out, None,
                                         PrepareOptions(StreamOptions(max_seq_len=32)),
                                         vocab_size=200)):
        with pytest.raises(ValueError, match=message[kind]):
            call()
        assert folder_bytes(tmp_path) == before  # nothing written, nothing left beside it


def test_prepare_failing_midway_leaves_no_shards(tok, tmp_path):
    corpus = tmp_path / "corpus"
    write_text_corpus(corpus, n=40)
    (corpus / "zz_empty.txt").write_text("  \n", encoding="utf-8")  # read last: an error midway
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"zz_empty\.txt' has no sentences"):
        prepare_shards(corpus, tok, out,
                       PrepareOptions(StreamOptions(max_seq_len=32, batch_docs=4), shard_size=5))
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]  # no partial folder either

    def failing_stream():
        yield from synthetic_docs(50, seed=7)
        raise RuntimeError("disk went away")

    out.mkdir()  # an existing empty folder stays empty
    with pytest.raises(RuntimeError, match="disk went away"):
        prepare_shards(failing_stream(), tok, out, PrepareOptions(
            StreamOptions(max_seq_len=32, batch_docs=4), splits=None, shard_size=5))
    assert list(out.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "out"]
    # The same corpus, once fixed, prepares into that folder.
    (corpus / "zz_empty.txt").unlink()
    summary = prepare_shards(corpus, tok, out,
                             PrepareOptions(StreamOptions(max_seq_len=32), splits=None))
    assert summary["splits"]["all"]["documents"] == 40
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith("shard-")) == [
        "docs.txt", "meta.json", "tokenizer.json"]
    assert load_tokenizer(out / "tokenizer.json").get_vocab() == tok.get_vocab()


def test_prepare_reads_rows_and_records_the_bad_rows_it_skipped(tok, tmp_path):
    docs = synthetic_docs(60, seed=3)
    corpus = tmp_path / "pages.jsonl"
    lines = [json.dumps({"page": d.id, "p": s}) for d in docs for s in d.sentences]
    lines.insert(5, '{"page": "syn/0", "p": 7}')  # a bad row inside the first document
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    read = {"text_field": "p", "doc_field": "page", "on_bad_row": "skip"}
    with pytest.warns(UserWarning, match="record 6 .* holds a number in field 'p'"):
        assert [d.sentences for d in iter_documents(corpus, **read)] == [d.sentences for d in docs]
    tok_path = save_tokenizer(tok, tmp_path / "tok.json")
    with pytest.warns(UserWarning, match="skipped 1 bad row"):
        summary = prepare_command(corpus, tmp_path / "out", tok_path,
                                  PrepareOptions(StreamOptions(max_seq_len=48), read=read))
    assert summary["corpus_read"]["bad_rows_skipped"] == 1
    meta = json.loads((tmp_path / "out" / "train" / "meta.json").read_text())
    assert meta["corpus_read"]["bad_rows_skipped"] == 1


def test_single_segment_shards_hold_the_examples_built_in_memory(tok, tmp_path):
    docs = synthetic_docs(160, seed=4)  # one to eight sentences each
    options = dict(max_seq_len=32, short_seq_prob=0.3)
    stream = StreamOptions(batch_docs=16, segments="single", **options)
    summary = prepare_shards(docs, tok, tmp_path, PrepareOptions(stream, shard_size=40,
                                                                 pair_draws=2), seed=3)
    train = split_documents(docs)["train"]
    meta = json.loads((tmp_path / "train" / "meta.json").read_text())
    assert meta["segments"] == "single" and len(meta["shards"]) > 2
    for draw in (0, 1):  # draw k: the examples of seed pair_draw_seed(seed, k), as in memory
        memory = create_single_examples(train, tok, seed=pair_draw_seed(3, draw), **options)
        shards = ShardExamples(tmp_path / "train", draw=draw)
        assert [s.input_ids.tolist() for s in shards] == [e.input_ids for e in memory]
        assert {s.next_sentence_label for s in shards} == {-100}
        assert all(s.a_len == len(s.input_ids) - 2 for s in shards)
    assert summary["splits"]["train"]["tokens_dropped"] == memory.info["tokens_cut"]
    assert json.loads((tmp_path / "validation" / "meta.json").read_text())["segments"] == "single"
    # Batches from the shards are those of single segments built from the documents.
    common = LoaderOptions(batch_size=8, max_seq_len=32, short_seq_prob=0.3, pairs="single")
    on_disk = shard_loader(tmp_path, tok, seed=3, options=replace(common, pair_draws=1))
    in_memory = pretraining_loader(docs, tok, seed=3, options=common)
    for a, b in zip(on_disk, in_memory, strict=True):
        assert all(torch.equal(a[k], b[k]) for k in BATCH_KEYS)
        assert (a["next_sentence_label"] == -100).all() and (a["token_type_ids"] == 0).all()


def test_single_segment_shards_and_pair_shards_are_not_mixed_up(tok, tmp_path):
    docs = synthetic_docs(20, seed=5)
    prepare_shards(docs, tok, tmp_path / "single",
                   PrepareOptions(StreamOptions(max_seq_len=32, segments="single"), splits=None))
    prepare_shards(docs, tok, tmp_path / "pairs",
                   PrepareOptions(StreamOptions(max_seq_len=32), splits=None))
    with pytest.raises(ValueError,
                       match=r"hold single segments .* pass LoaderOptions\(pairs='single'\)"):
        shard_loader(tmp_path / "single", tok, split=None, options=LoaderOptions(pairs="nsp"))
    with pytest.raises(ValueError, match="sop pairs are built from documents"):
        shard_loader(tmp_path / "single", tok, split=None, options=LoaderOptions(pairs="sop"))
    with pytest.raises(ValueError, match="hold NSP pairs;.* prepare them with --segments single"):
        shard_loader(tmp_path / "pairs", tok, split=None, options=LoaderOptions(pairs="single"))
    with pytest.raises(ValueError, match="segments='both' is not known"):
        prepare_shards(docs, tok, tmp_path / "x", PrepareOptions(StreamOptions(segments="both")))
    with pytest.raises(ValueError, match="no pair label to balance"):
        prepare_shards(docs, tok, tmp_path / "y",
                       PrepareOptions(StreamOptions(segments="single", balance="google")))
    # One document is enough for single segments (no negatives to draw from another).
    prepare_shards(docs[:1], tok, tmp_path / "one",
                   PrepareOptions(StreamOptions(segments="single"), splits=None))
    with pytest.raises(ValueError, match="is empty: no document has a sentence with text"):
        prepare_shards([Document(id="e", text="", sentences=[])], tok, tmp_path / "none",
                       PrepareOptions(StreamOptions(segments="single"), splits=None))


def test_a_folder_goes_through_shard_loader_and_stored_examples_stay_on_disk(tok, tmp_path):
    prepare_shards(synthetic_docs(60, seed=6), tok, tmp_path,
                   PrepareOptions(StreamOptions(max_seq_len=32), shard_size=30, pair_draws=2))
    with pytest.raises(BadInput, match=r"source '.*': a path; .*bertlab\.engine\.shards\.shard_loader"):
        pretraining_loader(tmp_path, tok)
    stored = ShardExamples(tmp_path / "train", draw=1)
    assert isinstance(stored, StoredExamples) and not isinstance(list(stored), StoredExamples)
    assert stored.pairs == "nsp" and stored.max_seq_len == 32
    # The lesson's loader keeps stored examples on disk: the same batches as the folder's.
    options = LoaderOptions(batch_size=8)
    given = pretraining_loader(PairDraws([ShardExamples(tmp_path / "train"), stored]), tok,
                               seed=2, options=options)
    folder = shard_loader(tmp_path, tok, seed=2, options=options)
    assert [type(d) for d in given.dataset.draws] == [ShardExamples, ShardExamples]
    assert given.dataset.digest() == folder.dataset.digest()
    assert (given.pairs, given.max_seq_len) == (folder.pairs, folder.max_seq_len) == ("nsp", 32)
    for _ in range(2):  # epochs 0 and 1: draws 0 and 1
        for a, b in zip(given, folder, strict=True):
            assert all(torch.equal(a[k], b[k]) for k in BATCH_KEYS)
    with pytest.raises(ValueError, match="hold nsp examples, not the single pairs"):
        pretraining_loader(stored, tok, options=LoaderOptions(pairs="single"))
    with pytest.raises(ValueError, match="got 1 draw.*pair_draws=2"):
        pretraining_loader(stored, tok, options=LoaderOptions(pair_draws=2))


@pytest.mark.usefixtures("one_thread")
def test_pretrain_streams_one_sentence_documents_from_single_segment_shards(tmp_path, capsys):
    reviews = tmp_path / "reviews"
    reviews.mkdir()
    for i, doc in enumerate(bl.load_corpus("bbc")[:80]):  # one sentence per file
        (reviews / f"r{i:02d}.txt").write_text(doc.sentences[0] + "\n", encoding="utf-8")
    shards, run = tmp_path / "shards", tmp_path / "run"
    assert main(["prepare", "--corpus", str(reviews), "--out", str(shards), "--vocab-size",
                 "300", "--max-seq-len", "64", "--segments", "single"]) == 0
    assert "--objectives mlm --segments single" in capsys.readouterr().out
    small = ["--hidden-size", "32", "--num-heads", "2", "--intermediate-size", "64",
             "--batch-size", "8", "--eval-interval", "2", "--eval-batches", "1",
             "--no-progress", "--log-interval", "0", "--device", "cpu", "--max-steps", "4"]
    assert main(["pretrain", "--corpus", str(shards), "--out", str(run), *small,
                 "--objectives", "mlm", "--segments", "single"]) == 0
    assert "MLM only on single segments" in capsys.readouterr().out
    history = json.loads((run / "history.json").read_text())
    assert history[-1]["step"] == 4 and "val_mask_accuracy" in history[-1]
    assert not any("nsp" in k or "sop" in k for row in history for k in row)
