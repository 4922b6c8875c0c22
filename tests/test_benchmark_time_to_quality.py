"""benchmarks/time_to_quality.py: transformers' arm is scored and fed as the bertlab arms are."""

from __future__ import annotations

import pytest
import torch

import bertlab as bl
from bertlab.course.cloze import CLOZE_SET, cloze_score
from bertlab.data import LoaderOptions, pretraining_loader
from bertlab.hf import from_hf_state_dict
from bertlab.masking import IGNORE_INDEX
from bertlab.model import BertConfig, BertForPreTraining
from bertlab.pretraining import evaluate

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def script(load_benchmark):
    return load_benchmark("time_to_quality")


@pytest.fixture(scope="module")
def setup(one_thread):
    docs = bl.load_corpus("bbc")
    return docs[:40], bl.train_tokenizer(docs, vocab_size=8192)


def test_wrapped_transformers_model_gets_bertlab_scores_of_the_same_weights(script, setup):
    docs, tok = setup
    cfg = BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, num_layers=1, num_heads=2,
                     intermediate_size=64, max_position_embeddings=64)
    theirs = script.HfBert(cfg, seed=0).eval()
    state, missing = from_hf_state_dict(theirs.hf.state_dict(), cfg, "pretraining")
    assert missing == []
    ours = BertForPreTraining(cfg)
    ours.load_state_dict(state)
    val = pretraining_loader(docs, tok, split=None, seed=0,
                             options=LoaderOptions(batch_size=4, max_seq_len=48))
    got, want = evaluate(theirs, val, 2), evaluate(ours.eval(), val, 2)
    assert got.keys() == want.keys() and "mask_accuracy" in got
    assert got == pytest.approx(want, rel=1e-4, abs=1e-5)
    items = CLOZE_SET[:5]
    got_cloze, want_cloze = cloze_score(theirs, tok, items), cloze_score(ours, tok, items)
    assert [g["top"] for g in got_cloze["guesses"]] == [g["top"] for g in want_cloze["guesses"]]


def test_transformers_loader_has_the_bertlab_loaders_examples_in_its_order(script, setup):
    docs, tok = setup
    ours = pretraining_loader(docs, tok, split=None, seed=3,
                              options=LoaderOptions(batch_size=4, max_seq_len=48))
    theirs = script.hf_loader(ours, tok, seed=3)
    for _ in range(2):  # two epochs: the order is reshuffled alike
        for i, (a, b) in enumerate(zip(ours, theirs, strict=False)):
            if i == 3:
                break
            original = {name: torch.where(x["labels"] != IGNORE_INDEX, x["labels"],
                                          x["input_ids"]) for name, x in (("a", a), ("b", b))}
            assert torch.equal(original["a"], original["b"])
            assert torch.equal(a["next_sentence_label"], b["next_sentence_label"])
            assert torch.equal(a["token_type_ids"], b["token_type_ids"])
            special = torch.isin(original["b"], torch.tensor([tok.token_to_id("[CLS]"),
                                                               tok.token_to_id("[SEP]")]))
            assert (b["labels"][special] == IGNORE_INDEX).all()  # transformers masks no specials
