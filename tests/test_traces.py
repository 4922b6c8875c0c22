"""Reproduce traces: every shipped model's first steps replay with today's code, bit for bit on
the machine that recorded them and within kernel noise on another."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertlab.config import TrainConfig, lr_at
from bertlab.course.traces import (
    CROSS_MACHINE_RTOL,
    compare_values,
    differences,
    machine,
    make_trace,
    replay,
    replay_script,
    trace_command,
)
from bertlab.readers import load_corpus

REPO = Path(__file__).resolve().parents[1]
MANIFESTS = sorted(REPO.glob("models/*/MANIFEST.json"))
SMALL = ["--vocab-size", "300", "--max-seq-len", "64", "--hidden-size", "32", "--num-heads", "2",
         "--intermediate-size", "64", "--batch-size", "8", "--eval-interval", "3",
         "--eval-batches", "2", "--device", "cpu"]


def test_stop_after_keeps_the_schedule_of_the_whole_run():
    whole = TrainConfig(max_steps=100, lr=1e-3)
    cut = TrainConfig(max_steps=100, lr=1e-3, stop_after=10)
    assert [lr_at(s, cut) for s in range(10)] == [lr_at(s, whole) for s in range(10)]
    with pytest.raises(ValueError, match="stop_after"):
        TrainConfig(stop_after=0)


def test_a_trace_command_pins_threads_precision_and_the_output_folder():
    command = ["pretrain", "--recipe", "course", "--max-steps", "8000", "--threads", "2",
               "--no-progress", "--out", "runs/x", "--resume"]
    assert trace_command(command, 50) == [
        "pretrain", "--recipe", "course", "--max-steps", "8000", "--stop-after", "50",
        "--threads", "1", "--precision", "fp32", "--no-progress", "--out", "{out}"]
    bf16 = trace_command([*command, "--precision", "bf16"], 50)  # a bf16 run replays in bf16
    assert bf16[bf16.index("--precision") + 1] == "bf16" and bf16.count("--precision") == 1
    with pytest.raises(ValueError, match="pretrain command"):
        trace_command(["finetune", "runs/x"], 5)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    for i, doc in enumerate(load_corpus("bbc")[:40]):
        (folder / f"doc{i:02d}.txt").write_text(doc.text, encoding="utf-8")
    return folder


def test_a_trace_replays_exactly_and_a_moved_stream_is_named(corpus):
    command = ["pretrain", "--corpus", str(corpus), "--max-steps", "40", *SMALL]
    trace = make_trace(command, 6)
    assert [row["step"] for row in trace["history"]] == [0, 3, 6]
    assert not any("elapsed_s" in row or "tokens_per_s" in row for row in trace["history"])
    assert replay(trace) == []
    moved = {**trace, "command": [*trace["command"], "--data-seed", "1"]}  # another data order
    found = replay(moved)
    assert any("train_loss" in line for line in found), found
    assert any(line.startswith("weights after step-00000006") for line in found), found
    # the budget is part of the stream: the same 6 steps of a 60-step run have other rates
    longer = {**trace, "command": [a if a != "40" else "60" for a in trace["command"]]}
    assert any(": lr " in line for line in replay(longer))


def test_differences_name_each_field():
    trace = {"history": [{"step": 0, "train_loss": None, "val_mask_accuracy": 0.1}],
             "weights_sha256": "a" * 64, "checkpoint": "step-00000002"}
    now = {"history": [{"step": 0, "train_loss": None, "val_mask_accuracy": 0.2}],
           "weights_sha256": "b" * 64}
    assert differences(trace, now) == [
        "step 0: val_mask_accuracy 0.1 -> 0.2",
        "weights after step-00000002: sha256 aaaaaaaaaaaa -> bbbbbbbbbbbb"]


def test_on_another_machine_counts_stay_exact_and_real_numbers_move_only_by_kernel_noise():
    trace = {"history": [{"step": 300, "tokens": 4800, "train_loss": 7.596770167350769}],
             "weights_sha256": "a" * 64, "checkpoint": "step-00000300"}
    # Measured: this step's loss on an Intel Xeon and on an AMD EPYC, same code and command.
    drift = {"history": [{"step": 300, "tokens": 4800, "train_loss": 7.596770809491475}],
             "weights_sha256": "b" * 64}
    assert differences(trace, drift, exact=False) == []  # the hash belongs to one machine
    assert len(differences(trace, drift)) == 2  # on the recording machine every bit counts
    moved = {**drift, "history": [{"step": 300, "tokens": 4800, "train_loss": 7.6}]}
    assert differences(trace, moved, exact=False) == [
        "step 300: train_loss 7.596770167350769 -> 7.6"]
    recount = {"history": [{"step": 300, "tokens": 4801, "train_loss": 7.596770167350769}]}
    assert differences(trace, {**drift, **recount}, exact=False) == [
        "step 300: tokens 4800 -> 4801"]
    assert compare_values({"loss": 0.06381050497293472, "predictions": [1, 2]},
                          {"loss": 0.06381051987409592, "predictions": [1, 2]}, exact=False) == []
    assert compare_values({"predictions": [1, 2]}, {"predictions": [1, 3]}, exact=False) == [
        "predictions[1]: 2 -> 3"]


# A model that cannot carry a trace yet, with why (none today): nothing else may lack one.
WITHOUT_TRACE: dict[str, str] = {}


def test_only_the_listed_models_lack_a_trace():
    lacking = {m.parent.name for m in MANIFESTS if "trace" not in json.loads(m.read_text())
               and json.loads(m.read_text()).get("device", "cpu") == "cpu"}
    assert lacking == set(WITHOUT_TRACE), ("a model without a reproduce trace must be re-made "
                                           "(its made_by writes one), and one re-made leaves "
                                           "WITHOUT_TRACE")


@pytest.mark.parametrize("manifest", MANIFESTS, ids=[m.parent.name for m in MANIFESTS])
def test_every_shipped_model_made_on_a_cpu_replays_its_trace(manifest):
    made = json.loads(manifest.read_text())
    if made.get("device", "cpu") != "cpu":
        pytest.skip(f"{manifest.parent.name} was made on {made['device']}: no CPU trace")
    if manifest.parent.name in WITHOUT_TRACE:
        pytest.skip(f"{manifest.parent.name}: {WITHOUT_TRACE[manifest.parent.name]}")
    assert made.get("commit"), f"{manifest}: names no commit"
    assert "trace" in made, (f"{manifest} has no reproduce trace; re-make the model with the "
                             f"command in its made_by, which writes one")
    found = replay(made["trace"])
    where = _where(made["trace"])
    assert not found, (f"{manifest.parent.name} no longer replays its trace: today's code trains "
                       f"another stream ({'; '.join(found[:6])}). If the change was meant, re-make "
                       f"the model ({made.get('made_by')}) and what reads it; if not, find what "
                       f"moved the stream.{where}")


def _where(trace: dict) -> str:
    """Return what a failed replay's message adds when the trace came from another machine."""
    recorded, here = trace.get("machine"), machine()
    if recorded in (None, here):
        return ""
    return (f" The trace was recorded on {recorded}, this is {here}, so its real numbers were "
            f"compared within a relative {CROSS_MACHINE_RTOL:g} (the kernels of two CPUs differ "
            f"by far less).")


