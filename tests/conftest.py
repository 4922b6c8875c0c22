"""Fixtures shared by several test modules."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


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


@pytest.fixture(scope="session")
def load_benchmark():
    """Return a loader: `load_benchmark("ablations")` imports benchmarks/ablations.py as a module
    (the scripts are not a package; they import their sibling `_record`)."""
    def load(name: str):
        sys.path.insert(0, str(BENCHMARKS))
        try:
            spec = importlib.util.spec_from_file_location(f"{name}_script", BENCHMARKS / f"{name}.py")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        finally:
            sys.path.remove(str(BENCHMARKS))
        return module
    return load
