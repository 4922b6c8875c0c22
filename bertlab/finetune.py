"""[CLS] downstream: what pretraining is worth on a classification task, measured four ways.

Every method returns the same `ClassificationResult` (accuracy, macro-F1, confusion matrix on a
held-out split), so their tables line up. Read top to bottom:

- The task: documents and their labels (`bertlab.downstream.load_task` reads a named task,
  "bbc-topic", or your own labelled folder or file); `labelled_splits` sets their training,
  validation and evaluation documents apart.
- The inputs, [CLS] title + first sentences [SEP] (`document_chunks`), and the metrics every
  method reports (`classification_metrics`).
- `linear_probe`: the encoder frozen, logistic regression on its [CLS] vectors (`cls_features`):
  what the pretraining alone put into [CLS].
- `tfidf_baseline`: TF-IDF word and bigram counts + logistic regression, no neural network.
- `finetune_classifier`: a pretrained encoder + a fresh linear layer on the pooled [CLS] vector,
  all weights trained (the recipe of the BERT paper, section 4), with the training loop of
  `bertlab.train` and a classification loss; `FinetuneConfig` holds its settings.
  `from_scratch`: the same architecture and recipe from random weights (the gap to it is what
  pretraining is worth).
- `compare_methods`: all four on one task; `format_table` prints them side by side.

Taught in notebooks/06_cls_and_downstream.ipynb.
"""

from __future__ import annotations

import math
import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from torch import nn

from bertlab.corpus import SPLITS, Document
from bertlab.data import EpochLoader, EpochShuffleSampler
from bertlab.errors import BadInput, check_number, check_type
from bertlab.loading import load_model
from bertlab.model import BertConfig, BertForSequenceClassification, BertModel
from bertlab.tokenizer import check_tokenizer_fits, special_ids
from bertlab.train import Objective, TrainConfig, train_loop

POOLINGS = ("pooled", "cls", "mean")  # which vector of the encoder a probe reads
PROBE_C_GRID = (0.01, 0.1, 1.0, 10.0)  # inverse regularisation strengths tried on validation

# ---------------------------------------------------------------------------------------------
# Labels and splits


def sample_per_class(indices: Sequence[int], labels: Sequence[str], k: int | None,
                     seed: int) -> list[int]:
    """Return `k` indices per class drawn from `indices` (all of them when k is None), sorted.

    Used for the low-label runs: k labelled training documents per class.
    """
    if k is None:
        return sorted(indices)
    if k < 1:
        raise ValueError(f"k (examples per class) must be >= 1 or None for all, got {k}")
    by_class: dict[str, list[int]] = {}
    for i in sorted(indices):
        by_class.setdefault(labels[i], []).append(i)
    short = {c: len(v) for c, v in by_class.items() if len(v) < k}
    if short:
        raise ValueError(f"k={k} examples per class, but some classes have fewer: {short}")
    rng = random.Random(seed)
    return sorted(i for c in sorted(by_class) for i in rng.sample(by_class[c], k))


@dataclass(frozen=True, eq=False)
class LabelledSplits:
    """The documents of one run: class names, each document's class, and which documents train,
    choose settings (validation) and are scored (`eval_split`)."""

    label_names: list[str]
    y: np.ndarray  # (N,) class index of every document
    train: list[int]
    validation: list[int]
    evaluation: list[int]
    eval_split: str
    k_per_class: int | None
    seed: int

    def result(self, method: str, predictions: Sequence[int], details: dict,
               model: object | None = None) -> ClassificationResult:
        """Return the `ClassificationResult` of predictions for the evaluation documents."""
        y_true = self.y[self.evaluation]
        metrics = classification_metrics(y_true, predictions, len(self.label_names))
        return ClassificationResult(
            method, metrics["accuracy"], metrics["macro_f1"], metrics["confusion"],
            self.label_names, self.eval_split, len(self.train), self.k_per_class, self.seed,
            [int(p) for p in predictions], details, model)


