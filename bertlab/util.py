"""Small pieces the rest of the package shares: atomic writes, what a folder holds, a folder lock.

Every file bertlab writes into a run, a shard folder or a cache goes through `atomic_write_*`
(a temporary file in the same folder, flushed, then renamed over the target), so a crash, a
kill or a full disk leaves either the old file or the new one, never half of one.

`folder_kind` tells the artefacts apart (a pretraining run, prepared shards, a Hugging Face
export, a single checkpoint), so a command can refuse, before it writes anything, a folder that
belongs to something else. `FolderLock` keeps two processes out of one run folder.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

LOCK_NAME = ".lock"  # inside a locked folder; never counts as content


# --------------------------------------------------------------------------------------------
# Atomic writes


def fsync_path(path: str | Path) -> None:
    """Flush a file (or a folder's entry table) to disk; a no-op where the OS cannot."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # folders cannot be opened on Windows
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Return `path` after replacing its content with `data` in one step (temp file + rename)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_path(path.parent)
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Return `path` after replacing its content with `text` (UTF-8) in one step."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> Path:
    """Return `path` after replacing its content with `obj` as indented JSON, in one step."""
    return atomic_write_text(path, json.dumps(obj, indent=1))


# --------------------------------------------------------------------------------------------
# What a folder holds

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
    if (path / "checkpoints").is_dir() or (path / "run.json").is_file():
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


def check_output_folder(path: str | Path, flag: str, accept: tuple[str, ...] = ()) -> str:
    """Return the `folder_kind` of an output folder after checking it may be written.

    A missing or empty folder is always fine; `accept` lists the artefact kinds that may also be
    there (e.g. "run" when resuming). Anything else raises a ValueError that names `flag`, the
    path, what is there and what to do: a file, a folder whose parent is a file, another kind
    of artefact, or a folder with files of its own.
    """
    path = Path(path)
    if str(path).strip() == "":
        raise ValueError(f"{flag} is empty; pass a folder path")
    for parent in path.absolute().parents:
        if parent.exists() and not parent.is_dir():
            raise ValueError(f"{flag} {path}: {parent} is a file, not a folder; choose a path "
                             f"under a folder")
    kind = folder_kind(path)
    if kind in ("missing", "empty") or kind in accept:
        return kind
    if kind == "file":
        raise ValueError(f"{flag} {path} is a file, not a folder; choose a folder path")
    raise ValueError(f"{flag} {path} already holds {describe_kind(kind)}; choose a new or empty "
                     f"folder (nothing was written)")


# --------------------------------------------------------------------------------------------
# One process per folder

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]
    import msvcrt

_HELD: dict[Path, list] = {}  # folder -> [open lock file, depth]: re-entrant within a process


class FolderLock:
    """Hold `folder/.lock` exclusively while the `with` block runs, or raise a clear ValueError.

    The operating system drops the lock when the holding process ends, however it ends (kill -9
    included), so a stale lock never blocks a new run. The file records the holder's pid, host,
    command and start time, which the error message of a second process quotes. Taking the same
    lock again inside the same process just nests.
    """

    def __init__(self, folder: str | Path, what: str = "run folder") -> None:
        self.folder, self.what = Path(folder), what

    def __enter__(self) -> FolderLock:
        key = self.folder.resolve()
        if key in _HELD:
            _HELD[key][1] += 1
            return self
        self.folder.mkdir(parents=True, exist_ok=True)
        handle = open(self.folder / LOCK_NAME, "a+", encoding="utf-8")  # noqa: SIM115
        try:
            _lock(handle)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise ValueError(f"{self.what} {self.folder} is in use by {holder}; wait for it to "
                             f"finish (or stop it), or choose another folder") from None
        handle.seek(0)
        handle.truncate()
        command = " ".join(sys.argv) or sys.executable
        handle.write(f"process {os.getpid()} on {socket.gethostname()} ({command!r}, since "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S')})\n")
        handle.flush()
        _HELD[key] = [handle, 1]
        return self

    def __exit__(self, *exc: object) -> None:
        key = self.folder.resolve()
        entry = _HELD[key]
        entry[1] -= 1
        if entry[1] == 0:
            handle = entry[0]
            handle.seek(0)
            handle.truncate()
            _unlock(handle)
            handle.close()
            del _HELD[key]


def _lock(handle: Any) -> None:
    if fcntl is not None:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    else:
        handle.seek(0)
        msvcrt.locking(handle.fileno(), msvcrt.LK_NBLCK, 1)


def _unlock(handle: Any) -> None:
    if fcntl is not None:
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    else:
        handle.seek(0)
        msvcrt.locking(handle.fileno(), msvcrt.LK_UNLCK, 1)
