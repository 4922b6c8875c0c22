"""Ablation runner: a declarative grid of pretraining variants, each run once and cached by config.

A *cell* is one pretraining run: a name, the settings it changes (`overrides` of
`PRETRAIN_DEFAULTS`), a seed and a `Budget` (model size, steps, data, which downstream
measurements to take). `run_cell` pretrains a fresh model for the cell, measures it and writes
one JSON record keyed by `cell_key`: a hash of everything that can change its numbers (settings,
seed, budget, corpus, device kind and a digest of the bertlab source that produces them). A
record already on disk under that key is read back instead of re-run; change any setting, or
the code, and the key changes, so the cell runs again.

Measurements of a cell (all on held-out data, the same validation masks for every cell):

- `mlm_accuracy`: ordinary masked-LM accuracy (15% targets, 80/10/10);
- `mlm_accuracy_kept` / `mlm_accuracy_random`: the same targets with no [MASK] in the input,
  every target left unchanged / replaced by a random token; `mlm_accuracy_no_mask` is their
  mean (the accuracy under a 50/50 mix of the two, with the targets held fixed);
- `nsp_accuracy`: next-sentence prediction (chance is 0.5; MLM-only runs never train the head);
- `probe_accuracy` / `probe_accuracy_cls`: logistic regression on the frozen pooled / raw [CLS]
  vector for the BBC topic (BERT's "feature-based" column);
- `finetune_accuracy`: the whole encoder fine-tuned on BBC topics (when the budget asks for it);
- `curve`: held-out MLM and NSP accuracy at 9 points of the run (a few batches each).

Taught in notebooks/07_ablations_and_insights.ipynb
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

EXPERIMENT_VERSION = 1  # bump when the measurement itself changes (not needed for code edits)

# Every pretraining setting a cell may change, with BERT's values.
PRETRAIN_DEFAULTS: dict[str, Any] = {
    "mlm_probability": 0.15,  # share of tokens selected as targets
    "mask_replace_prob": 0.8,  # of the targets: -> [MASK]
    "random_replace_prob": 0.1,  # of the targets: -> a random token (the rest stay unchanged)
    "nsp": True,  # train the next-sentence head too (False: MLM loss only)
    "masking": "dynamic",  # "dynamic" (new mask every epoch) or "static" (dupe_factor copies)
    "dupe_factor": 1,  # static masking: number of fixed masks cycled over epochs
}

EVAL_SEED = 20_190_524  # validation examples and their masks: the same for every cell
CODE_MODULES = ("corpus", "tokenizer", "masking", "nsp", "data", "model", "train", "finetune",
                "experiments")


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

# Claims without a table we reproduce here (qualitative), for the notebook and the CLI.
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
    "masking-rate": [("15%", {}), ("30%", {"mlm_probability": 0.30}),
                     ("40%", {"mlm_probability": 0.40})],
    "static-vs-dynamic": [("dynamic", {}),
                          ("static x5", {"masking": "static", "dupe_factor": 5})],
}
BASELINES = {"masking-procedure": "80/10/10", "nsp": "MLM + NSP", "masking-rate": "15%",
             "static-vs-dynamic": "dynamic"}


# ---------------------------------------------------------------------------------------------
# Configuration: budget, cell, key


@dataclass
class Budget:
    """How big and how long each run is, and what is measured after it. Every field is hashed.

    `settings` are the pretraining settings every cell of the budget starts from, on top of
    `PRETRAIN_DEFAULTS` (a cell's overrides win); e.g. {"nsp": False} makes MLM-only the
    reference recipe. `max_docs` keeps a fixed pseudo-random subset of the corpus (None: all of
    it; the train / validation / test split of each document is unchanged). `finetune_epochs=0`
    skips fine-tuning (the probes still run); `probe=False` skips both downstream measurements.

    Taught in notebooks/07_ablations_and_insights.ipynb
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


# Named budgets. "quick": the reduced sweep for a shared machine (64-token pairs; measured about
# 2.3 min per run with 1 thread on a 2-core machine shared with ~4 other jobs). "cpu", the default:
# 128-token pairs, 300 steps; the full grid (10 distinct runs x 3 seeds) is estimated at 45-60 min
# on 2 idle cores, from the single-thread step time measured under load. Both end inside the
# phase where a tiny model predicts frequent words (held-out MLM accuracy near the unigram
# guess), so they show the machinery, not the effects. "cpu-long": 64-token pairs, 4,000 steps
# at lr 2e-3 without dropout, with fine-tuning: where the variants start to separate (measured,
# benchmarks/results/ablations-cpu-long.json: at 15% masking the models are only beginning to
# read context, at 30-40% well past it); 7-11 min per run on one core, 20 distinct runs (2
# seeds) took 173 core-minutes, ~90 min with --jobs 2. Its reference recipe is MLM-only
# (RoBERTa's): Table 8 is a question about the MLM loss, and in a 2-layer model NSP competes
# with it for capacity (20-minute runs: MLM accuracy 0.147 with NSP, 0.284 without). "gpu": a mini
# model with fine-tuning, sized for about 1 hour on one GPU by estimate; not yet measured on one.
BUDGETS: dict[str, Budget] = {
    "quick": Budget(name="quick", max_seq_len=64, max_steps=250, eval_batches=10),
    "cpu": Budget(name="cpu", max_steps=300, eval_batches=12),
    "cpu-long": Budget(name="cpu-long", max_seq_len=64, max_steps=4000, lr=2e-3,
                       model_overrides={"hidden_dropout": 0.0, "attention_dropout": 0.0},
                       settings={"nsp": False}, eval_batches=20, finetune_epochs=4.0),
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


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """Return a short hash of the bertlab source files that produce an ablation's numbers.

    Read once per process, so a file edited while a sweep runs cannot relabel its later cells.
    """
    h = hashlib.sha256()
    here = Path(__file__).resolve().parent
    for module in CODE_MODULES:
        h.update(module.encode())
        h.update((here / f"{module}.py").read_bytes())
    return h.hexdigest()[:16]


def _device_kind(budget: Budget) -> str:
    from bertlab.train import resolve_device, resolve_precision

    device = resolve_device(budget.device)
    return f"{device.type}/{resolve_precision(budget.precision, device)}"


def cell_config(cell: Cell) -> dict[str, Any]:
    """Return everything that can change a cell's numbers, as a JSON-ready dict (what is hashed).

    The cell's name and group are labels, not settings: two cells that differ only there are the
    same experiment and share one record.

    Taught in notebooks/07_ablations_and_insights.ipynb
    """
    import bertlab

    return {
        "experiment_version": EXPERIMENT_VERSION,
        "settings": cell.settings(),
        "seed": cell.seed,
        # The budget's `settings` are already inside "settings" (merged), so two budgets that
        # differ only there share the records of cells whose merged settings agree.
        "budget": {k: v for k, v in cell.budget.to_dict().items() if k not in ("name", "settings")},
        "device": _device_kind(cell.budget),
        "code": code_digest(),
        "bertlab": bertlab.__version__,
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


# ---------------------------------------------------------------------------------------------
# Running one cell


class _Data:
    """Corpus, tokenizer and NSP examples, built once per budget and shared by its cells."""

    def __init__(self, budget: Budget) -> None:
        from bertlab.corpus import load_corpus, split_documents
        from bertlab.tokenizer import train_tokenizer

        docs = load_corpus(budget.corpus)
        if budget.max_docs is not None:
            # A fixed pseudo-random subset (hash of the id), so every class keeps its share.
            docs = sorted(docs, key=lambda d: hashlib.sha256(d.id.encode()).hexdigest())
            docs = sorted(docs[: budget.max_docs], key=lambda d: d.id)
        self.docs = docs
        self.splits = split_documents(docs)
        self.tokenizer = train_tokenizer(self.splits["train"], vocab_size=budget.vocab_size)
        self.max_seq_len = budget.max_seq_len
        self._train: dict[int, Any] = {}
        self.validation = self._examples("validation", EVAL_SEED)

    def _examples(self, split: str, seed: int):
        from bertlab.nsp import create_nsp_examples

        if len(self.splits[split]) < 2:
            raise ValueError(f"the {split} split has {len(self.splits[split])} document(s); NSP "
                             f"needs at least 2: raise Budget.max_docs")
        return create_nsp_examples(self.splits[split], self.tokenizer,
                                   max_seq_len=self.max_seq_len, seed=seed)

    def train(self, seed: int):
        if seed not in self._train:
            self._train[seed] = self._examples("train", seed)
        return self._train[seed]


def _data_key(budget: Budget) -> str:
    """Return the key under which a process keeps the data of a budget (built once per budget)."""
    return json.dumps(budget.to_dict(), sort_keys=True)


def _train_and_measure(cell: Cell, data: _Data) -> dict[str, Any]:
    from bertlab.data import pretraining_loader
    from bertlab.model import BertConfig, BertForPreTraining
    from bertlab.train import (
        TrainConfig,
        evaluate,
        pretrain,
        resolve_device,
        resolve_precision,
    )

    b, s = cell.budget, cell.settings()
    tok = data.tokenizer
    examples = data.train(cell.seed)
    loader = pretraining_loader(
        examples, tok, split=None, batch_size=b.batch_size, seed=cell.seed,
        masking=s["masking"], dupe_factor=s["dupe_factor"], mlm_probability=s["mlm_probability"],
        mask_replace_prob=s["mask_replace_prob"], random_replace_prob=s["random_replace_prob"])
    config = BertConfig.preset(b.preset, vocab_size=tok.get_vocab_size(), **b.model_overrides)
    model = BertForPreTraining(config, generator=torch.Generator().manual_seed(cell.seed))
    # The learning curve: held-out MLM / NSP accuracy at 9 points of the run, on a few batches
    # of the fixed validation pairs (the final numbers below use more).
    curve_loader = pretraining_loader(data.validation, tok, split=None, batch_size=b.batch_size,
                                      seed=EVAL_SEED, shuffle=True, masking="static")
    train_config = TrainConfig(
        max_steps=b.max_steps, batch_size=b.batch_size, lr=b.lr,
        eval_interval=max(b.max_steps // 8, 1), eval_batches=min(b.eval_batches, 6),
        checkpoint_interval=None, device=b.device, precision=b.precision, seed=cell.seed,
        log_interval=0, progress=False)
    start = time.perf_counter()
    run = pretrain(model, loader, curve_loader, train_config, nsp=s["nsp"])
    train_seconds = time.perf_counter() - start
    curve = [{"step": row["step"], "mlm_accuracy": row["val_mlm_accuracy"],
              "nsp_accuracy": row["val_nsp_accuracy"]} for row in run.history]

    device = resolve_device(b.device)
    precision = resolve_precision(b.precision, device)
    metrics: dict[str, Any] = {}
    # The same validation pairs, targets and masks for every cell: evaluation is always BERT's
    # 15% with 80/10/10, then the same targets with no [MASK] (kept, or randomised).
    for suffix, mask_p, random_p in (("", 0.8, 0.1), ("_kept", 0.0, 0.0), ("_random", 0.0, 1.0)):
        # shuffle=True with a fixed seed: a random but fixed subset of the validation pairs (in
        # document order the first batches would all come from one topic).
        val = pretraining_loader(data.validation, tok, split=None, batch_size=b.batch_size,
                                 seed=EVAL_SEED, shuffle=True, masking="static",
                                 mask_replace_prob=mask_p, random_replace_prob=random_p)
        scores = evaluate(model, val, b.eval_batches, device=device, precision=precision)
        metrics[f"mlm_accuracy{suffix}"] = scores["mlm_accuracy"]
        metrics[f"mlm_loss{suffix}"] = scores["mlm_loss"]
        if not suffix:
            metrics["nsp_accuracy"] = scores["nsp_accuracy"]
    metrics["mlm_accuracy_no_mask"] = (metrics["mlm_accuracy_kept"]
                                       + metrics["mlm_accuracy_random"]) / 2
    metrics.update(_downstream_metrics(model, data, b, cell.seed))
    metrics.update({
        "final_train_loss": run.step_losses[-1],
        "steps": run.steps,
        "epochs_seen": run.steps * b.batch_size / len(examples),
        "train_examples": len(examples),
        "train_seconds": round(train_seconds, 2),
        "curve": curve,
    })
    return metrics


def _downstream_metrics(model, data: _Data, b: Budget, seed: int) -> dict[str, float | None]:
    """Return the [CLS] probes (pooled, raw) and the fine-tuned accuracy the budget asks for."""
    from bertlab.finetune import FinetuneConfig, finetune_classifier, linear_probe

    metrics: dict[str, float | None] = {"probe_accuracy": None, "probe_accuracy_cls": None,
                                        "finetune_accuracy": None}
    if not b.probe:
        return metrics
    for pooling, name in (("pooled", "probe_accuracy"), ("cls", "probe_accuracy_cls")):
        metrics[name] = linear_probe(model, data.docs, tokenizer=data.tokenizer, pooling=pooling,
                                     seed=seed, max_seq_len=b.max_seq_len).accuracy
    if b.finetune_epochs > 0:
        metrics["finetune_accuracy"] = finetune_classifier(
            model, data.docs, tokenizer=data.tokenizer, config=FinetuneConfig(
                epochs=b.finetune_epochs, min_steps=1, batch_size=b.batch_size,
                max_seq_len=b.max_seq_len, device=b.device, precision=b.precision,
                seed=seed)).accuracy
    return metrics


def unigram_reference(budget: Budget) -> dict[str, Any]:
    """Return {"token", "mlm_accuracy"}: the score of always guessing the most frequent target.

    Counted on training pairs, scored on the validation pairs and masks every cell is scored
    on, with the budget's own tokenizer: the held-out MLM accuracy of a model that learned word
    frequencies and no context, the bar every cell's accuracy is read against.
    """
    from bertlab.data import pretraining_loader
    from bertlab.train import unigram_baseline

    data = _Data(budget)
    loaders = [pretraining_loader(examples, data.tokenizer, split=None,
                                  batch_size=budget.batch_size, seed=EVAL_SEED, shuffle=True,
                                  masking="static")
               for examples in (data.train(EVAL_SEED), data.validation)]
    found = unigram_baseline(*loaders, max_batches=budget.eval_batches)
    return {"token": data.tokenizer.id_to_token(found["token_id"]),
            "mlm_accuracy": found["mlm_accuracy"]}


def random_init_scores(budget: Budget, seeds: Sequence[int]) -> dict[str, list]:
    """Return the downstream scores of the cells' starting point, per seed: the same model,
    tokenizer and measurements as a cell, on the weights the seed initialises before pretraining.

    Without them a cell's fine-tuned or probe accuracy has no scale: they say what pretraining
    added (or took away). Keys: "seeds", and each measured metric of `_downstream_metrics`.

    Taught in notebooks/07_ablations_and_insights.ipynb
    """
    from bertlab.model import BertConfig, BertForPreTraining

    data = _Data(budget)
    config = BertConfig.preset(budget.preset, vocab_size=data.tokenizer.get_vocab_size(),
                               **budget.model_overrides)
    scores: dict[str, list] = {"seeds": list(seeds)}
    for seed in seeds:
        model = BertForPreTraining(config, generator=torch.Generator().manual_seed(seed))
        for name, value in _downstream_metrics(model, data, budget, seed).items():
            if value is not None:
                scores.setdefault(name, []).append(value)
    return scores


def run_cell(cell: Cell, cache_dir: str | Path, *, force: bool = False,
             data: _Data | None = None) -> dict[str, Any]:
    """Return the record of a cell: read from `cache_dir/<key>.json`, or run and written there.

    A record holds `key`, `config` (what was hashed), `cell` (name, group, overrides, seed),
    `metrics`, `elapsed_s`, `machine` and `cached` (True when read back). `force=True` re-runs
    and overwrites. Runs are deterministic given the config on one machine; across machines
    float results can differ in the last digits.

    Taught in notebooks/07_ablations_and_insights.ipynb
    """
    config = cell_config(cell)
    key = config_key(config)
    cache = Path(cache_dir)
    path = cache / f"{key}.json"
    if path.is_file() and not force:
        record = json.loads(path.read_text(encoding="utf-8"))
        if record.get("config") == config:
            return {**record, "cell": _cell_info(cell), "cached": True}
    start = time.perf_counter()
    metrics = _train_and_measure(cell, data or _Data(cell.budget))
    record = {
        "key": key, "config": config, "cell": _cell_info(cell), "metrics": metrics,
        "elapsed_s": round(time.perf_counter() - start, 2),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"platform": platform.platform(), "torch_threads": torch.get_num_threads(),
                    "cpu_count": os.cpu_count()},
    }
    cache.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1), encoding="utf-8")
    os.replace(tmp, path)  # atomic: a killed run never leaves half a record
    return {**record, "cached": False}


def _cell_info(cell: Cell) -> dict[str, Any]:
    return {"name": cell.name, "group": cell.group, "overrides": dict(cell.overrides),
            "seed": cell.seed, "budget": cell.budget.name}


def run_grid(cells: Iterable[Cell], cache_dir: str | Path, *, force: bool = False,
             on_record: Callable[[dict[str, Any]], None] | None = None, jobs: int = 1,
             threads: int = 1) -> list[dict[str, Any]]:
    """Return the records of all cells in order, running only those not cached yet.

    A config shared by several cells (the reference run appears in every group) runs once.
    `on_record(record)` is called after each cell (to save partial results or print progress).
    `jobs > 1` runs that many cells at once in worker processes with `threads` torch threads
    each (a tiny model runs best on one thread per core); records then reach `on_record` in the
    order they finish, and the returned list is still in cell order. A cell's numbers do not
    depend on `jobs`.

    Taught in notebooks/07_ablations_and_insights.ipynb
    """
    cells = list(cells)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs={jobs!r}; pass a positive integer (1 runs the cells one by one)")
    if jobs > 1:
        return _run_grid_parallel(cells, cache_dir, force, on_record, jobs, threads)
    records, done, datasets = [], {}, {}
    for cell in cells:
        key = cell_key(cell)
        if key in done:
            record = {**done[key], "cell": _cell_info(cell), "cached": True}
        else:
            data_key = _data_key(cell.budget)
            needs_run = force or not (Path(cache_dir) / f"{key}.json").is_file()
            if needs_run and data_key not in datasets:
                datasets[data_key] = _Data(cell.budget)
            record = run_cell(cell, cache_dir, force=force, data=datasets.get(data_key))
            done[key] = record
        records.append(record)
        if on_record is not None:
            on_record(record)
    return records


_WORKER_DATA: dict[str, _Data] = {}  # per worker process: the data of each budget, built once


def _init_worker(threads: int) -> None:
    torch.set_num_threads(threads)


def _run_cell_in_worker(cell: Cell, cache_dir: str, force: bool) -> dict[str, Any]:
    data_key = _data_key(cell.budget)
    if data_key not in _WORKER_DATA:
        _WORKER_DATA[data_key] = _Data(cell.budget)
    return run_cell(cell, cache_dir, force=force, data=_WORKER_DATA[data_key])


def _run_grid_parallel(cells: list[Cell], cache_dir: str | Path, force: bool,
                       on_record: Callable[[dict[str, Any]], None] | None, jobs: int,
                       threads: int) -> list[dict[str, Any]]:
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    keys = [cell_key(c) for c in cells]
    by_key: dict[str, dict[str, Any]] = {}
    to_run: dict[str, Cell] = {}
    for cell, key in zip(cells, keys, strict=True):
        if key in by_key or key in to_run:
            continue
        if not force and (Path(cache_dir) / f"{key}.json").is_file():
            record = run_cell(cell, cache_dir)  # reads the record (re-runs only a stale one)
            by_key[key] = record
            if on_record is not None:
                on_record(record)
        else:
            to_run[key] = cell
    # spawn: a fresh interpreter per worker (forking a process that already ran torch is unsafe)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_init_worker,
                             initargs=(threads,)) as pool:
        pending = {pool.submit(_run_cell_in_worker, cell, str(cache_dir), force): key
                   for key, cell in to_run.items()}
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                key = pending.pop(future)
                by_key[key] = future.result()
                if on_record is not None:
                    on_record(by_key[key])
    records = []
    seen: set[str] = set()
    for cell, key in zip(cells, keys, strict=True):
        record = {**by_key[key], "cell": _cell_info(cell)}
        if key in seen:
            record["cached"] = True
        seen.add(key)
        records.append(record)
    return records


