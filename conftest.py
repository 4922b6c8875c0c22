"""Settings for every test run: the unit tests (`pytest tests`) and the notebooks (`pytest --nbval`).

Each pytest invocation gets its own empty bertlab cache, as a new learner's machine has, so no
test passes only because something earlier (another test run, a notebook, last week's demo) left
a trained tokenizer behind. The folder goes into the environment, so the notebook kernels that
nbval starts use it too; it is removed when the run ends.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest


def pytest_configure(config: pytest.Config) -> None:
    folder = tempfile.mkdtemp(prefix="bertlab-test-cache-")
    config.stash[_CACHE] = (folder, os.environ.get("BERTLAB_CACHE"))
    os.environ["BERTLAB_CACHE"] = folder


def pytest_unconfigure(config: pytest.Config) -> None:
    folder, previous = config.stash[_CACHE]
    shutil.rmtree(folder, ignore_errors=True)
    if previous is None:
        os.environ.pop("BERTLAB_CACHE", None)
    else:
        os.environ["BERTLAB_CACHE"] = previous


_CACHE = pytest.StashKey[tuple[str, "str | None"]]()
