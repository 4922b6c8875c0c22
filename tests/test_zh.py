"""Whole-word masking for Chinese from the gold zh-news segmentation (bertlab.zh)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from bertlab.corpus import Document
from bertlab.data import LoaderOptions, PretrainingCollator, PretrainingDataset, pretraining_loader
from bertlab.masking import IGNORE_INDEX, MaskingConfig
from bertlab.pairs import IS_NEXT, NOT_NEXT, create_nsp_examples, tokenize_corpus
from bertlab.readers import load_corpus
from bertlab.tokenizer import UNK, train_tokenizer
from bertlab.zh import (
    nsp_word_ids,
    second_character_batches,
    segment_corpus,
    whole_word_counts,
    whole_word_scores,
)


@pytest.fixture(scope="module")
def zh_news() -> list[Document]:
    return load_corpus("zh-news")[:200]


@pytest.fixture(scope="module")
def zh_tok():
    # The vocabulary test_chinese.py trains (first 400 articles), so the disk cache is shared.
    return train_tokenizer(load_corpus("zh-news")[:400])


@pytest.fixture(scope="module")
def segmented(zh_news, zh_tok):
    corpus = segment_corpus(zh_news, zh_tok)
    # A short max_seq_len forces truncation on most pairs, so cut words are exercised too.
    examples = create_nsp_examples(corpus, zh_tok, max_seq_len=48, seed=0)
    return corpus, examples, [nsp_word_ids(e, corpus) for e in examples]


def word_loader(examples, word_ids, tokenizer, seed=0, **options):
    """The Chinese pretraining loader: NSP examples masked by their gold words (or characters);
    `options` are `LoaderOptions`'."""
    return pretraining_loader(examples, tokenizer, split=None, seed=seed, word_ids=word_ids,
                              options=LoaderOptions(**options))


def _groups(tokens: list[str], word_ids: list[int | None]) -> dict[int, str]:
    """Word id -> its tokens joined into text (## marks removed)."""
    out: dict[int, str] = {}
    for token, w in zip(tokens, word_ids, strict=True):
        if w is not None:
            out[w] = out.get(w, "") + token.removeprefix("##")
    return out


def test_segment_corpus_matches_tokenize_corpus(zh_news, zh_tok, segmented):
    corpus = segmented[0]
    plain = tokenize_corpus(zh_news, zh_tok)
    assert corpus.sentences == plain.sentences  # same token ids, same kept sentences
    assert corpus.empty_sentences == plain.empty_sentences
    for ids, words in zip(corpus.sentences, corpus.word_ids, strict=True):
        assert [len(s) for s in ids] == [len(w) for w in words]


def test_word_ids_group_exactly_the_gold_words(zh_news, zh_tok, segmented):
    corpus = segmented[0]
    checked = 0
    for d, doc in enumerate(zh_news[:50]):
        for gold, ids, words in zip(doc.words, corpus.sentences[d], corpus.word_ids[d],
                                    strict=True):
            tokens = [zh_tok.id_to_token(i) for i in ids]
            if UNK in tokens or len(set(words)) != len(gold):
                continue  # [UNK] hides characters; a fallback merges gold words
            groups = _groups(tokens, words)
            assert [groups[w] for w in sorted(groups)] == [g.lower() for g in gold]
            checked += 1
    assert checked > 400


def test_nsp_word_ids_line_up_with_both_segments(zh_news, zh_tok, segmented):
    corpus, examples, all_ids = segmented
    gold = {w.lower() for doc in zh_news for sentence in doc.words for w in sentence}
    labels = {IS_NEXT: 0, NOT_NEXT: 0}
    cut = checked = 0
    for ex, ids in zip(examples, all_ids, strict=True):
        n = len(ex.input_ids)
        assert len(ids) == n
        specials = [i for i, w in enumerate(ids) if w is None]
        assert specials == [0, ex.a_len + 1, n - 1]  # [CLS] A [SEP] B [SEP]
        a, b = ids[1 : ex.a_len + 1], ids[ex.a_len + 2 : n - 1]
        assert not set(a) & set(b)  # A and B never share a word
        numbered = [w for w in ids if w is not None]
        assert sorted(set(numbered)) == list(range(len(set(numbered))))
        assert numbered == sorted(numbered)  # in order of appearance
        tokens = [zh_tok.id_to_token(i) for i in ex.input_ids]
        for side, (start, stop) in (("a", (1, ex.a_len + 1)), ("b", (ex.a_len + 2, n - 1))):
            groups = _groups(tokens[start:stop], ids[start:stop])
            inner = sorted(groups)[1:-1]  # the edge words may be cut by truncation
            # Skipped: [UNK] (its characters are lost) and "##" pieces, where a gold cut inside
            # a WordPiece word ("8" + "℃" but tokens "8 ##℃") makes the fallback merge them.
            if not any(t == UNK or t.startswith("##") for t in tokens[start:stop]):
                assert all(groups[w] in gold for w in inner), (side, ex.doc_id)
                checked += 1
        labels[ex.next_sentence_label] += 1
        cut += ex.truncated
    assert min(labels.values()) > 200 and cut > 300  # both labels, and many truncated pairs
    assert checked > 1000


