"""Pairs drawn afresh each epoch: `pair_draws=K` cuts the corpus into pairs K times and epoch e
trains on draw e % K, in memory and from shards, on one process and under DDP, resumably."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import bertlab as bl
from bertlab.data import (
    LoaderOptions,
    PairDraws,
    PretrainingDataset,
    ShardedEpochSampler,
    pretraining_loader,
)
from bertlab.engine.resume import DataPosition
from bertlab.engine.shards import (
    PrepareOptions,
    ShardExamples,
    pair_draws_in,
    prepare_shards,
    shard_loader,
)
from bertlab.engine.streaming import StreamOptions
from bertlab.pairs import create_nsp_examples, pair_draw_seed


@pytest.fixture(scope="module")
def setup():
    docs = bl.load_corpus("bbc")
    tok = bl.train_tokenizer(docs)
    return tok, docs[:150]


def rows(batch):
    """The batch's rows, unpadded, with their masks: what one example looks like in a step."""
    out = []
    for ids, labels, att in zip(batch["input_ids"], batch["labels"], batch["attention_mask"],
                                strict=True):
        n = int(att.sum())
        out.append((tuple(ids[:n].tolist()), tuple(labels[:n].tolist())))
    return sorted(out)


def examples_of_epoch(dataset, epoch):
    dataset.set_epoch(epoch)
    return [(tuple(int(t) for t in dataset.examples[i].input_ids),
             dataset.examples[i].next_sentence_label) for i in range(len(dataset))]


def test_draw_zero_is_the_single_draw_and_later_draws_pair_the_text_otherwise(setup):
    tok, docs = setup
    one = pretraining_loader(docs, tok, split=None, seed=3, options=LoaderOptions(max_seq_len=64))
    three = pretraining_loader(docs, tok, split=None, seed=3,
                               options=LoaderOptions(max_seq_len=64, pair_draws=3))
    assert isinstance(one.dataset.examples, list) and three.dataset.pair_draws == 3
    # Epoch 0 of three draws is, batch for batch, the run without draws.
    assert [b["input_ids"].tolist() for b in one] == [b["input_ids"].tolist() for b in three]
    draws = [examples_of_epoch(three.dataset, e) for e in range(4)]
    assert draws[3] == draws[0]  # epoch 3 is draw 0 again
    assert draws[1] != draws[0] and draws[2] != draws[1] and draws[2] != draws[0]
    # The same text, cut otherwise: most pairs of draw 1 are not pairs of draw 0, and each draw
    # keeps NSP's balance.
    shared = len(set(draws[0]) & set(draws[1])) / len(draws[1])
    assert shared < 0.5
    for d in draws[:3]:
        not_next = sum(label for _, label in d) / len(d)
        assert 0.4 < not_next < 0.6
    # Each draw is exactly create_nsp_examples with the draw's seed.
    want = create_nsp_examples(docs, tok, max_seq_len=64, seed=pair_draw_seed(3, 2))
    assert draws[2] == [(tuple(e.input_ids), e.next_sentence_label) for e in want]
    assert pair_draw_seed(3, 0) == 3 and len({pair_draw_seed(3, k) for k in range(50)}) == 50


def test_the_loader_follows_each_draws_own_length_and_resumes_exactly(setup):
    tok, docs = setup
    loader = pretraining_loader(docs, tok, split=None, seed=1,
                                options=LoaderOptions(max_seq_len=64, pair_draws=2, batch_size=8))
    lengths = []
    for _ in range(2):
        batches = list(loader)
        lengths.append(sum(len(b["input_ids"]) for b in batches))
        assert len(batches) == len(loader)  # the loader's length is the current draw's
    sizes = [len(d) for d in loader.dataset.draws]
    assert lengths == sizes
    # A resume into epoch 1 at batch 3 sees what the uninterrupted run saw.
    loader.set_epoch(1)
    straight = [b["input_ids"].tolist() for b in loader]
    resumed = DataPosition(pretraining_loader(
        docs, tok, split=None, seed=1,
        options=LoaderOptions(max_seq_len=64, pair_draws=2, batch_size=8)), 1, 3)
    assert [resumed.next()["input_ids"].tolist() for _ in range(len(straight) - 3)] == straight[3:]
    # Another number of draws is another dataset, so a resume cannot mix them up.
    assert loader.dataset.digest() != pretraining_loader(
        docs, tok, split=None, seed=1,
        options=LoaderOptions(max_seq_len=64, pair_draws=3)).dataset.digest()


def test_ddp_ranks_split_each_draw_as_one_process_sees_it(setup):
    tok, docs = setup
    common = LoaderOptions(max_seq_len=64, pair_draws=2)
    single = pretraining_loader(docs, tok, split=None, seed=2,
                                options=replace(common, batch_size=8))
    ranks = [pretraining_loader(docs, tok, split=None, seed=2, options=replace(
                 common, batch_size=4, sampler=lambda ds, r=r: ShardedEpochSampler(
                     ds, num_replicas=2, rank=r, seed=2))) for r in (0, 1)]
    for epoch in (0, 1):
        for loader in (single, *ranks):
            loader.set_epoch(epoch)
        want = [rows(b) for b in single]
        got = [sorted(rows(a) + rows(b)) for a, b in zip(*[list(r) for r in ranks], strict=True)]
        full = len(single.dataset) // 8  # the last, partial batch is padded differently
        assert full > 5 and got[:full] == want[:full]
        assert len(got) == len(want)  # each epoch as long as its own draw


