"""Write the reproduce trace of one cheap cell into each benchmark record that quotes models.

A record in benchmarks/results/ is made once, by hours of CPU. So that a change to the code that
moves its numbers shows in `make test`, as a moved training stream does for the shipped models
(tests/test_traces.py), each record below carries a trace: the benchmark script's own `--trace`
mode on one cheap cell, what it gave, the commit and the machine. Before writing, this tool sets
the trace beside the record's own numbers for the same cell and writes what it finds
(`agrees_with_record`: the fields that differ, none when it agrees), so a record that today's
code no longer rebuilds says so instead of being re-blessed.

- downstream.json: every method at 8 labels per class, seed 0 (scores, predictions, final loss);
  the record's rows of that cell must be the same numbers.
- ablations-course.json: the masking-procedure group's 80/10/10 cell, seed 0, its first 312 steps
  (the first point of its learning curve, on the whole run's schedule); the record's curve rows at
  steps 0 and 312 must be the same.
- time_to_quality.json: the course arm, seed 0, its clock-free start (a time budget's schedule
  depends on the clock, so only the warm-up's 20 steps on a step schedule and the evaluation of
  the initial weights replay); the record's curve starts with the same step-0 row.

Usage: python tools/record_traces.py [--only downstream ablations-course time_to_quality]
Run it after re-making a record (a benchmark writes its record afresh, without a trace).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from bertlab.atomic import atomic_write_json
from bertlab.course.traces import REPO, compare_values, make_script_trace

RESULTS = REPO / "benchmarks" / "results"
CURVE_KEYS = ("mask_accuracy", "mlm_accuracy", "nsp_accuracy")


def downstream_cell(record: dict) -> dict:
    rows = [r for r in record["results"] if r["k_per_class"] == 8 and r["seed"] == 0]
    return {r["method"]: {"accuracy": r["accuracy"], "macro_f1": r["macro_f1"],
                          "predictions": r["predictions"],
                          "final_train_loss": r["details"].get("final_train_loss")}
            for r in rows}


def ablation_cell(record: dict) -> dict:
    cell = next(r for r in record["records"] if r["cell"]["group"] == "masking-procedure"
                and r["cell"]["name"] == "80/10/10" and r["cell"]["seed"] == 0)
    return {"curve": [row for row in cell["metrics"]["curve"] if row["step"] <= 312]}


def time_to_quality_cell(record: dict) -> dict:
    run = next(r for r in record["runs"]["course"] if r["seed"] == 0)
    first = run["curve"][0]
    return {"curve": [{"step": first["step"], **{k: first.get(k) for k in CURVE_KEYS}}]}


# record name -> (the trace's command, what it runs, the record's own numbers of that cell)
TRACES: dict[str, tuple[list[str], str, Callable[[dict], dict]]] = {
    "downstream": (
        ["benchmarks/downstream.py", "--threads", "1", "--trace", "8", "0"],
        "every method at 8 labels per class, seed 0, fine-tuned from models/course-tiny",
        downstream_cell),
    "ablations-course": (
        ["benchmarks/ablations.py", "--budget", "course", "--threads", "1", "--trace",
         "masking-procedure", "80/10/10", "0", "312"],
        "the 80/10/10 cell, seed 0: its first 312 of 2,500 steps (the curve's first point)",
        ablation_cell),
    "time_to_quality": (
        ["benchmarks/time_to_quality.py", "--threads", "1", "--preset", "tiny",
         "--eval-batches", "20", "--trace", "course", "0"],
        "the course arm, seed 0: the clock-free start of its run (20 warm-up steps on a step "
        "schedule, the initial weights' evaluation)",
        time_to_quality_cell),
}


def agrees(record_cell: dict, gave: dict) -> list[str]:
    """Return the fields where the record's own numbers differ from the trace's (none: agree)."""
    if "curve" in record_cell:  # the record keeps only some rows, and only some fields
        kept = {r["step"]: r for r in gave["curve"]}
        gave = {"curve": [{k: kept.get(r["step"], {}).get(k) for k in r}
                          for r in record_cell["curve"]]}
    return compare_values(record_cell, gave)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", choices=list(TRACES), default=list(TRACES))
    args = parser.parse_args(argv)
    for name in args.only:
        command, what, cell = TRACES[name]
        path = RESULTS / f"{name}.json"
        record: dict[str, Any] = json.loads(path.read_text())
        trace = make_script_trace(command, what)
        trace["agrees_with_record"] = agrees(cell(record), trace["gave"])
        record["trace"] = trace
        atomic_write_json(path, record)
        found = trace["agrees_with_record"]
        print(f"{path.relative_to(REPO)}: trace written; "
              + ("the record's own numbers of the cell agree" if not found else
                 f"the record's own numbers differ in {len(found)} field(s): "
                 + "; ".join(found[:4])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