def test_whole_word_masking_never_selects_part_of_a_word(zh_tok, segmented):
    _, examples, all_ids = segmented

    def split_words(whole_word: bool) -> tuple[int, int]:
        loader = word_loader(examples, all_ids, zh_tok, whole_word=whole_word,
                             batch_size=64, seed=3, masking=MaskingConfig(mlm_probability=0.3),
                             return_word_ids=True)
        partial = whole = 0
        for i, batch in enumerate(loader):
            if i == 4:
                break
            targets = batch["labels"] != IGNORE_INDEX
            words = batch["word_ids"]
            for row in range(len(words)):
                for w in words[row][words[row] >= 0].unique():
                    hidden = targets[row][words[row] == w]
                    if hidden.any() and not hidden.all():
                        partial += 1
                    elif hidden.all() and len(hidden) >= 2:
                        whole += 1
        return partial, whole

    partial, whole = split_words(whole_word=True)
    assert partial == 0 and whole > 300
    partial, _ = split_words(whole_word=False)  # character masking does cut words
    assert partial > 300


def test_char_and_word_loaders_see_the_same_data(zh_tok, segmented):
    _, examples, all_ids = segmented
    batches = [next(iter(word_loader(examples, all_ids, zh_tok, whole_word=flag, seed=1)))
               for flag in (False, True)]
    for key in ("token_type_ids", "attention_mask", "next_sentence_label"):
        assert torch.equal(batches[0][key], batches[1][key])
    untouched = (batches[0]["labels"] == IGNORE_INDEX) & (batches[1]["labels"] == IGNORE_INDEX)
    assert torch.equal(batches[0]["input_ids"][untouched], batches[1]["input_ids"][untouched])
    assert not torch.equal(batches[0]["labels"], batches[1]["labels"])
    assert set(batches[0]) == {"input_ids", "token_type_ids", "attention_mask", "labels",
                               "next_sentence_label"}


def test_whole_word_counts_by_hand():
    # [CLS] w0 w0 w1 w1 w2 w3 w3 w4 [SEP]: w0 hidden and right, w1 hidden with one miss,
    # w2 (one character) hidden and right, w3 only half hidden, w4 not hidden.
    word_ids = torch.tensor([[-1, 0, 0, 1, 1, 2, 3, 3, 4, -1]])
    labels = torch.tensor([[-100, 10, 11, 12, 13, 14, 15, -100, -100, -100]])
    predictions = torch.tensor([[-100, 10, 11, 12, 99, 14, 15, -100, -100, -100]])
    assert whole_word_counts(predictions, labels, word_ids) == {
        "words": 3, "words_correct": 2, "tokens": 5, "tokens_correct": 4}
    assert whole_word_counts(predictions, labels, word_ids, min_tokens=2) == {
        "words": 2, "words_correct": 1, "tokens": 4, "tokens_correct": 3}
    # Rows are kept apart: the same word id in another row is another word.
    two_rows = whole_word_counts(predictions.repeat(2, 1), labels.repeat(2, 1),
                                 word_ids.repeat(2, 1))
    assert two_rows == {"words": 6, "words_correct": 4, "tokens": 10, "tokens_correct": 8}
    with pytest.raises(ValueError, match="same \\(B, T\\) shape"):
        whole_word_counts(predictions, labels, word_ids[:, :5])


class _Guesser(torch.nn.Module):
    """A stand-in masked LM: predicts each target's label (oracle) or always one token."""

    def __init__(self, vocab_size: int, always: int | None = None) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.vocab_size, self.always = vocab_size, always

    def forward(self, input_ids, attention_mask, token_type_ids, labels):
        targets = labels[labels != IGNORE_INDEX]  # row-major, like BertForPreTraining
        guess = targets if self.always is None else torch.full_like(targets, self.always)
        return SimpleNamespace(target_logits=torch.nn.functional.one_hot(guess, self.vocab_size))


def test_whole_word_scores_with_stand_in_models(zh_tok, segmented):
    _, examples, all_ids = segmented
    loader = word_loader(examples[:200], all_ids[:200], zh_tok, whole_word=True, shuffle=False,
                         mask_schedule="static", return_word_ids=True, batch_size=50,
                         masking=MaskingConfig(mask_replace_prob=1.0, random_replace_prob=0.0))
    oracle = whole_word_scores(_Guesser(zh_tok.get_vocab_size()), loader)
    assert oracle["char_accuracy"] == oracle["word_accuracy"] == 1.0
    assert oracle["multi_char_word_accuracy"] == 1.0 and oracle["multi_char_words"] > 100
    de = zh_tok.token_to_id("的")
    always = whole_word_scores(_Guesser(zh_tok.get_vocab_size(), always=de), loader)
    share = sum(int((b["labels"] == de).sum()) for b in loader) / always["targets"]
    assert always["char_accuracy"] == pytest.approx(share) and 0.01 < share < 0.2
    assert always["multi_char_word_accuracy"] == 0.0  # no gold word is 的的
    with pytest.raises(ValueError, match="return_word_ids=True"):
        whole_word_scores(_Guesser(10), word_loader(examples[:4], all_ids[:4], zh_tok))


