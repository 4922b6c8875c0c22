"""Tests for bertlab.course.grid and bertlab.course.ablations: the config grid, the result schema, caching by
config hash, one runner in one process or many."""

from __future__ import annotations

import json
import math

import pytest

from bertlab.course import ablations, grid
from bertlab.course.ablations import (
    BudgetData,
    compare_to_baseline,
    format_summary,
    load_results,
    run_cell,
    run_grid,
    summarize_records,
    unigram_reference,
)
from bertlab.course.grid import (
    BUDGETS,
    GROUPS,
    PAPER_MASKING,
    PRETRAIN_DEFAULTS,
    Budget,
    Cell,
    ablation_grid,
    cell_config,
    cell_key,
    config_key,
    group_baseline,
    procedure_overrides,
    recipe_budget,
)
from bertlab.recipes import recipe

# A toy budget: 60 BBC documents, a 1-layer 32-wide model, 3 steps, small evaluations.
TOY = Budget(name="toy", max_docs=60, vocab_size=400, max_seq_len=32, batch_size=8, max_steps=3,
             eval_batches=2, device="cpu", precision="fp32",
             model_overrides={"hidden_size": 32, "num_layers": 1, "num_heads": 2,
                              "intermediate_size": 64, "max_position_embeddings": 64})
METRIC_KEYS = {"mask_accuracy", "mask_loss", "mask_unigram_accuracy", "mlm_accuracy", "mlm_loss", "mlm_accuracy_kept", "mlm_loss_kept",
               "mlm_accuracy_random", "mlm_loss_random", "mlm_accuracy_no_mask", "nsp_accuracy",
               "probe_accuracy", "probe_accuracy_cls", "finetune_accuracy", "final_train_loss",
               "steps", "epochs_seen", "train_examples", "train_seconds", "curve"}


@pytest.fixture(scope="module")
def data():
    return BudgetData(TOY)


# ---------------------------------------------------------------------------------------------
# The grid and its keys


def test_grid_has_every_variant_and_seed():
    cells = ablation_grid(["masking-procedure", "nsp"], seeds=(0, 1), budget=TOY)
    assert len(cells) == (len(PAPER_MASKING) + 2) * 2
    assert [c.name for c in cells if c.seed == 0][:6] == list(PAPER_MASKING)
    by_name = {(c.name, c.seed): c for c in cells}
    assert by_name[("0/0/100", 0)].settings()["mask_replace_prob"] == 0.0
    assert by_name[("0/0/100", 0)].settings()["random_replace_prob"] == 1.0
    assert by_name[("80/20/0", 1)].settings()["random_replace_prob"] == 0.0
    assert by_name[("MLM only", 0)].settings()["nsp"] is False
    # BERT's recipe is the baseline of both groups: one config, one key; all others differ.
    assert cell_key(by_name[("80/10/10", 0)]) == cell_key(by_name[("MLM + NSP", 0)])
    assert len({cell_key(c) for c in cells}) == 7 * 2
    for group in GROUPS:
        baseline = Cell("b", dict(GROUPS[group])[group_baseline(group, TOY)], 0, TOY)
        assert baseline.settings() == PRETRAIN_DEFAULTS  # the baseline is BERT's recipe


def test_the_course_budget_is_the_course_recipe_and_its_baselines_follow():
    course, r = BUDGETS["course"], recipe("course")
    assert (course.optimizer, course.lr, course.muon_lr) == (r.optimizer, r.lr, r.muon_lr)
    assert (course.batch_size, course.max_seq_len) == (r.batch_size, r.max_seq_len)
    assert course.model_overrides == {"hidden_dropout": r.dropout, "attention_dropout": r.dropout}
    reference = {**PRETRAIN_DEFAULTS, "mlm_probability": r.mlm_probability, "nsp": "nsp" in r.objectives}
    assert {g: group_baseline(g, course) for g in GROUPS} == {
        "masking-procedure": "80/10/10", "nsp": "MLM only", "masking-rate": "40%",
        "static-vs-dynamic": "dynamic"}
    for group in GROUPS:  # each group's baseline is the recipe itself; every other cell is not
        for name, overrides in GROUPS[group]:
            is_reference = Cell(name, overrides, 0, course).settings() == reference
            assert is_reference == (name == group_baseline(group, course))
    cells = ablation_grid(None, (0, 1, 2), course)
    assert len({cell_key(c) for c in cells}) == 10 * 3  # the reference runs once per seed
    assert recipe_budget("course", "x", max_steps=7).max_steps == 7  # fields win over the recipe
    with pytest.raises(ValueError, match="no variant of group 'masking-rate'"):
        group_baseline("masking-rate", Budget(name="odd", settings={"mlm_probability": 0.2}))


