"""Fixtures shared by the test modules."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One intra-op thread for the test (restored after it).

    Tiny ops: one thread avoids oversubscription stalls on a busy 2-core machine. A module
    opts in with ``pytestmark = pytest.mark.usefixtures("one_thread")``.
    """
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
