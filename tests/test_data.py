"""The NSP dataset, the padding + masking collate (word ids from "##" or from the examples), loaders."""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest
import torch
from torch.utils.data import DistributedSampler

import bertlab as bl
from bertlab.corpus import split_documents
from bertlab.data import (
    BATCH_KEYS,
    EpochLoader,
    EpochShuffleSampler,
    LoaderOptions,
    PretrainingCollator,
    PretrainingDataset,
    ShardedEpochSampler,
    pretraining_loader,
)
from bertlab.masking import IGNORE_INDEX, MaskingConfig, example_seed
from bertlab.pairs import IS_NEXT, NOT_NEXT, create_nsp_examples
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
    ds = PretrainingDataset(examples)
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
    ds = PretrainingDataset(examples, seed=7)
    collate = PretrainingCollator(tok)
    alone = masked_rows(collate([ds[3]]))[0]
    mixed = masked_rows(collate([ds[40], ds[3], ds[11]]))[1]
    assert alone == mixed
    ds.set_epoch(1)
    assert masked_rows(collate([ds[3]]))[0] != alone  # dynamic: a new mask next epoch
    other_seed = PretrainingDataset(examples, seed=8)
    assert masked_rows(collate([other_seed[3]]))[0] != alone
    assert ds[3]["row_seed"] == example_seed(7, 1, 3)


def test_static_masks_are_fixed_and_cycle_with_mask_copies(setup):
    tok, _, examples = setup
    collate = PretrainingCollator(tok)
    static = PretrainingDataset(examples, mask_schedule="static")
    first = masked_rows(collate([static[i] for i in range(8)]))
    for epoch in (1, 5):
        static.set_epoch(epoch)
        assert masked_rows(collate([static[i] for i in range(8)])) == first
    cycled = PretrainingDataset(examples, mask_schedule="static", mask_copies=2)
    seen = []
    for epoch in range(3):
        cycled.set_epoch(epoch)
        seen.append(masked_rows(collate([cycled[i] for i in range(8)])))
    assert seen[0] == seen[2] != seen[1]


def test_whole_word_masks_every_piece_of_a_word(setup):
    tok, _, examples = setup
    vocab = {i: t for t, i in tok.get_vocab().items()}
    ds = PretrainingDataset(examples, seed=1)
    batch = PretrainingCollator(tok, MaskingConfig(mlm_probability=0.3), whole_word=True)([ds[i] for i in range(40)])
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


