"""[CLS] classification: fine-tuning a pretrained encoder, the same model trained from scratch,
and the comparison of every downstream method.

- `finetune_classifier`: a pretrained encoder + a fresh linear layer on the pooled [CLS] vector,
  all weights trained (the recipe of the BERT paper, section 4), with the training loop of
  `bertlab.train` and a classification loss;
- `from_scratch`: the same architecture and recipe from random weights (what pretraining is
  worth);
- `compare_downstream`: both, beside the linear probe and TF-IDF of `bertlab.downstream`, on a
  named task; `format_table` prints them side by side.

Inputs, splits and results are those of `bertlab.downstream`: every method returns the same
`ClassificationResult`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer
from torch import nn

from bertlab.classifier import BertForSequenceClassification
from bertlab.data import EpochLoader, EpochShuffleSampler
from bertlab.document import Document, split_documents
from bertlab.downstream import (
    ClassificationResult,
    ProbeConfig,
    average_over_windows,
    bert_encoder,
    cls_features,
    document_chunks,
    labelled_splits,
    linear_probe,
    load_task,
    pad_batch,
    tfidf_baseline,
)
from bertlab.loading import load_model
from bertlab.model import BertConfig
from bertlab.tokenizer import check_tokenizer_fits
from bertlab.train import Objective, TrainConfig, train_loop
from bertlab.util import check_number

METHODS = ("fine-tuned", "linear probe", "TF-IDF", "from scratch")  # what compare_downstream runs
# The settings the `finetune` command has a flag for (`--epochs`...), named in their errors.
_FLAGGED = ("epochs", "lr", "batch_size", "max_seq_len", "device")


@dataclass
class FinetuneConfig:
    """Every setting of a fine-tuning run, with defaults that suit the small presets on CPU.

    The run lasts `epochs` passes over the training examples, but at least `min_steps`
    optimizer steps (so an 8-examples-per-class run still gets enough updates). Optimizer,
    schedule, mixed precision and checkpoints are those of `bertlab.TrainConfig`
    (`to_train_config` builds one).

    Taught in notebooks/06_cls_and_downstream.ipynb
    """

    epochs: float = 10.0  # passes over the training examples
    min_steps: int = 60
    batch_size: int = 32
    lr: float = 1e-3  # tiny/mini presets; BERT-base fine-tunes at 2e-5 to 5e-5
    warmup_fraction: float = 0.1
    weight_decay: float = 0.01
    max_seq_len: int = 128
    max_chunks: int = 1  # windows per document (training uses each; evaluation averages logits)
    device: str = "auto"
    precision: str = "auto"
    seed: int = 0  # head init, data order and dropout (and which k_per_class documents)
    progress: bool = False
    eval_split: str = "test"  # the split scored ("validation" while choosing settings)

    def __post_init__(self) -> None:
        # Finite numbers only: epochs=inf would ask for infinitely many steps.
        kinds = {"positive number": ("epochs", "lr"), "number >= 0": ("weight_decay",),
                 "positive integer": ("min_steps", "batch_size", "max_chunks")}
        for kind, names in kinds.items():
            for name in names:
                check_number("FinetuneConfig", name, getattr(self, name), kind,
                             flag=name in _FLAGGED)
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise ValueError(f"FinetuneConfig.warmup_fraction must be in [0, 1), got "
                             f"{self.warmup_fraction!r}")
        if self.max_seq_len < 3:
            raise ValueError(f"FinetuneConfig.max_seq_len={self.max_seq_len} (--max-seq-len) "
                             f"leaves no room for text after [CLS] and [SEP]; use at least 3")

    def steps_for(self, num_examples: int) -> int:
        """Return the optimizer steps of a run on `num_examples` training examples."""
        per_epoch = math.ceil(num_examples / min(self.batch_size, num_examples))
        return max(self.min_steps, math.ceil(self.epochs * per_epoch))

    def to_train_config(self, num_examples: int) -> TrainConfig:
        """Return the `TrainConfig` the training loop runs with (batch capped at the data size)."""
        return TrainConfig(
            max_steps=self.steps_for(num_examples), batch_size=min(self.batch_size, num_examples),
            lr=self.lr, warmup_fraction=self.warmup_fraction, weight_decay=self.weight_decay,
            eval_interval=None, checkpoint_interval=None, device=self.device,
            precision=self.precision, seed=self.seed, progress=self.progress, log_interval=0,
        )


class ClassificationDataset(torch.utils.data.Dataset):
    """Token-id windows with integer labels; `collate` pads a list of them into a batch dict."""

    def __init__(self, sequences: Sequence[Sequence[int]], labels: Sequence[int],
                 tokenizer: Tokenizer):
        if len(sequences) != len(labels):
            raise ValueError(f"{len(sequences)} sequences but {len(labels)} labels")
        self.sequences, self.labels, self.tokenizer = list(sequences), list(labels), tokenizer

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, i: int) -> tuple[Sequence[int], int]:
        return self.sequences[i], self.labels[i]

    def collate(self, items: list[tuple[Sequence[int], int]]) -> dict[str, torch.Tensor]:
        """Return the padded batch dict (with labels) for a list of items."""
        return pad_batch([s for s, _ in items], self.tokenizer, [y for _, y in items])


class ClassificationObjective(Objective):
    """Fine-tuning's objective for the training loop: cross-entropy on the label of [CLS]."""

    name = "classification"

    def counts(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        """Return the denominator of the loss for one batch: its number of examples."""
        return {"sequences": float(batch["labels"].numel())}

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor],
             totals: dict[str, float]) -> torch.Tensor:
        """Return this batch's share of the step's cross-entropy (summed, over the step's
        examples): the same gradient whether a global batch arrives whole, in accumulation
        pieces or split over processes."""
        out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                    labels=batch["labels"])
        return out.loss_sum / max(totals["sequences"], 1.0)


