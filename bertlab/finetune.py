"""[CLS] downstream: fine-tuning a classifier, linear probes on [CLS], and the baselines beside them.

Every method returns the same `ClassificationResult` (accuracy, macro-F1, confusion matrix on a
held-out split), so their tables line up:

- `finetune_classifier`: a pretrained encoder + a fresh linear layer on the pooled [CLS] vector,
  all weights trained (the recipe of the BERT paper, section 4);
- `linear_probe`: the encoder frozen; logistic regression on its [CLS] vectors (what the
  pretraining alone put into [CLS]);
- `tfidf_baseline`: TF-IDF word/bigram counts + logistic regression (no neural network);
- `from_scratch`: the same architecture and recipe as `finetune_classifier`, random init
  (what pretraining is worth).

Inputs: one segment, `[CLS] title + first sentences [SEP]`, cut to `max_seq_len` tokens. News
is written as an inverted pyramid (the headline and first paragraph say what the story is about),
so the start of an article is where its topic lives; `max_chunks > 1` also reads the rest of
the document in windows and averages over them.

Taught in notebooks/06_cls_and_downstream.ipynb
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from torch import nn

from bertlab.corpus import SPLITS, Document, load_corpus
from bertlab.data import EpochShuffleSampler
from bertlab.model import BertConfig, BertForSequenceClassification, BertModel
from bertlab.tokenizer import special_ids
from bertlab.train import TrainConfig, load_run, train_loop

POOLINGS = ("pooled", "cls", "mean")  # which vector of the encoder a probe reads

# ---------------------------------------------------------------------------------------------
# Tasks and labels


@dataclass(frozen=True)
class DownstreamTask:
    """A named classification task: which corpus, and which field of a `Document` is the label."""

    name: str
    corpus: str
    description: str

    def load(self) -> tuple[list[Document], list[str]]:
        """Return the task's documents and their labels (aligned lists)."""
        docs = load_corpus(self.corpus)
        return docs, [d.label for d in docs]


TASKS: dict[str, DownstreamTask] = {
    "bbc-topic": DownstreamTask("bbc-topic", "bbc", "BBC News topic, 5 classes "
                                "(business, entertainment, politics, sports, tech)"),
}


def load_task(name: str) -> tuple[list[Document], list[str]]:
    """Return (documents, labels) of a named downstream task such as "bbc-topic".

    Taught in notebooks/06_cls_and_downstream.ipynb
    """
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}")
    return TASKS[name].load()


