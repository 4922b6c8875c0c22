"""Downstream tasks from disk: a named task, or your own labelled folder or file of rows.

The lesson (`bertlab.finetune`) fine-tunes, probes and compares on documents and labels it is
given; this module reads them. `load_task` reads a named task (`TASKS`, "bbc-topic"), a folder
with one sub-folder per label, or a file of rows with a label field, and refuses one a classifier
cannot learn from. `compare_downstream` reads a task and runs `bertlab.finetune.compare_methods`
on it (the `finetune` command's table).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer
from torch import nn

from bertlab import finetune
from bertlab.artefacts import folder_kind
from bertlab.corpus import Document, split_documents
from bertlab.errors import BadInput, check_type
from bertlab.finetune import ClassificationResult, FinetuneConfig
from bertlab.readers import load_corpus
from bertlab.rows import row_format
from bertlab.textfiles import ARTEFACT_KINDS, folder_contents
from bertlab.tokenizer import check_tokenizer_fits


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
    methods: Sequence[str] = finetune.METHODS,
    read: Mapping[str, Any] | None = None,
) -> list[ClassificationResult]:
    """Return the results of fine-tuning, the [CLS] linear probe, TF-IDF and from-scratch
    training on a task (`load_task`: a name, a labelled folder or a file of rows read with
    `read`), for each labels-per-class budget and seed (`bertlab.finetune.format_table` prints
    them side by side). `config` holds the fine-tuning settings, and what every method reads and
    is scored on (its max_seq_len, max_chunks and eval_split); each run takes its seed from
    `seeds`. The methods, budgets and seeds are those of `bertlab.finetune.compare_methods`.

    Taught in notebooks/06_cls_and_downstream.ipynb
    """
    # The methods and the tokenizer are refused before the task is read, which can take a while.
    check_type(pretrained, nn.Module, "compare_downstream(pretrained)", "a bertlab model",
               "pass the model bl.load_model gives")
    check_type(tokenizer, Tokenizer, "compare_downstream(tokenizer)", "a tokenizers.Tokenizer",
               "pass the tokenizer the model was trained with")
    check_type(config, (FinetuneConfig, type(None)), "compare_downstream(config)",
               "a FinetuneConfig or None", "pass bl.FinetuneConfig(...)")
    finetune.check_methods(methods)
    config = config or FinetuneConfig()
    check_tokenizer_fits(tokenizer, finetune.bert_encoder(pretrained).config.vocab_size,
                         "compare_downstream")
    docs, labels = load_task(task, read=read)
    _check_task_splits(task, docs, config.eval_split)
    return finetune.compare_methods(pretrained, tokenizer, docs, labels, config=config,
                                    k_per_class=k_per_class, seeds=seeds, methods=methods)
