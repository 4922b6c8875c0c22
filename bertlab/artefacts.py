"""What a folder holds: bertlab's artefacts told apart by the files that mark them.

`folder_kind` says whether a path is a pretraining run, prepared shards, a Hugging Face export, a
single checkpoint, a folder of other files, an empty folder, a file or nothing, so that a reader
skips bertlab's output where it looks for text, and a command refuses, before it writes anything,
a folder that belongs to something else (`bertlab.engine.outputs.check_output`).
"""

from __future__ import annotations

from pathlib import Path

LOCK_NAME = ".lock"  # inside a locked folder; never counts as content
HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin")  # what makes a config.json an export

KINDS = {
    "run": "a pretraining run (checkpoints/ or run.json)",
    "shards": "prepared NSP shards (meta.json)",
    "hf": "a Hugging Face model folder (config.json)",
    "checkpoint": "a single checkpoint (state.json)",
}


def folder_kind(path: str | Path) -> str:
    """Return what `path` is: "missing", "file", "empty", "run", "shards", "hf", "checkpoint" or "other".

    "empty" also covers a folder that holds only a lock file; "other" is a non-empty folder that
    is none of bertlab's artefacts (your own files, for example).
    """
    path = Path(path)
    if not path.exists():
        return "missing"
    if not path.is_dir():
        return "file"
    if (path / "checkpoints").is_dir():
        return "run"
    if (path / "config.json").is_file() and any((path / w).is_file() for w in HF_WEIGHTS):
        return "hf"  # an export, even with a copy of its run's run.json beside it
    if (path / "run.json").is_file():
        return "run"
    if (path / "meta.json").is_file() or (path / "train" / "meta.json").is_file():
        return "shards"
    if (path / "config.json").is_file():
        return "hf"
    if (path / "state.json").is_file():
        return "checkpoint"
    if any(entry.name != LOCK_NAME for entry in path.iterdir()):
        return "other"
    return "empty"


def describe_kind(kind: str) -> str:
    """Return a few words for a `folder_kind` result, for error messages."""
    return KINDS.get(kind, {"file": "a file", "other": "other files", "empty": "nothing",
                            "missing": "nothing (it does not exist)"}.get(kind, kind))
