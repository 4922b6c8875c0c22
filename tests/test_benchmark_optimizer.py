"""benchmarks/optimizer.py on small sizes: both stages write a record that says what it measured,
on which CPU, and the learning stage's verdict comes from the course's one rule."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bertlab.course.twins import verdict

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "optimizer.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=900)


@pytest.mark.slow
def test_the_speed_stage_times_three_arms_and_names_the_cpu(tmp_path):
    out = tmp_path / "speed.json"
    done = run("--stage", "speed", "--repeats", "1", "--steps", "3", "--out", str(out))
    assert done.returncode == 0, done.stderr
    record = json.loads(out.read_text())
    here = record["here"]
    assert set(here["steps_per_s"]) == {"muon, Newton-Schulz bf16", "muon, Newton-Schulz fp32",
                                        "adamw"}
    assert all(r["median"] > 0 and len(r["all"]) == 1 for r in here["steps_per_s"].values())
    assert set(here["ratio_to_adamw"]) == {"muon, Newton-Schulz bf16", "muon, Newton-Schulz fp32"}
    assert here["cpu"]["cpu"] and isinstance(here["cpu"]["native_bf16"], bool)
    assert here["matmul_512x128x128_us"]["bf16 / fp32"] > 0
    assert record["course_machine"]["source"].startswith("quoted")  # never passed off as measured
    assert record["command"].startswith("python benchmarks/optimizer.py --stage speed")


@pytest.mark.slow
def test_the_learning_stage_pairs_the_dtypes_by_seed(tmp_path):
    out = tmp_path / "learning.json"
    done = run("--stage", "learning", "--seeds", "0", "1", "--learning-steps", "10",
               "--eval-batches", "2", "--out", str(out))
    assert done.returncode == 0, done.stderr
    record = json.loads(out.read_text())
    assert sorted((r["newton_schulz"], r["seed"]) for r in record["runs"]) == [
        ("bf16", 0), ("bf16", 1), ("fp32", 0), ("fp32", 1)]
    difference = record["summary"]["fp32 - bf16 mask_accuracy"]
    by = {(r["newton_schulz"], r["seed"]): r["mask_accuracy"] for r in record["runs"]}
    assert difference["per_seed"] == [by["fp32", s] - by["bf16", s] for s in (0, 1)]
    assert difference["verdict"] == verdict(difference)


@pytest.mark.parametrize("args, words", [(["--steps", "0"], "--steps 0"),
                                         (["--out", "{tmp}"], "is a folder")])
def test_bad_arguments_are_refused_before_any_work(tmp_path, args, words):
    done = run(*[a.format(tmp=tmp_path) for a in args])
    assert done.returncode != 0 and words.format(tmp=tmp_path) in done.stderr
    assert list(tmp_path.iterdir()) == []