def test_shards_keep_their_draws_apart(setup, tmp_path):
    tok, docs = setup
    summary = prepare_shards(docs, tok, tmp_path / "s", PrepareOptions(
        StreamOptions(max_seq_len=64), pair_draws=3, shard_size=200), seed=0)
    train = summary["splits"]["train"]
    assert train["pair_draws"] == 3 and len(train["draws"]) == 3
    assert summary["splits"]["validation"].get("pair_draws", 1) == 1  # always the same pairs
    assert pair_draws_in(tmp_path / "s" / "train") == 3
    folders = [ShardExamples(tmp_path / "s" / "train", draw=k) for k in range(3)]
    assert [len(f) for f in folders] == [d["examples"] for d in train["draws"]]
    assert train["examples"] == len(folders[0])  # the top-level counts are draw 0's
    first = [tuple(folders[0][i].input_ids.tolist()) for i in range(len(folders[0]))]
    second = [tuple(folders[1][i].input_ids.tolist()) for i in range(len(folders[1]))]
    assert len(set(first) & set(second)) / len(second) < 0.5
    # Draw 0 alone is what one draw would have written: a reader of one draw gets it.
    one = prepare_shards(docs, tok, tmp_path / "one",
                         PrepareOptions(StreamOptions(max_seq_len=64), shard_size=200), seed=0)
    assert one["splits"]["train"]["examples"] == train["examples"]
    single = ShardExamples(tmp_path / "one" / "train")
    assert [tuple(single[i].input_ids.tolist()) for i in range(len(single))] == first
    # The loader reads all draws by default, fewer when asked, and refuses more than there are.
    loader = shard_loader(tmp_path / "s", tok, split="train")
    assert loader.dataset.pair_draws == 3
    assert examples_of_epoch(loader.dataset, 1)[0][0] == second[0]
    assert shard_loader(tmp_path / "s", tok, split="train",
                        options=LoaderOptions(pair_draws=2)).dataset.pair_draws == 2
    with pytest.raises(ValueError, match="hold 3 draw.*--pair-draws 5"):
        shard_loader(tmp_path / "s", tok, split="train", options=LoaderOptions(pair_draws=5))
    with pytest.raises(ValueError, match="holds 3 pair draw"):
        ShardExamples(tmp_path / "s" / "train", draw=3)
    meta = json.loads((tmp_path / "s" / "train" / "meta.json").read_text())
    assert all(s["name"].startswith("draw-2-") for s in meta["draws"][2]["shards"])


def test_bad_pair_draws_are_refused_with_the_fix(setup, tmp_path):
    tok, docs = setup
    examples = create_nsp_examples(docs, tok, max_seq_len=64)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="pass a whole number >= 1"):
            pretraining_loader(docs, tok, split=None, options=LoaderOptions(pair_draws=bad))
    with pytest.raises(ValueError, match="ready-made pair examples and pair_draws=2"):
        pretraining_loader(examples, tok, split=None, options=LoaderOptions(pair_draws=2))
    with pytest.raises(ValueError, match="choose one"):
        prepare_shards(docs, tok, tmp_path / "x",
                       PrepareOptions(StreamOptions(dupe_factor=2), pair_draws=2))
    assert not (tmp_path / "x").exists()
    with pytest.raises(ValueError, match="every draw needs examples"):
        PairDraws([examples, []])
    with pytest.raises(ValueError, match="word_ids belong to one set"):
        PretrainingDataset(PairDraws([examples, examples]), word_ids=[[None]] * len(examples))


def test_draws_beyond_memory_are_refused_before_they_are_built(setup, monkeypatch):
    # --pair-draws 100000 built every draw before step 1: no output while memory grew.
    tok, docs = setup
    built = []
    real = bl.data.pair_builder("nsp")
    monkeypatch.setattr(bl.data, "pair_builder", lambda pairs: lambda *a, **k: (
        built.append(k["seed"]), real(*a, **k))[1])
    with pytest.raises(ValueError, match=r"pair_draws=100000 would build "
                                         r"100000 draws of \d+ pairs in memory before the first "
                                         r"step, about [\d,.]+ GiB .*pass pair_draws <= \d+ .*"
                                         r"prepare --pair-draws K"):
        pretraining_loader(docs, tok, split=None,
                           options=LoaderOptions(max_seq_len=64, pair_draws=100_000))
    assert built == [pair_draw_seed(0, 0)]  # draw 0 only, to measure one draw
    monkeypatch.setattr(bl.data, "MAX_DRAWS_BYTES", 1)
    with pytest.raises(ValueError, match=r"pass pair_draws <= 1 "):
        pretraining_loader(docs, tok, split=None,
                           options=LoaderOptions(max_seq_len=64, pair_draws=2))
    assert pretraining_loader(docs, tok, split=None,
                              options=LoaderOptions(max_seq_len=64)).dataset.pair_draws == 1