def _check_labels(docs: Sequence[Document], labels: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """Return (labels, sorted label names) after checking they fit the documents."""
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
    names = sorted({str(y) for y in labels})
    if len(names) < 2:
        raise ValueError(
            f"labels contain only one class ({names[0]!r}); a classifier needs at least two"
        )
    return [str(y) for y in labels], names


def _split_indices(docs: Sequence[Document], labels: Sequence[str], eval_split: str,
                   ) -> tuple[list[int], list[int], list[int]]:
    """Return the indices of the train, validation and evaluation documents."""
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
    return by_split["train"], by_split["validation"], by_split[eval_split]


def sample_per_class(indices: Sequence[int], labels: Sequence[str], k: int | None,
                     seed: int) -> list[int]:
    """Return `k` indices per class drawn from `indices` (all of them when k is None), sorted.

    Used for the low-label runs: k labelled training documents per class.

    Taught in notebooks/06_cls_and_downstream.ipynb
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


# ---------------------------------------------------------------------------------------------
# Encoding: [CLS] title + first sentences [SEP]


def document_text(doc: Document) -> str:
    """Return the text a classifier reads for a document: the title (if any), then the body."""
    return " ".join(([doc.title] if doc.title else []) + list(doc.sentences))


def document_chunks(docs: Sequence[Document], tokenizer: Tokenizer, max_seq_len: int = 128,
                    max_chunks: int = 1) -> list[list[list[int]]]:
    """Return, per document, up to `max_chunks` windows of token ids (no specials), each at most
    `max_seq_len - 2` long: the first window is the title + first sentences, the next ones
    continue where it stopped.

    Taught in notebooks/06_cls_and_downstream.ipynb
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
    heads = []
    for doc in docs:
        text = document_text(doc)
        heads.append(text[: 8 * want])
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

    Taught in notebooks/06_cls_and_downstream.ipynb
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


def encode_for_classification(docs_or_texts: Sequence[Document | str], tokenizer: Tokenizer,
                              max_seq_len: int = 128, batch_size: int = 64,
                              ) -> Iterator[dict[str, torch.Tensor]]:
    """Yield padded batches (`[CLS] text [SEP]`, first window only) for documents or strings.

    Taught in notebooks/06_cls_and_downstream.ipynb
    """
    docs = [d if isinstance(d, Document) else Document(id=f"text/{i}", text=d, sentences=[d])
            for i, d in enumerate(docs_or_texts)]
    chunks = document_chunks(docs, tokenizer, max_seq_len)
    for start in range(0, len(docs), batch_size):
        yield pad_batch([c[0] for c in chunks[start : start + batch_size]], tokenizer)


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

    Taught in notebooks/06_cls_and_downstream.ipynb
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


def _result(method: str, y_true: Sequence[int], y_pred: Sequence[int], label_names: list[str],
            split: str, num_train: int, k: int | None, seed: int, details: dict,
            model: object | None = None) -> ClassificationResult:
    metrics = classification_metrics(y_true, y_pred, len(label_names))
    return ClassificationResult(method, metrics["accuracy"], metrics["macro_f1"],
                                metrics["confusion"], label_names, split, num_train, k, seed,
                                [int(p) for p in y_pred], details, model)


def summarize(results: Sequence[ClassificationResult]) -> list[dict]:
    """Return one row per (method, k_per_class): the mean and standard deviation over seeds.

    Standard deviation is the sample one (n - 1); with a single run it is 0.

    Taught in notebooks/06_cls_and_downstream.ipynb
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


# ---------------------------------------------------------------------------------------------
# Frozen features: [CLS] vectors and the linear probe


def _check_seq_len(max_seq_len: int, model: nn.Module) -> None:
    positions = _encoder(model).config.max_position_embeddings
    if max_seq_len > positions:
        raise ValueError(f"max_seq_len={max_seq_len} is longer than the model's "
                         f"max_position_embeddings={positions}; use max_seq_len <= {positions}")


def _encoder(model: nn.Module) -> BertModel:
    if isinstance(model, BertModel):
        return model
    encoder = getattr(model, "bert", None)
    if not isinstance(encoder, BertModel):
        raise TypeError(
            f"expected a bertlab BertModel, BertForPreTraining or BertForSequenceClassification, "
            f"got {type(model).__name__}"
        )
    return encoder


@torch.no_grad()
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
    encoder = _encoder(model)
    _check_seq_len(max_seq_len, encoder)
    was_training = encoder.training
    encoder.eval()
    device = next(encoder.parameters()).device
    chunks = document_chunks(docs, tokenizer, max_seq_len, max_chunks)
    flat = [(d, c) for d, doc_chunks in enumerate(chunks) for c in doc_chunks]
    sums = torch.zeros(len(docs), encoder.config.hidden_size, dtype=torch.float64)
    try:
        for start in range(0, len(flat), batch_size):
            part = flat[start : start + batch_size]
            batch = {k: v.to(device) for k, v in pad_batch([c for _, c in part], tokenizer).items()}
            out = encoder(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
            if pooling == "pooled":
                vectors = out.pooler_output  # (B, d)
            elif pooling == "cls":
                vectors = out.last_hidden_state[:, 0]  # (B, T, d) -> (B, d)
            else:
                mask = batch["attention_mask"].unsqueeze(-1).to(out.last_hidden_state.dtype)
                vectors = (out.last_hidden_state * mask).sum(1) / mask.sum(1)  # (B, T, d) -> (B, d)
            sums.index_add_(0, torch.tensor([d for d, _ in part]), vectors.double().cpu())
    finally:
        encoder.train(was_training)
    counts = torch.tensor([len(c) for c in chunks], dtype=torch.float64).unsqueeze(1)
    return (sums / counts).float().numpy()


PROBE_C_GRID = (0.01, 0.1, 1.0, 10.0)


def _fit_logistic(x_train, y_train, x_val, y_val, C: float | None, seed: int):
    """Return (fitted logistic regression, its C): C is picked on the validation split among
    PROBE_C_GRID when None (C = 1 when there is no validation data)."""
    from sklearn.linear_model import LogisticRegression

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


def linear_probe(model: nn.Module, docs: Sequence[Document], labels: Sequence[str] | None = None,
                 *, tokenizer: Tokenizer, pooling: str = "pooled", k_per_class: int | None = None,
                 seed: int = 0, eval_split: str = "test", C: float | None = None,
                 max_seq_len: int = 128, max_chunks: int = 1, features: np.ndarray | None = None,
                 method: str | None = None) -> ClassificationResult:
    """Return the held-out scores of logistic regression on the frozen encoder's [CLS] vectors.

    The encoder is not changed: this measures what pretraining alone put into [CLS]. Features
    are standardised (mean 0, variance 1 on the train split); the inverse regularisation C is
    chosen on the validation split unless given. Pass `features` (from `cls_features`, aligned
    with `docs`) to reuse them across seeds and label budgets.

    The default reads the pooled output, because that is the vector the NSP head was trained
    on and the one a fine-tuned classifier starts from; `pooling="cls"` reads the raw hidden
    state of [CLS] instead (after MLM-only pretraining the pooler never received a gradient, so
    comparing the two separates "the encoder learned it" from "the pooler learned it").

    Taught in notebooks/06_cls_and_downstream.ipynb
    """
    labels, names = _check_labels(docs, labels)
    train_idx, val_idx, eval_idx = _split_indices(docs, labels, eval_split)
    train_idx = sample_per_class(train_idx, labels, k_per_class, seed)
    if features is None:
        features = cls_features(model, docs, tokenizer, pooling=pooling, max_seq_len=max_seq_len,
                                max_chunks=max_chunks)
    elif len(features) != len(docs):
        raise ValueError(f"features has {len(features)} rows but docs has {len(docs)}; compute them "
                         f"with cls_features(model, docs, ...) on the same documents")
    y = np.array([names.index(label) for label in labels])
    mean = features[train_idx].mean(0)
    std = features[train_idx].std(0) + 1e-6
    x = (features - mean) / std
    start = time.perf_counter()
    clf, chosen = _fit_logistic(x[train_idx], y[train_idx], x[val_idx], y[val_idx], C, seed)
    pred = clf.predict(x[eval_idx])
    details = {"pooling": pooling, "C": chosen, "max_seq_len": max_seq_len,
               "max_chunks": max_chunks, "fit_seconds": time.perf_counter() - start}
    return _result(method or f"linear probe ({pooling})", y[eval_idx], pred, names, eval_split,
                   len(train_idx), k_per_class, seed, details)


# ---------------------------------------------------------------------------------------------
# Baseline without a network: TF-IDF + logistic regression


def tfidf_baseline(docs: Sequence[Document], labels: Sequence[str] | None = None, *,
                   tokenizer: Tokenizer | None = None, k_per_class: int | None = None,
                   seed: int = 0, eval_split: str = "test", C: float | None = None,
                   max_seq_len: int | None = 128, method: str = "TF-IDF + logistic regression",
                   ) -> ClassificationResult:
    """Return the held-out scores of TF-IDF (words and word pairs) + logistic regression.

    With a `tokenizer` and `max_seq_len`, it reads exactly the WordPiece tokens the BERT models
    read (the first window), so the comparison is about the model, not the input; with
    `max_seq_len=None` it reads whole documents as words (a stronger, more common baseline).
    C is chosen on the validation split unless given.

    Taught in notebooks/06_cls_and_downstream.ipynb
    """
    from sklearn.feature_extraction.text import TfidfVectorizer

    labels, names = _check_labels(docs, labels)
    train_idx, val_idx, eval_idx = _split_indices(docs, labels, eval_split)
    train_idx = sample_per_class(train_idx, labels, k_per_class, seed)
    if max_seq_len is None:
        texts = [document_text(d) for d in docs]
        vectorizer = TfidfVectorizer(sublinear_tf=True, ngram_range=(1, 2), lowercase=True)
    else:
        if tokenizer is None:
            raise ValueError("tfidf_baseline: pass tokenizer= to read the model's WordPiece "
                             "window, or max_seq_len=None to read whole documents as words")
        windows = document_chunks(docs, tokenizer, max_seq_len)
        texts = [" ".join(map(str, w[0])) for w in windows]  # token ids as "words"
        vectorizer = TfidfVectorizer(sublinear_tf=True, ngram_range=(1, 2), lowercase=False,
                                     token_pattern=r"\S+")
    y = np.array([names.index(label) for label in labels])
    start = time.perf_counter()
    x_train = vectorizer.fit_transform([texts[i] for i in train_idx])
    x_val = vectorizer.transform([texts[i] for i in val_idx]) if val_idx else None
    clf, chosen = _fit_logistic(x_train, y[train_idx], x_val, y[val_idx], C, seed)
    pred = clf.predict(vectorizer.transform([texts[i] for i in eval_idx]))
    details = {"C": chosen, "max_seq_len": max_seq_len, "features": x_train.shape[1],
               "fit_seconds": time.perf_counter() - start}
    return _result(method, y[eval_idx], pred, names, eval_split, len(train_idx), k_per_class,
                   seed, details)


# ---------------------------------------------------------------------------------------------
# Fine-tuning: the pretraining loop (bertlab.train.train_loop) with a classification loss


@dataclass
class FinetuneConfig:
    """Every setting of a fine-tuning run, with defaults that suit the small presets on CPU.

    The run lasts `epochs` passes over the training examples, but at least `min_steps`
    optimizer steps (so an 8-examples-per-class run still gets enough updates). Optimizer,
    schedule, mixed precision and checkpoints are those of `bertlab.TrainConfig`
    (`to_train_config` builds one).

    Taught in notebooks/06_cls_and_downstream.ipynb
    """

    epochs: float = 10.0  # BBC, tiny from scratch: 89.8% test accuracy at 4 epochs, 95.6% at 10
    min_steps: int = 60
    batch_size: int = 32
    lr: float = 1e-3  # tiny/mini presets; BERT-base fine-tunes at 2e-5 to 5e-5
    warmup_fraction: float = 0.1
    weight_decay: float = 0.01
    max_seq_len: int = 128
    max_chunks: int = 1  # windows per document (training uses each; evaluation averages logits)
    device: str = "auto"
    precision: str = "auto"
    seed: int = 0  # head init, data order and dropout
    progress: bool = False

    def __post_init__(self) -> None:
        if not self.epochs > 0:
            raise ValueError(f"FinetuneConfig.epochs must be > 0, got {self.epochs!r}")
        for name in ("min_steps", "batch_size", "max_chunks"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"FinetuneConfig.{name} must be a positive integer, got {value!r}")
        if self.max_seq_len < 3:
            raise ValueError(f"FinetuneConfig.max_seq_len={self.max_seq_len} leaves no room for "
                             f"text after [CLS] and [SEP]; use at least 3")

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


def classification_counts(batch: dict[str, torch.Tensor]) -> dict[str, float]:
    """Return the denominator of the classification loss for one batch: its number of examples."""
    return {"sequences": float(batch["labels"].numel())}


def classification_loss(model: nn.Module, batch: dict[str, torch.Tensor],
                        totals: dict[str, float]) -> torch.Tensor:
    """Return this batch's share of the step's cross-entropy (summed, over the step's examples).

    The `train_loop` contract (see `bertlab.train.pretraining_loss`): the same gradient whether
    a global batch arrives whole, in accumulation pieces or split over processes.
    """
    logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits
    loss = nn.functional.cross_entropy(logits.float(), batch["labels"], reduction="sum")
    return loss / max(totals["sequences"], 1.0)


def _as_classifier(source: nn.Module | BertConfig | str | Path, num_labels: int,
                   generator: torch.Generator) -> tuple[BertForSequenceClassification, str]:
    """Return a fresh classifier whose encoder is copied from `source` (random for a config)."""
    if isinstance(source, (str, Path)):
        source = load_pretrained(source)[0]
    if isinstance(source, BertConfig):
        return BertForSequenceClassification(source, num_labels, generator=generator), "random"
    encoder = _encoder(source)
    model = BertForSequenceClassification(encoder.config, num_labels, generator=generator)
    # Copy the encoder and pooler (not share them): fine-tuning must not change `source`.
    model.bert.load_state_dict(encoder.state_dict())
    return model.to(next(encoder.parameters()).device), "pretrained"


@torch.no_grad()
def predict(model: BertForSequenceClassification, docs: Sequence[Document],
            tokenizer: Tokenizer, *, max_seq_len: int = 128, max_chunks: int = 1,
            batch_size: int = 64) -> np.ndarray:
    """Return the classifier's logits per document, (N, num_labels), averaged over its windows.

    Taught in notebooks/06_cls_and_downstream.ipynb
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    chunks = document_chunks(docs, tokenizer, max_seq_len, max_chunks)
    flat = [(d, c) for d, doc_chunks in enumerate(chunks) for c in doc_chunks]
    sums = torch.zeros(len(docs), model.num_labels, dtype=torch.float64)
    try:
        for start in range(0, len(flat), batch_size):
            part = flat[start : start + batch_size]
            batch = {k: v.to(device) for k, v in pad_batch([c for _, c in part], tokenizer).items()}
            logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits
            sums.index_add_(0, torch.tensor([d for d, _ in part]), logits.double().cpu())
    finally:
        model.train(was_training)
    counts = torch.tensor([len(c) for c in chunks], dtype=torch.float64).unsqueeze(1)
    return (sums / counts).float().numpy()


def finetune_classifier(
    pretrained: nn.Module | BertConfig | str | Path,
    docs: Sequence[Document],
    labels: Sequence[str] | None = None,
    *,
    tokenizer: Tokenizer,
    config: FinetuneConfig | TrainConfig | None = None,
    k_per_class: int | None = None,
    eval_split: str = "test",
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
    `out_dir` when given); scores are on `eval_split`, with the validation accuracy in `details`.
    `config` is a `FinetuneConfig`, or a `TrainConfig` used as is (inputs then use the
    `FinetuneConfig` defaults: 128 tokens, one window).

    Taught in notebooks/06_cls_and_downstream.ipynb
    """
    if isinstance(config, TrainConfig):  # the loop's settings as given; inputs as the defaults
        config, train_config = FinetuneConfig(seed=config.seed), config
    else:
        config, train_config = config or FinetuneConfig(), None
    labels, names = _check_labels(docs, labels)
    train_idx, val_idx, eval_idx = _split_indices(docs, labels, eval_split)
    train_idx = sample_per_class(train_idx, labels, k_per_class, config.seed)
    y = [names.index(label) for label in labels]

    generator = torch.Generator().manual_seed(config.seed)
    model, init = _as_classifier(pretrained, len(names), generator)
    _check_seq_len(config.max_seq_len, model)
    train_docs = [docs[i] for i in train_idx]
    windows = document_chunks(train_docs, tokenizer, config.max_seq_len, config.max_chunks)
    sequences = [w for doc_windows in windows for w in doc_windows]
    seq_labels = [y[i] for i, doc_windows in zip(train_idx, windows, strict=True)
                  for _ in doc_windows]
    dataset = ClassificationDataset(sequences, seq_labels, tokenizer)
    train_config = train_config or config.to_train_config(len(dataset))
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=train_config.batch_size // train_config.grad_accum,
        sampler=EpochShuffleSampler(len(dataset), config.seed), collate_fn=dataset.collate)
    run = train_loop(model, loader, train_config, loss_fn=classification_loss,
                     count_fn=classification_counts, out_dir=out_dir)
    model.eval()

    def scores(indices: list[int]) -> np.ndarray:
        logits = predict(model, [docs[i] for i in indices], tokenizer,
                         max_seq_len=config.max_seq_len, max_chunks=config.max_chunks)
        return logits.argmax(-1)

    val_acc = None
    if val_idx:
        val_acc = float((scores(val_idx) == np.array([y[i] for i in val_idx])).mean())
    pred = scores(eval_idx)
    details = {"init": init, "steps": run.steps, "train_seconds": round(run.elapsed_s, 2),
               "final_train_loss": run.step_losses[-1] if run.step_losses else None,
               "validation_accuracy": val_acc, "finetune_config": asdict(config),
               "train_config": train_config.to_dict(),
               "checkpoint": str(run.checkpoint) if run.checkpoint else None}
    default = "fine-tuned" if init == "pretrained" else "from scratch"
    return _result(method or default, [y[i] for i in eval_idx], pred, names, eval_split,
                   len(train_idx), k_per_class, config.seed, details, model)


def from_scratch(model_config: BertConfig | nn.Module, docs: Sequence[Document],
                 labels: Sequence[str] | None = None, *, tokenizer: Tokenizer,
                 config: FinetuneConfig | TrainConfig | None = None,
                 k_per_class: int | None = None, eval_split: str = "test",
                 method: str = "from scratch") -> ClassificationResult:
    """Return the held-out scores of the same architecture and recipe as `finetune_classifier`,
    started from random weights: the baseline that shows what pretraining is worth.

    `model_config`: a `BertConfig`, or a model whose config is reused (its weights are not).

    Taught in notebooks/06_cls_and_downstream.ipynb
    """
    if isinstance(model_config, nn.Module):
        model_config = _encoder(model_config).config
    return finetune_classifier(model_config, docs, labels, tokenizer=tokenizer, config=config,
                               k_per_class=k_per_class, eval_split=eval_split, method=method)


# ---------------------------------------------------------------------------------------------
# Loading a pretrained model, and the comparison table


def load_pretrained(path: str | Path) -> tuple[nn.Module, Tokenizer | None]:
    """Return (model, tokenizer) from a Hugging Face folder (config.json) or a pretraining run
    folder (checkpoints/); the tokenizer is None when the folder has none.

    Taught in notebooks/06_cls_and_downstream.ipynb
    """
    from bertlab.hf import load_hf, load_hf_tokenizer

    path = Path(path)
    if (path / "config.json").is_file():
        try:
            tokenizer = load_hf_tokenizer(path)
        except FileNotFoundError:
            tokenizer = None
        return load_hf(path), tokenizer
    if path.is_dir() and (path / "checkpoints").is_dir():
        return load_run(path)
    raise ValueError(f"'{path}' is neither a Hugging Face model folder (with config.json) nor a "
                     f"pretraining run folder (with checkpoints/); pass the folder that "
                     f"`bertlab pretrain --out` or `bertlab export-hf` wrote")


def compare_downstream(
    pretrained: nn.Module,
    tokenizer: Tokenizer,
    task: str = "bbc-topic",
    *,
    config: FinetuneConfig | None = None,
    k_per_class: Sequence[int | None] = (None,),
    seeds: Sequence[int] = (0,),
    eval_split: str = "test",
    methods: Sequence[str] = ("fine-tuned", "linear probe", "TF-IDF", "from scratch"),
) -> list[ClassificationResult]:
    """Return the results of fine-tuning, the [CLS] linear probe, TF-IDF and from-scratch
    training on a named task, for each labels-per-class budget and seed (`format_table` prints
    them side by side).

    Taught in notebooks/06_cls_and_downstream.ipynb
    """
    known = ("fine-tuned", "linear probe", "TF-IDF", "from scratch")
    unknown = [m for m in methods if m not in known]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; choose from {list(known)}")
    config = config or FinetuneConfig()
    docs, labels = load_task(task)
    features = None
    if "linear probe" in methods:
        features = cls_features(pretrained, docs, tokenizer, max_seq_len=config.max_seq_len,
                                max_chunks=config.max_chunks)
    results = []
    for k in k_per_class:
        for seed in seeds:
            run_config = FinetuneConfig(**{**asdict(config), "seed": seed})
            for m in methods:
                if m == "fine-tuned":
                    r = finetune_classifier(pretrained, docs, labels, tokenizer=tokenizer,
                                            config=run_config, k_per_class=k,
                                            eval_split=eval_split)
                    r.model = None  # keep memory flat over many runs
                elif m == "linear probe":
                    r = linear_probe(pretrained, docs, labels, tokenizer=tokenizer,
                                     k_per_class=k, seed=seed, eval_split=eval_split,
                                     max_seq_len=config.max_seq_len, features=features)
                elif m == "TF-IDF":
                    r = tfidf_baseline(docs, labels, tokenizer=tokenizer, k_per_class=k,
                                       seed=seed, eval_split=eval_split,
                                       max_seq_len=config.max_seq_len)
                else:
                    r = from_scratch(pretrained, docs, labels, tokenizer=tokenizer,
                                     config=run_config, k_per_class=k, eval_split=eval_split)
                    r.model = None
                results.append(r)
    return results