def labelled_splits(docs: Sequence[Document], labels: Sequence[str] | None, *, eval_split: str,
                    k_per_class: int | None, seed: int) -> LabelledSplits:
    """Return the checked labels and the train / validation / evaluation documents of a run
    (`k_per_class` training documents of each class when given, drawn with `seed`).

    `labels=None` reads each document's label field; every Document carries its split.
    """
    if labels is None:
        labels = [d.label for d in docs]
    labels = list(labels)
    if len(labels) != len(docs):
        raise ValueError(
            f"labels has {len(labels)} entries but docs has {len(docs)}; pass one label per "
            f"document, in the same order (or labels=None to use each document's label field)"
        )
    missing = [d.id for d, y in zip(docs, labels, strict=True) if y is None]
    if missing:
        raise ValueError(
            f"{len(missing)} document(s) have no label, e.g. {missing[:3]}; label them or drop them"
        )
    labels = [str(y) for y in labels]
    names = sorted(set(labels))
    if len(names) < 2:
        raise ValueError(
            f"labels contain only one class ({names[0]!r}); a classifier needs at least two"
        )
    if eval_split not in ("validation", "test"):
        raise ValueError(f"eval_split={eval_split!r}; use 'validation' or 'test'")
    by_split: dict[str, list[int]] = {s: [] for s in SPLITS}
    for i, d in enumerate(docs):
        by_split[d.split].append(i)
    for name in ("train", eval_split):
        if not by_split[name]:
            raise ValueError(
                f"no document has split={name!r}; every Document carries a split field "
                f"(train / validation / test, set from its id), so pass documents from all splits"
            )
    train_classes = {labels[i] for i in by_split["train"]}
    if len(train_classes) < 2:
        raise ValueError(
            f"the train split has only the class {sorted(train_classes)}; it needs at least two"
        )
    train = sample_per_class(by_split["train"], labels, k_per_class, seed)
    y = np.array([names.index(label) for label in labels])
    return LabelledSplits(names, y, train, by_split["validation"], by_split[eval_split],
                          eval_split, k_per_class, seed)


# ---------------------------------------------------------------------------------------------
# Inputs: [CLS] title + first sentences [SEP]
#
# One segment, cut to `max_seq_len` tokens. News is written as an inverted pyramid (the headline
# and first paragraph say what the story is about), so the start of an article is where its topic
# lives; `max_chunks > 1` also reads the rest of the document in windows and averages over them.


def document_text(doc: Document) -> str:
    """Return the text a classifier reads for a document: the title (if any), then the body."""
    return " ".join(([doc.title] if doc.title else []) + list(doc.sentences))


def document_chunks(docs: Sequence[Document], tokenizer: Tokenizer, max_seq_len: int = 128,
                    max_chunks: int = 1) -> list[list[list[int]]]:
    """Return, per document, up to `max_chunks` windows of token ids (no specials), each at most
    `max_seq_len - 2` long: the first window is the title + first sentences, the next ones
    continue where it stopped.
    """
    budget = max_seq_len - 2  # room for [CLS] and [SEP]
    if budget < 1:
        raise ValueError(f"max_seq_len={max_seq_len} leaves no room for text; use at least 3")
    if max_chunks < 1:
        raise ValueError(f"max_chunks must be >= 1, got {max_chunks}")
    want = budget * max_chunks
    # Encoding whole articles is the slow part. On BBC News 126 tokens span at most ~6 characters
    # per token, so the first 8 x want characters hold enough; any document where they don't is
    # re-encoded in full, so the result never depends on this shortcut.
    heads = [document_text(doc)[: 8 * want] for doc in docs]
    encoded = [e.ids for e in tokenizer.encode_batch(heads, add_special_tokens=False)]
    redo = [i for i, (ids, head, doc) in enumerate(zip(encoded, heads, docs, strict=True))
            if len(ids) < want and len(head) < len(document_text(doc))]
    if redo:
        full = tokenizer.encode_batch([document_text(docs[i]) for i in redo], add_special_tokens=False)
        for i, enc in zip(redo, full, strict=True):
            encoded[i] = enc.ids
    out = []
    for ids in encoded:
        ids = ids[:want]
        chunks = [ids[s : s + budget] for s in range(0, len(ids), budget)] or [[]]
        out.append(chunks)
    return out


