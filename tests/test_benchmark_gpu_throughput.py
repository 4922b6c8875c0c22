"""benchmarks/gpu_throughput.py on the CPU: the GPU benchmark's code path as a smoke run.

A GPU is lent only now and then, so the script must work before one is there: `--device cpu`
runs the same steps (both models, full and real batches, the record's schema), and its record
goes to a temporary folder, never over benchmarks/results/gpu_throughput.json.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import bertlab as bl
from bertlab.cli import main as cli
from bertlab.course.gpu_records import throughput_lines
from bertlab.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_throughput.py"
ROW_FIELDS = {"preset", "seq_len", "batch", "batch_size", "vocab_size", "compile", "unpad",
              "padding_share", "tokens_per_s", "mfu",
              "mfu_measured_peak", "transformers_tokens_per_s", "ratio_vs_transformers"}


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bbc")
    for doc in bl.load_corpus("bbc")[:60]:
        (folder / f"{doc.id.replace('/', '_')}.txt").write_text(
            doc.title + "\n\n" + " ".join(doc.sentences), encoding="utf-8")
    out = tmp_path_factory.mktemp("shards") / "bbc"
    assert cli(["prepare", "--corpus", str(folder), "--out", str(out), "--max-seq-len",
                "32"]) == 0
    return out


@pytest.mark.slow
def test_a_cpu_smoke_run_fills_the_record_and_writes_outside_the_results_folder(shards):
    pytest.importorskip("transformers")
    record = ROOT / "benchmarks" / "results" / "gpu_throughput.json"
    before = record.read_bytes() if record.exists() else None
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--rows", "tiny:32:full", "tiny:32:real",
         "tiny:32:real:unpad", "--shards", str(shards), "--batch-size", "4", "--vocab-size", "500", "--warmup", "1",
         "--steps", "2", "--no-compile", "--profile", "tiny:32:full", "--profile-steps", "2"],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    written = Path(re.search(r"^written: (\S+)$", done.stdout, flags=re.M).group(1))
    assert ROOT / "benchmarks" / "results" not in written.parents
    data = json.loads(written.read_text())
    assert data["device"] == "cpu" and data["compile"] is False and data["matmul_peak_tflops"] > 0
    rows = data["rows"]
    assert [(r["preset"], r["seq_len"], r["batch"], r["batch_size"]) for r in rows] == [
        ("tiny", 32, "full", 4), ("tiny", 32, "real", 4), ("tiny", 32, "real", 4)]
    assert [r["unpad"] for r in rows] == [False, False, True]
    assert rows[2]["padding_share"] == rows[1]["padding_share"]  # the same batches, unpadded
    assert all(set(r) == ROW_FIELDS for r in rows)
    shard_vocab = load_tokenizer(shards / "tokenizer.json").get_vocab_size()
    assert rows[0]["vocab_size"] == 500 and rows[1]["vocab_size"] == shard_vocab
    for r in rows:
        assert r["tokens_per_s"] > 0 and r["transformers_tokens_per_s"] > 0
        assert r["ratio_vs_transformers"] == pytest.approx(
            r["tokens_per_s"] / r["transformers_tokens_per_s"])
        assert r["mfu"] is None and r["mfu_measured_peak"] is None  # no MFU without a GPU
    # The profile: where a step's time goes, biggest first, in shares that add up to at most 1.
    profile = data["profile"]
    assert profile["row"] == "tiny:32:full" and profile["time"] == "CPU operators"
    shares = [k["share"] for k in profile["top"]]
    assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1 + 1e-9
    assert any("addmm" in k["name"] or "mm" in k["name"] for k in profile["top"])
    # A later phase of the same session adds its rows to the record, keeping the earlier ones.
    more = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--rows", "tiny:16:full:regional",
         "--batch-size", "4", "--vocab-size", "500", "--warmup", "1", "--steps", "2",
         "--no-reference", "--append", "--out", str(written)],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert more.returncode == 0, more.stderr[-3000:]
    merged = json.loads(written.read_text())
    assert [(r["seq_len"], r["batch"]) for r in merged["rows"]] == [(32, "full"), (32, "real"),
                                                                    (32, "real"), (16, "full")]
    assert merged["profile"] == profile and merged["rows"][3]["transformers_tokens_per_s"] is None
    # Each row says how it was compiled, and how much of a real batch is padding.
    assert [r["compile"] for r in merged["rows"]] == ["none", "none", "none", "regional"]
    assert rows[0]["padding_share"] == 0 and 0 <= rows[1]["padding_share"] < 0.5
    assert (record.read_bytes() if record.exists() else None) == before
    lines = throughput_lines(merged)  # what notebook 05 prints from a record
    assert lines[0].startswith("cpu, torch") and len(lines) == 1 + 4
    assert "MFU n/a" in lines[1] and "x transformers" in lines[1] and "x transformers" not in lines[4]
    assert "unpadded" in lines[3] and "unpadded" not in lines[2]
    assert "No GPU throughput record yet" in throughput_lines(None)[0]
