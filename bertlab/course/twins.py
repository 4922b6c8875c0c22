"""The twins, read for the notebooks: one recipe trained three ways, the objective the only change.

`benchmarks/twins.py` trains the `nsp` recipe with masked LM + NSP, masked LM alone and masked LM +
SOP (the same steps, seeds, data order and schedule) and records what each run learned in
benchmarks/results/twins-cpu.json (a GPU session writes twins-gpu.json in the same format). The
notebooks read that record here: each measure per arm as the mean and sample standard deviation
over the seeds, and each arm minus the MLM-only twin paired by seed (mean and two standard
errors). They never train the twins.

Taught in notebooks/06_cls_and_downstream.ipynb
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from bertlab.course.traces import REPO  # the checkout this bertlab is imported from

CPU_RECORD = "twins-cpu.json"
ARM_NAMES = {"mlm+nsp": "MLM + NSP", "mlm": "MLM alone", "mlm+sop": "MLM + SOP"}


def load_twins(root: str | Path | None = None, name: str = CPU_RECORD) -> dict[str, Any]:
    """Return the twins' record under `root`/benchmarks/results (default: the repository bertlab
    is imported from, so a notebook copied elsewhere still finds it), refusing one that is
    missing or holds fewer than two seeds of an arm."""
    path = Path(REPO if root is None else root) / "benchmarks" / "results" / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: python benchmarks/twins.py train --jobs 2, "
                                f"then python benchmarks/twins.py score, write it")
    record = json.loads(path.read_text(encoding="utf-8"))
    seeds = {arm: [r["seed"] for r in record["runs"] if r["arm"] == arm] for arm in ARM_NAMES}
    thin = [arm for arm, found in seeds.items() if len(found) < 2]
    if thin:
        raise ValueError(f"{path} holds fewer than 2 seeds of {', '.join(thin)} ({seeds}): no "
                         f"spread can be told; run benchmarks/twins.py train and score again")
    return record


def spread(record: dict[str, Any], arm: str, measure: str) -> dict[str, float]:
    """Return one arm's measure over its seeds: mean, std (sample) and n, from the record's
    summary (a KeyError names the measures it has)."""
    per_arm = record["summary"]["per_arm"][arm]
    if measure not in per_arm:
        raise KeyError(f"no measure {measure!r} for {arm}; the record has {sorted(per_arm)}")
    return per_arm[measure]


def paired(record: dict[str, Any], arm: str, measure: str) -> dict[str, Any]:
    """Return `arm` minus the MLM-only twin on `measure`, paired by seed: mean, two_se, n and
    the per-seed differences."""
    return record["summary"]["paired_by_seed"][f"{arm} - mlm"][measure]


def runs_of(record: dict[str, Any], arm: str) -> list[dict[str, Any]]:
    """Return the arm's runs, by seed."""
    return sorted((r for r in record["runs"] if r["arm"] == arm), key=lambda r: r["seed"])


def mean_of(runs: list[dict[str, Any]], read) -> float:
    """Return the mean over `runs` of `read(run)`."""
    values = [read(r) for r in runs]
    return sum(values) / len(values)


def mean_std(values: list[float]) -> tuple[float, float]:
    """Return the mean and the sample standard deviation of `values` (two or more)."""
    return statistics.mean(values), statistics.stdev(values)


def above_rule(record: dict[str, Any], arm: str, length: str) -> dict[str, Any]:
    """Return the arm's pair head minus notebook 03's word-overlap rule refitted on the same
    `length`-token validation pairs, paired by seed: mean, two_se, n and the per-seed
    differences, as `paired` gives them (so `verdict` reads it). The two standard errors add the
    rule's own sampling error on those pairs to the seeds' spread."""
    runs = runs_of(record, arm)
    diffs = [r["at"][length]["pair_accuracy"] - r["word_overlap_rule"][length]["accuracy"]
             for r in runs]
    mean, std = mean_std(diffs)
    rule_se = max(r["word_overlap_rule"][length]["se"] for r in runs)
    return {"mean": mean, "two_se": 2 * math.sqrt(std ** 2 / len(diffs) + rule_se ** 2),
            "n": len(diffs), "differences": diffs}


def arms_table(record: dict[str, Any], measures: dict[str, str], arms=tuple(ARM_NAMES)) -> str:
    """Return a table: one row per arm, one column per measure (label -> name in the record's
    summary), each cell the mean +- sample std over the seeds, or "not trained"."""
    width = max(len(label) for label in measures) + 2
    lines = [f"{'arm':<11}" + "".join(f"{label:>{max(width, 16)}}" for label in measures)]
    for arm in arms:
        cells = []
        for name in measures.values():
            per_arm = record["summary"]["per_arm"][arm]
            if name not in per_arm:
                cells.append("not trained")
                continue
            s = per_arm[name]
            cells.append(f"{s['mean']:.3f}" + ("" if s["std"] is None else f" ± {s['std']:.3f}"))
        lines.append(f"{arm:<11}" + "".join(f"{c:>{max(width, 16)}}" for c in cells))
    return "\n".join(lines)


def verdict(difference: dict[str, Any]) -> str:
    """Return "higher", "lower" or "within the noise": where a difference (its mean and two
    standard errors, as `paired` gives it) lies against zero. The notebooks' prose says one of
    the three, and an assert beside it checks it with this function."""
    if difference["mean"] - difference["two_se"] > 0:
        return "higher"
    if difference["mean"] + difference["two_se"] < 0:
        return "lower"
    return "within the noise"


# The goal the course set its NSP twins: pair accuracy on the 64-token validation pairs.
NSP_GOAL = 0.85


def _pm(difference: dict[str, Any]) -> str:
    return f"{difference['mean']:+.3f} ± {difference['two_se']:.3f}"


def nsp_verdict(record: dict[str, Any]) -> str:
    """Return the course's one-sentence verdict on NSP, built from the twins' record: what the
    NSP head reached against its goal and the word-overlap rule, what it leans on, and what it
    changed beside its MLM-only twin, each difference with its verdict. Notebooks 05, 06 and 07
    print it and the README quotes it, so the words cannot drift from the numbers."""
    nsp = spread(record, "mlm+nsp", "pair_accuracy_64")
    rule = above_rule(record, "mlm+nsp", "64")
    runs = runs_of(record, "mlm+nsp")
    same_topic = mean_std([r["pair_limits"]["by_partner_bert_masked"]["not_next_same_topic"]
                           ["accuracy"] for r in runs])
    probe = paired(record, "mlm+nsp", "cls_probe_pooled")
    few = paired(record, "mlm+nsp", "fine-tuned @ 8")
    mask = paired(record, "mlm+nsp", "mask_accuracy_64")
    goal = "met" if nsp["mean"] >= NSP_GOAL else "missed"
    return (f"NSP is learned but mostly as topic matching: the MLM + NSP twins reach "
            f"{nsp['mean']:.3f} ± {nsp['std']:.3f} on 64-token held-out pairs (the goal of "
            f"{NSP_GOAL} {goal}), {_pm(rule)} above the word-overlap rule ({verdict(rule)}), and at {runs[0]['pair_limits']['length']} "
            f"tokens get only {same_topic[0]:.3f} of the NotNext pairs right whose B is another "
            f"story of A's topic; beside MLM "
            f"alone, their pooled [CLS] probe is {verdict(probe)} ({_pm(probe)}), fine-tuning with "
            f"8 labels per topic {verdict(few)} ({_pm(few)}) and [MASK] accuracy {verdict(mask)} "
            f"({_pm(mask)}).")