# ---------------------------------------------------------------------------------------------
# Reading results: mean ± std over seeds, and whether a difference stands out of the noise


METRICS = ("mlm_accuracy", "mlm_accuracy_no_mask", "mlm_accuracy_kept", "mlm_accuracy_random",
           "nsp_accuracy", "probe_accuracy", "probe_accuracy_cls", "finetune_accuracy")


def summarize_records(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return one row per (group, name): seeds, and `<metric>_mean` / `<metric>_std` per metric.

    The standard deviation is the sample one (n - 1; 0 for a single seed). A metric that was not
    measured (None) is left out of the row.

    Taught in notebooks/07_ablations_and_insights.ipynb
    """
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["cell"]["group"], r["cell"]["name"]), []).append(r)
    rows = []
    for (group, name), runs in groups.items():
        row: dict[str, Any] = {"group": group, "name": name,
                               "seeds": sorted(r["cell"]["seed"] for r in runs)}
        for metric in METRICS:
            values = [r["metrics"].get(metric) for r in runs]
            if any(v is None for v in values):
                continue
            row[f"{metric}_mean"] = statistics.fmean(values)
            row[f"{metric}_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
            row[f"{metric}_values"] = values
        rows.append(row)
    return rows


def compare_to_baseline(rows: Sequence[dict[str, Any]], group: str, metric: str,
                        baseline: str | None = None, z: float = 2.0) -> list[dict[str, Any]]:
    """Return, per variant of `group`, its difference from the baseline on `metric` and a verdict.

    The noise scale is the standard error of the difference of two means,
    se = sqrt(s_a^2 / n_a + s_b^2 / n_b). Verdict: "within noise" when |diff| <= z x se,
    "better" / "worse" otherwise, "too few seeds" when either side has one seed. With 2-3 seeds
    the standard deviations themselves are rough, so treat a verdict as a hint, not a test.

    Taught in notebooks/07_ablations_and_insights.ipynb
    """
    baseline = baseline or BASELINES.get(group)
    mine = {r["name"]: r for r in rows if r["group"] == group and f"{metric}_mean" in r}
    if baseline not in mine:
        raise ValueError(f"group {group!r} has no baseline row {baseline!r} with {metric!r}; "
                         f"rows: {sorted(mine)}")
    base = mine[baseline]
    out = []
    for name, row in mine.items():
        if name == baseline:
            continue
        n_a, n_b = len(row["seeds"]), len(base["seeds"])
        diff = row[f"{metric}_mean"] - base[f"{metric}_mean"]
        se = math.sqrt(row[f"{metric}_std"] ** 2 / n_a + base[f"{metric}_std"] ** 2 / n_b)
        if min(n_a, n_b) < 2:
            verdict = "too few seeds"
        elif abs(diff) <= z * se:
            verdict = "within noise"
        else:
            verdict = "better" if diff > 0 else "worse"
        out.append({"name": name, "baseline": baseline, "metric": metric, "diff": diff, "se": se,
                    "verdict": verdict})
    return out


def format_summary(rows: Sequence[dict[str, Any]],
                   metrics: Sequence[str] = ("mlm_accuracy", "mlm_accuracy_no_mask",
                                             "nsp_accuracy", "probe_accuracy",
                                             "finetune_accuracy")) -> str:
    """Return a plain-text table of `summarize_records` rows, in %, mean ± std over seeds.

    Taught in notebooks/07_ablations_and_insights.ipynb
    """
    shown = [m for m in metrics if any(f"{m}_mean" in r for r in rows)]
    header = f"{'group':<18} {'variant':<10} {'n':>2} " + " ".join(f"{m:>22}" for m in shown)
    lines = [header, "-" * len(header)]
    for r in rows:
        cells = []
        for m in shown:
            if f"{m}_mean" in r:
                cells.append(f"{100 * r[f'{m}_mean']:.1f} ± {100 * r[f'{m}_std']:.1f}".rjust(22))
            else:
                cells.append("-".rjust(22))
        lines.append(f"{r['group']:<18} {r['name']:<10} {len(r['seeds']):>2} " + " ".join(cells))
    return "\n".join(lines)


def load_results(path: str | Path) -> dict[str, Any]:
    """Return a saved sweep (the JSON `benchmarks/ablations.py` writes), checking its shape.

    Taught in notebooks/07_ablations_and_insights.ipynb
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no results file at '{path}'; run `python benchmarks/ablations.py` to "
                         f"create it")
    data = json.loads(path.read_text(encoding="utf-8"))
    missing = [k for k in ("command", "budget", "records") if k not in data]
    if missing:
        raise ValueError(f"'{path}' is not an ablation results file (missing {missing}); "
                         f"write it with benchmarks/ablations.py")
    return data

