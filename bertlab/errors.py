"""How a command's failures reach the user: one `error:` line and an exit code.

`python -m bertlab` runs every subcommand through `run_reporting`: a ValueError (bad input)
exits 2, a failed run or machine (NaN loss, disk full) exits 1, a stop by signal N exits
128 + N; warnings print as one `warning:` line.

Taught in notebooks/05_pretraining.ipynb
"""

from __future__ import annotations

import errno
import math
import os
import re
import signal
import sys
import warnings
from collections.abc import Callable
from typing import Any


class BadInput(ValueError):
    """Bad input from the user: names the input, says what is wrong with it and how to fix it.

    The CLI prints it as one `error:` line with exit code 2 (like every ValueError); the Python
    API raises it, so a notebook sees the same sentence.
    """

    def __init__(self, what: str, problem: str, fix: str) -> None:
        self.what, self.problem, self.fix = what, problem, fix
        super().__init__(f"{what}: {problem}; {fix}")


class BadType(BadInput, TypeError):
    """An argument of the wrong type: a `BadInput` (one `error:` line, exit 2, the argument, its
    value and the fix) that is also the TypeError Python code expects for a wrong type."""


def check_type(value: Any, types: type | tuple[type, ...], argument: str, wanted: str,
               fix: str) -> None:
    """Raise `BadType` naming `argument`, its value and `fix` unless `value` is one of `types`
    (`wanted` says them in words: "a tokenizers.Tokenizer"). A bool is no number here."""
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in
                                           (types if isinstance(types, tuple) else (types,)))
    if not ok:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise BadType(f"{argument}={shown}", f"is a {type(value).__name__}, not {wanted}", fix)


# errno -> what to do about it, for OSErrors that reach main().
OS_ERROR_FIXES = {
    errno.ENOSPC: "free some disk space or write to another disk; files are written whole or "
                  "not at all, so rerun the same command (with --resume for pretrain)",
    errno.EDQUOT: "free some space within your quota or write elsewhere, then rerun",
    errno.EACCES: "check the permissions, or choose a path you may write to",
    errno.EPERM: "check the permissions, or choose a path you may write to",
    errno.EROFS: "the file system is read-only; choose a path on a writable disk",
    errno.ENOENT: "check the path",
    errno.ENOTDIR: "a part of the path is a file, not a folder; choose a path under a folder",
    errno.EISDIR: "it is a folder; pass a file path",
    errno.EEXIST: "it is in the way; move it or choose another path",
    errno.ENAMETOOLONG: "choose a shorter path",
}
# The machine, not the input, is at fault: exit 1 like a failed run, not 2 like a bad argument.
MACHINE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO}
# numpy's `tofile` (under `np.save`) reports a write that stopped short with this text and no
# errno: C's fwrite hides the reason, and on a local disk the reason is a full one.
_SHORT_WRITE = re.compile(r"(\d+) requested and (\d+) written")


def is_short_write(e: BaseException) -> bool:
    """Return True if `e` is numpy's OSError for a write that stopped short (a full disk)."""
    if not isinstance(e, OSError) or e.errno is not None:
        return False
    found = _SHORT_WRITE.fullmatch(str(e).strip())
    return found is not None and int(found[2]) < int(found[1])


def os_error_line(e: OSError) -> str:
    if is_short_write(e):
        return (f"error: no space left on the device: a write stopped short ({e}); "
                f"{OS_ERROR_FIXES[errno.ENOSPC]}")
    fix = OS_ERROR_FIXES.get(e.errno, "check the path and try again")
    if e.filename is None and e.strerror and e.errno is not None and \
            e.strerror != os.strerror(e.errno):
        return f"error: {e.strerror}"  # bertlab's own message: it names the path and the fix
    if e.filename is None:
        return f"error: {e.strerror or e}; {fix}"
    path = str(e.filename) + (f" -> {e.filename2}" if e.filename2 is not None else "")
    return f"error: cannot use {path}: {e.strerror or e}; {fix}"


def show_warning(message: Warning | str, *args: Any, **kwargs: Any) -> None:
    # A warning is news for the user (a corrupt checkpoint skipped, a cache entry retrained):
    # one line, without the source line that Python's default format adds.
    print(f"warning: {message}", file=sys.stderr)


def run_reporting(command: Callable[[], int], words: Callable[[str], str] = str) -> int:
    """Return the exit code of `command()`: its own, or the one its exception maps to (above),
    after printing one `error:` line (its text through `words`: the CLI adds the flag of each
    setting a message names). Warnings print as one `warning:` line meanwhile."""
    with warnings.catch_warnings():
        warnings.showwarning = show_warning
        try:
            return command()
        except ValueError as e:
            print(f"error: {words(str(e))}", file=sys.stderr)
            return 2
        except FloatingPointError as e:
            print(f"error: {words(str(e))}", file=sys.stderr)
            return 1
        except OSError as e:
            print(os_error_line(e), file=sys.stderr)
            return 1 if e.errno in MACHINE_ERRNOS or is_short_write(e) else 2
        except KeyboardInterrupt as e:
            # The training loop raises a KeyboardInterrupt carrying `signum` for SIGTERM too.
            signum = int(getattr(e, "signum", signal.SIGINT))
            print(f"stopped by {signal.Signals(signum).name} (exit code {128 + signum})",
                  file=sys.stderr)
            return 128 + signum


# --------------------------------------------------------------------------------------------
# Checking settings

# A number setting is finite: inf or NaN would train nothing, or train into NaN, silently.
_NUMBER_KINDS = {
    "positive integer": lambda v: isinstance(v, int) and v > 0,
    "integer >= 0": lambda v: isinstance(v, int) and v >= 0,
    "positive number": lambda v: isinstance(v, (int, float)) and math.isfinite(v) and v > 0,
    "number >= 0": lambda v: isinstance(v, (int, float)) and math.isfinite(v) and v >= 0,
}


def flag_of(name: str) -> str:
    """Return the command-line flag of a settings field: "max_seq_len" -> "--max-seq-len".

    The CLI makes its generated flags (one per TrainConfig field) this way, and adds the flag to
    an error that names the setting: "TrainConfig.lr (--lr)".
    """
    return "--" + name.replace("_", "-")


def check_number(owner: str, name: str, value: Any, kind: str, *, none_ok: bool = False) -> None:
    """Raise a ValueError naming `owner.name`, `kind` and `value` unless `value` is of `kind`.

    `kind` is "positive integer", "integer >= 0", "positive number" or "number >= 0" (a bool is
    none of them; a number is finite, never inf or NaN); None passes when `none_ok`. E.g.
    "TrainConfig.lr must be a positive number, got -1.0" (the CLI adds "(--lr)").
    """
    if value is None and none_ok:
        return
    if isinstance(value, bool) or not _NUMBER_KINDS[kind](value):
        article = "an" if kind[0] in "aeiou" else "a"
        finite = ("; inf and NaN are not settings" if isinstance(value, float)
                  and not math.isfinite(value) else "")
        raise ValueError(f"{owner}.{name} must be {article} {kind}"
                         f"{' or None' if none_ok else ''}, got {value!r}{finite}")
