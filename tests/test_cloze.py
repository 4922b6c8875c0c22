"""The cloze set: well-formed, answerable by the course tokenizer, original, and scored right."""

from __future__ import annotations

import re
from collections import Counter

import pytest
import torch

import bertlab as bl
import bertlab.course.cloze as cloze_mod
from bertlab.course.cloze import CLOZE_SET, ClozeItem, cloze_score

TOPICS = ("business", "entertainment", "politics", "sport", "tech")
RUN = 6  # words in a row that may not appear in the corpus


@pytest.fixture(scope="module")
def docs():
    return bl.load_corpus("bbc")


@pytest.fixture(scope="module")
def tok(docs):
    return bl.train_tokenizer(docs, vocab_size=8192)


def _words(text: str) -> list[str]:
    """Lower-case words with every punctuation mark split off, as the cloze sentences are written."""
    return re.sub(r"([^\w\s])", r" \1 ", text.lower()).split()


def test_the_set_is_well_formed():
    assert len(CLOZE_SET) >= 60
    topics = Counter(item.topic for item in CLOZE_SET)
    assert set(topics) == set(TOPICS), topics
    assert min(topics.values()) >= 10, topics
    assert len({item.text for item in CLOZE_SET}) == len(CLOZE_SET), "a sentence is repeated"
    for item in CLOZE_SET:
        assert item.text.count("[MASK]") == 1, item.text
        assert 1 <= len(item.answers) <= 4, item
        for word in item.answers:
            assert word and word == word.lower() and word.isalpha(), (item.text, word)


def test_every_item_has_a_single_token_answer(tok):
    unanswerable = [item.text for item in CLOZE_SET
                    if all(tok.token_to_id(word) is None for word in item.answers)]
    assert not unanswerable, unanswerable


def test_no_item_is_copied_from_the_corpus(docs):
    corpus = " " + " ".join(_words(" ".join(d.text for d in docs))) + " "
    copied = []
    for item in CLOZE_SET:
        for side in item.text.split("[MASK]"):  # runs that do not span the blank
            words = _words(side)
            for i in range(len(words) - RUN + 1):
                run = " " + " ".join(words[i:i + RUN]) + " "
                if run in corpus:
                    copied.append(f"{item.text!r}: {run.strip()!r}")
    assert not copied, "these runs are in the corpus:\n" + "\n".join(copied)


def test_an_untrained_model_scores_between_zero_and_one(tok, one_thread):
    config = bl.BertConfig.preset("tiny", vocab_size=tok.get_vocab_size())
    model = bl.BertForPreTraining(config, generator=torch.Generator().manual_seed(0))
    result = cloze_score(model, tok)
    assert result["items"] == len(CLOZE_SET) == len(result["guesses"])
    assert 0.0 <= result["top1"] <= result["top5"] <= 1.0
    first = result["guesses"][0]
    assert first["text"] == CLOZE_SET[0].text and len(first["top"]) == 5
    assert first["hit1"] == (first["top"][0] in CLOZE_SET[0].answers)


def test_a_model_that_knows_every_answer_scores_one(tok, monkeypatch):
    answer_of = {item.text: item.answers[0] for item in CLOZE_SET}

    def perfect(model, tokenizer, text, top_k):
        return [[(answer_of[text], 1.0)] + [("the", 0.0)] * (top_k - 1)]

    monkeypatch.setattr(cloze_mod, "fill_mask", perfect)
    result = cloze_score(None, tok, top_k=3)
    assert result["top1"] == result["top3"] == 1.0
    assert all(g["hit1"] and g["hitk"] for g in result["guesses"])


def test_a_wrong_first_guess_counts_only_in_top_k(tok, monkeypatch):
    item = ClozeItem("the world [MASK] will be held next summer .", ("cup",), "sport")
    monkeypatch.setattr(cloze_mod, "fill_mask",
                        lambda model, tokenizer, text, top_k: [[("the", 0.6), ("cup", 0.3)]])
    result = cloze_score(None, tok, items=[item], top_k=2)
    assert result["top1"] == 0.0 and result["top2"] == 1.0


@pytest.mark.parametrize("text, message", [
    ("the world cup will be held next summer .", "has 0 \\[MASK\\]s"),
    ("the [MASK] [MASK] will be held next summer .", "has 2 \\[MASK\\]s"),
])
def test_an_item_without_exactly_one_mask_is_named(tok, text, message):
    with pytest.raises(ValueError, match=message) as err:
        cloze_score(None, tok, items=[ClozeItem(text, ("cup",), "sport")])
    assert text in str(err.value) and "exactly one [MASK]" in str(err.value)


def test_an_item_with_no_single_token_answer_is_named(tok):
    text = "the new [MASK] was praised by critics ."
    with pytest.raises(ValueError, match="needs its own cloze items") as err:
        cloze_score(None, tok, items=[ClozeItem(text, ("zzxqvj", "qqwwzz"), "tech")])
    assert text in str(err.value) and "zzxqvj" in str(err.value)


def test_top_k_below_one_and_an_empty_set_are_refused(tok):
    with pytest.raises(ValueError, match="top_k must be >= 1, got 0"):
        cloze_score(None, tok, top_k=0)
    with pytest.raises(ValueError, match="no cloze items"):
        cloze_score(None, tok, items=[])
