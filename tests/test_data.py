"""Datasets, the padding + masking collate, loaders (epochs, DDP samplers) and on-disk shards."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler

import bertlab as bl
from bertlab.corpus import Document, split_documents
from bertlab.data import (
    BATCH_KEYS,
    NspDataset,
    PretrainingCollator,
    ShardDataset,
    ShardedEpochSampler,
    StreamingNspBuilder,
    iter_documents,
    prepare_command,
    prepare_shards,
    pretraining_loader,
    stream_nsp_examples,
)
from bertlab.masking import IGNORE_INDEX, example_seed
from bertlab.nsp import IS_NEXT, NOT_NEXT, create_nsp_examples
from bertlab.tokenizer import special_ids


@pytest.fixture(scope="module")
def setup():
    docs = bl.load_corpus("bbc")
    tok = bl.train_tokenizer(docs)
    small = docs[:120]
    examples = create_nsp_examples(small, tok, max_seq_len=64, seed=0)
    return tok, small, examples


def masked_rows(batch):
    """Per row, the unpadded (input_ids, labels) as tuples: what a mask looks like for one example."""
    rows = []
    for ids, labels, att in zip(batch["input_ids"], batch["labels"], batch["attention_mask"], strict=True):
        n = int(att.sum())
        rows.append((tuple(ids[:n].tolist()), tuple(labels[:n].tolist())))
    return rows


# --- collate --------------------------------------------------------------------------------------


def test_collate_returns_exact_keys_padding_and_labels(setup):
    tok, _, examples = setup
    special = special_ids(tok)
    ds = NspDataset(examples)
    items = [ds[i] for i in (0, 5, 9, 17)]
    for multiple in (None, 8):
        batch = PretrainingCollator(tok, pad_to_multiple_of=multiple)(items)
        assert tuple(batch) == BATCH_KEYS
        assert all(v.dtype == torch.int64 for v in batch.values())
        lengths = [len(it["input_ids"]) for it in items]
        width = batch["input_ids"].shape[1]
        assert width == (max(lengths) if multiple is None else -(-max(lengths) // 8) * 8)
        assert batch["attention_mask"].sum(1).tolist() == lengths
        pad = batch["attention_mask"] == 0
        assert (batch["input_ids"][pad] == special.pad).all()
        assert (batch["token_type_ids"][pad] == 0).all()
        assert (batch["labels"][pad] == IGNORE_INDEX).all()
        for row, it in enumerate(items):
            n = lengths[row]
            assert batch["token_type_ids"][row, :n].tolist() == it["token_type_ids"].tolist()
            predicted = batch["labels"][row, :n] != IGNORE_INDEX
            assert predicted.any()
            assert (batch["labels"][row, :n][predicted] == torch.tensor(it["input_ids"])[predicted]).all()
            unchanged = batch["input_ids"][row, :n][~predicted]
            assert unchanged.tolist() == torch.tensor(it["input_ids"])[~predicted].tolist()
        assert batch["next_sentence_label"].tolist() == [it["next_sentence_label"] for it in items]


def test_mask_depends_on_seed_epoch_index_not_on_the_batch(setup):
    tok, _, examples = setup
    ds = NspDataset(examples, seed=7)
    collate = PretrainingCollator(tok)
    alone = masked_rows(collate([ds[3]]))[0]
    mixed = masked_rows(collate([ds[40], ds[3], ds[11]]))[1]
    assert alone == mixed
    ds.set_epoch(1)
    assert masked_rows(collate([ds[3]]))[0] != alone  # dynamic: a new mask next epoch
    other_seed = NspDataset(examples, seed=8)
    assert masked_rows(collate([other_seed[3]]))[0] != alone
    assert ds[3]["row_seed"] == example_seed(7, 1, 3)


def test_static_masks_are_fixed_and_cycle_with_dupe_factor(setup):
    tok, _, examples = setup
    collate = PretrainingCollator(tok)
    static = NspDataset(examples, masking="static")
    first = masked_rows(collate([static[i] for i in range(8)]))
    for epoch in (1, 5):
        static.set_epoch(epoch)
        assert masked_rows(collate([static[i] for i in range(8)])) == first
    cycled = NspDataset(examples, masking="static", dupe_factor=2)
    seen = []
    for epoch in range(3):
        cycled.set_epoch(epoch)
        seen.append(masked_rows(collate([cycled[i] for i in range(8)])))
    assert seen[0] == seen[2] != seen[1]


def test_whole_word_masks_every_piece_of_a_word(setup):
    tok, _, examples = setup
    vocab = {i: t for t, i in tok.get_vocab().items()}
    ds = NspDataset(examples, seed=1)
    batch = PretrainingCollator(tok, whole_word=True, mlm_probability=0.3)([ds[i] for i in range(40)])
    special = set(special_ids(tok).all)
    checked = 0
    for row in range(40):
        original = ds[row]["input_ids"].tolist()
        labels = batch["labels"][row].tolist()
        for pos in range(1, len(original)):
            prev = original[pos - 1]
            if vocab[original[pos]].startswith("##") and prev not in special:
                assert (labels[pos] == IGNORE_INDEX) == (labels[pos - 1] == IGNORE_INDEX)
                checked += 1
    assert checked > 100


def test_collator_pickles_and_rejects_bad_options(setup):
    tok, _, examples = setup
    collate = pickle.loads(pickle.dumps(PretrainingCollator(tok, whole_word=True)))
    assert tuple(collate([NspDataset(examples)[0]])) == BATCH_KEYS
    with pytest.raises(ValueError, match="mlm_probability"):
        PretrainingCollator(tok, mlm_probability=2.0)
    with pytest.raises(ValueError, match="whole_word=True needs the tokenizers.Tokenizer"):
        PretrainingCollator(special_ids(tok), whole_word=True)
    with pytest.raises(ValueError, match="pad_to_multiple_of"):
        PretrainingCollator(tok, pad_to_multiple_of=0)


# --- loaders --------------------------------------------------------------------------------------


def all_batches(loader):
    return [masked_rows(b) + [tuple(b["next_sentence_label"].tolist())] for b in loader]


def test_loader_advances_epochs_and_set_epoch_reproduces(setup):
    tok, small, _ = setup
    loader = pretraining_loader(small, tok, batch_size=16, max_seq_len=64, split=None)
    epoch0 = all_batches(loader)
    epoch1 = all_batches(loader)
    assert loader.epoch == 1 and epoch0 != epoch1
    loader.set_epoch(0)
    assert all_batches(loader) == epoch0
    # Same examples, same order within an epoch, whatever the number of workers.
    workers = pretraining_loader(small, tok, batch_size=16, max_seq_len=64, split=None, num_workers=2)
    assert all_batches(workers) == epoch0


def test_distributed_ranks_see_the_same_masks_as_one_process(setup):
    tok, _, examples = setup
    single = pretraining_loader(examples, tok, split=None, batch_size=len(examples), shuffle=False)
    single.set_epoch(3)
    rows = masked_rows(next(iter(single)))
    for rank in (0, 1):
        def make(ds, rank=rank):
            return DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=False)

        loader = pretraining_loader(examples, tok, split=None, batch_size=4, sampler=make)
        loader.set_epoch(3)
        got = [r for b in loader for r in masked_rows(b)]
        want = [rows[i % len(rows)] for i in range(rank, 2 * len(got), 2)][: len(got)]
        assert got == want


def test_loader_splits_and_default_masking(setup):
    tok, small, _ = setup
    train = pretraining_loader(small, tok, max_seq_len=64)
    val = pretraining_loader(small, tok, max_seq_len=64, split="validation", shuffle=False)
    groups = split_documents(small)
    assert {e.doc_id for e in train.dataset.examples} <= {d.id for d in groups["train"]}
    assert {e.doc_id for e in val.dataset.examples} <= {d.id for d in groups["validation"]}
    assert (train.dataset.masking, val.dataset.masking) == ("dynamic", "static")
    assert all_batches(val) == all_batches(val)  # evaluation sees the same masks every time
    labels = {int(x) for b in train for x in b["next_sentence_label"]}
    assert labels == {IS_NEXT, NOT_NEXT}


def test_loader_errors(setup):
    tok, small, examples = setup
    with pytest.raises(ValueError, match="pass split=None"):
        pretraining_loader(examples, tok)
    with pytest.raises(ValueError, match="only applies to masking='static'"):
        pretraining_loader(examples, tok, split=None, dupe_factor=3)
    with pytest.raises(ValueError, match="masking='random' is not known"):
        pretraining_loader(examples, tok, split=None, masking="random")
    with pytest.raises(ValueError, match="split='dev' is not known"):
        pretraining_loader(small, tok, split="dev")
    with pytest.raises(ValueError, match="sampler='ddp'"):
        pretraining_loader(examples, tok, split=None, sampler="ddp")
    with pytest.raises(ValueError, match="takes Documents, NspExamples or a shard folder"):
        pretraining_loader([1, 2, 3], tok)
    with pytest.raises(ValueError, match="no 'test' documents"):
        pretraining_loader([d for d in small if d.split == "train"], tok, split="test")


# --- streaming and shards ------------------------------------------------------------------------

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


def test_shards_round_trip_exactly(setup, tmp_path):
    tok = setup[0]
    docs = synthetic_docs(90)
    options = dict(max_seq_len=32, seed=5, batch_docs=16, reservoir_docs=10)
    summary = prepare_shards(docs, tok, tmp_path, splits=None, shard_size=50, **options)
    expected = list(stream_nsp_examples(docs, tok, **options))
    ds = ShardDataset(tmp_path)
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert len(meta["shards"]) > 2 and summary["splits"]["all"]["examples"] == len(expected)
    assert len(ds) == len(expected)
    for i, ex in enumerate(expected):
        item = ds[i]
        assert item["input_ids"].tolist() == ex.input_ids
        assert item["token_type_ids"].tolist() == ex.token_type_ids
        assert item["next_sentence_label"] == ex.next_sentence_label
        assert ds.doc_id(i) == ex.doc_id
    # A shard dataset batches exactly like the in-memory dataset of the same examples.
    collate = PretrainingCollator(tok)
    memory = NspDataset(expected)
    for epoch in (0, 2):
        ds.set_epoch(epoch)
        memory.set_epoch(epoch)
        assert masked_rows(collate([ds[i] for i in range(0, 60, 7)])) == masked_rows(
            collate([memory[i] for i in range(0, 60, 7)]))
    assert pickle.loads(pickle.dumps(ds))[3]["input_ids"].tolist() == expected[3].input_ids


def test_streaming_negatives_come_from_other_documents_and_memory_is_bounded(setup):
    tok = setup[0]
    builder = StreamingNspBuilder(tok, max_seq_len=32, batch_docs=8, reservoir_docs=5)
    examples = []
    for doc in synthetic_docs(120, seed=1):
        examples.extend(builder.add(doc))
        assert len(builder.reservoir) <= 5 and len(builder.pending) < 8
    examples.extend(builder.finish())
    random_next = [e for e in examples if e.is_random_next]
    assert random_next and all(e.b_doc_index != e.doc_index for e in random_next)
    share = len(random_next) / len(examples)
    assert 0.4 < share < 0.6
    assert {e.b_doc_index for e in random_next} - set(range(100)) != set()  # late docs used too


def test_prepare_splits_from_a_bert_format_file_and_load_by_split(setup, tmp_path):
    tok = setup[0]
    docs = synthetic_docs(150, seed=2)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join("\n".join(d.sentences) for d in docs) + "\n", encoding="utf-8")
    read = list(iter_documents(corpus))
    assert [d.sentences for d in read] == [d.sentences for d in docs]
    assert read[0].id == "corpus/0" and read[-1].id == f"corpus/{len(docs) - 1}"
    assert [d.id for d in read] == [d.id for d in bl.load_corpus(corpus)]
    out = tmp_path / "shards"
    summary = prepare_shards(corpus, tok, out, max_seq_len=48)
    groups = split_documents(read)
    for split in ("train", "validation"):
        assert summary["splits"][split]["documents"] == len(groups[split])
        ids = {d.id for d in groups[split]}
        ds = ShardDataset(out / split)
        assert {ds.doc_id(i) for i in range(len(ds))} <= ids
    assert summary["documents_not_in_splits"] == len(groups["test"])
    loader = pretraining_loader(out, tok, split="validation", batch_size=8)
    assert loader.dataset.masking == "static" and len(loader.dataset) > 0
    batch = next(iter(loader))
    assert tuple(batch) == BATCH_KEYS and batch["input_ids"].shape[1] <= 48


def test_prepare_and_shard_errors(setup, tmp_path):
    tok = setup[0]
    with pytest.raises(ValueError, match="has 1 document; NSP needs at least 2"):
        prepare_shards(synthetic_docs(1), tok, tmp_path / "one", splits=None)
    prepare_shards(synthetic_docs(10), tok, tmp_path / "all", splits=None, max_seq_len=32)
    with pytest.raises(ValueError, match="already holds prepared NSP shards"):
        prepare_shards(synthetic_docs(10), tok, tmp_path / "all", splits=None)
    assert len(pretraining_loader(tmp_path / "all", tok).dataset) > 0
    with pytest.raises(ValueError, match="has no held-out|holds the whole corpus"):
        pretraining_loader(tmp_path / "all", tok, split="validation")
    with pytest.raises(ValueError, match="no meta.json"):
        pretraining_loader(tmp_path, tok)
    with pytest.raises(ValueError, match="splits="):
        prepare_shards(synthetic_docs(4), tok, tmp_path / "x", splits=("dev",))
    with pytest.raises(ValueError, match="shard_size"):
        prepare_shards(synthetic_docs(4), tok, tmp_path / "y", shard_size=0)


def test_prepare_command_trains_or_loads_a_tokenizer_and_saves_it(setup, tmp_path):
    tok = setup[0]
    docs = synthetic_docs(40, seed=3)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join("\n".join(d.sentences) for d in docs) + "\n", encoding="utf-8")
    summary = prepare_command(corpus, tmp_path / "trained", None, max_seq_len=32, vocab_size=200,
                              splits=None)
    trained = bl.load_tokenizer(summary["tokenizer"])
    assert trained.get_vocab_size() <= 200
    assert len(pretraining_loader(tmp_path / "trained", trained).dataset) > 0
    saved = bl.save_tokenizer(tok, tmp_path / "tok.json")
    summary = prepare_command(corpus, tmp_path / "given", saved, max_seq_len=32, splits=None)
    assert bl.load_tokenizer(summary["tokenizer"]).get_vocab() == tok.get_vocab()


def test_sharded_sampler_splits_the_single_process_order(setup):
    # Two ranks with batch 4 see, batch by batch, exactly the examples of one process with
    # batch 8 (the default shuffled order), epoch after epoch.
    tok, _, examples = setup
    single = pretraining_loader(examples, tok, split=None, batch_size=8, seed=5)
    ranks = [pretraining_loader(examples, tok, split=None, batch_size=4, seed=5,
                                sampler=lambda ds, r=r: ShardedEpochSampler(
                                    ds, num_replicas=2, rank=r, seed=5))
             for r in (0, 1)]
    for epoch in (0, 2):
        for loader in (single, *ranks):
            loader.set_epoch(epoch)
        want = [sorted(masked_rows(b)) for b in single]
        per_rank = [list(loader) for loader in ranks]
        got = [sorted(masked_rows(a) + masked_rows(b)) for a, b in zip(*per_rank, strict=False)]
        n = len(examples) // 8  # full batches (the last, partial one is padded differently)
        assert got[:n] == want[:n]


# --- prepare: bounded memory, output folder checks, failures ---------------------------------------


def folder_bytes(root) -> dict[str, bytes]:
    """Every file under `root` with its bytes, so a test can see that nothing was touched."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def write_text_corpus(folder, n: int = 30) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for d in synthetic_docs(n, seed=4):
        (folder / f"{d.id.replace('/', '_')}.txt").write_text(" ".join(d.sentences), encoding="utf-8")


