"""[CLS] downstream: the classification task, frozen [CLS] features, the linear probe, the TF-IDF
baseline, and the metrics every method reports.

Every method returns the same `ClassificationResult` (accuracy, macro-F1, confusion matrix on a
held-out split), so their tables line up: `linear_probe` (the encoder frozen; logistic regression
on its [CLS] vectors: what the pretraining alone put into [CLS]), `tfidf_baseline` (TF-IDF word
and bigram counts + logistic regression, no neural network), and in `bertlab.finetune` the
fine-tuned encoder, the same from random weights, and `compare_downstream` running all four.

Inputs: one segment, `[CLS] title + first sentences [SEP]`, cut to `max_seq_len` tokens. News
is written as an inverted pyramid (the headline and first paragraph say what the story is about),
so the start of an article is where its topic lives; `max_chunks > 1` also reads the rest of
the document in windows and averages over them.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer
from torch import nn

from bertlab.corpus import load_corpus
from bertlab.document import SPLITS, Document
from bertlab.errors import BadInput
from bertlab.model import BertModel
from bertlab.records import row_format
from bertlab.textfiles import ARTEFACT_KINDS, folder_contents
from bertlab.tokenizer import special_ids
from bertlab.util import check_number, folder_kind

POOLINGS = ("pooled", "cls", "mean")  # which vector of the encoder a probe reads
PROBE_C_GRID = (0.01, 0.1, 1.0, 10.0)  # inverse regularisation strengths tried on validation

# ---------------------------------------------------------------------------------------------
# Tasks, labels and splits


@dataclass(frozen=True)
class DownstreamTask:
    """A named classification task: which corpus, and which field of a `Document` is the label."""

    name: str
    corpus: str
    description: str

    def load(self, read: Mapping[str, Any] | None = None) -> tuple[list[Document], list[str]]:
        """Return the task's documents and their labels (aligned lists); `read`: `load_corpus`
        keywords (a named corpus refuses fields: it has none)."""
        docs = load_corpus(self.corpus, **(read or {}))
        return docs, [d.label for d in docs]


TASKS: dict[str, DownstreamTask] = {
    "bbc-topic": DownstreamTask("bbc-topic", "bbc", "BBC News topic, 5 classes "
                                "(business, entertainment, politics, sports, tech)"),
}


def load_task(name: str | Path, *, read: Mapping[str, Any] | None = None
              ) -> tuple[list[Document], list[str]]:
    """Return (documents, labels) of a downstream task: a named one such as "bbc-topic", a
    folder of labelled text, one sub-folder per label (a file's label is the sub-folder of the
    task folder it lies under, however deep, as `load_corpus` reads it), or a file of rows
    (.jsonl, .csv, .tsv, .parquet) whose field "label" (or `read["label_field"]`) labels each
    document. `read` holds `load_corpus`'s text_field, doc_field, label_field, on_bad_row and
    counts.
    The documents keep their train/validation/test split.
    """
    if isinstance(name, str) and name in TASKS:
        if Path(name).exists():
            raise ValueError(f"task '{name}' names both the built-in task and the "
                             f"{'folder' if Path(name).is_dir() else 'file'} ./{name} here; "
                             f"write ./{name} for yours")
        return TASKS[name].load(read)
    folder = Path(name)
    if folder.is_file() and row_format(folder):
        docs = load_corpus(folder, **{"label_field": "label", **(read or {})})
        return _check_classes(name, docs), [d.label for d in docs]
    if not folder.is_dir():
        raise ValueError(f"task '{name}' is neither a known task ({', '.join(sorted(TASKS))}) "
                         f"nor a folder; pass a folder of labelled text: one sub-folder per "
                         f"label, holding that label's .txt files (or a .jsonl, .csv, .tsv or "
                         f".parquet file with a label field)")
    docs = load_corpus(folder, **(read or {}))
    _check_label_folders(folder, {d.label for d in docs})
    loose = [d.id for d in docs if d.label is None]
    if loose:
        raise ValueError(f"task folder '{name}': {len(loose)} file(s) lie directly in it, with "
                         f"no label (e.g. {loose[0]}); put each file in a sub-folder named after "
                         f"its label")
    return _check_classes(name, docs), [d.label for d in docs]


def _check_label_folders(folder: Path, labels: set[str | None]) -> None:
    """Raise if a label sub-folder of a task folder gave no document: its class would be missing."""
    for sub in sorted(folder.iterdir()):
        if sub.name.startswith(".") or not sub.is_dir() or sub.name in labels or \
                folder_kind(sub) in ARTEFACT_KINDS:
            continue  # skipped with a warning by the corpus walk, like in any corpus folder
        _, skipped = folder_contents(sub)
        holds = f"only {skipped}" if skipped else "no file"
        raise BadInput(f"task folder '{folder}'", f"its label folder '{sub}' holds {holds} that "
                       f"could be read as text, so class '{sub.name}' would be missing",
                       "put that label's text in it as .txt files, or move the folder out")


def _check_classes(name: str | Path, docs: list[Document]) -> list[Document]:
    """Return `docs`, or raise if their labels make fewer than two classes."""
    classes = sorted({d.label for d in docs})
    if len(classes) < 2:
        what = "folder" if Path(name).is_dir() else "file"
        fix = "sub-folders of labelled text" if what == "folder" else "labels among its rows"
        raise ValueError(f"task {what} '{name}' has one label ({classes[0]}); a classifier "
                         f"needs at least two {fix}")
    return docs


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
    if not isinstance(encoder, BertModel):
        raise TypeError(
            f"expected a bertlab BertModel, BertForPreTraining or BertForSequenceClassification, "
            f"got {type(model).__name__}"
        )
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
    `eval_split`; `pooling` and `max_chunks` are the probe's alone. `compare_downstream` builds
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
