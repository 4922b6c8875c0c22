"""Helpers for the fault tests (bad input, data loss, kills): what was on disk before and after,
and what a refusal printed. Test modules import it as `faultlib` (pytest puts tests/ on the path).
"""

from __future__ import annotations

import hashlib
from pathlib import Path


def snapshot(*roots: str | Path) -> dict[str, object]:
    """Return {path: (SHA-256, mtime_ns)} for every file, {path: "folder"} for every folder and
    {path: "-> target"} for every link under each root (a root that is a file counts itself)."""
    state: dict[str, object] = {}
    for root in map(Path, roots):
        paths = [root, *sorted(root.rglob("*"))] if root.is_dir() and not root.is_symlink() \
            else [root]
        for path in paths:
            if path.is_symlink():
                state[str(path)] = f"-> {path.readlink()}"
            elif path.is_dir():
                state[str(path)] = "folder"
            elif path.is_file():
                state[str(path)] = (hashlib.sha256(path.read_bytes()).hexdigest(),
                                    path.stat().st_mtime_ns)
            elif path.exists():
                state[str(path)] = "special"
            else:
                state[str(path)] = "absent"
    return state


def assert_unchanged(before: dict[str, object], after: dict[str, object]) -> None:
    changed = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    assert changed == [], f"the refused command changed {changed}"


def assert_one_clear_error(err: str, fragments: list[str]) -> None:
    """One `error:` line holding every fragment, and no traceback."""
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, err
    for fragment in fragments:
        assert fragment in errors[0], f"{fragment!r} not in {errors[0]!r}"
