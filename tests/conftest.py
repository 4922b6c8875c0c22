"""Fixtures shared by several test modules."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
TOOLS = Path(__file__).resolve().parents[1] / "tools"


@pytest.fixture(scope="module")
def one_thread():
    """Run a module's tiny models on one torch thread (restored afterwards).

    They gain nothing from intra-op threads, and on a busy 2-core machine extra threads
    oversubscribe the cores (several times slower).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def load_script(folder: Path, name: str):
    """Import folder/name.py as a module (the benchmark and tool scripts are not a package; a
    benchmark imports its sibling `_record`, so the folder is on the path while it loads)."""
    sys.path.insert(0, str(folder))
    try:
        spec = importlib.util.spec_from_file_location(f"{name}_script", folder / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(folder))
    return module


@pytest.fixture(scope="session")
def load_benchmark():
    """Return a loader: `load_benchmark("ablations")` imports benchmarks/ablations.py."""
    return lambda name: load_script(BENCHMARKS, name)


@pytest.fixture(scope="session")
def load_tool():
    """Return a loader: `load_tool("step_functions")` imports tools/step_functions.py."""
    return lambda name: load_script(TOOLS, name)