def _as_classifier(source: nn.Module | BertConfig | str | Path, num_labels: int,
                   generator: torch.Generator) -> tuple[BertForSequenceClassification, str]:
    """Return a fresh classifier whose encoder is copied from `source` (random for a config)."""
    if isinstance(source, (str, Path)):
        source = load_model(source)[0]
    if isinstance(source, BertConfig):
        return BertForSequenceClassification(source, num_labels, generator=generator), "random"
    encoder = bert_encoder(source)
    model = BertForSequenceClassification(encoder.config, num_labels, generator=generator)
    # Copy the encoder and pooler (not share them): fine-tuning must not change `source`.
    model.bert.load_state_dict(encoder.state_dict())
    return model.to(next(encoder.parameters()).device), "pretrained"


def predict(model: BertForSequenceClassification, docs: Sequence[Document],
            tokenizer: Tokenizer, *, max_seq_len: int = 128, max_chunks: int = 1,
            batch_size: int = 64) -> np.ndarray:
    """Return the classifier's logits per document, (N, num_labels), averaged over its windows."""

    def read(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits

    return average_over_windows(model, read, model.num_labels, docs, tokenizer,
                                max_seq_len=max_seq_len, max_chunks=max_chunks,
                                batch_size=batch_size)


def finetune_classifier(
    pretrained: nn.Module | BertConfig | str | Path,
    docs: Sequence[Document],
    labels: Sequence[str] | None = None,
    *,
    tokenizer: Tokenizer,
    config: FinetuneConfig | TrainConfig | None = None,
    k_per_class: int | None = None,
    out_dir: str | Path | None = None,
    method: str | None = None,
) -> ClassificationResult:
    """Return the held-out scores of a `BertForSequenceClassification` fine-tuned on the labels
    (the trained model is in `result.model`).

    `pretrained`: a bertlab model (its encoder and pooler are copied; the original is not
    changed), a Hugging Face folder or a pretraining run folder, or a `BertConfig` for a random
    initialisation (the "from scratch" baseline). Training uses the documents whose split is
    "train" (`k_per_class` of each class when given, drawn with `config.seed`) and the training
    loop of `bertlab.train` (AdamW, warmup + linear decay, mixed precision, checkpoints in
    `out_dir` when given); scores are on `config.eval_split`, with the validation accuracy in
    `details`. `config` is a `FinetuneConfig`, or a `TrainConfig` used as is (inputs and the
    split scored then use the `FinetuneConfig` defaults: 128 tokens, one window, test).

    Taught in notebooks/06_cls_and_downstream.ipynb
    """
    if isinstance(config, TrainConfig):  # the loop's settings as given; inputs as the defaults
        if config.unpad:
            raise ValueError("finetune: TrainConfig.unpad=True is a pretraining setting; the "
                             "classifier runs padded batches as they are; pass unpad=False")
        config, train_config = FinetuneConfig(seed=config.seed), config
    else:
        config, train_config = config or FinetuneConfig(), None
    task = labelled_splits(docs, labels, eval_split=config.eval_split, k_per_class=k_per_class,
                           seed=config.seed)

    generator = torch.Generator().manual_seed(config.seed)
    model, init = _as_classifier(pretrained, len(task.label_names), generator)
    check_tokenizer_fits(tokenizer, model.config.vocab_size, "finetune_classifier")
    bert_encoder(model, config.max_seq_len)  # refuses windows longer than the model's positions
    windows = document_chunks([docs[i] for i in task.train], tokenizer, config.max_seq_len,
                              config.max_chunks)
    sequences = [w for doc_windows in windows for w in doc_windows]
    seq_labels = [int(task.y[i]) for i, doc_windows in zip(task.train, windows, strict=True)
                  for _ in doc_windows]
    dataset = ClassificationDataset(sequences, seq_labels, tokenizer)
    train_config = train_config or config.to_train_config(len(dataset))
    loader = EpochLoader(
        dataset, batch_size=train_config.batch_size // train_config.grad_accum,
        sampler=EpochShuffleSampler(len(dataset), config.seed), collate_fn=dataset.collate,
        seed=config.seed)
    run = train_loop(model, loader, train_config, ClassificationObjective(),
                     out_dir=out_dir)
    model.eval()

    def predicted(indices: list[int]) -> np.ndarray:
        logits = predict(model, [docs[i] for i in indices], tokenizer,
                         max_seq_len=config.max_seq_len, max_chunks=config.max_chunks)
        return logits.argmax(-1)

    val_acc = None
    if task.validation:
        val_acc = float((predicted(task.validation) == task.y[task.validation]).mean())
    details = {"init": init, "steps": run.steps, "train_seconds": round(run.elapsed_s, 2),
               "final_train_loss": run.step_losses[-1] if run.step_losses else None,
               "validation_accuracy": val_acc, "finetune_config": asdict(config),
               "train_config": train_config.to_dict(),
               "checkpoint": str(run.checkpoint) if run.checkpoint else None}
    default = "fine-tuned" if init == "pretrained" else "from scratch"
    return task.result(method or default, predicted(task.evaluation), details, model)


def from_scratch(model_config: BertConfig | nn.Module, docs: Sequence[Document],
                 labels: Sequence[str] | None = None, *, tokenizer: Tokenizer,
                 config: FinetuneConfig | TrainConfig | None = None,
                 k_per_class: int | None = None,
                 method: str = "from scratch") -> ClassificationResult:
    """Return the held-out scores of the same architecture and recipe as `finetune_classifier`,
    started from random weights: the baseline that shows what pretraining is worth.

    `model_config`: a `BertConfig`, or a model whose config is reused (its weights are not).

    Taught in notebooks/06_cls_and_downstream.ipynb
    """
    if isinstance(model_config, nn.Module):
        model_config = bert_encoder(model_config).config
    return finetune_classifier(model_config, docs, labels, tokenizer=tokenizer, config=config,
                               k_per_class=k_per_class, method=method)


# ---------------------------------------------------------------------------------------------
# Every method side by side


def _check_task_splits(task: str | Path, docs: Sequence[Document], eval_split: str) -> None:
    """Refuse a task with no training or no `eval_split` documents, in the user's words: the
    documents are split by name, not by a field anyone set."""
    counts = {name: len(part) for name, part in split_documents(docs).items()}
    for name in ("train", eval_split):
        if counts.get(name, 1) == 0:
            raise ValueError(f"task '{task}' is too small: none of its {len(docs)} documents "
                             f"falls in the {name} split (each document goes to train, "
                             f"validation or test by a hash of its name, about 80/10/10); add "
                             f"labelled documents, a few dozen per label or more")


def compare_downstream(
    pretrained: nn.Module,
    tokenizer: Tokenizer,
    task: str | Path = "bbc-topic",
    *,
    config: FinetuneConfig | None = None,
    k_per_class: Sequence[int | None] = (None,),
    seeds: Sequence[int] = (0,),
    methods: Sequence[str] = METHODS,
    read: Mapping[str, Any] | None = None,
) -> list[ClassificationResult]:
    """Return the results of fine-tuning, the [CLS] linear probe, TF-IDF and from-scratch
    training on a task (`load_task`: a name, a labelled folder or a file of rows read with
    `read`), for each labels-per-class budget and seed (`format_table` prints them side by side).
    `config` holds the fine-tuning settings, and what every method reads and is scored on (its
    max_seq_len, max_chunks and eval_split); each run takes its seed from `seeds`.

    Taught in notebooks/06_cls_and_downstream.ipynb
    """
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; choose from {list(METHODS)}")
    config = config or FinetuneConfig()
    check_tokenizer_fits(tokenizer, bert_encoder(pretrained).config.vocab_size,
                         "compare_downstream")
    docs, labels = load_task(task, read=read)
    _check_task_splits(task, docs, config.eval_split)
    features = None
    if "linear probe" in methods:
        features = cls_features(pretrained, docs, tokenizer, max_seq_len=config.max_seq_len,
                                max_chunks=config.max_chunks)
    results = []
    for k in k_per_class:
        for seed in seeds:
            run_config = FinetuneConfig(**{**asdict(config), "seed": seed})
            probe = ProbeConfig(max_seq_len=config.max_seq_len, max_chunks=config.max_chunks,
                                seed=seed, eval_split=config.eval_split)
            for m in methods:
                if m == "fine-tuned":
                    r = finetune_classifier(pretrained, docs, labels, tokenizer=tokenizer,
                                            config=run_config, k_per_class=k)
                    r.model = None  # keep memory flat over many runs
                elif m == "linear probe":
                    r = linear_probe(pretrained, docs, labels, tokenizer=tokenizer, config=probe,
                                     k_per_class=k, features=features)
                elif m == "TF-IDF":
                    r = tfidf_baseline(docs, labels, tokenizer=tokenizer, config=probe,
                                       k_per_class=k)
                else:
                    r = from_scratch(pretrained, docs, labels, tokenizer=tokenizer,
                                     config=run_config, k_per_class=k)
                    r.model = None
                results.append(r)
    return results


def summarize(results: Sequence[ClassificationResult]) -> list[dict]:
    """Return one row per (method, k_per_class): the mean and standard deviation over seeds.

    Standard deviation is the sample one (n - 1); with a single run it is 0.
    """
    groups: dict[tuple[str, int | None], list[ClassificationResult]] = {}
    for r in results:
        groups.setdefault((r.method, r.k_per_class), []).append(r)
    rows = []
    for (method, k), runs in groups.items():
        acc = [r.accuracy for r in runs]
        f1 = [r.macro_f1 for r in runs]
        rows.append({
            "method": method, "k_per_class": k, "runs": len(runs),
            "num_train": runs[0].num_train,
            "accuracy_mean": statistics.fmean(acc),
            "accuracy_std": statistics.stdev(acc) if len(acc) > 1 else 0.0,
            "macro_f1_mean": statistics.fmean(f1),
            "macro_f1_std": statistics.stdev(f1) if len(f1) > 1 else 0.0,
        })
    return rows


def format_table(results: Sequence[ClassificationResult] | Sequence[dict]) -> str:
    """Return a plain-text table of results (or of `summarize` rows): accuracy and macro-F1 in %,
    mean ± std over seeds.

    Taught in notebooks/06_cls_and_downstream.ipynb
    """
    rows = list(results)
    if rows and isinstance(rows[0], ClassificationResult):
        rows = summarize(rows)
    header = f"{'method':<28} {'labels/class':>12} {'runs':>4} {'accuracy %':>13} {'macro-F1 %':>13}"
    lines = [header, "-" * len(header)]
    for r in rows:
        k = "all" if r["k_per_class"] is None else str(r["k_per_class"])
        acc = f"{100 * r['accuracy_mean']:.1f} ± {100 * r['accuracy_std']:.1f}"
        f1 = f"{100 * r['macro_f1_mean']:.1f} ± {100 * r['macro_f1_std']:.1f}"
        lines.append(f"{r['method']:<28} {k:>12} {r['runs']:>4} {acc:>13} {f1:>13}")
    return "\n".join(lines)


