"""NSP example construction: layout, truncation, labels, balance, coverage, errors."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bertlab as bl
from bertlab.corpus import Document
from bertlab.pairs import (
    IS_NEXT,
    NOT_NEXT,
    TokenizedCorpus,
    create_nsp_examples,
    format_pair,
    nsp_stats,
    tokenize_corpus,
)
from bertlab.tokenizer import SpecialIds, special_ids

MAX = 128


@pytest.fixture(scope="module")
def bbc():
    docs = bl.load_corpus("bbc")
    tok = bl.train_tokenizer(docs)
    corpus = tokenize_corpus(docs, tok, name="bbc")
    examples = create_nsp_examples(corpus, tok, max_seq_len=MAX, seed=0)
    return tok, corpus, examples, docs


def flat(sentences):
    return [t for s in sentences for t in s]


def check_example(ex, corpus: TokenizedCorpus, special: SpecialIds, max_seq_len: int) -> None:
    """Every structural promise of an NSP Example, checked against the tokenized corpus."""
    ids = ex.input_ids
    a, b = ids[1 : 1 + ex.a_len], ids[2 + ex.a_len : -1]
    # Layout: [CLS] A [SEP] B [SEP], nothing else special, no padding, fits.
    assert ids[0] == special.cls
    assert [i for i, t in enumerate(ids) if t == special.sep] == [ex.a_len + 1, len(ids) - 1]
    assert ex.a_len >= 1 and ex.b_len >= 1 and len(ids) == ex.a_len + ex.b_len + 3
    assert len(ids) <= max_seq_len
    assert not set(a + b) & set(special.all)
    assert ex.token_type_ids == [0] * (ex.a_len + 2) + [1] * (ex.b_len + 1)
    # A and B are contiguous slices of their source sentences' tokens.
    a_doc = corpus.sentences[ex.doc_index]
    b_doc = corpus.sentences[ex.b_doc_index]
    a_src = flat(a_doc[ex.a_sentences[0] : ex.a_sentences[1]])
    b_src = flat(b_doc[ex.b_sentences[0] : ex.b_sentences[1]])
    assert a == a_src[ex.a_cut[0] : len(a_src) - ex.a_cut[1]]
    assert b == b_src[ex.b_cut[0] : len(b_src) - ex.b_cut[1]]
    assert ex.tokens_dropped == len(a_src) + len(b_src) - ex.a_len - ex.b_len
    if ex.truncated:
        assert ex.a_len + ex.b_len == max_seq_len - 3
    assert ex.doc_id == corpus.doc_ids[ex.doc_index]
    # Labels: NotNext B from another document; IsNext B is the very next sentences.
    assert ex.next_sentence_label in (IS_NEXT, NOT_NEXT)
    if ex.next_sentence_label == NOT_NEXT:
        assert ex.b_doc_index != ex.doc_index
    else:
        assert ex.b_doc_index == ex.doc_index
        assert ex.b_sentences[0] == ex.a_sentences[1]


def check_coverage(examples, corpus: TokenizedCorpus, skipped_one_sentence: bool) -> None:
    """With one pass, A ranges plus IsNext B ranges cover each document's sentences exactly once."""
    seen: dict[int, list[int]] = {}
    for ex in examples:
        spans = [ex.a_sentences] + ([] if ex.next_sentence_label == NOT_NEXT else [ex.b_sentences])
        for first, end in spans:
            seen.setdefault(ex.doc_index, []).extend(range(first, end))
    for d, sents in enumerate(corpus.sentences):
        if len(sents) == 1 and skipped_one_sentence:
            assert d not in seen
        elif sents:
            assert sorted(seen[d]) == list(range(len(sents))), corpus.doc_ids[d]


def test_constants():
    assert (IS_NEXT, NOT_NEXT) == (0, 1)  # Google and Hugging Face: is_random_next=True -> 1


def test_every_bbc_example_is_well_formed(bbc):
    tok, corpus, examples, _ = bbc
    special = special_ids(tok)
    assert len(examples) > 9000
    for ex in examples:
        check_example(ex, corpus, special, MAX)


def test_bbc_covers_every_sentence_once_and_counts_dropped_tokens(bbc):
    _, corpus, examples, _ = bbc
    check_coverage(examples, corpus, skipped_one_sentence=True)
    stats = nsp_stats(examples)
    assert stats["tokens_dropped"] == sum(e.tokens_dropped for e in examples) > 0
    assert 0 < stats["truncated"] < stats["examples"]
    assert stats["sentences"] == sum(len(s) for s in corpus.sentences)
    assert stats["examples"] == stats["is_next"] + stats["not_next"]