def test_second_character_batches_keep_only_second_characters(zh_tok, segmented):
    _, examples, all_ids = segmented
    loader = word_loader(examples[:100], all_ids[:100], zh_tok, whole_word=True, shuffle=False,
                         mask_schedule="static", return_word_ids=True, batch_size=25,
                         masking=MaskingConfig(mask_replace_prob=1.0, random_replace_prob=0.0))
    full = list(loader)
    hidden = second_character_batches(loader, reveal=False)
    shown = second_character_batches(loader, reveal=True, max_batches=2)
    assert len(hidden) == len(full) and len(shown) == 2
    mask = zh_tok.token_to_id("[MASK]")
    pairs = 0
    for batch, h, v in zip(full, hidden, shown + [None] * len(full), strict=False):
        for row in range(len(batch["labels"])):
            words = batch["word_ids"][row]
            for t in (h["labels"][row] != IGNORE_INDEX).nonzero().flatten().tolist():
                cols = (words == words[t]).nonzero().flatten().tolist()
                # the second of exactly two characters, both hidden in the original batch
                assert len(cols) == 2 and cols[1] == t
                assert (batch["labels"][row, cols] != IGNORE_INDEX).all()
                assert h["labels"][row, t] == batch["labels"][row, t]
                assert h["input_ids"][row, cols[0]] == mask
                if v is not None:
                    assert v["input_ids"][row, cols[0]] == batch["labels"][row, cols[0]]
                    assert v["input_ids"][row, t] == mask
                pairs += 1
    assert pairs > 100
    # An oracle is right on every second character; the labels are untouched by reveal.
    oracle = whole_word_scores(_Guesser(zh_tok.get_vocab_size()), hidden)
    assert oracle["char_accuracy"] == 1.0 and oracle["targets"] == pairs
    with pytest.raises(ValueError, match="return_word_ids=True"):
        second_character_batches(word_loader(examples[:4], all_ids[:4], zh_tok), reveal=True)


def test_bad_input_is_named(zh_news, zh_tok, segmented):
    corpus, examples, all_ids = segmented
    no_words = Document(id="mine/1", text="我爱北京。", sentences=["我爱北京。"])
    with pytest.raises(ValueError, match="'mine/1' has no word segmentation"):
        segment_corpus([no_words], zh_tok)
    other = segment_corpus(zh_news[100:], zh_tok)
    with pytest.raises(ValueError, match="not document 0 of this corpus"):
        nsp_word_ids(examples[0], other)
    with pytest.raises(TypeError, match="SegmentedCorpus"):
        nsp_word_ids(examples[0], tokenize_corpus(zh_news, zh_tok))
    with pytest.raises(ValueError, match="one list per example"):
        word_loader(examples, all_ids[:-1], zh_tok)
    with pytest.raises(ValueError, match="tokens but"):
        word_loader(examples[:1], [all_ids[0][:-1]], zh_tok)


def test_wordpiece_whole_words_cut_chinese_words_and_gold_ones_do_not(zh_tok, segmented):
    # Chinese has no "##" marks: without the gold word ids, every character is a word.
    _, examples, all_ids = segmented
    gold = PretrainingDataset(examples[:64], word_ids=all_ids[:64])
    plain = PretrainingDataset(examples[:64])
    collate = PretrainingCollator(zh_tok, whole_word=True)

    def partly_hidden(labels):
        count = 0
        for row in range(64):
            words = gold[row]["word_ids"]
            targets = labels[row, : len(words)] != IGNORE_INDEX
            for w in set(words.tolist()) - {-1}:
                hidden = targets[torch.from_numpy(words == w)]
                count += bool(hidden.any() and not hidden.all())
        return count

    assert partly_hidden(collate([gold[i] for i in range(64)])["labels"]) == 0
    assert partly_hidden(collate([plain[i] for i in range(64)])["labels"]) > 20


def test_word_strip_html_groups_words():
    from bertlab.course.widgets import word_strip_html

    html = word_strip_html(["[CLS]", "我", "爱", "华", "中", "[SEP]"], [None, 0, 1, 2, 2, None])
    assert html.count("display:inline-block") == 5  # [CLS], 我, 爱, 华中, [SEP]
    assert "华&#8201;中" in html
    with pytest.raises(ValueError, match="one word id"):
        word_strip_html(["我", "爱"], [0])
