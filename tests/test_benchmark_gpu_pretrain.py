"""benchmarks/gpu_pretrain.py on the CPU: the GPU twins' code path as a smoke run.

Both stages run as they will on the GPU machine, on prepared shards (pairs drawn afresh each
epoch): train starts the MLM + NSP run and its MLM-only twin at once, score fills the record
and writes the shipped model. A CPU run writes into a temporary folder, never over
benchmarks/results/gpu_pretrain.json or models/.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bertlab.cli import main as cli
from bertlab.course.gpu_records import gpu_curves, load_gpu_records, twins_lines
from bertlab.loading import load_model

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_pretrain.py"


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("shards")
    assert cli(["prepare", "--corpus", "bbc", "--out", str(out / "s128"), "--pair-draws",
                "2"]) == 0
    assert cli(["prepare", "--corpus", "bbc", "--out", str(out / "s64"), "--max-seq-len", "64",
                "--tokenizer", str(out / "s128" / "tokenizer.json")]) == 0
    return out


def run(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_the_twins_train_together_and_the_record_says_what_each_learned(shards, tmp_path):
    record = ROOT / "benchmarks" / "results" / "gpu_pretrain.json"
    before = record.read_bytes() if record.exists() else None
    runs = tmp_path / "runs"
    run("train", "--device", "cpu", "--preset", "tiny", "--steps", "4", "--batch-size", "8",
        "--eval-interval", "2", "--eval-batches", "2", "--threads", "1", "--num-workers", "0",
        "--seeds", "0", "--shards", str(shards / "s128"), "--shards64", str(shards / "s64"),
        "--runs", str(runs))
    assert json.loads((runs / "train.json").read_text())["concurrent_runs"] == 2
    done = run("score", "--runs", str(runs), "--shards", str(shards / "s128"),
               "--finetune-seeds", "2", "--label-budgets", "8", "--threads", "2")
    written = Path(re.search(r"^written: (\S+)$", done.stdout, flags=re.M).group(1))
    assert ROOT / "benchmarks" / "results" not in written.parents
    data = json.loads(written.read_text())
    assert data["device"] == "cpu" and data["shared_device"] is True
    by_twin = {r["twin"]: r for r in data["runs"]}
    assert set(by_twin) == {"mlm+nsp", "mlm"}
    nsp, mlm = by_twin["mlm+nsp"], by_twin["mlm"]
    for r in (nsp, mlm):
        assert r["steps"] == 4 and r["tokens"] > 0 and r["tokens_per_s"] > 0
        assert r["pair_draws"] == 2 and r["minutes"] > 0
        assert [h["step"] for h in r["history_128"]] == [h["step"] for h in r["history_64"]] \
            == [0, 2, 4]
        for length in ("at_128", "at_64"):
            assert 0 <= r[length]["mask_accuracy"] <= 1 and r[length]["mask_targets"] > 0
            assert 0 < r[length]["mask_unigram_accuracy"] < 0.2  # the bar beside it
        rule = r["word_overlap_rule_nsp_accuracy"]
        assert 0.6 < rule["accuracy"] < 0.8 and rule["validation_pairs"] > 1000
        assert 0 <= r["cloze"]["top1"] <= r["cloze"]["top5"] <= 1
        assert set(r["low_label"]) == {"fine-tuned @ 8", "linear probe (pooled) @ 8"}
        assert all(v["runs"] == 2 for v in r["low_label"].values())
    # The twin trained no pair head, so it has no NSP figure, only the words "not trained".
    assert mlm["at_128"]["nsp_accuracy"] == "not trained"
    assert all("nsp_accuracy" not in h for h in mlm["history_128"])
    assert 0 <= nsp["at_128"]["nsp_accuracy"] <= 1
    assert data["twins"]["seeds"] == [0] and data["twins"]["same_steps"] is True
    gap = data["twins"]["nsp_minus_mlm_only"]["cls_probe_all_labels"]
    assert gap["mean"] == pytest.approx(nsp["cls_probe_all_labels"]["accuracy"]
                                        - mlm["cls_probe_all_labels"]["accuracy"])
    # The shipped model: the MLM + NSP run as a bf16 Hugging Face folder with its manifest.
    model_dir = written.parent / "gpu-mini"
    manifest = json.loads((model_dir / "MANIFEST.json").read_text())
    assert manifest["device"] == "cpu" and manifest["steps"] == 4
    assert manifest["scores"]["at_128"] == nsp["at_128"]
    assert max(manifest["files"].values()) <= 16 * 2**20
    assert json.loads((model_dir / "config.json").read_text())["dtype"] == "bfloat16"
    model, tok = load_model(model_dir, require_tokenizer=True)
    assert model.config.num_layers == 2 and tok.get_vocab_size() == model.config.vocab_size
    assert torch.isfinite(next(model.parameters())).all()
    assert (record.read_bytes() if record.exists() else None) == before
    # What notebooks 05 and 06 print from such a record: every run, then the gaps.
    lines = twins_lines(data)
    assert len(lines) == 1 + 2 + len(data["twins"]["nsp_minus_mlm_only"])
    assert "NSP not trained" in lines[2] and "NSP 0." in lines[1]
    assert [len(c) for c in gpu_curves(data).values()] == [3, 3]
    assert gpu_curves(data, 64) != gpu_curves(data)  # the yardstick at 64 tokens, and at 128
    # ...and a smoke record is never taken for a GPU result.
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "gpu_pretrain.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="made on a CPU .* not a GPU result"):
        load_gpu_records(tmp_path)


def test_without_a_gpu_session_the_notebooks_say_so_in_words(tmp_path):
    records = load_gpu_records(tmp_path)
    assert records.throughput is None and records.pretrain is None
    assert "No GPU pretraining record yet" in twins_lines(None)[0]
    assert gpu_curves(None) == {}
    # The repository holds GPU records only from a GPU (none yet, or a real device name).
    committed = load_gpu_records(ROOT)
    for record in (committed.throughput, committed.pretrain):
        assert record is None or "cpu" not in record["device"].lower()