def test_prepare_cuts_a_long_line_and_keeps_all_of_it(setup, tmp_path):
    from bertlab.corpus import MAX_DOC_CHARS

    tok = setup[0]
    # A BERT-format file that is one 1.2 MB line: before, one "sentence" (dropped by NSP as a
    # one-sentence document); now two documents of many sentences, and the cut is reported.
    sentences = [f"Sentence {i} tells how the {WORDS[i % len(WORDS)]} moved today." for i in
                 range(25_000)]
    corpus = tmp_path / "dump.txt"
    corpus.write_text(" ".join(sentences), encoding="utf-8")
    assert corpus.stat().st_size > MAX_DOC_CHARS
    with pytest.warns(UserWarning, match="1 line"):
        summary = prepare_shards(corpus, tok, tmp_path / "out", splits=None, max_seq_len=64)
    meta = summary["splits"]["all"]
    assert summary["corpus_read"] == {"long_lines_split": 1, "documents_split": 1,
                                      "folders_skipped": 0}
    assert json.loads((tmp_path / "out" / "meta.json").read_text())["corpus_read"] == \
        summary["corpus_read"]
    assert meta["documents"] == 2 and meta["one_sentence_docs_skipped"] == 0
    assert (tmp_path / "out" / "docs.txt").read_text().split() == ["dump/0#1", "dump/0#2"]
    # Nearly every token reaches an example (only the pairs' truncation drops a few).
    text_tokens = sum(len(ids) for ids in bl.encode_sentences(tok, sentences))
    assert meta["tokens"] - 3 * meta["examples"] + meta["tokens_dropped"] >= 0.9 * text_tokens


