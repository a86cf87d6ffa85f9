"""Torch intra-op threads for one run, restored afterwards (the ``num_threads`` settings)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["torch_threads"]


@contextlib.contextmanager
def torch_threads(num_threads: int | None) -> Iterator[None]:
    """Run the block with ``num_threads`` torch intra-op threads (None: leave them as they are).

    Tiny models (PPCA at D = 10, the digits VAEs) gain nothing from a second
    thread, and on a busy machine its spin-waits multiply the CPU time: the
    quick Fig. 2 run took 664 s on 2 threads and 8 s on 1 on a loaded 2-core host.
    """
    before = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
