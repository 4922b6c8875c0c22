"""benchmarks/chinese_wwm.py --merge: seeds run as separate processes make the same record."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SAVED = json.loads((BENCHMARKS / "results" / "chinese_wwm.json").read_text())


@pytest.fixture(scope="module")
def script(load_benchmark):
    return load_benchmark("chinese_wwm")


def part(seeds, path: Path, **settings) -> Path:
    """Write the saved record cut down to `seeds`, as a run of those seeds alone would have."""
    record = copy.deepcopy(SAVED)
    record["settings"].update(seeds=list(seeds), **settings)
    record["rows"] = [row for row in record["rows"] if row["seed"] in seeds]
    path.write_text(json.dumps(record))
    return path


def test_merge_of_split_seeds_gives_the_saved_rows_and_medians(script, tmp_path):
    seeds = SAVED["settings"]["seeds"]
    a, b = part(seeds[::2], tmp_path / "a.json"), part(seeds[1::2], tmp_path / "b.json")
    out = tmp_path / "merged.json"
    assert script.main(["--merge", str(a), str(b), "--out", str(out)]) == 0
    merged = json.loads(out.read_text())
    key = lambda row: (row["seed"], row["model"])  # noqa: E731
    assert sorted(merged["rows"], key=key) == sorted(SAVED["rows"], key=key)
    assert [row["seed"] for row in merged["rows"]] == sorted(row["seed"] for row in SAVED["rows"])
    assert merged["medians"] == SAVED["medians"]
    assert merged["settings"]["seeds"] == sorted(seeds)
    assert merged["settings"]["steps"] == SAVED["settings"]["steps"]
    assert merged["complete"] and merged["recipe"] == SAVED["recipe"]
    assert [m["total_seconds"] for m in merged["merged_from"]] == [SAVED["total_seconds"]] * 2


@pytest.mark.parametrize("problem, message", [
    ("unfinished", "did not finish"),
    ("other steps", "steps differ"),
    ("same seed twice", "repeat"),
    ("not json", "cannot read"),
    ("another script's record", "not a chinese_wwm.py record"),
])
def test_merge_refuses_records_that_cannot_share_a_table(script, tmp_path, problem, message):
    a = part([0], tmp_path / "a.json")
    b = part([0] if problem == "same seed twice" else [1], tmp_path / "b.json",
             **({"steps": 1} if problem == "other steps" else {}))
    if problem == "unfinished":
        b.write_text(json.dumps({**json.loads(b.read_text()), "complete": False}))
    if problem == "not json":
        b.write_text("{")
    if problem == "another script's record":
        b.write_text((BENCHMARKS / "results" / "downstream.json").read_text())
    out = tmp_path / "merged.json"
    with pytest.raises(SystemExit, match=message) as err:
        script.main(["--merge", str(a), str(b), "--out", str(out)])
    assert str(b) in str(err.value) or problem == "same seed twice"
    assert not out.exists()


def test_the_script_runs_from_the_command_line(tmp_path):
    import subprocess

    bad = tmp_path / "bad.json"
    bad.write_text("{")
    done = subprocess.run([sys.executable, str(BENCHMARKS / "chinese_wwm.py"), "--merge", str(bad),
                           "--out", str(tmp_path / "merged.json")], capture_output=True, text=True)
    assert done.returncode != 0 and f"--merge {bad}: cannot read it" in done.stderr