def test_procedure_overrides_reads_mask_same_random():
    assert procedure_overrides("80/10/10") == {"mask_replace_prob": 0.8, "random_replace_prob": 0.1}
    assert procedure_overrides("0/20/80") == {"mask_replace_prob": 0.0, "random_replace_prob": 0.8}
    with pytest.raises(ValueError, match="summing to 100"):
        procedure_overrides("80/10/20")
    with pytest.raises(ValueError, match="MASK/SAME/RND"):
        procedure_overrides("80-10-10")


def test_key_follows_every_setting_but_not_the_label(monkeypatch):
    cell = Cell("a", {}, 0, TOY, group="g")
    key = cell_key(cell)
    assert len(key) == 16 and int(key, 16) >= 0
    assert cell_key(Cell("another name", {}, 0, TOY, group="other")) == key
    assert cell_key(Cell("a", {}, 1, TOY)) != key
    assert cell_key(Cell("a", {"mlm_probability": 0.3}, 0, TOY)) != key
    assert cell_key(Cell("a", {}, 0, Budget(**{**TOY.to_dict(), "max_steps": 4}))) != key
    # The budget's own name is a label too.
    assert cell_key(Cell("a", {}, 0, Budget(**{**TOY.to_dict(), "name": "renamed"}))) == key
    config = cell_config(cell)
    assert config["settings"] == {**PRETRAIN_DEFAULTS}
    assert config["device"] == "cpu/fp32"
    assert config_key(json.loads(json.dumps(config))) == key  # survives a JSON round trip
    # An edit to the source keeps the key: the records in the repository stay valid, and each
    # names the source that produced it. A change that moves numbers bumps EXPERIMENT_VERSION.
    monkeypatch.setattr(grid, "code_digest", lambda: "edited-source")
    assert cell_key(cell) == key
    monkeypatch.setattr(grid, "EXPERIMENT_VERSION", grid.EXPERIMENT_VERSION + 1)
    assert cell_key(cell) != key


def test_a_budget_can_change_the_reference_recipe():
    # MLM-only as the budget's recipe: "MLM only" is now the reference run every group shares,
    # and "MLM + NSP" is the variant; the merged settings, not their origin, decide the key.
    mlm_only = Budget(**{**TOY.to_dict(), "name": "toy-mlm", "settings": {"nsp": False}})
    cells = {c.name: c for c in ablation_grid(["masking-procedure", "nsp"], (0,), mlm_only)}
    assert cells["80/10/10"].settings()["nsp"] is False
    assert cells["MLM + NSP"].settings()["nsp"] is True
    assert cell_key(cells["80/10/10"]) == cell_key(cells["MLM only"])
    assert cell_key(cells["80/10/10"]) != cell_key(cells["MLM + NSP"])
    assert cell_key(cells["MLM + NSP"]) == cell_key(Cell("x", {}, 0, TOY))
    assert cell_key(cells["MLM only"]) == cell_key(Cell("x", {"nsp": False}, 0, TOY))
    with pytest.raises(ValueError, match="unknown setting"):
        Budget(settings={"masking_rate": 0.4})


def test_bad_settings_are_clear_errors():
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['mask_prob'\]"):
        Cell("x", {"mask_prob": 0.5}, 0, TOY)
    with pytest.raises(ValueError, match="seed=-1"):
        Cell("x", {}, -1, TOY)
    with pytest.raises(ValueError, match="unknown group"):
        ablation_grid(["masking"], budget=TOY)
    with pytest.raises(ValueError, match="unknown budget 'huge'"):
        ablation_grid(["nsp"], budget="huge")
    with pytest.raises(ValueError, match="seeds is empty"):
        ablation_grid(["nsp"], seeds=(), budget=TOY)
    with pytest.raises(ValueError, match="max_docs=3"):
        Budget(max_docs=3)
    with pytest.raises(ValueError, match="max_steps=0"):
        Budget(max_steps=0)
    with pytest.raises(ValueError, match="finetune_epochs"):
        Budget(finetune_epochs=-1)


# ---------------------------------------------------------------------------------------------
# Running, the record schema and the cache


