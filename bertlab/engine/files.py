"""Files and folders that survive a crash: atomic writes, what a folder holds, one writer.

Read top to bottom:

- Atomic writes: every file bertlab writes into a run, a shard folder or a cache goes through
  `atomic_write_*` (a temporary file in the same folder, flushed, then renamed over the target),
  so a crash, a kill or a full disk leaves either the old file or the new one, never half of
  one. A folder that must appear whole (a checkpoint, a Hugging Face export, prepared shards) is
  built by `atomic_write_folder` in a hidden staging sibling and renamed into place the same
  way; `sweep_dead_writers` clears what a killed writer left. `save_tokenizer` writes a
  tokenizer the user asked to keep (a run's tokenizer.json, your own file) the same way.
- What a folder holds: `folder_kind` tells the artefacts apart (a pretraining run, prepared
  shards, a Hugging Face export, a single checkpoint), so a command can refuse, before it writes
  anything, a folder that belongs to something else (`check_output_folder`).
- One process per folder: `FolderLock` keeps two processes out of one run folder, and
  `writing_into` holds it for a block that writes there.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import stat
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertlab.errors import BadInput, is_short_write

if TYPE_CHECKING:  # only the type hint: this module stays free of the tokenizers library
    from tokenizers import Tokenizer

LOCK_NAME = ".lock"  # inside a locked folder; never counts as content
HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin")  # what makes a config.json an export
STAGING_SUFFIX = ".tmp"  # hidden staging folders are named .{target}.{owner}.{random}.tmp
# Bytes of a target's name kept in its staging name: the tag (owner, random, suffix) needs about
# 40 more, and a name may have 255.
_STEM_BYTES = 200


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


def _file_mode() -> int:
    """Return the mode a new file gets here (0o666 less the umask): read once, at import."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


_FILE_MODE = _file_mode()


def is_disk_full(exc: BaseException) -> bool:
    """Return True if `exc` says the disk (or the quota) is full: an OSError (also numpy's
    short write, which has no errno), or safetensors' error, which reports the same fault as
    text ("StorageFull", "os error 28")."""
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT) or is_short_write(exc)
    text = str(exc)
    return type(exc).__name__ == "SafetensorError" and (
        "StorageFull" in text or "code: 28" in text or "os error 28" in text
        or "No space left" in text)


def _disk_full_error(path: Path, what: str) -> OSError:
    """Return the OSError a full disk becomes: it names the path and says nothing was kept."""
    return OSError(errno.ENOSPC, f"no space left on the device while writing {what} {path}; "
                   f"nothing of it was kept, and what was there before is unchanged: free some "
                   f"space on that disk (or write elsewhere), then rerun the same command")


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Return `path` after replacing its content with `data` in one step (temp file + rename).

    A full disk raises an OSError (ENOSPC) that names `path`; the old content stays. A
    symbolic link at `path` stays a link: the file it leads to is replaced, in that file's own
    folder. A device, FIFO or socket there is never replaced: a `BadInput` names it."""
    given = Path(path)
    path = through_link(given)
    special = special_kind(path)
    if special is not None:
        shown = str(given) if path == given else f"{given} (a link to {path})"
        raise BadInput(shown, f"is {special}, not a file, and writing a file there would "
                              f"replace it", "pass the path of a regular file (nothing was "
                                             "written)")
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{staging_stem(path.name)}.",
                                   suffix=".tmp")
    except OSError as exc:
        raise _named(exc, path) from None
    try:
        os.fchmod(fd, _FILE_MODE)  # mkstemp's file is owner-only; give it an ordinary file's mode
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if is_disk_full(exc):
            raise _disk_full_error(path, "file") from exc
        raise
    fsync_path(path.parent)
    return path


def special_kind(path: str | Path) -> str | None:
    """Return what `path` is when it is neither a file nor a folder ("a character device", "a
    block device", "a FIFO (named pipe)", "a socket"), else None (also when it is missing)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    for test, name in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return None


def _named(exc: OSError, path: Path) -> OSError:
    """Return `exc` as if raised for `path`: the user's file, not its hidden temporary one."""
    return exc if exc.errno is None else type(exc)(exc.errno, exc.strerror, str(path))


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Return `path` after replacing its content with `text` (UTF-8) in one step."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> Path:
    """Return `path` after replacing its content with `obj` as indented JSON, in one step."""
    return atomic_write_text(path, json.dumps(obj, indent=1))


def save_tokenizer(tokenizer: Tokenizer, path: str | Path) -> Path:
    """Return the path of the JSON file the tokenizer was written to (atomically: temp file, then rename).

    `path` is a file name, or a folder (the file is then `tokenizer.json` inside it). A write
    that fails raises, naming the file (a full disk as one, the old file kept); read the file
    back with `bertlab.tokenizer.load_tokenizer`.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, tokenizer.to_str())


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
        raise _named(exc, path) from None
    try:
        _write_whole(write, staging, path, fill_empty, last)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    if sweep_stale:
        for stale in path.parent.glob(f".*{STAGING_SUFFIX}"):
            shutil.rmtree(stale, ignore_errors=True)
    return path


def staging_stem(name: str) -> str:
    """Return the part of a staging name that comes from its target's `name`: the name itself,
    or, for a name too long to carry the staging tag within the file system's 255 bytes, its
    start and a digest of the whole (one per name, so a dead writer's leftovers are still found).
    """
    raw = os.fsencode(name)
    if len(raw) <= _STEM_BYTES:
        return name
    start = raw[:_STEM_BYTES - 17].decode("utf-8", "ignore")  # never half a character
    return f"{start}~{hashlib.sha256(raw).hexdigest()[:16]}"


def through_link(path: Path) -> Path:
    """Return where a symbolic link at `path` leads (or `path` itself, when it is no link), so
    that writing there keeps the user's link a link; a link that loops is a ValueError."""
    if not path.is_symlink():
        return path
    try:
        return path.resolve(strict=True)
    except (FileNotFoundError, NotADirectoryError):
        # A link to a folder not made yet: it is made where the link says. One that leads under
        # a file comes back too, for the caller's check of that path to name the file.
        return Path(os.path.realpath(path))
    except (RuntimeError, OSError):  # a loop: RuntimeError before Python 3.13, ELOOP after
        raise ValueError(f"'{path}' is a symbolic link that loops (it leads back to itself: "
                         f"{os.readlink(path)!r}); remove it, or pass another folder (nothing "
                         f"was written)") from None


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
                item.chmod(_FILE_MODE)  # some writers (safetensors) leave files owner-only
            fsync_path(item)
        fsync_path(staging)
    except BaseException as exc:
        if is_disk_full(exc):
            raise _disk_full_error(path, "folder") from exc
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
    try:
        through_link(path)  # a link is written through; one that loops is refused here
    except ValueError as e:
        raise ValueError(f"{flag} {e}") from None
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
        handle.seek(0)
        handle.truncate()
        command = " ".join(sys.argv) or sys.executable
        handle.write(f"process {os.getpid()} on {socket.gethostname()} ({command!r}, since "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S')})\n")
        handle.flush()
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
