"""The ablation grid as data: the pretraining settings a cell may change, the paper tables the
results are read against, the groups of variants, the budgets, the cells and their cache keys.

A *cell* is one pretraining run: a name, the settings it changes (`overrides` of
`PRETRAIN_DEFAULTS`), a seed and a `Budget` (model size, recipe, steps, data, which downstream
measurements to take). Its key, `cell_key`, is a hash of every setting that can change its
numbers (settings, seed, budget, device kind, the experiment version and the torch version), so
a finished cell is never run twice and a changed setting runs again. The key leaves the source
code out on purpose: finished records are kept in the repository, and an edit elsewhere in the
package must not throw hours of runs away. Each record names the source digest that produced it
(`code_digest`); a change that can move a cell's numbers bumps `EXPERIMENT_VERSION`. Running
cells and reading their records is `bertlab.course.ablations`.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch

from bertlab.engine.device import resolve_device, resolve_precision
from bertlab.masking import BERT_MASKING
from bertlab.recipes import recipe

# Bump when a change can move a cell's numbers (a new measurement, a fix in training or masking):
# every key changes, and every cell runs again. 2: the [MASK]-position metrics; optimizer in budgets.
EXPERIMENT_VERSION = 2
# Every pretraining setting a cell may change, with BERT's values.
PRETRAIN_DEFAULTS: dict[str, Any] = {
    "mlm_probability": BERT_MASKING.mlm_probability,  # share of tokens selected as targets
    "mask_replace_prob": BERT_MASKING.mask_replace_prob,  # of the targets: -> [MASK]
    # of the targets: -> a random token (the rest stay unchanged)
    "random_replace_prob": BERT_MASKING.random_replace_prob,
    "nsp": True,  # train the next-sentence head too (False: MLM loss only)
    "masking": "dynamic",  # "dynamic" (new mask every epoch) or "static" (dupe_factor copies)
    "dupe_factor": 1,  # static masking: number of fixed masks cycled over epochs
}

# ---------------------------------------------------------------------------------------------
# The numbers the papers report (dev sets), to put beside ours


# BERT (Devlin et al. 2019), Appendix C.2, Table 8: MASK/SAME/RND -> MNLI-m accuracy (fine-tune),
# CoNLL NER F1 (fine-tune), CoNLL NER F1 (feature-based: frozen BERT, last 4 layers).
PAPER_MASKING: dict[str, dict[str, float]] = {
    "80/10/10": {"mnli": 84.2, "ner_finetune": 95.4, "ner_feature": 94.9},
    "100/0/0": {"mnli": 84.3, "ner_finetune": 94.9, "ner_feature": 94.0},
    "80/0/20": {"mnli": 84.1, "ner_finetune": 95.2, "ner_feature": 94.6},
    "80/20/0": {"mnli": 84.4, "ner_finetune": 95.2, "ner_feature": 94.7},
    "0/20/80": {"mnli": 83.7, "ner_finetune": 94.8, "ner_feature": 94.6},
    "0/0/100": {"mnli": 83.6, "ner_finetune": 94.9, "ner_feature": 94.6},
}

# BERT Table 5 (BERT-base, dev): with and without next-sentence prediction.
PAPER_NSP: dict[str, dict[str, float]] = {
    "MLM + NSP": {"mnli": 84.4, "qnli": 88.4, "mrpc": 86.7, "sst2": 92.7, "squad_f1": 88.5},
    "MLM only": {"mnli": 83.9, "qnli": 84.9, "mrpc": 86.5, "sst2": 92.6, "squad_f1": 87.9},
}

# Claims without a table we reproduce here (qualitative), written into the results file.
PAPER_CLAIMS: dict[str, str] = {
    "nsp": "BERT Table 5: removing NSP hurts QNLI (-3.5), MNLI (-0.5); RoBERTa: with full-"
           "sentence inputs, dropping NSP matches or beats it",
    "masking-rate": "Wettig et al. 2022: 40% masking beats 15% for large models",
    "static-vs-dynamic": "RoBERTa Table 1: dynamic masking is comparable or slightly better "
                         "than static (dupe factor 10)",
}


def procedure_overrides(name: str) -> dict[str, float]:
    """Return the mask/random probabilities of a MASK/SAME/RND name such as "80/10/10".

    Taught in notebooks/07_ablations_and_insights.ipynb
    """
    parts = name.split("/")
    if len(parts) != 3 or not all(p.isdigit() for p in parts) or sum(map(int, parts)) != 100:
        raise ValueError(f"masking procedure {name!r} is not MASK/SAME/RND percentages summing to "
                         f"100, e.g. '80/10/10'")
    mask, _same, rnd = (int(p) / 100 for p in parts)
    return {"mask_replace_prob": mask, "random_replace_prob": rnd}


# The groups of the study: group name -> [(cell name, overrides)]. The reference run (the
# budget's recipe, no overrides) appears in every group; it has one key, so it runs once. The NSP
# group names both settings, so one of its cells is the reference whichever the budget uses.
GROUPS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "masking-procedure": [(name, procedure_overrides(name)) for name in PAPER_MASKING],
    "nsp": [("MLM + NSP", {"nsp": True}), ("MLM only", {"nsp": False})],
    "masking-rate": [("15%", {"mlm_probability": 0.15}), ("30%", {"mlm_probability": 0.30}),
                     ("40%", {"mlm_probability": 0.40})],
    # static x1: one mask per example for the whole run, the real contrast with dynamic masking.
    # (Static with k copies cycles k fixed masks, one per epoch, each drawn from (seed, epoch) as
    # the dynamic mask of that epoch is: a run of k epochs or fewer is the dynamic run, number for
    # number, so it compares nothing. The saved cpu-long sweep, 8 epochs, kept its "static x5".)
    "static-vs-dynamic": [("dynamic", {"masking": "dynamic", "dupe_factor": 1}),
                          ("static x1", {"masking": "static", "dupe_factor": 1})],
}


def group_baseline(group: str, budget: Budget) -> str:
    """Return the name of the variant of `group` that is the budget's own recipe (its reference
    run, the one every other variant of the group is compared with).

    Under the course budget (MLM only, 40% masking) that is "MLM only" and "40%"; under BERT's
    settings, "MLM + NSP" and "15%".

    Taught in notebooks/07_ablations_and_insights.ipynb
    """
    if group not in GROUPS:
        raise ValueError(f"unknown group {group!r}; known groups: {list(GROUPS)}")
    reference = {**PRETRAIN_DEFAULTS, **budget.settings}
    for name, overrides in GROUPS[group]:
        if {**reference, **overrides} == reference:
            return name
    raise ValueError(f"no variant of group {group!r} is budget {budget.name!r}'s own recipe "
                     f"{reference}; add one to GROUPS[{group!r}]")


# ---------------------------------------------------------------------------------------------
# Budgets and cells


@dataclass
class Budget:
    """How big and how long each run is, and what is measured after it. Every field is hashed.

    `settings` are the pretraining settings every cell of the budget starts from, on top of
    `PRETRAIN_DEFAULTS` (a cell's overrides win); e.g. {"nsp": False} makes MLM-only the
    reference recipe. `optimizer`, `lr` and `muon_lr` are `TrainConfig`'s (see `recipe_budget`
    for a budget that takes them, with the batch, length and dropout, from a named recipe). `max_docs` keeps a fixed pseudo-random subset of the corpus (None: all of
    it; the train / validation / test split of each document is unchanged). `finetune_epochs=0`
    skips fine-tuning (the probes still run); `probe=False` skips both downstream measurements.
    """

    name: str = "cpu"
    corpus: str = "bbc"
    preset: str = "tiny"
    model_overrides: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    vocab_size: int = 8192
    max_seq_len: int = 128
    batch_size: int = 32
    max_steps: int = 300
    lr: float = 1e-3
    optimizer: str = "adamw"
    muon_lr: float = 0.02
    max_docs: int | None = None
    eval_batches: int = 8
    probe: bool = True
    finetune_epochs: float = 0.0
    device: str = "auto"
    precision: str = "auto"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_seq_len", "batch_size", "max_steps", "eval_batches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Budget.{name}={value!r}; pass a positive integer")
        if self.max_docs is not None and (not isinstance(self.max_docs, int) or self.max_docs < 10):
            raise ValueError(f"Budget.max_docs={self.max_docs!r}; pass None (all documents) or "
                             f"an integer >= 10 (every split needs documents)")
        if not self.finetune_epochs >= 0:
            raise ValueError(f"Budget.finetune_epochs={self.finetune_epochs!r}; pass a number "
                             f">= 0 (0 skips fine-tuning)")
        unknown = sorted(set(self.settings) - set(PRETRAIN_DEFAULTS))
        if unknown:
            raise ValueError(f"Budget.settings has unknown setting(s) {unknown}; a budget may set "
                             f"{sorted(PRETRAIN_DEFAULTS)}")
        if not isinstance(self.model_overrides, dict):
            raise ValueError("Budget.model_overrides must be a dict of BertConfig settings, "
                             "e.g. {'hidden_size': 64}")

    def to_dict(self) -> dict[str, Any]:
        """Return the budget as a JSON-ready dict; `Budget(**d)` reverses it."""
        return asdict(self)


def recipe_budget(recipe_name: str, name: str, **fields: Any) -> Budget:
    """Return a budget that trains with a named recipe of `bertlab.recipes` (masking rate, NSP,
    dropout, batch, pair length, optimizer and learning rates); `fields` set the rest (steps,
    what to measure) and win over the recipe.
    """
    r = recipe(recipe_name)
    taken = {"max_seq_len": r.max_seq_len, "batch_size": r.batch_size, "lr": r.lr,
             "optimizer": r.optimizer, "muon_lr": r.muon_lr,
             "settings": {"mlm_probability": r.mlm_probability, "nsp": "nsp" in r.objectives},
             "model_overrides": {"hidden_dropout": r.dropout, "attention_dropout": r.dropout}}
    return Budget(name=name, **{**taken, **fields})


# Named budgets. "quick" (64-token pairs) and "cpu" (128-token pairs) end while a tiny model
# still predicts frequent words (held-out accuracy near the unigram guess): they show the
# machinery, not the effects. "cpu-long" (64-token pairs, 4,000 steps of AdamW at lr 2e-3 without
# dropout, 15% masking, MLM only) was the first attempt to get past that; at 15% it does not.
# "course" is the course recipe (`recipe("course")`: 40% masking, MLM only, Muon), 2,500 steps,
# the run of notebook 05: its reference cell leaves the plateau, so its variants can differ for a
# reason other than noise. "gpu": a mini model with fine-tuning.
BUDGETS: dict[str, Budget] = {
    "quick": Budget(name="quick", max_seq_len=64, max_steps=250, eval_batches=10),
    "cpu": Budget(name="cpu", max_steps=300, eval_batches=12),
    "cpu-long": Budget(name="cpu-long", max_seq_len=64, max_steps=4000, lr=2e-3,
                       model_overrides={"hidden_dropout": 0.0, "attention_dropout": 0.0},
                       settings={"nsp": False}, eval_batches=20, finetune_epochs=4.0),
    "course": recipe_budget("course", "course", max_steps=2500, eval_batches=20,
                            finetune_epochs=4.0),
    "gpu": Budget(name="gpu", preset="mini", max_steps=3000, batch_size=128, lr=5e-4,
                  eval_batches=20, finetune_epochs=3.0),
}


@dataclass
class Cell:
    """One run of the grid: a readable name, the settings it changes, a seed and a budget.

    Taught in notebooks/07_ablations_and_insights.ipynb
    """

    name: str
    overrides: dict[str, Any]
    seed: int
    budget: Budget
    group: str = ""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.overrides) - set(PRETRAIN_DEFAULTS))
        if unknown:
            raise ValueError(f"cell {self.name!r}: unknown setting(s) {unknown}; a cell may "
                             f"override {sorted(PRETRAIN_DEFAULTS)}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"cell {self.name!r}: seed={self.seed!r}; pass an integer >= 0")

    def settings(self) -> dict[str, Any]:
        """Return the full pretraining settings: defaults, then the budget's, then the cell's."""
        return {**PRETRAIN_DEFAULTS, **self.budget.settings, **self.overrides}


# ---------------------------------------------------------------------------------------------
# The cache key

# Modules that only show or drive results (figures, widgets, the command line): editing them
# cannot change a cell's numbers, so the code digest leaves them out.
PRESENTATION_MODULES = frozenset({"__init__", "__main__", "cli", "demo", "viz", "widgets"})


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """Return a short hash of the bertlab source files that produce an ablation's numbers (every
    module of the package but `PRESENTATION_MODULES`): the provenance each record carries. It is
    not part of the key (see the module docstring).

    Read once per process, so a file edited while a sweep runs cannot relabel its later cells.
    """
    h = hashlib.sha256()
    package = Path(__file__).resolve().parents[1]
    for path in sorted(package.rglob("*.py")):
        if path.stem not in PRESENTATION_MODULES:
            h.update(path.relative_to(package).as_posix().encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _device_kind(budget: Budget) -> str:
    device = resolve_device(budget.device)
    return f"{device.type}/{resolve_precision(budget.precision, device)}"


def cell_config(cell: Cell) -> dict[str, Any]:
    """Return every setting that can change a cell's numbers, as a JSON-ready dict (what is hashed).

    The cell's name and group are labels, not settings: two cells that differ only there are the
    same experiment and share one record. The source code is not in it: a record names its own
    `code_digest`, and a change that moves numbers bumps `EXPERIMENT_VERSION`.

    Taught in notebooks/07_ablations_and_insights.ipynb
    """
    return {
        "experiment_version": EXPERIMENT_VERSION,
        "settings": cell.settings(),
        "seed": cell.seed,
        # The budget's `settings` are already inside "settings" (merged), so two budgets that
        # differ only there share the records of cells whose merged settings agree.
        "budget": {k: v for k, v in cell.budget.to_dict().items() if k not in ("name", "settings")},
        "device": _device_kind(cell.budget),
        "bertlab": version("bertlab"),
        "torch": torch.__version__.split("+")[0],
    }


def config_key(config: dict[str, Any]) -> str:
    """Return the 16-hex-digit key of a config: a SHA-256 of its canonical JSON."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cell_key(cell: Cell) -> str:
    """Return the cache key of a cell (`config_key` of `cell_config`).

    Taught in notebooks/07_ablations_and_insights.ipynb
    """
    return config_key(cell_config(cell))


def ablation_grid(groups: Sequence[str] | None = None, seeds: Sequence[int] = (0, 1, 2),
                  budget: Budget | str = "cpu") -> list[Cell]:
    """Return the cells of the named groups (all of `GROUPS` when None), one per variant and seed.

    Taught in notebooks/07_ablations_and_insights.ipynb
    """
    if isinstance(budget, str):
        if budget not in BUDGETS:
            raise ValueError(f"unknown budget {budget!r}; known budgets: {', '.join(BUDGETS)}")
        budget = BUDGETS[budget]
    names = list(GROUPS) if groups is None else list(groups)
    unknown = [g for g in names if g not in GROUPS]
    if unknown:
        raise ValueError(f"unknown group(s) {unknown}; known groups: {list(GROUPS)}")
    if not seeds:
        raise ValueError("seeds is empty; pass at least one seed, e.g. (0, 1)")
    return [Cell(name, dict(overrides), seed, budget, group)
            for group in names for name, overrides in GROUPS[group] for seed in seeds]