@pytest.mark.slow
def test_run_cell_writes_a_record_and_reuses_it(tmp_path, data, monkeypatch):
    cell = Cell("80/10/10", {}, 0, TOY, group="masking-procedure")
    record = run_cell(cell, tmp_path, data=data)
    assert record["cached"] is False
    assert record["key"] == cell_key(cell)
    assert record["config"] == cell_config(cell)
    assert record["code"] == grid.code_digest()  # which source produced it
    assert record["cell"] == {"name": "80/10/10", "group": "masking-procedure", "overrides": {},
                              "seed": 0, "budget": "toy"}
    metrics = record["metrics"]
    assert set(metrics) == METRIC_KEYS
    for name in ("mask_accuracy", "mask_unigram_accuracy", "mlm_accuracy", "mlm_accuracy_kept",
                 "mlm_accuracy_random", "nsp_accuracy", "probe_accuracy", "probe_accuracy_cls"):
        assert 0.0 <= metrics[name] <= 1.0, name
    assert metrics["mlm_accuracy_no_mask"] == pytest.approx(
        (metrics["mlm_accuracy_kept"] + metrics["mlm_accuracy_random"]) / 2)
    assert metrics["finetune_accuracy"] is None  # the toy budget does not fine-tune
    assert metrics["steps"] == TOY.max_steps and math.isfinite(metrics["final_train_loss"])
    # The learning curve: step 0, every max_steps // 8 steps (1 here), and the end.
    assert [p["step"] for p in metrics["curve"]] == list(range(TOY.max_steps + 1))
    assert all(0.0 <= p[k] <= 1.0 for p in metrics["curve"]
               for k in ("mask_accuracy", "mlm_accuracy", "nsp_accuracy"))
    saved = json.loads((tmp_path / f"{record['key']}.json").read_text())
    assert saved["metrics"] == metrics and "cached" not in saved

    # Finished: the same config is read back, never re-run (even under another name).
    def must_not_run(*args, **kwargs):
        raise AssertionError("a cached cell was run again")

    with monkeypatch.context() as m:
        m.setattr(ablations, "_train_and_measure", must_not_run)
        again = run_cell(Cell("MLM + NSP", {}, 0, TOY, group="nsp"), tmp_path, data=data)
    assert again["cached"] is True and again["metrics"] == metrics
    assert again["cell"]["name"] == "MLM + NSP"

    # A changed config runs: a new key, a second file; the first record is left alone.
    changed = run_cell(Cell("0/0/100", procedure_overrides("0/0/100"), 0, TOY), tmp_path, data=data)
    assert changed["cached"] is False and changed["key"] != record["key"]
    assert sorted(p.name for p in tmp_path.glob("*.json")) == sorted(
        [f"{record['key']}.json", f"{changed['key']}.json"])
    assert json.loads((tmp_path / f"{record['key']}.json").read_text())["metrics"] == metrics


def test_stale_or_forced_records_run_again(tmp_path, monkeypatch):
    calls = []

    def fake_measure(cell, data):
        calls.append(cell.seed)
        return {"mlm_accuracy": 0.5}

    monkeypatch.setattr(ablations, "_train_and_measure", fake_measure)
    monkeypatch.setattr(ablations, "BudgetData", lambda budget: None)
    cell = Cell("x", {}, 3, TOY)
    run_cell(cell, tmp_path)
    run_cell(cell, tmp_path)
    assert calls == [3]
    run_cell(cell, tmp_path, force=True)
    assert calls == [3, 3]
    path = tmp_path / f"{cell_key(cell)}.json"
    record = json.loads(path.read_text())
    record["config"]["seed"] = 99  # a file whose config does not match its key is not trusted
    path.write_text(json.dumps(record))
    assert run_cell(cell, tmp_path)["cached"] is False
    assert calls == [3, 3, 3]


def test_run_grid_runs_a_shared_config_once(tmp_path, monkeypatch):
    runs = []

    def fake_measure(cell, data):
        runs.append((cell.name, cell.seed))
        return {"mlm_accuracy": 0.1 * len(runs)}

    monkeypatch.setattr(ablations, "_train_and_measure", fake_measure)
    monkeypatch.setattr(ablations, "BudgetData", lambda budget: None)
    cells = ablation_grid(["nsp", "masking-rate"], seeds=(0, 1), budget=TOY)
    seen = []
    records = run_grid(cells, tmp_path, on_record=seen.append)
    assert len(records) == len(cells) == 10
    assert len(runs) == len(seen) == 4 * 2  # "MLM + NSP" and "15%" are one config
    assert [r["cell"]["name"] for r in records] == [c.name for c in cells]
    shared = [r for r in records if r["cell"]["name"] in ("MLM + NSP", "15%") and
              r["cell"]["seed"] == 0]
    assert shared[0]["key"] == shared[1]["key"] and shared[1]["cached"] is True
    run_grid(cells, tmp_path)
    assert len(runs) == 8  # everything finished: nothing runs again