# The benchmark records that carry a trace of one cheap cell (tools/record_traces.py writes them).
TRACED_RECORDS = ("downstream", "ablations-course", "time_to_quality")


def test_compare_values_names_each_path():
    assert compare_values({"a": [1, 2], "b": {"c": 0.5}}, {"a": [1, 3], "b": {"c": 0.5}}) == [
        "a[1]: 2 -> 3"]
    assert compare_values({"a": [1]}, {"a": [1, 2]}) == ["a: [1] -> [1, 2]"]
    assert compare_values({"x": 1}, {"x": 1, "y": None}) == []  # a missing field reads as None


@pytest.mark.parametrize("name", TRACED_RECORDS)
def test_every_traced_record_replays_its_cheap_cell(name):
    record = json.loads((REPO / "benchmarks" / "results" / f"{name}.json").read_text())
    assert "trace" in record, (f"benchmarks/results/{name}.json has no reproduce trace: a "
                               f"benchmark writes its record afresh; run python "
                               f"tools/record_traces.py --only {name}")
    trace = record["trace"]
    assert trace.get("commit") and trace["gave"]
    found = replay_script(trace)
    where = _where(trace)
    assert not found, (f"benchmarks/results/{name}.json no longer replays its trace ({trace['what']}"
                       f"): {'; '.join(found[:6])}. If the change was meant, re-make the record "
                       f"({record['command']}) and run tools/record_traces.py; if not, find what "
                       f"moved the numbers.{where}")