def test_isnext_b_is_the_true_continuation_in_text(bbc):
    tok, corpus, examples, all_docs = bbc
    docs = {d.id: d for d in all_docs[:300]}
    checked = 0
    for ex in examples:
        if ex.next_sentence_label == NOT_NEXT or ex.doc_id not in docs or ex.truncated:
            continue
        sentences = docs[ex.doc_id].sentences
        a_text = " ".join(sentences[ex.a_sentences[0] : ex.a_sentences[1]])
        b_text = " ".join(sentences[ex.b_sentences[0] : ex.b_sentences[1]])
        assert tok.decode(ex.input_ids[1 : 1 + ex.a_len]) == tok.decode(tok.encode(a_text).ids)
        assert tok.decode(ex.input_ids[2 + ex.a_len : -1]) == tok.decode(tok.encode(b_text).ids)
        checked += 1
    assert checked > 50


def test_exact_balance_on_bbc(bbc):
    share = nsp_stats(bbc[2])["not_next_share"]
    assert abs(share - 0.5) <= 0.02


def test_exact_balance_over_100k_examples(bbc):
    tok, corpus, _, _ = bbc
    n = not_next = 0
    for seed in range(1, 10):
        labels = [e.next_sentence_label == NOT_NEXT
                  for e in create_nsp_examples(corpus, tok, seed=seed)]
        n += len(labels)
        not_next += sum(labels)
    assert n >= 100_000
    assert abs(not_next / n - 0.5) <= 0.005


def test_google_balance_shows_the_skew(bbc):
    tok, corpus, _, _ = bbc
    stats = nsp_stats(create_nsp_examples(corpus, tok, seed=0, balance="google"))
    assert 0.54 < stats["not_next_share"] < 0.60


def test_same_seed_same_examples_other_seed_different(bbc):
    tok, corpus, examples, _ = bbc
    sub = TokenizedCorpus(corpus.doc_ids[:200], corpus.sentences[:200])
    one = create_nsp_examples(sub, tok, seed=3)
    two = create_nsp_examples(sub, tok, seed=3)
    other = create_nsp_examples(sub, tok, seed=4)
    assert [(e.input_ids, e.next_sentence_label) for e in one] == \
        [(e.input_ids, e.next_sentence_label) for e in two]
    assert [e.input_ids for e in one] != [e.input_ids for e in other]


def test_documents_and_tokenized_corpus_give_the_same_examples(bbc):
    tok, docs = bbc[0], bbc[3][:50]
    direct = create_nsp_examples(docs, tok, seed=1, max_seq_len=64)
    via = create_nsp_examples(tokenize_corpus(docs, tok), tok, seed=1, max_seq_len=64)
    assert [e.input_ids for e in direct] == [e.input_ids for e in via]
    titled = tokenize_corpus(docs, tok, include_title=True)
    assert all(len(t) == len(d.sentences) + 1 for t, d in zip(titled.sentences, docs, strict=True))


def test_dupe_factor_makes_independent_passes(bbc):
    tok, corpus, _, _ = bbc
    sub = TokenizedCorpus(corpus.doc_ids[:100], corpus.sentences[:100])
    once = create_nsp_examples(sub, tok, seed=0)
    thrice = create_nsp_examples(sub, tok, seed=0, dupe_factor=3)
    assert len(thrice) > 2.5 * len(once)
    assert [e.input_ids for e in thrice[: len(once)]] == [e.input_ids for e in once]
    assert [e.input_ids for e in thrice[len(once) : 2 * len(once)]] != [e.input_ids for e in once]


# --- synthetic corpora: edge cases -------------------------------------------------------------

SPECIAL = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4, vocab_size=200)


def synthetic(lengths: list[list[int]], seed: int = 0) -> TokenizedCorpus:
    rng = random.Random(seed)
    sentences = [[[rng.randrange(5, 200) for _ in range(n)] for n in doc] for doc in lengths]
    return TokenizedCorpus([f"doc{i}" for i in range(len(lengths))], sentences, name="synthetic")


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.lists(st.integers(1, 60), min_size=1, max_size=12), min_size=2, max_size=8),
    max_seq_len=st.integers(8, 48),
    short_seq_prob=st.sampled_from([0.0, 0.1, 1.0]),
    balance=st.sampled_from(["exact", "google"]),
    seed=st.integers(0, 1000),
)
def test_invariants_hold_on_any_corpus(lengths, max_seq_len, short_seq_prob, balance, seed):
    corpus = synthetic(lengths, seed)
    examples = create_nsp_examples(corpus, SPECIAL, max_seq_len=max_seq_len, seed=seed,
                                   short_seq_prob=short_seq_prob, balance=balance)
    for ex in examples:
        check_example(ex, corpus, SPECIAL, max_seq_len)
    check_coverage(examples, corpus, skipped_one_sentence=balance == "exact")


