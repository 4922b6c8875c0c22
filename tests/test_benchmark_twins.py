"""benchmarks/twins.py on small sizes: three arms trained as CLI runs, resumed, scored, shipped.

The same code trains the CPU twins for hours and, with other settings, the GPU session's twins.
Here each run is 4 steps of a small model; the record and the models go to a temporary folder,
never over benchmarks/results/ or models/.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bertlab.course.gpu_records import gpu_curves, load_gpu_records
from bertlab.course.twins import above_rule, arms_table, load_twins, mean_std, verdict
from bertlab.loading import load_model

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "twins.py"
SMALL = ["--recipe", "bert", "--steps", "4", "--batch-size", "8", "--eval-interval", "2",
         "--eval-batches", "2", "--threads", "1", "--checkpoint-interval", "2"]


def run(*args: str, code: int = 0, timeout: int = 900) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    assert done.returncode == code, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_three_arms_train_resume_score_and_ship(tmp_path):
    runs, record, models = tmp_path / "runs", tmp_path / "twins-cpu.json", tmp_path / "models"
    train = ["train", *SMALL, "--seeds", "0", "--jobs", "3", "--runs", str(runs)]
    done = run(*train)
    assert "3 run(s) to train" in done.stdout
    for arm in ("mlm+nsp", "mlm", "mlm+sop"):
        summary = json.loads((runs / f"{arm}-seed0" / "summary.json").read_text())
        assert summary["steps"] == 4 and summary["objectives"] == arm.split("+")
        assert "--seed 0 --data-seed 0" in summary["command"]
        assert [r["step"] for r in summary["history"]] == [0, 2, 4]
        assert all("val_64_mask_accuracy" in r for r in summary["history"])  # the yardstick
        assert len(summary["sittings"]) == 1 and summary["sittings"][0]["exit"] == 0
    # A run that lost its summary (cut off after its last checkpoint) is resumed, not redone.
    (runs / "mlm-seed0" / "summary.json").unlink()
    again = run(*train)
    assert "1 run(s) to train" in again.stdout and "mlm-seed0: resumed" in again.stdout
    assert len(json.loads((runs / "mlm-seed0" / "sittings.json").read_text())) == 2
    # Runs are continued only by the code they started with.
    sittings = runs / "mlm-seed0" / "sittings.json"
    noted = json.loads(sittings.read_text())
    sittings.write_text(json.dumps([{**noted[0], "commit": "0" * 40}, *noted[1:]]))
    refused = run(*train, code=2)
    assert "started at commit" in refused.stdout
    sittings.write_text(json.dumps(noted))

    score = ["score", "--runs", str(runs), "--record", str(record),
             "--finetune-seeds", "1", "--label-budgets", "8", "--threads", "2", "--task-docs", "300",
             "--models", str(models), "--ship", "test-nsp=mlm+nsp"]
    run(*score)
    data = json.loads(record.read_text())
    assert data["device"] == "cpu" and [r["arm"] for r in data["runs"]] == [
        "mlm+nsp", "mlm", "mlm+sop"]
    by = {r["arm"]: r for r in data["runs"]}
    assert by["mlm"]["scored_by"] == {"command": "python benchmarks/twins.py score " + " ".join(
        score[1:]), "commit": data["scored_with"]}  # each run names what scored it
    assert by["mlm"]["at"]["64"]["pair_accuracy"] == "not trained"
    assert all("pair_accuracy" not in h for h in by["mlm"]["history"]["128"])
    for arm in ("mlm+nsp", "mlm+sop"):
        assert 0 <= by[arm]["at"]["64"]["pair_accuracy"] <= 1
        assert by[arm]["pair_objective"] == arm.split("+")[1]
    # The word-overlap rule reads NSP pairs well and SOP pairs not at all (same sets, either order).
    assert 0.6 < by["mlm+nsp"]["word_overlap_rule"]["64"]["accuracy"] < 0.8
    assert abs(by["mlm+sop"]["word_overlap_rule"]["64"]["accuracy"] - 0.5) < 0.05
    assert set(by["mlm"]["cls_probe_all_labels"]) == {"pooled", "cls", "mean"}
    assert set(data["random_init"]["0"]) == {"pooled", "cls", "mean"}
    paired = data["summary"]["paired_by_seed"]["mlm+nsp - mlm"]["cloze_top1"]
    assert paired["per_seed"]["0"] == pytest.approx(by["mlm+nsp"]["cloze"]["top1"]
                                                    - by["mlm"]["cloze"]["top1"])
    assert "pair_accuracy_64" in data["summary"]["per_arm"]["mlm+sop"]
    assert "pair_accuracy_64" not in data["summary"]["per_arm"]["mlm"]
    # What limits the pair head, measured: masking, pairs it trained on, and for NSP the topic.
    limits = by["mlm+nsp"]["pair_limits"]
    assert set(limits["validation"]) == {"unmasked", "bert_masked", "masked_as_trained"}
    assert all(0 <= a <= 1 for a in limits["validation"].values())
    assert limits["trained_pairs_bert_masked"]["pairs"] > 0
    partners = limits["by_partner_bert_masked"]
    assert sum(k["pairs"] for k in partners.values()) == limits["validation_pairs"]
    assert limits["topic_only_ceiling"] == pytest.approx(
        1 - partners["not_next_same_topic"]["pairs"] / limits["validation_pairs"])
    assert "by_partner_bert_masked" not in by["mlm+sop"]["pair_limits"]  # one document: no topic
    assert "pair_limits" not in by["mlm"]
    # Scoring again adds nothing: every run is in the record already.
    before = record.read_text()
    run(*score[:-2])
    assert json.loads(record.read_text())["runs"] == json.loads(before)["runs"]

    # What the notebooks read: one seed has no spread, so the course's reader refuses it...
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "twins-cpu.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="fewer than 2 seeds"):
        load_twins(tmp_path)
    table = arms_table(data, {"[MASK] at 64": "mask_accuracy_64", "pair at 64": "pair_accuracy_64"})
    assert table.splitlines()[2].split()[:2] == ["mlm", f"{by['mlm']['at']['64']['mask_accuracy']:.3f}"]
    assert "not trained" in table.splitlines()[2]
    assert [len(c) for c in gpu_curves(data).values()] == [3, 3, 3]
    # ...and a CPU record is never taken for a GPU result.
    (tmp_path / "benchmarks" / "results" / "twins-gpu.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="made on a CPU .* not a GPU result"):
        load_gpu_records(tmp_path)

    manifest = json.loads((models / "test-nsp" / "MANIFEST.json").read_text())
    assert manifest["objectives"] == ["mlm", "nsp"] and manifest["device"] == "cpu"
    assert manifest["what"].startswith("a tiny BERT pretrained by bertlab on BBC News with MLM + NSP")
    assert manifest["trace"]["history"] and manifest["commit"] == by["mlm+nsp"]["commit"]
    assert manifest["scored_by"] == by["mlm+nsp"]["scored_by"]["command"]  # its own scoring
    assert manifest["corpus"]["documents"] == 2225 and len(manifest["corpus"]["sha256"]) == 64
    model, tok = load_model(models / "test-nsp", require_tokenizer=True)
    assert tok.get_vocab_size() == model.config.vocab_size
    assert torch.isfinite(next(model.parameters())).all()
    from bertlab.course.traces import replay

    assert replay(manifest["trace"]) == []


@pytest.mark.slow
def test_a_signal_ends_the_sitting_and_starts_no_other_run(tmp_path):
    import signal

    runs = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "train", *SMALL, "--steps", "100000",
                             "--arms", "mlm+nsp", "mlm", "--seeds", "0", "--jobs", "1",
                             "--runs", str(runs)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    lines = [proc.stdout.readline(), proc.stdout.readline()]
    assert "mlm+nsp-seed0: started" in lines[1], lines
    proc.send_signal(signal.SIGTERM)  # a sitting ends: the run stops, and the next never starts
    rest = proc.communicate(timeout=300)[0]
    assert proc.returncode == 1, rest
    assert "not finished: mlm+nsp-seed0, mlm-seed0" in rest and "mlm-seed0: started" not in rest
    assert not (runs / "mlm-seed0").exists()


def test_without_a_gpu_session_the_notebooks_say_so_in_words(tmp_path):
    records = load_gpu_records(tmp_path)
    assert records.throughput is None and records.pretrain is None
    assert gpu_curves(None) == {}
    # The repository holds GPU records only from a GPU (none yet, or a real device name).
    committed = load_gpu_records(ROOT)
    for record in (committed.throughput, committed.pretrain):
        assert record is None or "cpu" not in record["device"].lower()


def test_cpu_runs_share_the_cores_and_take_the_recipes_step_budget(monkeypatch):
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import twins
    finally:
        sys.path.remove(str(SCRIPT.parent))
    seen = {}
    monkeypatch.setattr(twins, "train_stage", lambda args: seen.update(vars(args)) or 0)
    monkeypatch.setattr(twins.os, "cpu_count", lambda: 2)
    assert twins.main(["train", "--jobs", "2"]) == 0
    # Two runs on 2 cores: one thread each, never torch's default of every core per run.
    assert seen["threads"] == 1 and seen["steps"] == 10_000 and seen["recipe"] == "nsp"
    assert "--threads" in (command := twins.pretrain_command(twins.argparse.Namespace(**seen),
                                                             "mlm", 0))
    assert command[command.index("--threads") + 1] == "1"
    assert twins.main(["train", "--jobs", "1", "--threads", "2"]) == 0 and seen["threads"] == 2


def test_a_verdict_is_a_difference_read_against_two_standard_errors():
    assert verdict({"mean": 0.03, "two_se": 0.02}) == "higher"
    assert verdict({"mean": -0.03, "two_se": 0.02}) == "lower"
    assert verdict({"mean": 0.03, "two_se": 0.03}) == "within the noise"  # touching is not clearing
    assert verdict({"mean": -0.01, "two_se": 0.05}) == "within the noise"


def test_the_head_minus_the_rule_adds_the_rules_own_error_to_the_seeds_spread():
    def run(seed, head, rule, se):
        return {"arm": "mlm+nsp", "seed": seed, "at": {"64": {"pair_accuracy": head}},
                "word_overlap_rule": {"64": {"accuracy": rule, "se": se}}}

    record = {"runs": [run(1, 0.80, 0.60, 0.01), run(0, 0.70, 0.60, 0.02), run(0, 0.5, 0.5, 0.0)
                       | {"arm": "mlm+sop"}]}
    gap = above_rule(record, "mlm+nsp", "64")
    assert gap["n"] == 2 and gap["differences"] == pytest.approx([0.10, 0.20])  # by seed
    # the seeds' spread (sample std 0.0707 over 2) and the larger of the rule's errors, added
    assert gap["mean"] == pytest.approx(0.15)
    assert gap["two_se"] == pytest.approx(2 * (0.005 / 2 + 0.02 ** 2) ** 0.5)
    assert verdict(gap) == "higher"
    assert mean_std([0.1, 0.2, 0.3]) == pytest.approx((0.2, 0.1))


def _outputs(notebook: Path) -> str:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return " ".join("".join(o.get("text", "")) for c in cells if c["cell_type"] == "code"
                    for o in c.get("outputs", []))


def test_the_nsp_verdict_is_one_sentence_from_the_twins_record_everywhere_it_is_given():
    from bertlab.course.twins import nsp_verdict

    sentence = " ".join(nsp_verdict(load_twins()).split())
    assert sentence.startswith("NSP is learned") and sentence.endswith(").")
    readme = " ".join(line.removeprefix("> ") for line in
                      (ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert sentence in " ".join(readme.split()), "README.md does not quote nsp_verdict as it is now"
    for number in ("05", "06", "07"):
        notebook = next((ROOT / "notebooks").glob(f"{number}_*.ipynb"))
        assert sentence in " ".join(_outputs(notebook).split()), (
            f"{notebook.name} does not print nsp_verdict(load_twins()) as it is now; re-run it")
