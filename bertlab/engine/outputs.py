"""Where a command may write: one check for every output path, made before any work.

`check_output` refuses an output that is one of the command's own inputs (compared as real
paths, so a link to the input counts), a path inside a bertlab artefact (a run, a checkpoint,
shards, a Hugging Face export: a file written there would replace one of its files, or be
taken for one), a name longer than the file system allows, and a destination this process
cannot write; each refusal is one `BadInput` that names the flag and the path as the user gave
them. The writing itself is `bertlab.atomic`'s atomic replace.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bertlab.artefacts import HF_WEIGHTS, LOCK_NAME, describe_kind, folder_kind
from bertlab.atomic import special_kind, through_link
from bertlab.engine.folders import STAGING_SUFFIX, sweep_dead_writers
from bertlab.errors import BadInput

# The artefacts whose files belong to bertlab, and what a message calls each folder.
_ARTEFACTS = {"run": "the run folder", "checkpoint": "the checkpoint",
              "shards": "the shard folder", "hf": "the Hugging Face export"}
# How far up any folder that looks like an artefact counts: RUN/checkpoints/step-N/FILE. Further
# up, every ancestor is still looked at, but only one with bertlab's own marks counts.
_ARTEFACT_DEPTH = 3
_NOTHING = "(nothing was written)"


def check_output(path: str | Path, flag: str, *, inputs: Sequence[tuple[str, object]] = (),
                 folder: bool = False, accept: tuple[str, ...] | None = None,
                 new_folder_ok: bool = False) -> str:
    """Return what `path` holds now (`bertlab.engine.folders.folder_kind`: "missing", "file", "run"...)
    once a command may write there; raise `BadInput` (a ValueError) before, if it may not.

    `inputs` lists the command's inputs as (flag, path); those that are no path on disk (a
    corpus name such as "bbc", None) are passed over. `folder`: the output is a folder (else a
    file in an existing folder). With `accept` (a folder output), what the folder may already
    hold is checked too (`check_folder_holds`); None leaves that to the command.
    `new_folder_ok`: a file output's folder may be missing (the command makes it).
    """
    shown = f"{flag} {path}"
    if str(path).strip() == "":
        raise BadInput(f"{flag} {str(path)!r}", "is empty (an unset shell variable?)",
                       f"pass a {'folder' if folder else 'file'} path {_NOTHING}")
    path = Path(path)
    _check_name_lengths(path, shown)
    if folder:  # what a killed writer set aside is put back first, so the check sees it
        sweep_dead_writers(through_link(path))
        lock = path / LOCK_NAME
        if os.path.lexists(lock) and not lock.is_file():  # found now, not after the work
            raise BadInput(shown, f"holds {lock.name} as a folder or link, where bertlab keeps "
                                  f"the lock file of whoever writes there",
                           f"remove {lock} (nothing was written)")
    _check_not_an_input(path, shown, inputs)
    _check_outside_artefacts(path, shown)
    if folder and accept is not None:
        check_folder_holds(path, flag, accept)
    elif not folder:
        _check_file_target(path, shown, new_folder_ok)
    check_writable(path, shown, folder)
    return folder_kind(path)


def _check_name_lengths(path: Path, shown: str) -> None:
    """Refuse a name in `path` longer than its file system takes (255 bytes on most)."""
    limit = _name_max(path)
    for name in path.parts:
        size = len(os.fsencode(name))
        if size > limit:
            raise BadInput(shown, f"the name {name[:40]!r}... is {size} bytes long, and this "
                                  f"file system takes at most {limit}", "choose a shorter name "
                                  + _NOTHING)


def _name_max(path: Path) -> int:
    existing = _nearest_existing(path.absolute())
    try:
        return os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):  # not on this OS or file system
        return 255


def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if os.path.isdir(candidate):  # False, not an error, for a name too long
            return candidate
    return Path(path.anchor or ".")


def _check_not_an_input(path: Path, shown: str, inputs: Sequence[tuple[str, object]]) -> None:
    """Refuse an output that is one of the command's inputs, also through a link."""
    real = os.path.realpath(path)
    for flag, given in inputs:
        if given is None or not os.path.lexists(str(given)):
            continue
        if os.path.realpath(str(given)) != real:
            continue
        held = Path(str(given))
        what = (f"folder ({describe_kind(folder_kind(held))})" if held.is_dir() else "file")
        link = " (through a link)" if os.path.abspath(held) != os.path.abspath(path) else ""
        raise BadInput(shown, f"is the same {what} as {flag} {given}{link}, which this command "
                              f"reads; writing there would replace its own input",
                       f"write the output to another path {_NOTHING}")


