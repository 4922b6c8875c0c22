"""benchmarks/nsp_sentences.py on a small setting: the held-out pairs, the rule, the head's
scores and the record (written to a temporary folder, never over benchmarks/results/)."""

from __future__ import annotations

import json

import pytest
import torch

from bertlab.loading import load_model
from bertlab.pairs import IN_ORDER, IS_NEXT, NOT_NEXT, Example


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("nsp_sentences")


@pytest.fixture(scope="module")
def held(bench, one_thread):
    model, tok = load_model(bench.MODELS["course-nsp"], require_tokenizer=True)
    corpus, topics = bench.held_out(tok)
    return model, tok, corpus, topics


def pair(tok, a: str, b: str, label: int) -> Example:
    a_ids, b_ids = (tok.encode(t, add_special_tokens=False).ids for t in (a, b))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    return Example(input_ids=[cls, *a_ids, sep, *b_ids, sep], a_len=len(a_ids),
                   next_sentence_label=label, doc_index=0)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_pairs_have_k_sentences_a_side_half_of_them_next(bench, held, k):
    _, tok, corpus, topics = held
    pairs = bench.draw_pairs(corpus, topics, tok, k=k, pairs=60, seed=0, max_seq_len=128)
    assert len(pairs) == 60
    assert sum(e.next_sentence_label == IS_NEXT for e in pairs) == 30  # exactly balanced
    for e in pairs:
        (a0, a1), (b0, b1) = e.a_sentences, e.b_sentences
        assert a1 - a0 == k and b1 - b0 == k  # before truncation
        assert len(e.input_ids) <= 128 and (not e.truncated or len(e.input_ids) == 128)
        if e.next_sentence_label == IS_NEXT:  # B is the k sentences right after A
            assert e.b_doc_index == e.doc_index and b0 == a1
        else:  # B from another document, after a window of k sentences there
            assert e.b_doc_index != e.doc_index and b0 >= k
        if not e.truncated:  # the ids are the documents' own sentences
            sents = corpus.sentences
            want_a = [t for s in sents[e.doc_index][a0:a1] for t in s]
            want_b = [t for s in sents[e.b_doc_index][b0:b1] for t in s]
            assert list(e.input_ids) == [tok.token_to_id("[CLS]"), *want_a,
                                         tok.token_to_id("[SEP]"), *want_b,
                                         tok.token_to_id("[SEP]")]
    again = bench.draw_pairs(corpus, topics, tok, k=k, pairs=60, seed=0, max_seq_len=128)
    assert [e.input_ids for e in again] == [e.input_ids for e in pairs]  # a seed, its pairs


def test_notnext_partners_keep_to_their_topic(bench, held):
    _, tok, corpus, topics = held
    for kind, same in (("not_next_same_topic", True), ("not_next_other_topic", False)):
        pairs = bench.draw_pairs(corpus, topics, tok, k=1, pairs=40, seed=3, max_seq_len=128,
                                 kind=kind)
        assert all(e.next_sentence_label == NOT_NEXT for e in pairs)
        assert all((topics[e.b_doc_index] == topics[e.doc_index]) == same for e in pairs)
    pairs = bench.draw_pairs(corpus, topics, tok, k=1, pairs=10, seed=3, max_seq_len=128,
                             kind="is_next")
    assert all(e.next_sentence_label == IS_NEXT for e in pairs)


def test_the_rule_counts_only_shared_content_words(bench, held):
    _, tok, _, _ = held
    pairs = [
        pair(tok, "The striker scored twice.", "Fans cheered the striker.", IS_NEXT),  # striker
        pair(tok, "Shares fell on Monday.", "The band released an album.", NOT_NEXT),  # none
        pair(tok, "The minister said it was over.", "They said that it was.", IS_NEXT),  # stopwords
        pair(tok, "Oil prices rose.", "Prices of oil fell.", NOT_NEXT),  # oil, prices
    ]
    assert bench.rule_labels(pairs, tok) == [IS_NEXT, NOT_NEXT, NOT_NEXT, IS_NEXT]
    assert bench.accuracy(bench.rule_labels(pairs, tok), pairs) == 0.5
    assert bench.content_words("The UK's GDP, at 3%, is up in Britain.") == {"gdp", "britain"}
    # On sentence-order pairs the rule sees the same words either way round: every pair below
    # shares one, so it always says in order and is right on exactly the unswapped half.
    shared = [pair(tok, "Oil prices rose.", "Prices of oil fell.", IS_NEXT)] * 10
    assert bench.sop_rule_accuracy(shared, tok, seed=0) == 0.5
    assert IN_ORDER == IS_NEXT  # the rule's "in order" answer is its IsNext answer


def test_the_head_reads_each_pair_as_the_model_does_padding_or_not(bench, held):
    model, tok, corpus, topics = held
    pairs = bench.draw_pairs(corpus, topics, tok, k=2, pairs=8, seed=1, max_seq_len=128)
    batched = bench.p_is_next(model, pairs, pad=tok.token_to_id("[PAD]"), batch_size=8)
    with torch.no_grad():
        alone = [model(torch.tensor([list(e.input_ids)]),
                       token_type_ids=torch.tensor([e.token_type_ids])).nsp_logits.softmax(-1)
                 [0, IS_NEXT].item() for e in pairs]
    assert batched == pytest.approx(alone, abs=1e-5)
    assert bench.head_labels([0.9, 0.2, 0.51]) == [IS_NEXT, NOT_NEXT, IS_NEXT]


def test_the_record_holds_every_k_scorer_and_partner(bench, tmp_path, one_thread):
    out = tmp_path / "nsp_sentences.json"
    assert bench.main(["--pairs", "40", "--draws", "2", "--sides", "1", "2", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["command"].startswith("python benchmarks/nsp_sentences.py --pairs 40")
    assert record["max_seq_len"] == 128 and set(record["models"]) == {"course-nsp", "course-mlm"}
    assert record["models"]["course-mlm"]["pair_head"].startswith("never trained")
    assert set(record["by_sides"]) == {"1", "2"}
    for row in record["by_sides"].values():
        for name in ("course-nsp", "course-mlm", "rule", "rule_on_sop_pairs"):
            assert len(row[name]["per_draw"]) == 2 and 0 <= row[name]["mean"] <= 1
        assert row["is_next_share"] == 0.5 and row["pairs_per_draw"] == 40
        gaps = [a - b for a, b in zip(row["course-nsp"]["per_draw"], row["rule"]["per_draw"],
                                      strict=True)]
        assert row["nsp_minus_rule"]["mean"] == pytest.approx(sum(gaps) / 2)
    assert set(record["by_partner"]) == {"sides", "is_next", "not_next_same_topic",
                                         "not_next_other_topic"}
    assert "the" in record["rule"]["stopwords"] and record["rule"]["min_letters"] == 3
    assert record["labels"] == {"is_next": IS_NEXT, "not_next": NOT_NEXT}
    assert all(isinstance(ok, bool) for ok in record["checks"].values())