def pad_batch(sequences: Sequence[Sequence[int]], tokenizer: Tokenizer,
              labels: Sequence[int] | None = None) -> dict[str, torch.Tensor]:
    """Return a batch dict for single-segment inputs: `[CLS] ids [SEP]`, padded to the longest.

    Keys: input_ids, token_type_ids (all 0: one segment), attention_mask (1 = real token), and
    labels when given.
    """
    ids = special_ids(tokenizer)
    if labels is not None and len(labels) != len(sequences):
        raise ValueError(f"pad_batch: {len(labels)} labels for {len(sequences)} sequences")
    T = max(len(s) for s in sequences) + 2
    input_ids = torch.full((len(sequences), T), ids.pad, dtype=torch.long)  # (B, T)
    attention_mask = torch.zeros((len(sequences), T), dtype=torch.long)
    for row, seq in enumerate(sequences):
        n = len(seq) + 2
        input_ids[row, :n] = torch.tensor([ids.cls, *seq, ids.sep], dtype=torch.long)
        attention_mask[row, :n] = 1
    batch = {"input_ids": input_ids, "token_type_ids": torch.zeros_like(input_ids),
             "attention_mask": attention_mask}
    if labels is not None:
        batch["labels"] = torch.as_tensor(list(labels), dtype=torch.long)
    return batch


def bert_encoder(model: nn.Module, max_seq_len: int | None = None) -> BertModel:
    """Return the `BertModel` inside a bertlab model, checking it has positions for
    `max_seq_len` tokens when given."""
    encoder = model if isinstance(model, BertModel) else getattr(model, "bert", None)
    check_type(encoder, BertModel, "model", "a bertlab BertModel, BertForPreTraining or "
               "BertForSequenceClassification", "pass a model bl.load_model or "
               "bl.BertForPreTraining gives")
    positions = encoder.config.max_position_embeddings
    if max_seq_len is not None and max_seq_len > positions:
        raise ValueError(f"max_seq_len={max_seq_len} is longer than the model's "
                         f"max_position_embeddings={positions}; use max_seq_len <= {positions}")
    return encoder


