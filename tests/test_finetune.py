"""Tests for bertlab.finetune and bertlab.downstream: encoding, metrics, sampling, probes,
baselines, fine-tuning, export."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
import torch

import bertlab.finetune
from bertlab.corpus import Document
from bertlab.downstream import compare_downstream, load_task
from bertlab.finetune import (
    ClassificationResult,
    FinetuneConfig,
    ProbeConfig,
    classification_metrics,
    cls_features,
    document_chunks,
    document_text,
    finetune_classifier,
    format_table,
    from_scratch,
    linear_probe,
    pad_batch,
    sample_per_class,
    summarize,
    tfidf_baseline,
)
from bertlab.model import BertConfig, BertForPreTraining, BertForSequenceClassification
from bertlab.tokenizer import special_ids, train_tokenizer
from bertlab.train import TrainConfig

TOPICS = {
    "sport": "goal match team coach league striker penalty season cup referee".split(),
    "money": "market shares profit bank inflation investors trade rates bonds growth".split(),
    "music": "album band singer concert guitar chart songs tour stage festival".split(),
}
FILLER = "the a of and said on it was in for with this that".split()


def _sentence(rng: random.Random, topic: str) -> str:
    words = [rng.choice(TOPICS[topic]) if rng.random() < 0.4 else rng.choice(FILLER)
             for _ in range(rng.randint(6, 12))]
    return " ".join(words).capitalize() + "."


@pytest.fixture(scope="module")
def corpus() -> list[Document]:
    """Three topics, 40 train / 10 validation / 10 test documents each (splits set explicitly)."""
    rng = random.Random(0)
    docs = []
    for topic in TOPICS:
        for i in range(60):
            split = "train" if i < 40 else "validation" if i < 50 else "test"
            sentences = [_sentence(rng, topic) for _ in range(4)]
            docs.append(Document(id=f"{topic}/{i}", text=" ".join(sentences), sentences=sentences,
                                 label=topic, title=_sentence(rng, topic)[:-1], split=split))
    return docs


@pytest.fixture(scope="module")
def tok(corpus):
    return train_tokenizer(corpus, vocab_size=200, cache=False)


@pytest.fixture(scope="module")
def small_config(tok) -> BertConfig:
    return BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, num_layers=1, num_heads=2,
                      intermediate_size=64, max_position_embeddings=64)


FAST = FinetuneConfig(epochs=1, min_steps=40, batch_size=16, lr=1e-2, max_seq_len=16,
                      device="cpu")


# ---------------------------------------------------------------------------------------------
# Encoding


def test_first_window_is_title_then_body_and_fits(corpus, tok):
    windows = document_chunks(corpus[:5], tok, max_seq_len=16, max_chunks=3)
    for doc, chunks in zip(corpus[:5], windows, strict=True):
        full = tok.encode(document_text(doc), add_special_tokens=False).ids
        assert document_text(doc).startswith(doc.title)
        assert all(len(c) <= 14 for c in chunks)
        assert [i for c in chunks for i in c] == full[: 14 * 3]  # consecutive windows


def test_long_document_shortcut_gives_the_exact_tokens(tok):
    # A document of very long "words" defeats the characters-per-token shortcut; it must be
    # re-encoded in full, not cut short.
    long = ["x" * 60 + " " + "y" * 60 + "."] * 40
    doc = Document(id="long", text=" ".join(long), sentences=long, split="train")
    ids = document_chunks([doc], tok, max_seq_len=128)[0][0]
    assert ids == tok.encode(document_text(doc), add_special_tokens=False).ids[:126]


def test_pad_batch_is_single_segment_with_mask(tok):
    ids = special_ids(tok)
    batch = pad_batch([[10, 11, 12], [13]], tok, labels=[1, 0])
    assert batch["input_ids"].tolist() == [[ids.cls, 10, 11, 12, ids.sep],
                                           [ids.cls, 13, ids.sep, ids.pad, ids.pad]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert batch["token_type_ids"].sum() == 0
    assert batch["labels"].tolist() == [1, 0]


# ---------------------------------------------------------------------------------------------
# Metrics, sampling, tables


def test_metrics_match_scikit_learn():
    from sklearn.metrics import accuracy_score, confusion_matrix, f1_score

    rng = np.random.default_rng(0)
    y_true = rng.integers(0, 4, 200)
    y_pred = np.where(rng.random(200) < 0.6, y_true, rng.integers(0, 4, 200))
    y_pred[y_pred == 3] = 2  # class 3 is never predicted: its F1 is 0
    m = classification_metrics(y_true, y_pred, 4)
    assert m["accuracy"] == pytest.approx(accuracy_score(y_true, y_pred))
    assert m["macro_f1"] == pytest.approx(f1_score(y_true, y_pred, average="macro",
                                                   zero_division=0))
    assert m["confusion"] == confusion_matrix(y_true, y_pred, labels=range(4)).tolist()


def test_sample_per_class_draws_k_of_each_reproducibly():
    labels = ["a"] * 10 + ["b"] * 7 + ["c"] * 5
    train = list(range(20))  # the last two "c" are outside the pool
    picked = sample_per_class(train, labels, 3, seed=1)
    assert sorted(labels[i] for i in picked) == ["a"] * 3 + ["b"] * 3 + ["c"] * 3
    assert set(picked) <= set(train)
    assert picked == sample_per_class(train, labels, 3, seed=1)
    assert picked != sample_per_class(train, labels, 3, seed=2)
    assert sample_per_class(train, labels, None, seed=0) == train
    with pytest.raises(ValueError, match="fewer"):
        sample_per_class(train, labels, 4, seed=0)


def test_summarize_gives_mean_and_sample_std():
    def r(acc, seed):
        return ClassificationResult("m", acc, acc, [[1]], ["x", "y"], "test", 10, 8, seed, [])

    rows = summarize([r(0.5, 0), r(0.7, 1), r(0.9, 2)])
    assert rows[0]["runs"] == 3
    assert rows[0]["accuracy_mean"] == pytest.approx(0.7)
    assert rows[0]["accuracy_std"] == pytest.approx(0.2)
    assert "70.0 ± 20.0" in format_table(rows)


# ---------------------------------------------------------------------------------------------
# Methods: one result structure, clear errors


def test_fine_tuning_beats_chance_and_uses_the_train_loop(corpus, tok, small_config):
    torch.manual_seed(0)  # the weights come from generator=; this only pins anything left over
    result = from_scratch(small_config, corpus, tokenizer=tok, config=FAST)
    assert result.details["steps"] == 40
    assert result.num_train == 120 and sum(map(sum, result.confusion)) == 30
    assert result.accuracy >= 0.8  # chance is 1/3; the topic words make this easy
    assert isinstance(result.model, BertForSequenceClassification)


def test_fine_tuning_copies_the_encoder_and_leaves_the_original(corpus, tok, small_config):
    pre = BertForPreTraining(small_config, generator=torch.Generator().manual_seed(1))
    before = {k: v.clone() for k, v in pre.state_dict().items()}
    # lr ~ 0: the fine-tuned encoder must still be the pretrained one, not a fresh random one.
    config = dataclasses.replace(FAST, min_steps=2, epochs=0.1, lr=1e-12)
    result = finetune_classifier(pre, corpus, tokenizer=tok, config=config, k_per_class=4)
    assert result.method == "fine-tuned" and result.details["init"] == "pretrained"
    assert result.num_train == 12
    for name, tensor in result.model.bert.state_dict().items():
        torch.testing.assert_close(tensor, before["bert." + name], atol=1e-9, rtol=0)
    assert all(torch.equal(before[k], v) for k, v in pre.state_dict().items())
    assert result.model.bert.pooler.weight.data_ptr() != pre.bert.pooler.weight.data_ptr()


def test_a_model_folder_fine_tunes_like_the_model_itself(corpus, tok, small_config, tmp_path):
    from bertlab.hf import save_hf

    pre = BertForPreTraining(small_config, generator=torch.Generator().manual_seed(1))
    save_hf(pre, tok, tmp_path / "hf")
    config = dataclasses.replace(FAST, min_steps=3, epochs=0.1)
    from_folder = finetune_classifier(tmp_path / "hf", corpus, tokenizer=tok, config=config)
    from_model = finetune_classifier(pre, corpus, tokenizer=tok, config=config)
    assert from_folder.details["init"] == "pretrained"
    assert from_folder.predictions == from_model.predictions
    assert from_folder.details["final_train_loss"] == from_model.details["final_train_loss"]
    with pytest.raises(ValueError, match="neither a run folder"):
        bertlab.finetune.finetune_classifier(tmp_path, corpus, tokenizer=tok, config=config)
    assert bertlab.finetune.finetune_classifier is finetune_classifier  # one function, not twins


def test_a_train_config_drives_the_loop_as_given(corpus, tok, small_config):

    config = TrainConfig(max_steps=3, batch_size=8, lr=1e-3, checkpoint_interval=None,
                         progress=False, log_interval=0, device="cpu")
    big = BertConfig(**{**small_config.to_dict(), "max_position_embeddings": 128})
    result = from_scratch(big, corpus, tokenizer=tok, config=config, k_per_class=4)
    assert result.details["steps"] == 3 and result.details["train_config"]["batch_size"] == 8
    with pytest.raises(ValueError, match="max_position_embeddings=64"):
        from_scratch(small_config, corpus, tokenizer=tok, config=config)


def test_probe_and_baselines_share_one_result_structure(corpus, tok, small_config):
    model = BertForPreTraining(small_config, generator=torch.Generator().manual_seed(0))
    results = [
        linear_probe(model, corpus, tokenizer=tok, config=ProbeConfig(max_seq_len=16)),
        linear_probe(model, corpus, tokenizer=tok, config=ProbeConfig(max_seq_len=16, pooling="cls"),
                     k_per_class=8),
        tfidf_baseline(corpus, tokenizer=tok, config=ProbeConfig(max_seq_len=16)),
        tfidf_baseline(corpus, config=ProbeConfig(max_seq_len=None, seed=3), k_per_class=8),
        from_scratch(small_config, corpus, tokenizer=tok,
                     config=dataclasses.replace(FAST, min_steps=2)),
    ]
    for r in results:
        assert isinstance(r, ClassificationResult)
        assert set(r.to_dict()) == {f.name for f in dataclasses.fields(r)} - {"model"}
        assert r.label_names == ["money", "music", "sport"] and r.split == "test"
        assert len(r.predictions) == 30 and sum(map(sum, r.confusion)) == 30
        assert 0.0 <= r.macro_f1 <= 1.0
    assert [r.num_train for r in results] == [120, 24, 120, 24, 120]
    assert results[2].accuracy >= 0.9  # TF-IDF finds the topic words
    table = format_table(results)
    assert "linear probe (pooled)" in table and "TF-IDF" in table and "from scratch" in table


def test_the_split_scored_is_a_setting_of_every_method(corpus, tok, small_config):
    validation = sum(d.split == "validation" for d in corpus)
    assert validation > 0
    results = [
        tfidf_baseline(corpus, tokenizer=tok,
                       config=ProbeConfig(max_seq_len=16, eval_split="validation")),
        from_scratch(small_config, corpus, tokenizer=tok, config=dataclasses.replace(
            FAST, min_steps=2, epochs=0.1, eval_split="validation")),
    ]
    for r in results:
        assert r.split == "validation" and len(r.predictions) == validation


def test_cls_features_read_pooled_raw_and_mean(corpus, tok, small_config):
    model = BertForPreTraining(small_config, generator=torch.Generator().manual_seed(0)).eval()
    docs = corpus[:3]
    pooled = cls_features(model, docs, tok, pooling="pooled", max_seq_len=16)
    raw = cls_features(model, docs, tok, pooling="cls", max_seq_len=16)
    assert pooled.shape == raw.shape == (3, 32)
    expected = torch.tanh(model.bert.pooler(torch.from_numpy(raw))).detach().numpy()
    np.testing.assert_allclose(pooled, expected, atol=1e-5)
    assert not np.allclose(cls_features(model, docs, tok, pooling="mean", max_seq_len=16), raw)


def test_one_class_labels_are_refused(corpus, tok):
    with pytest.raises(ValueError, match="only one class"):
        tfidf_baseline(corpus, ["sport"] * len(corpus), tokenizer=tok)


def test_misaligned_labels_are_refused(corpus, tok, small_config):
    labels = [d.label for d in corpus][:-1]
    with pytest.raises(ValueError, match=r"labels has 179 entries but docs has 180"):
        from_scratch(small_config, corpus, labels, tokenizer=tok, config=FAST)
    with pytest.raises(ValueError, match="same order"):
        linear_probe(BertForPreTraining(small_config), corpus, labels, tokenizer=tok)


def test_unknown_task_and_bad_settings_are_refused(corpus, tok):
    with pytest.raises(ValueError, match=r"task 'imdb' is neither a known task \(bbc-topic\)"):
        load_task("imdb")
    with pytest.raises(ValueError, match="ProbeConfig.pooling='max'; choose one of pooled"):
        ProbeConfig(pooling="max")
    with pytest.raises(ValueError, match="max_seq_len=None reads whole documents"):
        linear_probe(None, corpus, tokenizer=tok, config=ProbeConfig(max_seq_len=None))
    with pytest.raises(ValueError, match=r"ProbeConfig.C must be a positive number or None"):
        ProbeConfig(C=0.0)
    with pytest.raises(ValueError, match="split='train'"):
        tfidf_baseline([d for d in corpus if d.split != "train"], tokenizer=tok)
    with pytest.raises(ValueError, match="max_seq_len"):
        FinetuneConfig(max_seq_len=2)


@pytest.mark.parametrize("settings, message", [
    # The library names the setting (the CLI adds its flag: tests/test_cli.py).
    ({"epochs": float("inf")}, r"FinetuneConfig.epochs must be a positive number, got inf"),
    ({"epochs": float("nan")}, r"epochs must be a positive number, got nan"),
    ({"lr": float("inf")}, r"lr must be a positive number, got inf"),
    ({"weight_decay": float("nan")}, "FinetuneConfig.weight_decay must be a number >= 0, got nan"),
    ({"warmup_fraction": 1.0}, r"warmup_fraction must be in \[0, 1\)"),
])
def test_finetune_settings_are_finite(settings, message):
    # epochs=inf asked for infinitely many steps: a traceback from the step count.
    with pytest.raises(ValueError, match=message):
        FinetuneConfig(**settings)


def test_a_model_smaller_than_its_tokenizer_is_refused(tok, small_config):
    smaller = BertForPreTraining(dataclasses.replace(small_config,
                                                     vocab_size=small_config.vocab_size - 10))
    with pytest.raises(ValueError, match=rf"compare_downstream: the tokenizer has "
                                         rf"{tok.get_vocab_size()} tokens"):
        compare_downstream(smaller, tok, methods=["linear probe"], config=FAST)


# ---------------------------------------------------------------------------------------------
# Export


def test_classifier_exports_to_transformers_with_equal_logits(corpus, tok, small_config, tmp_path):
    transformers = pytest.importorskip("transformers")
    from bertlab.hf import load_hf, save_hf

    config = dataclasses.replace(FAST, min_steps=3, epochs=0.1)
    result = from_scratch(small_config, corpus, tokenizer=tok, config=config)
    model = result.model.eval()
    save_hf(model, tok, tmp_path / "clf", label_names=result.label_names)
    theirs = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "clf").eval()
    assert theirs.config.id2label == dict(enumerate(result.label_names))
    batch = pad_batch([c[0] for c in document_chunks(corpus[:6], tok, 16)], tok)
    with torch.no_grad():
        ours = model(**batch).logits
        torch.testing.assert_close(theirs(**batch).logits, ours, atol=1e-5, rtol=1e-5)
        back = load_hf(tmp_path / "clf", task="classification")
        torch.testing.assert_close(back(**batch).logits, ours, atol=1e-6, rtol=1e-6)


def test_cli_finetune_refuses_bad_arguments_clearly(capsys, tmp_path):
    from bertlab.cli import main

    assert main(["finetune", str(tmp_path), "--methods", "bert-large"]) == 2
    assert "--methods bert-large: unknown" in capsys.readouterr().err
    assert main(["finetune", str(tmp_path), "--labels-per-class", "few"]) == 2
    assert "whole numbers or 'all'" in capsys.readouterr().err
    assert main(["finetune", str(tmp_path)]) == 2  # an empty folder is not a model
    assert "neither a run folder" in capsys.readouterr().err


def test_a_task_folder_labels_by_its_top_sub_folders_and_skips_hidden_ones(tmp_path):
    for rel in ("tech/2004/a.txt", "tech/2005/b.txt", "sport/c.txt",
                "sport/.ipynb_checkpoints/c-checkpoint.txt", ".ipynb_checkpoints/x.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("A short text. Two sentences.", encoding="utf-8")
    with pytest.warns(UserWarning, match=r"skipped 2 hidden"):
        docs, labels = load_task(tmp_path)
    assert [d.id for d in docs] == ["sport/c", "tech/2004/a", "tech/2005/b"]
    assert labels == ["sport", "tech", "tech"]


def test_a_task_of_rows_reads_its_label_field(tmp_path):
    import json
    path = tmp_path / "reviews.jsonl"
    rows = [{"review": f"Review {i}. It was {'good' if i % 2 else 'bad'}.",
             "stars": "pos" if i % 2 else "neg"} for i in range(10)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    docs, labels = load_task(path, read={"text_field": "review", "label_field": "stars"})
    assert labels == [r["stars"] for r in rows] and docs[1].sentences == ["Review 1.", "It was good."]
    with pytest.raises(ValueError, match=r"has no field 'label' \(--label-field\); the fields it "
                                         r"has are 'review', 'stars'"):
        load_task(path, read={"text_field": "review"})
    path.write_text("".join(json.dumps(r | {"stars": "pos"}) + "\n" for r in rows), encoding="utf-8")
    with pytest.raises(ValueError, match=r"task file '.*reviews.jsonl' has one label \(pos\)"):
        load_task(path, read={"text_field": "review", "label_field": "stars"})
