"""Folders that survive a crash, what a folder holds, and one writer per folder.

- Whole folders: a folder that must appear whole (a checkpoint, a Hugging Face export, prepared
  shards) is built by `atomic_write_folder` in a hidden staging sibling and renamed into place;
  `sweep_dead_writers` clears what a killed writer left, putting a set-aside copy back. (Single
  files are written by `bertlab.atomic`.)
- One process per folder: `FolderLock` keeps two processes out of one run folder, and
  `writing_into` holds it for a block that writes there.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import secrets
import shutil
import signal
import socket
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bertlab.artefacts import LOCK_NAME, folder_kind
from bertlab.atomic import (
    FILE_MODE,
    disk_full_error,
    fsync_path,
    is_disk_full,
    named_error,
    staging_stem,
    through_link,
)

STAGING_SUFFIX = ".tmp"  # hidden staging folders are named .{target}.{owner}.{random}.tmp


# --------------------------------------------------------------------------------------------
# Whole folders

def atomic_write_folder(path: str | Path, write: Callable[[Path], None], *,
                        sweep_stale: bool = False, fill_empty: bool = False,
                        last: tuple[str, ...] = ()) -> Path:
    """Return `path` after `write(staging)` built the folder in a hidden sibling, moved into place.

    `write` fills a fresh staging folder next to `path` (`.{name}.{random}.tmp`); its files are
    flushed to disk, then it is renamed to `path` in one step. An existing `path` is first moved
    aside, so one complete copy exists at every moment, and removed after. If `write` raises
    (a crash, a full disk, Ctrl-C), the staging folder is deleted and `path` is untouched.
    Ctrl-C and SIGTERM wait while the renames run. `sweep_stale=True` also deletes the staging
    folders that killed writers left in the same parent: only for a parent bertlab owns (a run's
    checkpoints/), never for a folder of the user's. Whatever the parent, the staging and
    set-aside folders of `path` itself whose writer (a process of this machine, named in the
    folder's name) is dead are cleared first (`sweep_dead_writers`): a killed export leaves
    nothing behind for long. If that puts a missing `path` back, nothing is written and a
    ValueError says so: the caller's decision was made without it (`check_output` sweeps before
    it looks, so a command decides with the folder in place).
    `fill_empty=True` keeps an existing `path` that holds nothing (or only a lock,
    `folder_kind` "empty"): the content moves into it, the entries named in `last` at the end,
    so the folder never looks complete too early. A full disk raises an OSError (ENOSPC) that
    names `path`.
    """
    path = through_link(Path(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    if not os.path.lexists(path) and sweep_dead_writers(path) and os.path.lexists(path):
        # The caller looked at `path` while it was missing; it is a folder again now, and
        # whether to replace it was never decided. Its check sweeps first (check_output).
        raise ValueError(f"'{path}' was missing because a writer was killed while replacing "
                         f"it; its previous content is back in place now, and nothing was "
                         f"written: rerun the same command to decide with it there")
    sweep_dead_writers(path)
    # mkdir, not mkdtemp: the folder gets the usual permissions (mkdtemp's are owner-only).
    staging = (path.parent /
               f".{staging_stem(path.name)}.{_owner()}.{secrets.token_hex(4)}{STAGING_SUFFIX}")
    try:
        staging.mkdir()
    except OSError as exc:
        raise named_error(exc, path) from None
    try:
        _write_whole(write, staging, path, fill_empty, last)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    if sweep_stale:
        for stale in path.parent.glob(f".*{STAGING_SUFFIX}"):
            shutil.rmtree(stale, ignore_errors=True)
    return path


def keep_entry(entry: Path, to: Path) -> None:
    """Copy a file or folder of the user's to `to` as it is: a symbolic link stays a link (its
    target is neither copied nor followed), also inside a folder, so a link to a large folder
    costs nothing and a link that loops back into its own folder is copied as the link it is."""
    if entry.is_symlink():
        os.symlink(os.readlink(entry), to, target_is_directory=entry.is_dir())
    elif entry.is_dir():
        shutil.copytree(entry, to, symlinks=True)
    else:
        shutil.copy2(entry, to)


def _owner() -> str:
    """Return this process's tag in a staging folder's name: a hash of the host, and the pid."""
    host = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:6]
    return f"{host}-{os.getpid()}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def sweep_dead_writers(path: str | Path) -> list[Path]:
    """Return the staging and set-aside folders of `path` that a dead writer of this machine
    left (`atomic_write_folder`'s `.{name}.{owner}.*`), after clearing them away.

    A set-aside folder (`.old`) is the previous complete `path`, the user's own files in it
    included: a writer killed between its two renames leaves `path` missing, and then the
    set-aside copy is moved back. When `path` is there (the writer was killed after its second
    rename, so the new `path` carries copies of everything), the copy is deleted only if `path`
    holds each of its entries; otherwise it is kept beside `path` under a visible name
    (`{name}.recovered`, `{name}.recovered-2`, ...) with a warning, never deleted. A staging
    folder holds only what the writer itself wrote (copies), and is deleted."""
    path = Path(path)
    host, _ = _owner().split("-")
    swept = []
    # .old first, so a missing `path` is restored before anything is deleted.
    stem = staging_stem(path.name)
    entries = sorted(path.parent.glob(f".{glob.escape(stem)}.{host}-*"),
                     key=lambda e: not e.name.endswith(".old"))
    for entry in entries:
        pid = entry.name[len(stem) + 2 + len(host) + 1:].split(".", 1)[0]
        if not (entry.is_dir() and pid.isdigit()) or _pid_alive(int(pid)):
            continue
        if entry.name.endswith(".old"):
            _restore_set_aside(entry, path)
        else:
            shutil.rmtree(entry, ignore_errors=True)
        swept.append(entry)
    return swept


def _restore_set_aside(aside: Path, path: Path) -> None:
    """Put a dead writer's set-aside copy of `path` back, or delete it where `path` carries all
    of it, or keep it visible beside `path` (sweep_dead_writers' rule for `.old` folders)."""
    if not os.path.lexists(path):
        os.replace(aside, path)
        return
    if path.is_dir() and all(os.path.lexists(path / e.name) for e in aside.iterdir()):
        shutil.rmtree(aside, ignore_errors=True)
        return
    keep, n = path.with_name(f"{path.name}.recovered"), 1
    while os.path.lexists(keep):
        n += 1
        keep = path.with_name(f"{path.name}.recovered-{n}")
    os.replace(aside, keep)
    warnings.warn(f"a writer of {path} was killed while replacing it, and {path} was made "
                  f"again since; the folder it replaced is kept as {keep} (nothing in it was "
                  f"deleted): look through it, then delete it", stacklevel=3)


def _write_whole(write: Callable[[Path], None], staging: Path, path: Path, fill_empty: bool,
                 last: tuple[str, ...]) -> None:
    """Fill `staging`, flush it, and move it into place at `path` (atomic_write_folder's body)."""
    try:
        write(staging)
        for item in sorted(staging.rglob("*"), reverse=True):  # files before their folders
            if item.is_symlink():  # a link of the user's: its target is not ours to touch
                continue
            if item.is_file():
                item.chmod(FILE_MODE)  # some writers (safetensors) leave files owner-only
            fsync_path(item)
        fsync_path(staging)
    except BaseException as exc:
        if is_disk_full(exc):
            raise disk_full_error(path, "folder") from exc
        raise
    with _signals_deferred():
        if fill_empty and folder_kind(path) == "empty":
            for entry in sorted(staging.iterdir(), key=lambda e: (e.name in last, e.name)):
                os.replace(entry, path / entry.name)
            staging.rmdir()
        elif path.exists():
            aside = (path.parent /
                     f".{staging_stem(path.name)}.{_owner()}.{secrets.token_hex(4)}.old")
            os.replace(path, aside)
            os.replace(staging, path)
            shutil.rmtree(aside)
        else:
            os.replace(staging, path)
        fsync_path(path.parent)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    # A Ctrl-C or SIGTERM that arrives while folders are being renamed waits until the renames
    # are done, so the folder being replaced is never left missing.
    if hasattr(signal, "pthread_sigmask") and threading.current_thread() is threading.main_thread():
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    else:
        yield


# --------------------------------------------------------------------------------------------
# One process per folder

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]
    import msvcrt

_HELD: dict[Path, list] = {}  # folder -> [open lock file, depth, holding thread]: re-entrant in a thread
_HELD_GUARD = threading.Lock()


class FolderLock:
    """Hold `folder/.lock` exclusively while the `with` block runs, or raise a clear ValueError.

    The operating system drops the lock when the holding process ends, however it ends (kill -9
    included), and the processes it forks (DataLoader workers) never hold it, so a stale lock
    never blocks a new run; a holder that lets go normally deletes
    the file too, so a finished folder holds only its data. The file records the holder's pid, host,
    command and start time, which the error message of a second process quotes. Taking the same
    lock again in the same thread just nests; another thread of the same process is refused as
    a second process is.
    """

    def __init__(self, folder: str | Path, what: str = "run folder") -> None:
        self.folder, self.what = Path(folder), what

    def __enter__(self) -> FolderLock:
        key = self.folder.resolve()
        with _HELD_GUARD:
            if key in _HELD:
                if _HELD[key][2] != threading.get_ident():  # two writers in one process
                    raise in_use_error(self.what, self.folder,
                                       f"another thread of this process ({os.getpid()})")
                _HELD[key][1] += 1
                return self
            self._hold(key)
        return self

    def _hold(self, key: Path) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        handle = self._take()
        command = " ".join(sys.argv) or sys.executable
        try:
            handle.seek(0)
            handle.truncate()
            handle.write(f"process {os.getpid()} on {socket.gethostname()} ({command!r}, since "
                         f"{time.strftime('%Y-%m-%d %H:%M:%S')})\n")
            handle.flush()
        except OSError as exc:  # a full disk, say: name the lock file, and hold nothing
            _unlock(handle)
            handle.close()
            raise named_error(exc, self.folder / LOCK_NAME) from None
        _HELD[key] = [handle, 1, threading.get_ident()]

    def _take(self) -> Any:
        """Return the open, locked lock file; raise the in-use error if another process holds it.

        The holder deletes the file when it lets go (a finished folder holds only its data), so
        a lock taken on a file that was deleted meanwhile is no lock: then take it again."""
        path = self.folder / LOCK_NAME
        while True:
            handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115
            try:
                _lock(handle)
            except OSError:
                handle.seek(0)
                holder = handle.read().strip() or "another process"
                handle.close()
                raise in_use_error(self.what, self.folder, holder) from None
            try:
                if os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:
                    return handle
            except FileNotFoundError:
                pass
            _unlock(handle)
            handle.close()

    def __exit__(self, *exc: object) -> None:
        with _HELD_GUARD:
            self._let_go(self.folder.resolve())

    def _let_go(self, key: Path) -> None:
        entry = _HELD[key]
        entry[1] -= 1
        if entry[1] == 0:
            handle = entry[0]
            handle.seek(0)
            handle.truncate()
            if fcntl is not None:  # deleted while still held (Windows cannot delete an open file)
                with contextlib.suppress(OSError):
                    (self.folder / LOCK_NAME).unlink()
            _unlock(handle)
            handle.close()
            del _HELD[key]


def in_use_error(what: str, folder: Path, holder: str) -> ValueError:
    """Return the error for a folder whose lock another process holds."""
    return ValueError(f"{what} {folder} is in use by {holder}; wait for it to finish (or stop "
                      f"it), or choose another folder")


def lock_holder(folder: str | Path) -> str | None:
    """Return who holds `folder`'s lock ("process N on HOST ..."), or None if no other process
    does; the lock file is only looked at, never written."""
    path = Path(folder) / LOCK_NAME
    if not path.is_file() or Path(folder).resolve() in _HELD:
        return None
    with open(path, encoding="utf-8") as handle:
        try:
            _lock(handle, shared=True)
        except OSError:
            return handle.read().strip() or "another process"
        _unlock(handle)
    return None


def _lock(handle: Any, shared: bool = False) -> None:
    # POSIX record locks belong to the process, and a forked child (a DataLoader worker) does not
    # inherit them: after kill -9 the folder is free at once, not when the last worker has
    # noticed. (flock locks belong to the open file, which every worker shares.) The price: any
    # close of this file by the holder drops its lock, hence `_HELD` and lock_holder's check.
    # A read-only handle (lock_holder, which only looks) can take a shared lock only.
    if fcntl is not None:
        fcntl.lockf(handle.fileno(), (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    else:
        handle.seek(0)
        msvcrt.locking(handle.fileno(), msvcrt.LK_NBLCK, 1)


def _unlock(handle: Any) -> None:
    if fcntl is not None:
        fcntl.lockf(handle.fileno(), fcntl.LOCK_UN)
    else:
        handle.seek(0)
        msvcrt.locking(handle.fileno(), msvcrt.LK_UNLCK, 1)


@contextlib.contextmanager
def writing_into(out: Path, what: str) -> Iterator[None]:
    """Hold `FolderLock(out, what)` for the block. If the block fails while `out` holds nothing
    but the lock, the folders the lock had to create are removed again: a refusal leaves no trace.
    """
    new_folders = []
    for folder in [out.absolute(), *out.absolute().parents]:
        if folder.exists():
            break
        new_folders.append(folder)
    try:
        with FolderLock(out, what):
            yield
    except BaseException:
        if new_folders and folder_kind(out) == "empty":
            (out / LOCK_NAME).unlink(missing_ok=True)
            for folder in new_folders:
                with contextlib.suppress(OSError):  # not empty: something else wrote there
                    folder.rmdir()
        raise
