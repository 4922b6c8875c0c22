"""Fixtures shared by several test modules."""

from __future__ import annotations

import pytest
import torch


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
