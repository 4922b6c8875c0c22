"""Fine-tuned models are kept (issue 57): `finetune --out` saves the classifier as a Hugging Face
folder with finetune.json, `classify` reads texts with it, and transformers gives the same
probabilities from the same folder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from faultlib import assert_one_clear_error, assert_unchanged, snapshot

from bertlab.cli import main
from bertlab.finetune import classify
from bertlab.loading import classifier_labels, load_model
from bertlab.model import BertForSequenceClassification
from bertlab.readers import load_corpus

pytestmark = pytest.mark.usefixtures("one_thread")
TEXTS = ["the striker scored twice as united beat chelsea on saturday",
         "shares in the bank fell sharply after the profit warning"]
FAST = ["--methods", "fine-tuned", "--labels-per-class", "8", "--epochs", "1", "--device", "cpu"]


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("task")
    docs = load_corpus("bbc")
    for label in ("sport", "business"):
        (folder / label).mkdir()
        for i, doc in enumerate([d for d in docs if d.label == label][:40]):
            (folder / label / f"{i:02d}.txt").write_text(doc.text, encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def kept(task, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("kept") / "clf"
    assert main(["finetune", "course-tiny", "--task", str(task), *FAST, "--out", str(out)]) == 0
    return out


def test_finetune_out_keeps_the_classifier_its_labels_length_and_scores(kept):
    names = sorted(p.name for p in kept.iterdir())
    assert names == ["config.json", "finetune.json", "model.safetensors",
                     "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json",
                     "vocab.txt"]
    record = json.loads((kept / "finetune.json").read_text())
    assert record["pretrained"] == "course-tiny" and record["max_seq_len"] == 64
    assert record["result"]["method"] == "fine-tuned" and record["result"]["k_per_class"] == 8
    assert 0 <= record["result"]["accuracy"] <= 1
    assert classifier_labels(kept) == record["result"]["label_names"] == ["business", "sport"]
    assert json.loads((kept / "tokenizer_config.json").read_text())["model_max_length"] == 64
    model, tok = load_model(kept)  # the same loader opens it, as the classifier it is
    assert isinstance(model, BertForSequenceClassification) and model.num_labels == 2


def test_classify_prints_each_labels_probability_most_likely_first(kept, tmp_path, capsys):
    assert main(["classify", str(kept), TEXTS[0]]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == TEXTS[0]  # 59 characters: shown whole (past 60, cut with "...")
    label, p = out[1].split(",")[0].split()
    assert label == "sport" and 0.5 < float(p) <= 1
    lines = tmp_path / "texts.txt"
    lines.write_text("\n".join(TEXTS) + "\n\n", encoding="utf-8")
    assert main(["classify", str(kept), "--file", str(lines)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 4  # two texts, two lines each


def test_transformers_gives_the_probabilities_bertlab_gives(kept):
    transformers = pytest.importorskip("transformers")
    model, tok = load_model(kept)
    ours = classify(model, tok, TEXTS, max_seq_len=64)
    theirs_model = transformers.AutoModelForSequenceClassification.from_pretrained(kept)
    theirs_tok = transformers.AutoTokenizer.from_pretrained(kept)
    with torch.no_grad():
        logits = theirs_model(**theirs_tok(TEXTS, return_tensors="pt", padding=True,
                                           truncation=True)).logits
    np.testing.assert_allclose(torch.softmax(logits, -1).numpy(), ours, atol=1e-5)
    pipe = transformers.pipeline("text-classification", model=str(kept), top_k=None)
    labels = classifier_labels(kept)
    piped = [[{d["label"]: d["score"] for d in row}[name] for name in labels]
             for row in pipe(TEXTS)]
    np.testing.assert_allclose(np.array(piped), ours, atol=1e-5)


@pytest.mark.parametrize("argv, fragments", [
    (["finetune", "course-tiny", "--task", "{task}", *FAST[:2], "--labels-per-class", "8", "32",
      "--out", "{root}/clf"], ["--out {root}/clf", "keeps one fine-tuned classifier",
                               "one --labels-per-class and --seeds 1"]),
    (["finetune", "course-tiny", "--task", "{task}", "--methods", "tf-idf", "--out",
      "{root}/clf"], ["--out {root}/clf", "this command trains 0"]),
    (["finetune", "course-tiny", "--task", "{task}", *FAST, "--out", "{task}"],
     ["--out {task}", "--task"]),
    (["classify", "course-tiny", "some text"], ["is no classifier", "finetune MODEL"]),
    (["classify", "{kept}"], ["got no text", "--file"]),
    (["classify", "{kept}", "--file", "{root}/missing.txt"], ["--file {root}/missing.txt",
                                                             "cannot be read"]),
], ids=["two-budgets", "no-fine-tuned-method", "out-is-the-task", "a-pretrained-model",
        "no-text", "missing-file"])
def test_bad_input_to_finetune_out_and_classify_is_one_error_and_writes_nothing(
        task, kept, tmp_path, capsys, argv, fragments):
    paths = {"task": task, "kept": kept, "root": tmp_path}
    before = snapshot(tmp_path, task, kept)
    code = main([a.format(**paths) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert_one_clear_error(err, [f.format(**paths) for f in fragments])
    assert_unchanged(before, snapshot(tmp_path, task, kept))