@torch.no_grad()
def average_over_windows(model: nn.Module, read: Callable[[dict[str, torch.Tensor]], torch.Tensor],
                         width: int, docs: Sequence[Document], tokenizer: Tokenizer, *,
                         max_seq_len: int, max_chunks: int, batch_size: int) -> np.ndarray:
    """Return `read(batch)` per document, (N, width), averaged over the document's windows.

    `read` maps a padded batch of windows to one (B, width) row each; `model` is run in eval mode
    (no dropout) and put back in the mode it was in.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    chunks = document_chunks(docs, tokenizer, max_seq_len, max_chunks)
    flat = [(d, c) for d, doc_chunks in enumerate(chunks) for c in doc_chunks]
    sums = torch.zeros(len(docs), width, dtype=torch.float64)
    try:
        for start in range(0, len(flat), batch_size):
            part = flat[start : start + batch_size]
            batch = {k: v.to(device) for k, v in pad_batch([c for _, c in part], tokenizer).items()}
            sums.index_add_(0, torch.tensor([d for d, _ in part]), read(batch).double().cpu())
    finally:
        model.train(was_training)
    counts = torch.tensor([len(c) for c in chunks], dtype=torch.float64).unsqueeze(1)
    return (sums / counts).float().numpy()


# ---------------------------------------------------------------------------------------------
# Metrics and results


def classification_metrics(y_true: Sequence[int], y_pred: Sequence[int],
                           num_labels: int) -> dict[str, float | list[list[int]]]:
    """Return accuracy, macro-F1 and the confusion matrix (rows = true class, columns = predicted).

    Macro-F1 is the unweighted mean of the per-class F1 scores; a class never predicted and
    never present scores 0 (as scikit-learn's `zero_division=0`).

    Taught in notebooks/06_cls_and_downstream.ipynb
    """
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    if y_true.shape != y_pred.shape:
        raise ValueError(f"{len(y_true)} true labels but {len(y_pred)} predictions")
    confusion = np.zeros((num_labels, num_labels), dtype=np.int64)
    np.add.at(confusion, (y_true, y_pred), 1)
    tp = np.diag(confusion).astype(float)
    predicted, actual = confusion.sum(0), confusion.sum(1)
    denom = predicted + actual
    f1 = np.divide(2 * tp, denom, out=np.zeros_like(tp), where=denom > 0)
    return {
        "accuracy": float(tp.sum() / max(1, len(y_true))),
        "macro_f1": float(f1.mean()),
        "confusion": confusion.tolist(),
    }


@dataclass
class ClassificationResult:
    """What every downstream method returns: its scores on the held-out split, and how it got them.

    `k_per_class` is None for a run on the whole train split. `model` (the trained classifier, if
    there is one) is left out of `to_dict`.
    """

    method: str
    accuracy: float
    macro_f1: float
    confusion: list[list[int]]
    label_names: list[str]
    split: str
    num_train: int
    k_per_class: int | None
    seed: int
    predictions: list[int]
    details: dict = field(default_factory=dict)
    model: object | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        """Return the result as JSON-ready data (without the model)."""
        out = asdict(self)  # deep-copies fields; the model is dropped just after
        out.pop("model")
        return out


# ---------------------------------------------------------------------------------------------
# Frozen features: [CLS] vectors and the linear probe


def cls_features(model: nn.Module, docs: Sequence[Document], tokenizer: Tokenizer, *,
                 pooling: str = "pooled", max_seq_len: int = 128, max_chunks: int = 1,
                 batch_size: int = 64) -> np.ndarray:
    """Return one vector per document, (N, hidden_size), read from the frozen encoder.

    `pooling`: "pooled" = the pooler's tanh(W h_[CLS] + b), what the NSP head and the
    classifier read; "cls" = the last layer's raw [CLS] hidden state; "mean" = the average of
    the real tokens' vectors (not [CLS]; a reference point). With `max_chunks > 1` the vectors of
    a document's windows are averaged. The model is run in eval mode (no dropout).

    Taught in notebooks/06_cls_and_downstream.ipynb
    """
    if pooling not in POOLINGS:
        raise ValueError(f"pooling={pooling!r}; choose one of {', '.join(POOLINGS)}")
    encoder = bert_encoder(model, max_seq_len)

    def read(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        out = encoder(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        if pooling == "pooled":
            return out.pooler_output  # (B, d)
        if pooling == "cls":
            return out.last_hidden_state[:, 0]  # (B, T, d) -> (B, d)
        mask = batch["attention_mask"].unsqueeze(-1).to(out.last_hidden_state.dtype)
        return (out.last_hidden_state * mask).sum(1) / mask.sum(1)  # (B, T, d) -> (B, d)

    return average_over_windows(encoder, read, encoder.config.hidden_size, docs, tokenizer,
                                max_seq_len=max_seq_len, max_chunks=max_chunks,
                                batch_size=batch_size)


def _fit_logistic(x_train, y_train, x_val, y_val, C: float | None, seed: int):
    """Return (fitted logistic regression, its C): C is picked on the validation split among
    PROBE_C_GRID when None (C = 1 when there is no validation data)."""
    from sklearn.linear_model import LogisticRegression  # heavy to import; only baselines need it

    def fit(c: float):
        return LogisticRegression(C=c, max_iter=1000, solver="newton-cg",
                                  random_state=seed).fit(x_train, y_train)

    if C is not None or len(y_val) == 0:
        c = 1.0 if C is None else C
        return fit(c), c
    best = None
    for c in PROBE_C_GRID:
        clf = fit(c)
        score = float((clf.predict(x_val) == np.asarray(y_val)).mean())
        if best is None or score > best[0]:  # ties keep the stronger regularisation
            best = (score, c, clf)
    return best[2], best[1]


@dataclass
class ProbeConfig:
    """Every setting of the linear probe and the TF-IDF baseline, with its default.

    `tfidf_baseline` reads `C`, `max_seq_len` (None: whole documents, as words), `seed` and
    `eval_split`; `pooling` and `max_chunks` are the probe's alone. `compare_methods` builds
    one per seed from its `FinetuneConfig`, so every method reads and scores the same text.

    Taught in notebooks/06_cls_and_downstream.ipynb
    """

    pooling: str = "pooled"  # the vector the probe reads (POOLINGS; see `cls_features`)
    C: float | None = None  # inverse regularisation; None: chosen on validation (PROBE_C_GRID)
    max_seq_len: int | None = 128  # tokens per window: [CLS] title + first sentences [SEP]
    max_chunks: int = 1  # windows per document, their vectors averaged
    seed: int = 0  # draws the k_per_class documents; the solver's random_state
    eval_split: str = "test"  # the split scored ("validation" while choosing settings)

    def __post_init__(self) -> None:
        if self.pooling not in POOLINGS:
            raise ValueError(f"ProbeConfig.pooling={self.pooling!r}; choose one of "
                             f"{', '.join(POOLINGS)}")
        check_number("ProbeConfig", "C", self.C, "positive number", none_ok=True)


def linear_probe(model: nn.Module, docs: Sequence[Document], labels: Sequence[str] | None = None,
                 *, tokenizer: Tokenizer, config: ProbeConfig | None = None,
                 k_per_class: int | None = None, features: np.ndarray | None = None,
                 method: str | None = None) -> ClassificationResult:
    """Return the held-out scores of logistic regression on the frozen encoder's [CLS] vectors.

    The encoder is not changed: this measures what pretraining alone put into [CLS]. Features
    are standardised (mean 0, variance 1 on the train split); the inverse regularisation C is
    chosen on the validation split unless `config.C` gives it. Training uses `k_per_class`
    documents of each class when given (drawn with `config.seed`). Pass `features` (from
    `cls_features`, aligned with `docs`) to reuse them across seeds and label budgets.

    The default reads the pooled output, because that is the vector the NSP head was trained
    on and the one a fine-tuned classifier starts from; `ProbeConfig(pooling="cls")` reads the
    raw hidden state of [CLS] instead (after MLM-only pretraining the pooler never received a
    gradient, so comparing the two separates "the encoder learned it" from "the pooler learned
    it").

    Taught in notebooks/06_cls_and_downstream.ipynb
    """
    config = config or ProbeConfig()
    if config.max_seq_len is None:
        raise ValueError("linear_probe: ProbeConfig.max_seq_len=None reads whole documents as "
                         "words, which only tfidf_baseline does; pass the tokens per window "
                         "(e.g. 128), and max_chunks > 1 to read more of each document")
    check_type(model, nn.Module, "linear_probe(model)", "a bertlab model",
               "pass the model bl.load_model gives")
    check_inputs("linear_probe", docs, tokenizer)
    task = labelled_splits(docs, labels, eval_split=config.eval_split, k_per_class=k_per_class,
                           seed=config.seed)
    if features is None:
        features = cls_features(model, docs, tokenizer, pooling=config.pooling,
                                max_seq_len=config.max_seq_len, max_chunks=config.max_chunks)
    elif len(features) != len(docs):
        raise ValueError(f"features has {len(features)} rows but docs has {len(docs)}; compute them "
                         f"with cls_features(model, docs, ...) on the same documents")
    train, val, y = task.train, task.validation, task.y
    mean = features[train].mean(0)
    std = features[train].std(0) + 1e-6
    x = (features - mean) / std
    start = time.perf_counter()
    clf, chosen = _fit_logistic(x[train], y[train], x[val], y[val], config.C, config.seed)
    pred = clf.predict(x[task.evaluation])
    details = {"pooling": config.pooling, "C": chosen, "max_seq_len": config.max_seq_len,
               "max_chunks": config.max_chunks, "fit_seconds": time.perf_counter() - start}
    return task.result(method or f"linear probe ({config.pooling})", pred, details)


# ---------------------------------------------------------------------------------------------
# Baseline without a network: TF-IDF + logistic regression


def tfidf_baseline(docs: Sequence[Document], labels: Sequence[str] | None = None, *,
                   tokenizer: Tokenizer | None = None, config: ProbeConfig | None = None,
                   k_per_class: int | None = None, method: str = "TF-IDF + logistic regression",
                   ) -> ClassificationResult:
    """Return the held-out scores of TF-IDF (words and word pairs) + logistic regression.

    With a `tokenizer` and `config.max_seq_len`, it reads exactly the WordPiece tokens the BERT
    models read (the first window), so the comparison is about the model, not the input; with
    `ProbeConfig(max_seq_len=None)` it reads whole documents as words (a stronger, more common
    baseline). C is chosen on the validation split unless `config.C` gives it; `k_per_class`
    and `config.seed` draw the training documents as for `linear_probe`.

    Taught in notebooks/06_cls_and_downstream.ipynb
    """
    from sklearn.feature_extraction.text import TfidfVectorizer  # heavy to import; see above

    config = config or ProbeConfig()
    max_seq_len = config.max_seq_len
    task = labelled_splits(docs, labels, eval_split=config.eval_split, k_per_class=k_per_class,
                           seed=config.seed)
    if max_seq_len is None:
        texts = [document_text(d) for d in docs]
        vectorizer = TfidfVectorizer(sublinear_tf=True, ngram_range=(1, 2), lowercase=True)
    else:
        if tokenizer is None:
            raise ValueError("tfidf_baseline: pass tokenizer= to read the model's WordPiece "
                             "window, or config=ProbeConfig(max_seq_len=None) to read whole "
                             "documents as words")
        windows = document_chunks(docs, tokenizer, max_seq_len)
        texts = [" ".join(map(str, w[0])) for w in windows]  # token ids as "words"
        vectorizer = TfidfVectorizer(sublinear_tf=True, ngram_range=(1, 2), lowercase=False,
                                     token_pattern=r"\S+")
    train, val, y = task.train, task.validation, task.y
    start = time.perf_counter()
    x_train = vectorizer.fit_transform([texts[i] for i in train])
    x_val = vectorizer.transform([texts[i] for i in val]) if val else None
    clf, chosen = _fit_logistic(x_train, y[train], x_val, y[val], config.C, config.seed)
    pred = clf.predict(vectorizer.transform([texts[i] for i in task.evaluation]))
    details = {"C": chosen, "max_seq_len": max_seq_len, "features": x_train.shape[1],
               "fit_seconds": time.perf_counter() - start}
    return task.result(method, pred, details)


# ---------------------------------------------------------------------------------------------
# Fine-tuning: every weight trained on the task, from pretrained or from random weights

METHODS = ("fine-tuned", "linear probe", "TF-IDF", "from scratch")  # what compare_methods runs


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
                check_number("FinetuneConfig", name, getattr(self, name), kind)
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise ValueError(f"FinetuneConfig.warmup_fraction must be in [0, 1), got "
                             f"{self.warmup_fraction!r}")
        if self.max_seq_len < 3:
            raise ValueError(f"FinetuneConfig.max_seq_len={self.max_seq_len} "
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


def _as_classifier(source: nn.Module | BertConfig, num_labels: int,
                   generator: torch.Generator) -> tuple[BertForSequenceClassification, str]:
    """Return a fresh classifier whose encoder is copied from `source` (random for a config)."""
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


def classify(model: BertForSequenceClassification, tokenizer: Tokenizer, texts: Sequence[str],
             *, max_seq_len: int = 128, max_chunks: int = 1) -> np.ndarray:
    """Return each label's probability for each text, (N, num_labels): the softmax of the
    classifier's logits, read as fine-tuning read its documents (the first `max_seq_len` tokens,
    in up to `max_chunks` windows whose logits are averaged)."""
    check_type(model, BertForSequenceClassification, "classify(model)",
               "a bertlab BertForSequenceClassification",
               "pass the classifier finetune_classifier trained, or bl.load_model(folder)[0] of "
               "a folder finetune --out saved")
    check_type(texts, (list, tuple), "classify(texts)", "a list of strings",
               "pass a list of the texts to classify")
    empty = [i for i, t in enumerate(texts) if not isinstance(t, str) or not t.strip()]
    if not texts or empty:
        raise BadInput(f"classify(texts[{empty[0]}])" if empty else "classify(texts=[])",
                       "is not a text with words in it", "pass non-empty strings")
    docs = [Document(id=str(i), text=t, sentences=[t]) for i, t in enumerate(texts)]
    logits = predict(model, docs, tokenizer, max_seq_len=max_seq_len, max_chunks=max_chunks)
    return torch.softmax(torch.from_numpy(logits).double(), dim=-1).numpy()


def finetune_classifier(
    pretrained: nn.Module | BertConfig,
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
    changed), a run folder or Hugging Face folder (its model, `bertlab.loading.load_model`), or a
    `BertConfig` for a random initialisation (the "from scratch" baseline). Training uses the documents whose split is "train" (`k_per_class` of each class when given, drawn with `config.seed`) and the training
    loop of `bertlab.train` (AdamW, warmup + linear decay, mixed precision, checkpoints in
    `out_dir` when given); scores are on `config.eval_split`, with the validation accuracy in
    `details`. `config` is a `FinetuneConfig`, or a `TrainConfig` used as is (inputs and the
    split scored then use the `FinetuneConfig` defaults: 128 tokens, one window, test).

    Taught in notebooks/06_cls_and_downstream.ipynb
    """
    check_type(pretrained, (nn.Module, BertConfig, str, os.PathLike), "finetune_classifier(pretrained)",
               "a bertlab model or a BertConfig", "pass the model bl.load_model gives, or a "
               "BertConfig for a random start")
    check_inputs("finetune_classifier", docs, tokenizer)
    if isinstance(pretrained, (str, os.PathLike)):
        pretrained = load_model(pretrained)[0]
    check_type(config, (FinetuneConfig, TrainConfig, type(None)), "finetune_classifier(config)",
               "a FinetuneConfig, a TrainConfig or None", "pass bl.FinetuneConfig(...)")
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


def check_inputs(caller: str, docs: Sequence[Document], tokenizer: Tokenizer) -> None:
    """Raise `BadInput` naming `caller`'s argument unless `docs` is a list of Documents and
    `tokenizer` a tokenizers.Tokenizer."""
    check_type(docs, (list, tuple), f"{caller}(docs)", "a list of Documents",
               "pass the documents bl.load_corpus (or load_task) returns")
    if not docs:
        raise BadInput(f"{caller}(docs=[])", "holds no document",
                       "pass the documents bl.load_corpus (or load_task) returns")
    check_type(tokenizer, Tokenizer, f"{caller}(tokenizer)", "a tokenizers.Tokenizer",
               "pass the tokenizer the model was trained with")


def check_methods(methods: Sequence[str]) -> None:
    """Raise if `methods` names one that is not in `METHODS`."""
    check_type(methods, (list, tuple, str), "methods", "a list of method names",
               f"pass a list of one or more of {list(METHODS)}")
    if isinstance(methods, str) or not methods:
        raise BadInput(f"methods={methods!r}", "names no method" if not isinstance(methods, str)
                       else "is one string, not a list of names",
                       f"pass a list of one or more of {list(METHODS)}")
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; choose from {list(METHODS)}")


def compare_methods(
    pretrained: nn.Module,
    tokenizer: Tokenizer,
    docs: Sequence[Document],
    labels: Sequence[str] | None = None,
    *,
    config: FinetuneConfig | None = None,
    k_per_class: Sequence[int | None] = (None,),
    seeds: Sequence[int] = (0,),
    methods: Sequence[str] = METHODS,
) -> list[ClassificationResult]:
    """Return the results of fine-tuning, the [CLS] linear probe, TF-IDF and from-scratch
    training on the documents and their labels (each document's `label` when `labels` is None),
    for each labels-per-class budget and seed (`format_table` prints them side by side).
    `config` holds the fine-tuning settings, and what every method reads and is scored on (its
    max_seq_len, max_chunks and eval_split); each run takes its seed from `seeds`.
    `bertlab.downstream.compare_downstream` reads a named task or your own folder, then calls
    this.

    Taught in notebooks/06_cls_and_downstream.ipynb
    """
    # A generator is read once, here: every budget and seed below iterates these lists.
    methods, k_per_class, seeds = (v if isinstance(v, (str, int)) or v is None else list(v)
                                   for v in (methods, k_per_class, seeds))
    check_methods(methods)
    for name, values in (("k_per_class", k_per_class), ("seeds", seeds)):
        if not isinstance(values, list) or not values:
            raise BadInput(f"compare_methods({name}={values!r})", "is not a non-empty list, so "
                           "there would be no run to compare", f"pass a list, e.g. {name}="
                           f"{[None] if name == 'k_per_class' else [0]}")
    config = config or FinetuneConfig()
    check_tokenizer_fits(tokenizer, bert_encoder(pretrained).config.vocab_size,
                         "compare_methods")
    features = None
    if "linear probe" in methods:
        features = cls_features(pretrained, docs, tokenizer, max_seq_len=config.max_seq_len,
                                max_chunks=config.max_chunks)
    results = []
    one_run = len(k_per_class) * len(seeds) == 1  # its fine-tuned model is kept, to be saved
    for k in k_per_class:
        for seed in seeds:
            run_config = FinetuneConfig(**{**asdict(config), "seed": seed})
            probe = ProbeConfig(max_seq_len=config.max_seq_len, max_chunks=config.max_chunks,
                                seed=seed, eval_split=config.eval_split)
            for m in methods:
                if m == "fine-tuned":
                    r = finetune_classifier(pretrained, docs, labels, tokenizer=tokenizer,
                                            config=run_config, k_per_class=k)
                    if not one_run:
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
    check_type(results, (list, tuple), "format_table(results)", "a list of results",
               "pass what compare_methods or bl.compare_downstream returns")
    if not results:
        raise BadInput("format_table(results=[])", "holds no result", "pass what "
                       "compare_methods or bl.compare_downstream returns (one or more)")
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
