"""Objectives as a list: the registry, sentence-order pairs (SOP), and SOP trained end to end."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from bertlab.corpus import Document
from bertlab.data import LoaderOptions, PretrainingDataset, pretraining_loader
from bertlab.engine.shards import shard_loader
from bertlab.model import BertConfig, BertForPreTraining
from bertlab.pairs import (
    IN_ORDER,
    IS_NEXT,
    OBJECTIVES,
    SWAPPED,
    Example,
    check_objectives,
    create_nsp_examples,
    create_single_examples,
    create_sop_examples,
    pair_builder,
    pairs_of,
    segment_ids,
    tokenize_corpus,
)
from bertlab.pretraining import PretrainingObjective, evaluate, pretrain
from bertlab.readers import load_corpus
from bertlab.recipes import recipe
from bertlab.tokenizer import special_ids, train_tokenizer
from bertlab.train import TrainConfig
from tests.test_train import InterruptAt

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def docs():
    return load_corpus("bbc")[:40]


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(load_corpus("bbc")[:200], vocab_size=500)


# ---------------------------------------------------------------------------------------------
# The registry


def test_objective_lists_are_checked_and_named():
    assert check_objectives("mlm,sop") == ("mlm", "sop")
    assert check_objectives(["mlm"]) == ("mlm",)
    assert pairs_of(("mlm",)) == "nsp" and pairs_of(("mlm", "sop")) == "sop"
    assert pair_builder("sop") is create_sop_examples
    for bad, message in [("mlm,xyz", "unknown objective 'xyz'"), ("mlm,mlm", "twice"),
                         ("nsp", "leaves out mlm"), ("mlm,nsp,sop", "nsp and sop both train"),
                         ("", "unknown objective ''")]:
        with pytest.raises(ValueError, match=message):
            check_objectives(bad, "--objectives")
    with pytest.raises(ValueError, match="pairs='mlm' is not a pair objective"):
        pair_builder("mlm")


def test_every_pair_objective_names_what_only_it_trains():
    model_names = {n for n, _ in BertForPreTraining(BertConfig.preset(
        "tiny", vocab_size=100)).named_parameters()}
    for spec in OBJECTIVES.values():
        assert spec.pairs is None or spec.trains, spec.name
        for prefix in spec.trains:
            assert any(n.startswith(prefix) for n in model_names), (spec.name, prefix)


def test_a_recipe_carries_its_objectives_to_the_loader():
    course = recipe("course")
    assert course.objectives == ("mlm",) and recipe("bert").objectives == ("mlm", "nsp")
    sop = course.with_objectives("mlm,sop")
    assert sop.objectives == ("mlm", "sop") and sop.loader_options().pairs == "sop"
    with pytest.raises(ValueError, match="leaves out mlm"):
        course.with_objectives("sop")


# ---------------------------------------------------------------------------------------------
# Sentence-order pairs


def _segments(e) -> tuple[list[int], list[int]]:
    return e.input_ids[1:1 + e.a_len], e.input_ids[2 + e.a_len:-1]


def test_nsp_without_negatives_gives_only_in_order_pairs_and_needs_one_document(docs, tok):
    positives = create_nsp_examples(docs, tok, max_seq_len=64, seed=0, negatives=False)
    assert positives and all(e.next_sentence_label == IS_NEXT for e in positives)
    assert all(e.b_doc_index == e.doc_index and e.b_sentences[0] == e.a_sentences[1]
               for e in positives)
    assert create_nsp_examples(docs[:1], tok, max_seq_len=64, negatives=False)
    with pytest.raises(ValueError, match="negatives=False needs balance='exact'"):
        create_nsp_examples(docs, tok, balance="google", negatives=False)


def test_sop_pairs_are_nsp_positives_half_of_them_swapped(docs, tok):
    positives = create_nsp_examples(docs, tok, max_seq_len=64, seed=3, negatives=False)
    sop = create_sop_examples(docs, tok, max_seq_len=64, seed=3)
    assert len(sop) == len(positives) and all(isinstance(e, Example) for e in sop)
    special = special_ids(tok)
    for s, p in zip(sop, positives, strict=True):
        a, b = _segments(p)
        swapped = s.next_sentence_label == SWAPPED
        assert s.input_ids[0] == special.cls and s.input_ids[-1] == special.sep
        assert _segments(s) == ((b, a) if swapped else (a, b))
        assert s.next_sentence_label in (IN_ORDER, SWAPPED)
        # A is the first segment, wherever in the document it comes from.
        assert (s.a_sentences, s.a_cut) == ((p.b_sentences, p.b_cut) if swapped else
                                            (p.a_sentences, p.a_cut))
        assert s.token_type_ids == [0] * (s.a_len + 2) + [1] * (s.b_len + 1)
        assert len(s.token_type_ids) == len(s.input_ids) <= 64
    swapped = sum(e.next_sentence_label == SWAPPED for e in sop)
    assert abs(swapped - len(sop) / 2) < 4 * math.sqrt(len(sop) / 4)  # a fair coin, 4 sigma
    assert [e.input_ids for e in create_sop_examples(docs, tok, max_seq_len=64, seed=3)] == \
        [e.input_ids for e in sop]
    assert [e.next_sentence_label for e in create_sop_examples(docs, tok, max_seq_len=64,
                                                               seed=4)] != \
        [e.next_sentence_label for e in sop]
    with pytest.raises(ValueError, match="balance must be 'exact'"):
        create_sop_examples(docs, tok, balance="google")


def test_loader_builds_the_pairs_it_is_asked_for(docs, tok, tmp_path):
    sop = pretraining_loader(docs, tok, split=None, seed=0,
                             options=LoaderOptions(batch_size=8, max_seq_len=64, pairs="sop"))
    assert all(isinstance(e, Example) for e in sop.dataset.examples)
    batch = next(iter(sop))
    labels = [sop.dataset.examples[i].next_sentence_label for i in range(len(sop.dataset))]
    assert set(batch["next_sentence_label"].tolist()) <= {IN_ORDER, SWAPPED}
    assert set(labels) == {IN_ORDER, SWAPPED}
    given = pretraining_loader(list(sop.dataset.examples), tok, split=None,
                               options=LoaderOptions(batch_size=8))
    assert len(given.dataset) == len(sop.dataset)
    (tmp_path / "shards").mkdir()
    with pytest.raises(ValueError, match="hold NSP pairs .* pass the corpus itself"):
        shard_loader(tmp_path / "shards", tok, options=LoaderOptions(pairs="sop"))
    with pytest.raises(ValueError, match="pairs='xyz' is not a pair objective"):
        pretraining_loader(docs, tok, options=LoaderOptions(pairs="xyz"))


def test_a_one_document_corpus_trains_sop_but_not_nsp(tok):
    sentences = [f"sentence number {i} of my notes." for i in range(40)]
    text = Document(id="notes", text=" ".join(sentences), sentences=sentences)
    assert pretraining_loader([text], tok, split=None,
                              options=LoaderOptions(batch_size=4, max_seq_len=32, pairs="sop"))
    with pytest.raises(ValueError, match="NSP needs at least 2"):
        pretraining_loader([text], tok, split=None,
                           options=LoaderOptions(batch_size=4, max_seq_len=32))


# ---------------------------------------------------------------------------------------------
# Single segments: masked LM alone on text without sentence pairs


def _reviews(n=30):
    """Documents of one sentence each, as reviews or tweets are."""
    return [Document(id=f"r{i}", text=t, sentences=[t]) for i, t in enumerate(
        f"review {i} says the film was {'good' if i % 2 else 'slow'} and the music loud."
        for i in range(n))]


def test_every_builder_gives_the_one_example_type_and_its_segment_ids(docs, tok):
    # NSP pairs, SOP pairs and single segments (and shards: tests/test_shards.py) are one
    # frozen Example; their segment ids come from segment_ids, as the loader's items do.
    for build in (create_nsp_examples, create_sop_examples, create_single_examples):
        examples = build(docs[:40], tok, max_seq_len=64, seed=0)
        assert {type(e) for e in examples} == {Example}
        first = examples[0]
        assert first.token_type_ids == segment_ids(len(first.input_ids), first.a_len).tolist()
        assert PretrainingDataset(examples)[0]["token_type_ids"].tolist() == first.token_type_ids
        with pytest.raises(dataclasses.FrozenInstanceError):
            first.a_len = 3


def test_single_segments_pack_whole_sentences_of_one_document(docs, tok):
    special = special_ids(tok)
    examples = create_single_examples(docs, tok, max_seq_len=64, short_seq_prob=0.0, seed=3)
    assert examples and all(isinstance(e, Example) for e in examples)
    by_doc: dict[int, list] = {}
    for e in examples:
        assert e.input_ids[0] == special.cls and e.input_ids[-1] == special.sep
        assert len(e.input_ids) == e.a_len + 2 <= 64
        assert special.sep not in e.input_ids[1:-1]  # one segment: no [SEP] inside
        assert e.token_type_ids == [0] * len(e.input_ids)
        assert e.next_sentence_label == -100  # no pair label: no pair loss, no pair figure
        by_doc.setdefault(e.doc_index, []).append(e.a_sentences)
    # Every sentence of every document is used once, in order, within its own document.
    corpus = tokenize_corpus(docs, tok)
    for d, sents in enumerate(corpus.sentences):
        ranges = by_doc.get(d, [])
        assert [r[0] for r in ranges] == [0, *(r[1] for r in ranges[:-1])]
        assert (ranges[-1][1] if ranges else 0) == len(sents)
    same = create_single_examples(docs, tok, max_seq_len=64, short_seq_prob=0.0, seed=3)
    assert [e.input_ids for e in same] == [e.input_ids for e in examples]
    with pytest.raises(ValueError, match="no pair label to balance"):
        create_single_examples(docs, tok, balance="google")


def test_one_sentence_documents_lose_nothing_as_single_segments(tok):
    reviews = _reviews()
    with pytest.raises(ValueError, match="have one sentence.*pairs='single'"):
        pretraining_loader(reviews, tok, split=None,
                           options=LoaderOptions(batch_size=4, max_seq_len=32))
    loader = pretraining_loader(reviews, tok, split=None,
                                options=LoaderOptions(batch_size=4, max_seq_len=32, pairs="single"))
    assert len(loader.dataset) == len(reviews)  # one example per review: no text skipped
    batch = next(iter(loader))
    assert batch["token_type_ids"].eq(0).all()
    assert batch["next_sentence_label"].eq(-100).all()
    metrics = evaluate(_tiny(tok), loader)
    assert "mask_accuracy" in metrics and not any(k.startswith("nsp") for k in metrics)
    assert pairs_of(("mlm",), "single") == "single"
    with pytest.raises(ValueError, match="nsp trains on sentence pairs"):
        pairs_of(("mlm", "nsp"), "single")


def test_masked_lm_alone_trains_on_single_segments_and_resumes_exactly(tok, tmp_path):
    config = TrainConfig(max_steps=6, batch_size=4, lr=3e-3, checkpoint_interval=None,
                         eval_interval=3, progress=False, device="cpu")

    def loader():
        return pretraining_loader(_reviews(), tok, split=None, seed=0,
                                  options=LoaderOptions(batch_size=4, max_seq_len=32,
                                                        pairs="single"))

    model = _tiny(tok)
    head = model.nsp.weight.detach().clone()
    full = pretrain(model, loader(), loader(), config, out_dir=tmp_path / "full",
                    objectives=("mlm",))
    assert torch.equal(model.nsp.weight, head)  # no pair label reached the pair head
    assert all(math.isfinite(x) for x in full.step_losses) and len(full.step_losses) == 6
    assert not any(k.startswith("val_nsp") for row in full.history for k in row)
    with pytest.raises(KeyboardInterrupt):
        pretrain(_tiny(tok), InterruptAt(loader(), 4), None, config, out_dir=tmp_path / "cut",
                 objectives=("mlm",))
    resumed = pretrain(_tiny(tok, seed=1), loader(), None, config, out_dir=tmp_path / "cut",
                       resume=True, objectives=("mlm",))
    assert resumed.step_losses == full.step_losses[3:]  # bit for bit


# ---------------------------------------------------------------------------------------------
# SOP, trained


def _tiny(tok, seed=0):
    config = BertConfig.preset("tiny", vocab_size=tok.get_vocab_size(), hidden_size=32,
                               intermediate_size=64, max_position_embeddings=64)
    return BertForPreTraining(config, generator=torch.Generator().manual_seed(seed))


def test_sop_trains_the_pair_head_and_resumes_exactly(docs, tok, tmp_path):
    config = TrainConfig(max_steps=6, batch_size=8, lr=3e-3, checkpoint_interval=None,
                         eval_interval=None, progress=False, device="cpu")

    def loader():
        return pretraining_loader(docs, tok, split=None, seed=0,
                                  options=LoaderOptions(batch_size=8, max_seq_len=64, pairs="sop"))

    model = _tiny(tok)
    head = model.nsp.weight.detach().clone()
    full = pretrain(model, loader(), None, config, out_dir=tmp_path / "full",
                    objectives=("mlm", "sop"))
    assert not torch.equal(model.nsp.weight, head)  # the pair head learned from SOP
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C when the 4th batch is asked for
        pretrain(_tiny(tok), InterruptAt(loader(), 4), None, config, out_dir=tmp_path / "cut",
                 objectives=("mlm", "sop"))
    with pytest.raises(ValueError, match="objective mlm,sop, this resume has mlm,nsp.*"
                                         "--objectives"):
        pretrain(_tiny(tok), loader(), None, config, out_dir=tmp_path / "cut", resume=True)
    resumed = pretrain(_tiny(tok, seed=1), loader(), None, config, out_dir=tmp_path / "cut",
                       resume=True, objectives="mlm,sop")
    assert resumed.first_step == 3
    assert resumed.step_losses == full.step_losses[3:]  # bit for bit
    state = json.loads(next((tmp_path / "cut" / "checkpoints").iterdir()).joinpath(
        "state.json").read_text())
    assert state["objective"] == "mlm,sop"


def test_the_loop_objective_is_named_by_its_list():
    assert PretrainingObjective(("mlm", "sop")).name == "mlm,sop"
    assert PretrainingObjective().name == "mlm,nsp"


def test_a_pair_objective_on_other_pairs_is_refused_before_any_step(docs, tok):
    # The SOP head trained on IsNext/NotNext labels learned another task without a word.
    config = TrainConfig(max_steps=2, batch_size=8, progress=False, device="cpu")
    nsp = pretraining_loader(docs, tok, split=None,
                             options=LoaderOptions(batch_size=8, max_seq_len=64, pairs="nsp"))
    sop = pretraining_loader(docs, tok, split=None,
                             options=LoaderOptions(batch_size=8, max_seq_len=64, pairs="sop"))
    single = pretraining_loader(_reviews(), tok, split=None,
                                options=LoaderOptions(batch_size=8, max_seq_len=32, pairs="single"))
    assert (nsp.pairs, sop.pairs, single.pairs) == ("nsp", "sop", "single")
    model = _tiny(tok)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"objectives mlm,sop: sop trains the pair head on "
                                         r"sentence-order pairs .* the training loader holds "
                                         r"NSP pairs .* pairs='sop'"):
        pretrain(model, nsp, None, config, objectives=("mlm", "sop"))
    with pytest.raises(ValueError, match=r"the validation loader holds NSP pairs"):
        pretrain(model, sop, nsp, config, objectives="mlm,sop")
    with pytest.raises(ValueError, match=r"mlm,nsp: nsp .* training loader holds single "
                                         r"segments .* train objectives \('mlm',\) alone"):
        pretrain(model, single, None, config, objectives=("mlm", "nsp"))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    # Ready-made examples say nothing of how they were built: not checked.
    given = pretraining_loader(create_sop_examples(docs, tok, max_seq_len=64, seed=0), tok,
                               split=None, options=LoaderOptions(batch_size=8))
    assert given.pairs is None


def test_a_batch_larger_than_the_training_examples_is_refused(tok):
    loader = pretraining_loader(_reviews(10), tok, split=None, options=LoaderOptions(
        batch_size=16, max_seq_len=32, pairs="single"))
    with pytest.raises(ValueError, match=r"batch_size=16 is larger than the 10 training "
                                         r"examples.*at most 10"):
        pretrain(_tiny(tok), loader, None, TrainConfig(max_steps=2, batch_size=16,
                                                       progress=False, device="cpu"),
                 objectives=("mlm",))


def test_a_model_smaller_than_the_loaders_tokenizer_is_refused(docs, tok):
    # Its ids would index past the embedding table: a raw IndexError from inside the model.
    small = BertForPreTraining(BertConfig.preset("tiny", vocab_size=tok.get_vocab_size() - 100,
                                                 hidden_size=32, intermediate_size=64,
                                                 max_position_embeddings=64))
    train = pretraining_loader(docs, tok, split=None,
                               options=LoaderOptions(batch_size=8, max_seq_len=64))
    message = rf"tokenizer has {tok.get_vocab_size()} tokens but the model's vocabulary has 400"
    with pytest.raises(ValueError, match=rf"pretrain \(training loader\): the loader's {message}"):
        pretrain(small, train, None, TrainConfig(max_steps=1, batch_size=8, progress=False,
                                                 device="cpu"))
    with pytest.raises(ValueError, match=rf"evaluate: the loader's {message}"):
        evaluate(small, train, 1)
