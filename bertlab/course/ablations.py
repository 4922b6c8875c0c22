"""Running the ablation grid of `bertlab.course.grid`: each cell pretrained, measured and cached once,
and the records read back as mean ± std over seeds against each group's baseline.

`run_cell` pretrains a fresh model for a cell, measures it and writes one JSON record under the
cell's key; a record already on disk under that key is read back instead. `run_grid` runs many
cells, one after the other in this process or several at once in worker processes.

Measurements of a cell (all on held-out data, the same validation masks for every cell, BERT's
15% with 80/10/10 whatever the cell trained with):

- `mask_accuracy`: accuracy at the targets shown as [MASK] (the number that says whether the model
  reads context; `mask_unigram_accuracy` beside it is always guessing the most frequent of those
  targets);
- `mlm_accuracy`: accuracy at all targets, BERT's number (the kept 10% are mostly copied);
- `mlm_accuracy_kept` / `mlm_accuracy_random`: the same targets with no [MASK] in the input,
  every target left unchanged / replaced by a random token; `mlm_accuracy_no_mask` is their
  mean (the accuracy under a 50/50 mix of the two, with the targets held fixed);
- `nsp_accuracy`: next-sentence prediction (chance is 0.5); None for MLM-only runs, which never
  train the head (an untrained head's accuracy is not a result);
- `probe_accuracy` / `probe_accuracy_cls`: logistic regression on the frozen pooled / raw [CLS]
  vector for the BBC topic (BERT's "feature-based" column);
- `finetune_accuracy`: the whole encoder fine-tuned on BBC topics (when the budget asks for it);
- `curve`: held-out [MASK], MLM and NSP accuracy at 9 points of the run (a few batches each).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import multiprocessing
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import torch

from bertlab.atomic import atomic_write_json
from bertlab.corpus import split_documents
from bertlab.course.grid import Budget, Cell, cell_config, cell_key, code_digest, config_key
from bertlab.course.twins import verdict
from bertlab.data import LoaderOptions, pretraining_loader
from bertlab.engine.device import resolve_device, resolve_precision
from bertlab.finetune import FinetuneConfig, ProbeConfig, finetune_classifier, linear_probe
from bertlab.masking import MaskingConfig
from bertlab.model import BertConfig, BertForPreTraining
from bertlab.pairs import Example, create_nsp_examples
from bertlab.pretraining import evaluate, pretrain, unigram_baseline
from bertlab.readers import load_corpus
from bertlab.tokenizer import train_tokenizer
from bertlab.train import TrainConfig

EVAL_SEED = 20_190_524  # validation examples and their masks: the same for every cell


# ---------------------------------------------------------------------------------------------
# Measuring one cell


class BudgetData:
    """Corpus, tokenizer and NSP examples of a budget, built once and shared by its cells."""

    def __init__(self, budget: Budget) -> None:
        docs = load_corpus(budget.corpus)
        if budget.max_docs is not None:
            # A fixed pseudo-random subset (hash of the id), so every class keeps its share.
            docs = sorted(docs, key=lambda d: hashlib.sha256(d.id.encode()).hexdigest())
            docs = sorted(docs[: budget.max_docs], key=lambda d: d.id)
        self.docs = docs
        self.splits = split_documents(docs)
        self.tokenizer = train_tokenizer(self.splits["train"], vocab_size=budget.vocab_size)
        self.max_seq_len = budget.max_seq_len
        self._train: dict[int, list[Example]] = {}
        self.validation = self._examples("validation", EVAL_SEED)

    def _examples(self, split: str, seed: int) -> list[Example]:
        if len(self.splits[split]) < 2:
            raise ValueError(f"the {split} split has {len(self.splits[split])} document(s); NSP "
                             f"needs at least 2: raise Budget.max_docs")
        return create_nsp_examples(self.splits[split], self.tokenizer,
                                   max_seq_len=self.max_seq_len, seed=seed)

    def train(self, seed: int) -> list[Example]:
        """Return the training pairs of a seed (built on first use)."""
        if seed not in self._train:
            self._train[seed] = self._examples("train", seed)
        return self._train[seed]


def _pretrain_cell(cell: Cell, data: BudgetData, stop_after: int | None = None
                   ) -> tuple[BertForPreTraining, Any, tuple[str, ...], float]:
    """Pretrain a fresh model on a cell's settings (its first `stop_after` steps, when given,
    on the whole run's schedule); return the model, the run, its objectives and the seconds."""
    b, s = cell.budget, cell.settings()
    tok = data.tokenizer
    examples = data.train(cell.seed)
    loader = pretraining_loader(examples, tok, split=None, seed=cell.seed, options=LoaderOptions(
        batch_size=b.batch_size, mask_schedule=s["masking"], mask_copies=s["dupe_factor"],
        masking=MaskingConfig(mlm_probability=s["mlm_probability"],
                              mask_replace_prob=s["mask_replace_prob"],
                              random_replace_prob=s["random_replace_prob"])))
    config = BertConfig.preset(b.preset, vocab_size=tok.get_vocab_size(), **b.model_overrides)
    model = BertForPreTraining(config, generator=torch.Generator().manual_seed(cell.seed))
    # The learning curve: held-out MLM / NSP accuracy at 9 points of the run, on a few batches
    # of the fixed validation pairs (the final numbers below use more).
    curve_loader = pretraining_loader(data.validation, tok, split=None, seed=EVAL_SEED,
                                      options=LoaderOptions(batch_size=b.batch_size,
                                                            mask_schedule="static"))
    train_config = TrainConfig(
        max_steps=b.max_steps, batch_size=b.batch_size, lr=b.lr, optimizer=b.optimizer,
        muon_lr=b.muon_lr,
        eval_interval=max(b.max_steps // 8, 1), eval_batches=min(b.eval_batches, 6),
        checkpoint_interval=None, device=b.device, precision=b.precision, seed=cell.seed,
        log_interval=0, progress=False, stop_after=stop_after)
    start = time.perf_counter()
    objectives = ("mlm", "nsp") if s["nsp"] else ("mlm",)
    run = pretrain(model, loader, curve_loader, train_config, objectives=objectives)
    return model, run, objectives, time.perf_counter() - start


def _curve(run: Any) -> list[dict[str, Any]]:
    return [{"step": row["step"], "mask_accuracy": row["val_mask_accuracy"],
             "mlm_accuracy": row["val_mlm_accuracy"],
             "nsp_accuracy": row.get("val_nsp_accuracy")} for row in run.history]


def trace_cell(cell: Cell, steps: int) -> dict[str, Any]:
    """Return a cell's first `steps` steps as its record keeps them (the learning curve's rows;
    `steps` a multiple of the curve's interval), with every step's loss and the SHA-256 of the
    weights they left: a reproduce trace (bertlab.course.traces)."""
    model, run, _, _ = _pretrain_cell(cell, BudgetData(cell.budget), stop_after=steps)
    weights = hashlib.sha256(b"".join(t.detach().contiguous().numpy().tobytes()
                                      for t in model.state_dict().values())).hexdigest()
    return {"curve": _curve(run), "step_losses": list(run.step_losses), "weights_sha256": weights}


def _train_and_measure(cell: Cell, data: BudgetData) -> dict[str, Any]:
    """Return the metrics of a cell: pretrain a fresh model on its settings, then measure it."""
    b = cell.budget
    tok = data.tokenizer
    examples = data.train(cell.seed)
    model, run, objectives, train_seconds = _pretrain_cell(cell, data)
    curve = _curve(run)

    device = resolve_device(b.device)
    precision = resolve_precision(b.precision, device)
    metrics: dict[str, Any] = {}
    # The same validation pairs, targets and masks for every cell: evaluation is always BERT's
    # 15% with 80/10/10, then the same targets with no [MASK] (kept, or randomised).
    for suffix, mask_p, random_p in (("", 0.8, 0.1), ("_kept", 0.0, 0.0), ("_random", 0.0, 1.0)):
        # shuffle=True with a fixed seed: a random but fixed subset of the validation pairs (in
        # document order the first batches would all come from one topic).
        val = pretraining_loader(data.validation, tok, split=None, seed=EVAL_SEED,
                                 options=LoaderOptions(
                                     batch_size=b.batch_size, shuffle=True,
                                     mask_schedule="static",
                                     masking=MaskingConfig(mask_replace_prob=mask_p,
                                                           random_replace_prob=random_p)))
        scores = evaluate(model, val, b.eval_batches, device=device, precision=precision,
                          objectives=objectives)
        metrics[f"mlm_accuracy{suffix}"] = scores["mlm_accuracy"]
        metrics[f"mlm_loss{suffix}"] = scores["mlm_loss"]
        if not suffix:
            metrics["nsp_accuracy"] = scores.get("nsp_accuracy")  # None: not trained
            for name in ("mask_accuracy", "mask_loss", "mask_unigram_accuracy"):
                metrics[name] = scores[name]
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


def _downstream_metrics(model: BertForPreTraining, data: BudgetData, b: Budget,
                        seed: int) -> dict[str, float | None]:
    """Return the [CLS] probes (pooled, raw) and the fine-tuned accuracy the budget asks for."""
    metrics: dict[str, float | None] = {"probe_accuracy": None, "probe_accuracy_cls": None,
                                        "finetune_accuracy": None}
    if not b.probe:
        return metrics
    for pooling, name in (("pooled", "probe_accuracy"), ("cls", "probe_accuracy_cls")):
        probe = ProbeConfig(pooling=pooling, max_seq_len=b.max_seq_len, seed=seed)
        metrics[name] = linear_probe(model, data.docs, tokenizer=data.tokenizer,
                                     config=probe).accuracy
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
    data = BudgetData(budget)
    options = LoaderOptions(batch_size=budget.batch_size, mask_schedule="static")
    loaders = [pretraining_loader(examples, data.tokenizer, split=None, seed=EVAL_SEED,
                                  options=options)
               for examples in (data.train(EVAL_SEED), data.validation)]
    found = unigram_baseline(*loaders, max_batches=budget.eval_batches)
    return {"token": data.tokenizer.id_to_token(found["token_id"]),
            "mlm_accuracy": found["mlm_accuracy"]}


def random_init_scores(budget: Budget, seeds: Sequence[int]) -> dict[str, list]:
    """Return the downstream scores of the cells' starting point, per seed: the same model,
    tokenizer and measurements as a cell, on the weights the seed initialises before pretraining.

    Without them a cell's fine-tuned or probe accuracy has no scale: they say what pretraining
    added (or took away). Keys: "seeds", and each measured metric of `_downstream_metrics`.
    """
    data = BudgetData(budget)
    config = BertConfig.preset(budget.preset, vocab_size=data.tokenizer.get_vocab_size(),
                               **budget.model_overrides)
    scores: dict[str, list] = {"seeds": list(seeds)}
    for seed in seeds:
        model = BertForPreTraining(config, generator=torch.Generator().manual_seed(seed))
        for name, value in _downstream_metrics(model, data, budget, seed).items():
            if value is not None:
                scores.setdefault(name, []).append(value)
    return scores


# ---------------------------------------------------------------------------------------------
# Running cells: the cache, and one runner for one process or many


def _cached_record(cell: Cell, cache_dir: str | Path) -> dict[str, Any] | None:
    """Return the finished record of `cell` in `cache_dir`, or None when there is none (or the
    file's config is not the cell's: such a record is not trusted)."""
    config = cell_config(cell)
    path = Path(cache_dir) / f"{config_key(config)}.json"
    if not path.is_file():
        return None
    record = json.loads(path.read_text(encoding="utf-8"))
    if record.get("config") != config:
        return None
    return {**record, "cell": _cell_info(cell), "cached": True}


def run_cell(cell: Cell, cache_dir: str | Path, *, force: bool = False,
             data: BudgetData | None = None) -> dict[str, Any]:
    """Return the record of a cell: read from `cache_dir/<key>.json`, or run and written there.

    A record holds `key`, `config` (what was hashed), `cell` (name, group, overrides, seed),
    `metrics`, `elapsed_s`, `machine` and `cached` (True when read back). `force=True` re-runs
    and overwrites. `data` (the budget's `BudgetData`) saves building it again. Runs are
    deterministic given the config on one machine; across machines float results can differ in
    the last digits.

    Taught in notebooks/07_ablations_and_insights.ipynb
    """
    if not force:
        record = _cached_record(cell, cache_dir)
        if record is not None:
            return record
    config = cell_config(cell)
    key = config_key(config)
    start = time.perf_counter()
    metrics = _train_and_measure(cell, data or BudgetData(cell.budget))
    record = {
        "key": key, "config": config, "cell": _cell_info(cell), "metrics": metrics,
        "elapsed_s": round(time.perf_counter() - start, 2),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "code": code_digest(),
        "machine": {"platform": platform.platform(), "torch_threads": torch.get_num_threads(),
                    "cpu_count": os.cpu_count()},
    }
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    atomic_write_json(Path(cache_dir) / f"{key}.json", record)  # a killed run leaves no half record
    return {**record, "cached": False}


def _cell_info(cell: Cell) -> dict[str, Any]:
    return {"name": cell.name, "group": cell.group, "overrides": dict(cell.overrides),
            "seed": cell.seed, "budget": cell.budget.name}


class _CellRunner:
    """Runs cells in one process (anew: the caller has read the cache), each budget's data
    built once."""

    def __init__(self, cache_dir: str) -> None:
        self.cache_dir = cache_dir
        self.data: dict[str, BudgetData] = {}

    def __call__(self, cell: Cell) -> dict[str, Any]:
        key = json.dumps(cell.budget.to_dict(), sort_keys=True)
        if key not in self.data:
            self.data[key] = BudgetData(cell.budget)
        return run_cell(cell, self.cache_dir, force=True, data=self.data[key])


_WORKER: _CellRunner | None = None  # the runner of a worker process (set by _start_worker)


def _start_worker(cache_dir: str, threads: int) -> None:
    global _WORKER
    torch.set_num_threads(threads)
    _WORKER = _CellRunner(cache_dir)


def _run_in_worker(cell: Cell) -> dict[str, Any]:
    return _WORKER(cell)


def _execute(cells: dict[str, Cell], cache_dir: str, jobs: int,
             threads: int) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield (key, record) of each cell as it finishes: one after the other in this process
    when `jobs` is 1, else `jobs` at a time in worker processes of `threads` torch threads."""
    if jobs == 1:
        runner = _CellRunner(cache_dir)
        for key, cell in cells.items():
            yield key, runner(cell)
        return
    if not cells:
        return
    # spawn: a fresh interpreter per worker (forking a process that already ran torch is unsafe)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_start_worker,
                             initargs=(cache_dir, threads)) as pool:
        futures = {pool.submit(_run_in_worker, cell): key for key, cell in cells.items()}
        for future in as_completed(futures):
            yield futures[future], future.result()


def run_grid(cells: Iterable[Cell], cache_dir: str | Path, *, jobs: int = 1, threads: int = 1,
             force: bool = False,
             on_record: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Return the records of all cells in order, running only those not cached yet.

    A config shared by several cells (the reference run appears in every group) runs once.
    `jobs=1` runs the cells one after the other in this process; `jobs > 1` runs that many at
    once in worker processes with `threads` torch threads each (a tiny model runs best on one
    thread per core). A cell's numbers do not depend on `jobs`. `on_record(record)` is called
    once per distinct config as it is read from the cache or finishes (to save partial results
    or print progress); the returned list has one record per cell, a repeated config marked
    `cached`.
    """
    cells = list(cells)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs={jobs!r}; pass a positive integer (1 runs the cells one by one)")
    keys = [cell_key(c) for c in cells]
    distinct: dict[str, Cell] = {}
    for cell, key in zip(cells, keys, strict=True):
        distinct.setdefault(key, cell)
    cached = {key: None if force else _cached_record(cell, cache_dir)
              for key, cell in distinct.items()}
    to_run = {key: distinct[key] for key, record in cached.items() if record is None}
    by_key: dict[str, dict[str, Any]] = {}
    for key, record in itertools.chain(((k, r) for k, r in cached.items() if r is not None),
                                       _execute(to_run, str(cache_dir), jobs, threads)):
        by_key[key] = record
        if on_record is not None:
            on_record(record)
    records, seen = [], set()
    for cell, key in zip(cells, keys, strict=True):
        record = {**by_key[key], "cell": _cell_info(cell)}
        if key in seen:
            record["cached"] = True
        seen.add(key)
        records.append(record)
    return records


# ---------------------------------------------------------------------------------------------
# Reading results: mean ± std over seeds, and whether a difference stands out of the noise


METRICS = ("mask_accuracy", "mlm_accuracy", "mlm_accuracy_no_mask", "mlm_accuracy_kept", "mlm_accuracy_random",
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
                        baseline: str, z: float = 2.0) -> list[dict[str, Any]]:
    """Return, per variant of `group`, its difference from the `baseline` variant on `metric`
    (`grid.group_baseline` names the budget's own recipe) and a verdict.

    The noise scale is the standard error of the difference of two means,
    se = sqrt(s_a^2 / n_a + s_b^2 / n_b). The verdict is the course's one vocabulary
    (`bertlab.course.twins.verdict`, with z x se as the noise): "higher" or "lower" when the
    interval diff +- z x se lies on one side of zero, "within the noise" when it spans zero, "too
    few seeds" when either side has one seed. With 2-3 seeds the standard deviations themselves are
    rough, so treat a verdict as a hint, not a test.

    Taught in notebooks/07_ablations_and_insights.ipynb
    """
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
        found = ("too few seeds" if min(n_a, n_b) < 2
                 else verdict({"mean": diff, "two_se": z * se}))
        out.append({"name": name, "baseline": baseline, "metric": metric, "diff": diff, "se": se,
                    "verdict": found})
    return out


def format_summary(rows: Sequence[dict[str, Any]],
                   metrics: Sequence[str] = ("mask_accuracy", "mlm_accuracy",
                                             "mlm_accuracy_no_mask",
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