def fake_word_ids(example):
    """Word ids that pair the tokens of A and of B two by two (None at [CLS] and [SEP])."""
    a, b = example.a_len, example.b_len
    return [None, *(i // 2 for i in range(a)), None, *(a + i // 2 for i in range(b)), None]


def test_whole_word_uses_the_items_word_ids_when_they_carry_them(setup):
    tok, _, examples = setup
    words = [fake_word_ids(e) for e in examples[:40]]
    own = PretrainingDataset(examples[:40], word_ids=words, seed=1)
    plain = PretrainingDataset(examples[:40], seed=1)
    assert own[3]["word_ids"].tolist() == [-1 if w is None else w for w in words[3]]
    assert "word_ids" not in plain[3]
    whole = PretrainingCollator(tok, MaskingConfig(mlm_probability=0.3), whole_word=True,
                                return_word_ids=True)
    batch = whole([own[i] for i in range(40)])
    targets = batch["labels"] != IGNORE_INDEX
    for row in range(40):
        n = len(words[row])
        assert batch["word_ids"][row, :n].tolist() == own[row]["word_ids"].tolist()
        assert (batch["word_ids"][row, n:] == -1).all()
        for w in set(own[row]["word_ids"].tolist()) - {-1}:
            hidden = targets[row, :n][torch.from_numpy(own[row]["word_ids"] == w)]
            assert hidden.all() or not hidden.any()  # a pair of tokens is hidden together
    assert not torch.equal(batch["labels"], whole([plain[i] for i in range(40)])["labels"])
    # whole_word=False masks token by token: the word ids change nothing but the extra key.
    by_token = PretrainingCollator(tok, MaskingConfig(mlm_probability=0.3), return_word_ids=True)
    with_ids, without = by_token([own[i] for i in range(40)]), by_token([plain[i] for i in range(40)])
    assert all(torch.equal(with_ids[k], without[k]) for k in BATCH_KEYS)
    # Without word ids in the items, the returned ones are the "##" words the collate masks by.
    pieces = PretrainingCollator(tok, whole_word=True, return_word_ids=True)([plain[i] for i in range(40)])
    assert tuple(pieces) == (*BATCH_KEYS, "word_ids")
    assert (pieces["word_ids"][pieces["attention_mask"] == 0] == -1).all()
    with pytest.raises(ValueError, match="some items carry 'word_ids' and some do not"):
        whole([own[0], plain[1]])


def test_collator_pickles_and_rejects_bad_options(setup):
    tok, _, examples = setup
    collate = pickle.loads(pickle.dumps(PretrainingCollator(tok, whole_word=True)))
    assert tuple(collate([PretrainingDataset(examples)[0]])) == BATCH_KEYS
    with pytest.raises(ValueError, match="mlm_probability"):
        PretrainingCollator(tok, MaskingConfig(mlm_probability=2.0))
    with pytest.raises(ValueError, match="whole_word=True needs the tokenizers.Tokenizer"):
        PretrainingCollator(special_ids(tok), whole_word=True)
    with pytest.raises(ValueError, match="return_word_ids=True needs the tokenizers.Tokenizer"):
        PretrainingCollator(special_ids(tok), return_word_ids=True)
    words = [fake_word_ids(e) for e in examples[:3]]
    with pytest.raises(ValueError, match="one list per example"):
        PretrainingDataset(examples[:3], word_ids=words[:2])
    with pytest.raises(ValueError, match="tokens but"):
        PretrainingDataset(examples[:1], word_ids=[words[0][:-1]])
    with pytest.raises(ValueError, match="pad_to_multiple_of"):
        PretrainingCollator(tok, pad_to_multiple_of=0)


# --- loaders --------------------------------------------------------------------------------------


def all_batches(loader):
    return [masked_rows(b) + [tuple(b["next_sentence_label"].tolist())] for b in loader]


class Recorder:
    """A map-style dataset, batch sampler or anything else that records the epochs it is given."""

    def __init__(self, n: int = 0) -> None:
        self.n, self.epochs = n, []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index


class BatchRecorder(Recorder):
    def __iter__(self):
        return iter([[0, 1], [2]])


def test_epoch_loader_moves_any_dataset_and_sampler_to_the_next_epoch():
    data = Recorder(10)
    loader = EpochLoader(data, batch_size=4, sampler=EpochShuffleSampler(10, seed=3), seed=3)
    first, second = [b.tolist() for b in loader], [b.tolist() for b in loader]
    assert first != second and sorted(sum(first, [])) == list(range(10))
    assert loader.epoch == 1 and data.epochs == [0, 1] and loader.sampler.epoch == 1
    loader.set_epoch(0)
    assert [b.tolist() for b in loader] == first
    assert [b.tolist() for b in loader] == second  # on from the chosen epoch
    assert loader.seed == 3 and EpochLoader(list(range(4))).seed is None
    assert EpochLoader(PretrainingDataset([], seed=9)).seed == 9  # the dataset's data seed
    by_batch = EpochLoader(list(range(3)), batch_sampler=BatchRecorder(2))
    assert [b.tolist() for b in by_batch] == [[0, 1], [2]] and list(by_batch)
    assert by_batch.batch_sampler.epochs == [0, 1]
    with pytest.raises(ValueError, match="epoch=-1"):
        loader.set_epoch(-1)


def test_loader_advances_epochs_and_set_epoch_reproduces(setup):
    tok, small, _ = setup
    loader = pretraining_loader(small, tok, split=None,
                                options=LoaderOptions(batch_size=16, max_seq_len=64))
    epoch0 = all_batches(loader)
    epoch1 = all_batches(loader)
    assert loader.epoch == 1 and epoch0 != epoch1
    loader.set_epoch(0)
    assert all_batches(loader) == epoch0
    # Same examples, same order within an epoch, whatever the number of workers.
    workers = pretraining_loader(small, tok, split=None,
                                 options=LoaderOptions(batch_size=16, max_seq_len=64,
                                                       num_workers=2))
    assert all_batches(workers) == epoch0


def test_distributed_ranks_see_the_same_masks_as_one_process(setup):
    tok, _, examples = setup
    single = pretraining_loader(examples, tok, split=None,
                                options=LoaderOptions(batch_size=len(examples), shuffle=False))
    single.set_epoch(3)
    rows = masked_rows(next(iter(single)))
    for rank in (0, 1):
        def make(ds, rank=rank):
            return DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=False)

        loader = pretraining_loader(examples, tok, split=None,
                                    options=LoaderOptions(batch_size=4, sampler=make))
        loader.set_epoch(3)
        got = [r for b in loader for r in masked_rows(b)]
        want = [rows[i % len(rows)] for i in range(rank, 2 * len(got), 2)][: len(got)]
        assert got == want


def test_loader_splits_and_default_masking(setup):
    tok, small, _ = setup
    train = pretraining_loader(small, tok, options=LoaderOptions(max_seq_len=64))
    val = pretraining_loader(small, tok, split="validation",
                             options=LoaderOptions(max_seq_len=64, shuffle=False))
    groups = split_documents(small)
    assert {e.doc_id for e in train.dataset.examples} <= {d.id for d in groups["train"]}
    assert {e.doc_id for e in val.dataset.examples} <= {d.id for d in groups["validation"]}
    assert (train.dataset.mask_schedule, val.dataset.mask_schedule) == ("dynamic", "static")
    assert all_batches(val) == all_batches(val)  # evaluation sees the same masks every time
    labels = {int(x) for b in train for x in b["next_sentence_label"]}
    assert labels == {IS_NEXT, NOT_NEXT}


def test_loader_with_word_ids_keeps_static_masks_and_samplers(setup):
    tok, _, examples = setup
    words = [fake_word_ids(e) for e in examples]
    options = LoaderOptions(whole_word=True, shuffle=False, batch_size=16, return_word_ids=True)
    cycled = pretraining_loader(examples, tok, split=None, word_ids=words, options=replace(
        options, mask_schedule="static", mask_copies=2))
    seen = [masked_rows(next(iter(cycled))) for _ in range(3)]
    assert seen[0] == seen[2] != seen[1]
    single = pretraining_loader(examples, tok, split=None, word_ids=words, options=options)
    rows = [r for b in single for r in masked_rows(b)]
    for rank in (0, 1):
        ranked = pretraining_loader(examples, tok, split=None, word_ids=words, options=replace(
            options, sampler=lambda ds, r=rank: DistributedSampler(
                ds, num_replicas=2, rank=r, shuffle=False)))
        got = [r for b in ranked for r in masked_rows(b)]
        assert got == [rows[i % len(rows)] for i in range(rank, 2 * len(got), 2)][: len(got)]
    with pytest.raises(ValueError, match="word_ids go with the NSP examples"):
        pretraining_loader(setup[1], tok, word_ids=words)


def test_loader_errors(setup):
    tok, small, examples = setup
    with pytest.raises(ValueError, match="pass split=None"):
        pretraining_loader(examples, tok)
    with pytest.raises(ValueError, match="only applies to mask_schedule='static'"):
        pretraining_loader(examples, tok, split=None, options=LoaderOptions(mask_copies=3))
    with pytest.raises(ValueError, match="mask_schedule='random' is not known"):
        pretraining_loader(examples, tok, split=None, options=LoaderOptions(mask_schedule="random"))
    with pytest.raises(ValueError, match="pass a bertlab.data.LoaderOptions"):
        pretraining_loader(examples, tok, split=None, options={"batch_size": 8})
    with pytest.raises(ValueError, match="split='dev' is not known"):
        pretraining_loader(small, tok, split="dev")
    with pytest.raises(ValueError, match="sampler='ddp'"):
        pretraining_loader(examples, tok, split=None, options=LoaderOptions(sampler="ddp"))
    with pytest.raises(ValueError, match=r"takes Documents, Examples \(bertlab.pairs\) or a "):
        pretraining_loader([1, 2, 3], tok)
    with pytest.raises(ValueError, match="no 'test' documents"):
        pretraining_loader([d for d in small if d.split == "train"], tok, split="test")



def test_sharded_sampler_splits_the_single_process_order(setup):
    # Two ranks with batch 4 see, batch by batch, exactly the examples of one process with
    # batch 8 (the default shuffled order), epoch after epoch.
    tok, _, examples = setup
    single = pretraining_loader(examples, tok, split=None, seed=5,
                                options=LoaderOptions(batch_size=8))
    ranks = [pretraining_loader(examples, tok, split=None, seed=5, options=LoaderOptions(
                 batch_size=4, sampler=lambda ds, r=r: ShardedEpochSampler(
                     ds, num_replicas=2, rank=r, seed=5)))
             for r in (0, 1)]
    for epoch in (0, 2):
        for loader in (single, *ranks):
            loader.set_epoch(epoch)
        want = [sorted(masked_rows(b)) for b in single]
        per_rank = [list(loader) for loader in ranks]
        got = [sorted(masked_rows(a) + masked_rows(b)) for a, b in zip(*per_rank, strict=False)]
        n = len(examples) // 8  # full batches (the last, partial one is padded differently)
        assert got[:n] == want[:n]


def test_the_collator_takes_its_masking_as_one_object(setup):
    tok, _, _ = setup
    with pytest.raises(ValueError, match="pass a bertlab.masking.MaskingConfig"):
        PretrainingCollator(tok, {"mlm_probability": 0.4})
    with pytest.raises(TypeError):
        PretrainingCollator(tok, mlm_probability=0.4)  # no loose options: one object
