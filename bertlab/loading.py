"""A trained model back from disk, whichever way it was saved: a run folder or a Hugging Face folder.

`load_model` is the one way the CLI, fine-tuning and the notebooks get a trained model and its
tokenizer back; it sits above both formats (`bertlab.engine.checkpoint`, `bertlab.hf`), so neither
needs the other. `pretrained_length` says how many tokens a saved model was pretrained at, the
length fine-tuning reads by default.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from tokenizers import Tokenizer

from bertlab.artefacts import describe_kind, folder_kind
from bertlab.engine.checkpoint import (
    check_run_tokenizer,
    checkpoint_folders,
    latest_checkpoint,
    read_checkpoint_state,
    read_run_json,
    read_run_model,
)
from bertlab.errors import BadInput, check_type
from bertlab.hf import ModelFolderMissingError, load_hf, load_hf_tokenizer
from bertlab.model import BertForPreTraining, BertForSequenceClassification
from bertlab.tokenizer import check_tokenizer_fits, load_tokenizer

_MODEL_KINDS = {"run": "a pretraining run folder (the --out of pretrain)",
                "hf": "a Hugging Face folder (from export-hf)"}


def load_run(run_dir: str | Path, checkpoint: str | Path | None = None,
             device: str | torch.device = "cpu") -> tuple[BertForPreTraining, Tokenizer | None]:
    """Return (model, tokenizer) of a pretraining run folder, from its newest sound checkpoint.

    The model is rebuilt from the config stored in the checkpoint; the tokenizer is the
    `tokenizer.json` the CLI saves in the run folder (None if absent). Without `checkpoint`, a
    newest checkpoint that fails its digests is skipped, with a warning, for the newest one that
    verifies.

    Taught in notebooks/05_pretraining.ipynb
    """
    run_dir = Path(run_dir)
    path, model = read_run_model(run_dir, checkpoint, device)
    tok_file = run_dir / "tokenizer.json"
    tok = load_tokenizer(tok_file) if tok_file.is_file() else None
    if tok is not None and tok.get_vocab_size() == model.config.vocab_size:  # else the callers'
        check_run_tokenizer(read_checkpoint_state(path, verified=True), tok, tok_file)  # size check
    return model, tok


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Return the complete checkpoints of a run, oldest first (half-written ones never count).

    Taught in notebooks/05_pretraining.ipynb
    """
    return checkpoint_folders(run_dir)


# The course's models, shipped inside the package (bertlab/models/<name>; `models/` in a checkout
# is a link to it), so a name finds them from an installed wheel in any folder.
SHIPPED_MODELS = Path(__file__).resolve().parent / "models"


def shipped_models() -> list[str]:
    """Return the names of the models that ship with bertlab ("course-tiny", ...)."""
    return sorted(p.name for p in SHIPPED_MODELS.iterdir() if (p / "MANIFEST.json").is_file())


def model_path(path: str | Path) -> Path:
    """Return the folder `path` names: itself, or, for the name of a shipped model that is no
    path here ("course-tiny"), that model's folder inside the package."""
    given = Path(path)
    if not given.exists() and len(given.parts) == 1 and (SHIPPED_MODELS / given).is_dir():
        return SHIPPED_MODELS / given
    return given


def check_model_folder(path: str | Path, kinds: tuple[str, ...] = ("run", "hf")) -> str:
    """Return "run" or "hf", the kind of a model folder, after checking it is one of `kinds`.

    `path` may also be the name of a shipped model (`shipped_models`). A run folder must have a
    checkpoint. Anything else (a missing folder, a file, shards, other files) raises a
    ValueError that says what is there and what to pass instead.
    """
    path = model_path(path)
    kind = folder_kind(path)
    wanted = " or ".join(_MODEL_KINDS[k] for k in kinds)
    if kind == "run" and latest_checkpoint(path) is None:
        raise ValueError(f"run folder {path} has no checkpoint yet (looked in "
                         f"{path / 'checkpoints'}); train first, or wait for the run's first "
                         f"checkpoint")
    if kind in kinds:
        return kind
    if kind in ("missing", "file"):
        what = "it does not exist" if kind == "missing" else "it is a file"
        raise ValueError(f"{path} is not a folder ({what}); pass {wanted}, or the name of a "
                         f"shipped model ({', '.join(shipped_models())})")
    if "hf" in kinds:
        raise ValueError(f"{path} is neither a run folder (no checkpoints/) nor a Hugging Face "
                         f"folder (no config.json): it holds {describe_kind(kind)}; pass {wanted}")
    raise ValueError(f"{path} has no checkpoint: it holds {describe_kind(kind)}; pass {wanted}")