@pytest.mark.slow
def test_parallel_grid_matches_the_serial_one(tmp_path, data):
    # Two worker processes: the same records, in cell order, as one process running them in turn;
    # the shared baseline still runs once, and a second call reads everything back.
    cells = ablation_grid(["nsp"], seeds=(0,), budget=TOY) + [
        Cell("MLM + NSP", {}, 0, TOY, group="again")]
    serial = run_grid(cells, tmp_path / "serial")
    seen = []
    parallel = run_grid(cells, tmp_path / "parallel", jobs=2, on_record=seen.append)
    assert len(seen) == 2 and not any(r["cached"] for r in seen)
    assert [r["cell"] for r in parallel] == [r["cell"] for r in serial]
    assert [r["cached"] for r in parallel] == [False, False, True]
    for a, b in zip(serial, parallel, strict=True):
        assert a["key"] == b["key"]
        assert a["metrics"]["mlm_accuracy"] == pytest.approx(b["metrics"]["mlm_accuracy"], abs=1e-6)
        assert a["metrics"]["final_train_loss"] == pytest.approx(b["metrics"]["final_train_loss"],
                                                                 rel=1e-5)
    assert len(list((tmp_path / "parallel").glob("*.json"))) == 2
    again = run_grid(cells, tmp_path / "parallel", jobs=2)
    assert all(r["cached"] for r in again)
    with pytest.raises(ValueError, match="jobs"):
        run_grid(cells, tmp_path, jobs=0)


# ---------------------------------------------------------------------------------------------
# Reading results


def _record(group: str, name: str, seed: int, acc: float) -> dict:
    return {"cell": {"group": group, "name": name, "seed": seed},
            "metrics": {"mlm_accuracy": acc, "probe_accuracy": None}}


def test_summary_and_noise_verdicts():
    records = [_record("nsp", "MLM + NSP", 0, 0.50), _record("nsp", "MLM + NSP", 1, 0.52),
               _record("nsp", "MLM only", 0, 0.51), _record("nsp", "MLM only", 1, 0.49),
               _record("masking-rate", "15%", 0, 0.30), _record("masking-rate", "15%", 1, 0.31),
               _record("masking-rate", "40%", 0, 0.40), _record("masking-rate", "40%", 1, 0.41),
               _record("masking-rate", "30%", 0, 0.20)]
    rows = summarize_records(records)
    base = next(r for r in rows if r["name"] == "MLM + NSP")
    assert base["seeds"] == [0, 1]
    assert base["mlm_accuracy_mean"] == pytest.approx(0.51)
    assert base["mlm_accuracy_std"] == pytest.approx(math.sqrt(2) * 0.01)
    assert "probe_accuracy_mean" not in base  # not measured
    (nsp,) = compare_to_baseline(rows, "nsp", "mlm_accuracy", "MLM + NSP")
    assert nsp["diff"] == pytest.approx(-0.01) and nsp["verdict"] == "within the noise"
    verdicts = {v["name"]: v
                for v in compare_to_baseline(rows, "masking-rate", "mlm_accuracy", "15%")}
    assert verdicts["40%"]["verdict"] == "higher"  # the words of bertlab.course.twins.verdict
    assert verdicts["40%"]["se"] == pytest.approx(math.sqrt(0.00005 / 2 + 0.00005 / 2))
    assert verdicts["30%"]["verdict"] == "too few seeds"
    (lower,) = compare_to_baseline(rows, "masking-rate", "mlm_accuracy", "40%")[:1]
    assert lower["name"] == "15%" and lower["verdict"] == "lower"
    with pytest.raises(ValueError, match="no baseline row"):
        compare_to_baseline(rows, "nsp", "probe_accuracy", "MLM + NSP")
    table = format_summary(rows, metrics=("mlm_accuracy", "probe_accuracy"))
    assert "51.0 ± 1.4" in table and "probe_accuracy" not in table


def test_load_results_checks_the_file(tmp_path):
    with pytest.raises(ValueError, match="run `python benchmarks/ablations.py`"):
        load_results(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"records": []}))
    with pytest.raises(ValueError, match=r"missing \['command', 'budget'\]"):
        load_results(bad)
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"command": "python x", "budget": {}, "records": []}))
    assert load_results(good)["command"] == "python x"