def test_one_sentence_documents_exact_skips_google_uses_as_notnext():
    corpus = synthetic([[10], [10, 12, 9], [30], [8, 8]])
    exact = create_nsp_examples(corpus, SPECIAL, max_seq_len=32)
    assert exact.info["one_sentence_docs"] == 2
    assert exact.info["one_sentence_docs_skipped"] == 2
    assert {e.doc_index for e in exact} == {1, 3}
    assert {e.b_doc_index for e in exact if e.next_sentence_label == NOT_NEXT} <= {0, 1, 2, 3}
    google = create_nsp_examples(corpus, SPECIAL, max_seq_len=32, balance="google")
    lone = [e for e in google if e.doc_index in (0, 2)]
    assert len(lone) == 2 and all(e.next_sentence_label == NOT_NEXT for e in lone)
    assert google.info["one_sentence_docs_skipped"] == 0


def test_exact_mode_pulls_in_a_sentence_after_a_long_one():
    # Every sentence alone exceeds the target, so Google's rule would make every example NotNext.
    corpus = synthetic([[40] * 6, [40] * 6, [40] * 6])
    google = create_nsp_examples(corpus, SPECIAL, max_seq_len=16, balance="google")
    assert all(e.next_sentence_label == NOT_NEXT for e in google)
    exact = create_nsp_examples(corpus, SPECIAL, max_seq_len=16, seed=0, dupe_factor=20)
    assert 0.4 < nsp_stats(exact)["not_next_share"] < 0.6
    assert exact.info["long_sentences"] == 18


def test_long_sentences_are_truncated_and_counted():
    corpus = synthetic([[300, 5], [4, 6, 7]])
    examples = create_nsp_examples(corpus, SPECIAL, max_seq_len=32, dupe_factor=5)
    assert examples.info["long_sentences"] == 1
    first = [e for e in examples if e.doc_index == 0]
    assert all(len(e.input_ids) == 32 and e.truncated for e in first)
    for ex in examples:
        check_example(ex, corpus, SPECIAL, 32)


def test_empty_sentences_are_dropped_and_counted(bbc):
    tok = bbc[0]
    docs = [Document("a", "x", ["Hello there.", "\u200b", "More text."]),
            Document("b", "y", ["Another one.", "And more."])]
    corpus = tokenize_corpus(docs, tok)
    if corpus.empty_sentences:  # the zero-width space normalizes away
        assert [len(s) for s in corpus.sentences] == [2, 2]
    examples = create_nsp_examples(corpus, tok)
    for ex in examples:
        check_example(ex, corpus, special_ids(tok), 128)


# --- errors ------------------------------------------------------------------------------------


def test_one_document_is_a_clear_error():
    with pytest.raises(ValueError, match="has 1 document; NSP needs at least 2"):
        create_nsp_examples(synthetic([[5, 6, 7]]), SPECIAL)


def test_empty_corpus_is_a_clear_error(bbc):
    with pytest.raises(ValueError, match="is empty"):
        create_nsp_examples(TokenizedCorpus([], [], name="nothing"), SPECIAL)
    with pytest.raises(ValueError, match="is empty"):
        create_nsp_examples([Document("x", "", [])], bbc[0])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_seq_len": 7}, "max_seq_len=7 is too small"),
        ({"short_seq_prob": 1.5}, "short_seq_prob=1.5 is a probability"),
        ({"balance": "even"}, "balance='even' is not known"),
        ({"dupe_factor": 0}, "dupe_factor=0"),
    ],
)
def test_bad_settings_are_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        create_nsp_examples(synthetic([[5, 6], [7, 8]]), SPECIAL, **kwargs)


def test_format_pair_puts_each_segment_id_under_its_token(bbc):
    tok, _, examples, _ = bbc
    ex = examples[0]
    lines = format_pair(ex, tok, width=60).splitlines()
    assert lines[0].startswith("IsNext" if ex.next_sentence_label == IS_NEXT else "NotNext")
    tokens, segments = [], []
    for top, bottom in zip(lines[1::2], lines[2::2], strict=True):
        assert len(top) <= 60
        starts = [i for i, ch in enumerate(top) if ch != " " and (i == 0 or top[i - 1] == " ")]
        assert [i for i, ch in enumerate(bottom) if ch != " "] == starts
        tokens += top.split()
        segments += [int(x) for x in bottom.split()]
    assert tokens == [tok.id_to_token(i) for i in ex.input_ids]
    assert segments == ex.token_type_ids
