"""Files written in one step: a crash, a kill or a full disk leaves the old file or the new one.

Every file bertlab writes (into a run, a shard folder, a cache, a results file) goes through
`atomic_write_*`: a temporary file in the same folder, flushed, then renamed over the target. A
symbolic link at the target stays a link (`through_link`: the file it leads to is replaced), and a
device, FIFO or socket is never replaced. A full disk raises an OSError that names the file
(`is_disk_full` recognises one however it is reported). Folders that must appear whole are built
by `bertlab.engine.folders.atomic_write_folder` on top of these.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from bertlab.errors import BadInput, is_short_write

# Bytes of a target's name kept in its staging name: the tag (owner, random, suffix) needs about
# 40 more, and a name may have 255.
_STEM_BYTES = 200


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


FILE_MODE = _file_mode()


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


def disk_full_error(path: Path, what: str) -> OSError:
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
        raise named_error(exc, path) from None
    try:
        os.fchmod(fd, FILE_MODE)  # mkstemp's file is owner-only; give it an ordinary file's mode
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if is_disk_full(exc):
            raise disk_full_error(path, "file") from exc
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


def named_error(exc: OSError, path: Path) -> OSError:
    """Return `exc` as if raised for `path`: the user's file, not its hidden temporary one."""
    return exc if exc.errno is None else type(exc)(exc.errno, exc.strerror, str(path))


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Return `path` after replacing its content with `text` (UTF-8) in one step."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> Path:
    """Return `path` after replacing its content with `obj` as indented JSON, in one step."""
    return atomic_write_text(path, json.dumps(obj, indent=1))


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