def test_curve_plot_draws_one_line_per_variant_and_rejects_records_without_curves():
    import matplotlib

    matplotlib.use("Agg")
    from bertlab.course.viz import plot_ablation_curves

    def rec(name, seed, accs):
        return {"cell": {"group": "nsp", "name": name, "seed": seed},
                "metrics": {"curve": [{"step": 10 * i, "mask_accuracy": a, "mlm_accuracy": 2 * a,
                                       "nsp_accuracy": 0.5} for i, a in enumerate(accs)]}}

    records = [rec("MLM + NSP", 0, [0.0, 0.1, 0.2]), rec("MLM + NSP", 1, [0.0, 0.1, 0.3]),
               rec("MLM only", 0, [0.0, 0.2, 0.4])]
    fig = plot_ablation_curves(records, ["nsp"], baseline=0.05)
    lines = fig.axes[0].get_lines()
    assert len(lines) == 3  # two variants and the baseline
    assert list(lines[0].get_ydata()) == pytest.approx([0.0, 10.0, 25.0])  # mean of the seeds
    assert fig.axes[0].get_ylabel() == "held-out mask_accuracy (%)"
    fig = plot_ablation_curves(records, ["nsp"], metric="mlm_accuracy")
    assert list(fig.axes[0].get_lines()[0].get_ydata()) == pytest.approx([0.0, 20.0, 50.0])
    with pytest.raises(ValueError, match="no record of group 'masking-rate'"):
        plot_ablation_curves(records, ["masking-rate"])


@pytest.mark.slow
def test_ablations_script_writes_the_results_file_and_resumes_from_the_cache(
        tmp_path, monkeypatch, capsys, load_benchmark):
    from dataclasses import replace

    script = load_benchmark("ablations")
    toy = replace(TOY, name="quick", finetune_epochs=1.0)
    monkeypatch.setitem(BUDGETS, "quick", toy)
    out = tmp_path / "results.json"
    argv = ["--budget", "quick", "--groups", "nsp", "--seeds", "0", "--cache-dir",
            str(tmp_path / "cache"), "--out", str(out)]
    assert script.main(argv) == 0
    saved = load_results(out)
    assert saved["complete"] is True and saved["command"].endswith(" ".join(argv))
    assert saved["budget"] == toy.to_dict() and saved["seeds"] == [0]
    assert [r["cell"]["name"] for r in saved["records"]] == ["MLM + NSP", "MLM only"]
    assert not any(r["cached"] for r in saved["records"])
    # The untrained starting point of every cell, measured the same way.
    assert saved["random_init"]["seeds"] == [0]
    for name in ("probe_accuracy", "probe_accuracy_cls", "finetune_accuracy"):
        assert len(saved["random_init"][name]) == 1 and 0 <= saved["random_init"][name][0] <= 1
    assert {r["name"] for r in saved["summary"]} == {"MLM + NSP", "MLM only"}
    # The frequency guess on the sweep's own vocabulary and held-out targets.
    assert saved["unigram"] == unigram_reference(toy)
    assert 0 < saved["unigram"]["mlm_accuracy"] < 0.5 and saved["unigram"]["token"] in {
        "the", ",", ".", "to", "of"}
    capsys.readouterr()
    assert script.main(argv) == 0  # everything finished: read back from the cache
    assert "cached" in capsys.readouterr().out
    assert all(r["cached"] for r in load_results(out)["records"])
    assert saved["code"] == [grid.code_digest()]
    # A fresh clone has the results file but an empty cache: its records seed the cache, and
    # nothing runs again.
    monkeypatch.setattr(script, "run_grid", _no_run_grid(script.run_grid))
    fresh = ["--cache-dir", str(tmp_path / "fresh-cache")]
    assert script.main([*argv[:-4], *fresh, "--out", str(out)]) == 0
    assert "2 finished record(s)" in capsys.readouterr().out
    assert all(r["cached"] for r in load_results(out)["records"])


def _no_run_grid(run_grid):
    """Wrap run_grid so that a cell that would run (not read from the cache) fails the test."""
    def wrapped(cells, cache_dir, **kwargs):
        def must_not_run(*args, **kw):
            raise AssertionError("a cell in the seeded cache was run again")
        original, ablations._train_and_measure = ablations._train_and_measure, must_not_run
        try:
            return run_grid(cells, cache_dir, **kwargs)
        finally:
            ablations._train_and_measure = original
    return wrapped
