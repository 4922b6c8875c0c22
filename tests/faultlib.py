"""Helpers for the fault tests (bad input, data loss, kills): what was on disk before and after,
and what a refusal printed. Test modules import it as `faultlib` (pytest puts tests/ on the path).
"""

from __future__ import annotations

import hashlib
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from bertlab.readers import load_corpus

# A model small enough that a command wrongly accepted finishes in seconds, not an hour.
SMALL = ["--vocab-size", "300", "--max-seq-len", "64", "--hidden-size", "32", "--num-heads", "2",
         "--intermediate-size", "64", "--batch-size", "8", "--eval-interval", "3",
         "--eval-batches", "1", "--no-progress", "--log-interval", "0", "--device", "cpu"]
TINY = ["--max-steps", "2", *SMALL]  # a 2-step pretrain


def corpus_folder(folder: Path, count: int = 40) -> Path:
    """Return `folder`, made and holding the first `count` BBC articles as .txt files."""
    folder.mkdir()
    for i, doc in enumerate(load_corpus("bbc")[:count]):
        (folder / f"doc{i:02d}.txt").write_text(doc.text, encoding="utf-8")
    return folder


def expand(command: str, world: dict[str, str]) -> list[str]:
    """Split `command` like a shell; `{name}` is a path of `world`, `TINY` a 2-step pretrain."""
    argv: list[str] = []
    for token in shlex.split(command):
        argv += TINY if token == "TINY" else [token.format(**world)]
    return argv


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


def private_tmpfs_works() -> str | None:
    """Return None where a test may mount a small private tmpfs (a real full disk), else why not."""
    if sys.platform != "linux" or shutil.which("unshare") is None:
        return "needs Linux and unshare(1)"
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                            "d=$(mktemp -d) && mount -t tmpfs -o size=1m tmpfs $d"],
                           capture_output=True, text=True)
    return None if probe.returncode == 0 else f"cannot mount a private tmpfs: {probe.stderr}"