def test_streaming_batches_are_bounded_by_characters(setup):
    tok = setup[0]
    builder = StreamingNspBuilder(tok, max_seq_len=32, batch_docs=100, batch_chars=2_000)
    for doc in synthetic_docs(60, seed=6):
        list(builder.add(doc))
        assert builder.pending_chars < 2_000 and len(builder.pending) < 100
    assert builder.seen > 0  # batches were flushed on characters, long before 100 documents


@pytest.mark.parametrize("kind", ["run", "hf", "other", "inside_corpus"])
def test_prepare_refuses_an_occupied_or_unsafe_out_folder_and_changes_nothing(setup, tmp_path, kind):
    tok = setup[0]
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
    for call in (lambda: prepare_shards(corpus, tok, out, max_seq_len=32),
                 lambda: prepare_command(corpus, out, None, max_seq_len=32, vocab_size=200)):
        with pytest.raises(ValueError, match=message[kind]):
            call()
        assert folder_bytes(tmp_path) == before  # nothing written, nothing left beside it


def test_prepare_failing_midway_leaves_no_shards(setup, tmp_path):
    tok = setup[0]
    corpus = tmp_path / "corpus"
    write_text_corpus(corpus, n=40)
    (corpus / "zz_empty.txt").write_text("  \n", encoding="utf-8")  # read last: an error midway
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"zz_empty\.txt' has no sentences"):
        prepare_shards(corpus, tok, out, max_seq_len=32, batch_docs=4, shard_size=5)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]  # no partial folder either

    def failing_stream():
        yield from synthetic_docs(50, seed=7)
        raise RuntimeError("disk went away")

    out.mkdir()  # an existing empty folder stays empty
    with pytest.raises(RuntimeError, match="disk went away"):
        prepare_shards(failing_stream(), tok, out, splits=None, max_seq_len=32, batch_docs=4,
                       shard_size=5)
    assert list(out.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "out"]
    # The same corpus, once fixed, prepares into that folder.
    (corpus / "zz_empty.txt").unlink()
    summary = prepare_shards(corpus, tok, out, max_seq_len=32, splits=None)
    assert summary["splits"]["all"]["documents"] == 40
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith("shard-")) == [
        "docs.txt", "meta.json", "tokenizer.json"]
    assert bl.load_tokenizer(out / "tokenizer.json").get_vocab() == tok.get_vocab()