def _check_outside_artefacts(path: Path, shown: str) -> None:
    """Refuse a path inside a run, a checkpoint, shards or a Hugging Face export, however deep."""
    real = Path(os.path.realpath(path))
    given = [p for p in Path(path).parents if str(p) != "."]
    for depth, ancestor in enumerate(real.parents):
        kind = folder_kind(ancestor)
        if kind not in _ARTEFACTS:
            continue
        if kind == "hf" and not any((ancestor / name).is_file() for name in HF_WEIGHTS):
            continue  # a config.json alone (a project's own) makes no export
        if depth >= _ARTEFACT_DEPTH and not _surely_bertlabs(ancestor, kind):
            continue  # far up, a folder of another tool's may look like one (a checkpoints/)
        name = given[depth] if depth < len(given) else ancestor
        raise BadInput(shown, f"lies inside {_ARTEFACTS[kind]} {name} ({describe_kind(kind)}); "
                              f"a file written there would replace one of its files or be taken "
                              f"for one, and it might no longer load",
                       f"write it outside that folder {_NOTHING}")


def _surely_bertlabs(folder: Path, kind: str) -> bool:
    """Return whether `folder`, which `folder_kind` calls `kind`, bears bertlab's own marks: a
    run's run.json or checkpoints/step-N, a checkpoint's state.json beside its weights."""
    if kind == "run":
        return (folder / "run.json").is_file() or any((folder / "checkpoints").glob("step-*"))
    if kind == "checkpoint":
        return (folder / "model.safetensors").is_file()
    return True


def _check_file_target(path: Path, shown: str, new_folder_ok: bool = False) -> None:
    if path.is_dir():
        raise BadInput(shown, "is a folder", "pass a file path")
    special = special_kind(path)
    if special is not None:
        leads = os.path.realpath(path)
        link = f" (through a link to {leads})" if leads != os.path.abspath(path) else ""
        raise BadInput(shown, f"is {special}{link}, not a file, and writing the results there "
                              f"would replace it", f"pass the path of a regular file {_NOTHING}")
    parent = path.parent
    if new_folder_ok:  # the command makes the missing folders, under the nearest that is there
        missing = [parent.absolute(), *parent.absolute().parents]
        missing = missing[:missing.index(_nearest_existing(parent.absolute()))]
        if not any(os.path.lexists(p) for p in missing):
            return
    if not parent.is_dir():
        problem = (f"{parent} is a file, not a folder" if parent.exists() else
                   f"folder {parent} does not exist")
        raise BadInput(shown, problem, f"pass a file path in an existing folder {_NOTHING}")


def check_writable(path: str | Path, shown: str, folder: bool = False) -> None:
    """Raise `BadInput` naming `shown` unless this process can create files where `path` goes.

    Permission bits do not stop every writer (root ignores them) and a read-only mount says so
    only when written, so a probe file is made and removed in the folder that will take the
    output: the folder itself (an existing output folder), else the nearest existing one above.
    """
    path = Path(path).absolute()
    places = [path] if folder and path.is_dir() else []
    places.append(_nearest_existing(path.parent))
    for place in places:
        fix = f"choose a folder you may write to, or change its permissions {_NOTHING}"
        if not os.access(place, os.W_OK | os.X_OK):
            raise BadInput(shown, f"cannot be written: this process may not write in {place}",
                           fix)
        try:
            fd, probe = tempfile.mkstemp(dir=place, prefix=".bertlab-probe.",
                                         suffix=STAGING_SUFFIX)
        except OSError as e:
            raise BadInput(shown, f"cannot be written: creating a file in {place} failed "
                                  f"({e.strerror or e})", fix) from None
        os.close(fd)
        os.unlink(probe)


def check_folder_holds(path: str | Path, flag: str, accept: tuple[str, ...] = ()) -> str:
    """Return the `folder_kind` of an output folder after checking what it holds may be written
    over: `check_output`'s last step for a folder with `accept`, and the whole check of
    `bertlab.hf.save_hf`, which may write inside a run folder (a twin keeps its model in
    RUN/model) where a command's output may not.

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