def load_model(path: str | Path, *, kinds: tuple[str, ...] = ("run", "hf"),
               require_tokenizer: bool = False,
               ) -> tuple[BertForPreTraining | BertForSequenceClassification, Tokenizer | None]:
    """Return (model, tokenizer) from a pretraining run folder, a Hugging Face folder, or a
    model that ships with bertlab, by name (`load_model("course-tiny")`, from any folder). A
    Hugging Face folder of a classifier (what `finetune --out` saves) gives its
    `BertForSequenceClassification` (its label names: `classifier_labels`).

    The one way to get a trained model back from disk, for the CLI and for fine-tuning. The kind
    of folder is told apart first (`check_model_folder`; `kinds` says which are accepted): a run
    gives its newest checkpoint that verifies (`load_run`), a Hugging Face folder goes through
    `load_hf`. The model comes back on the CPU in eval mode, with finite weights.

    The tokenizer is the folder's own (tokenizer.json, or vocab.txt in a Hugging Face folder);
    None when there is none, unless `require_tokenizer`, which makes its absence a ValueError.
    A tokenizer whose size is not the model's vocabulary is refused (`check_tokenizer_fits`).
    """
    check_type(path, (str, os.PathLike), "load_model(path)", "a path",
               "pass a run or Hugging Face folder's path as a str or pathlib.Path")
    path = model_path(path)
    if check_model_folder(path, kinds) == "run":
        model, tok = load_run(path)
        if tok is None and require_tokenizer:
            raise ValueError(f"run folder {path} has no tokenizer.json; copy in the tokenizer "
                             f"the run was trained with (e.g. from its shard folder)")
    else:
        model = load_hf(path, task="classification" if is_classifier_folder(path) else
                        "pretraining")
        try:
            tok = load_hf_tokenizer(path)
        except ModelFolderMissingError:
            if require_tokenizer:
                raise
            tok = None
    if tok is not None:
        check_tokenizer_fits(tok, model.config.vocab_size, str(path))
    return model, tok


def is_classifier_folder(path: str | Path) -> bool:
    """Return whether the Hugging Face folder `path` holds a sequence classifier (its
    config.json's architectures say BertForSequenceClassification)."""
    try:
        config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False  # load_hf names what is wrong with the file
    return isinstance(config, dict) and "BertForSequenceClassification" in (
        config.get("architectures") or [])


def classifier_labels(path: str | Path) -> list[str]:
    """Return the label names of a classifier folder, in the order of its outputs (config.json's
    id2label)."""
    config = json.loads((model_path(path) / "config.json").read_text(encoding="utf-8"))
    names = config.get("id2label") or {}
    return [names[str(i)] for i in range(len(names))]


# What to do about a record of the pretraining length that cannot be read.
_LENGTH_FIX = ("the length the model was pretrained at is read there; restore the file, or pass "
               "--max-seq-len to choose the length yourself")


def pretrained_length(path: str | Path) -> tuple[int, Path] | None:
    """Return (length, record): the sequence length the model folder `path` was pretrained at
    and the file that says so; None when nothing there records it.

    A run folder's run.json has it ("max_seq_len", written by `pretrain`; null for a run on
    ready-made examples); a Hugging Face folder made from the course (models/<name>) has it in
    MANIFEST.json's recipe. Positions past it never had a gradient in pretraining, so their
    embeddings never learned, which is why fine-tuning reads this many tokens by default.
    A record that is not valid JSON, or whose length is not a whole number of at least 3
    tokens, raises a `BadInput` naming the file.
    """
    path = model_path(path)
    record, length = path / "run.json", read_run_json(path, _LENGTH_FIX).get("max_seq_len")
    if length is None and (path / "MANIFEST.json").is_file():
        record = path / "MANIFEST.json"
        length = _manifest_recipe(record).get("max_seq_len")
    if length is None:
        return None
    if isinstance(length, bool) or not isinstance(length, int) or length < 3:
        raise BadInput(str(record), f"its max_seq_len is {length!r}, not a whole number of at "
                       f"least 3 tokens", _LENGTH_FIX)
    return length, record


def _manifest_recipe(manifest: Path) -> dict:
    """Return the "recipe" object of a shipped model's MANIFEST.json ({} when it has none)."""
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadInput(str(manifest), f"is not valid JSON ({e})", _LENGTH_FIX) from None
    recipe = data.get("recipe") if isinstance(data, dict) else None
    return recipe if isinstance(recipe, dict) else {}
