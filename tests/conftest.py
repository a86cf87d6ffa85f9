"""Fixtures shared by the test modules, the session's offline switch, and threads per worker.

The tests never download: ``HF_HUB_OFFLINE`` (Hugging Face's own switch) is
read when ``huggingface_hub``/``datasets`` are imported, so it is set here,
before any test module imports them. Without it a hub id that is not cached
is retried over the network for about a minute.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test` runs one worker per core (pytest-xdist):
    # each worker's torch then keeps to its share of the cores, no oversubscription
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(
        os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))


@pytest.fixture(autouse=True)
def _not_quiet_after() -> Iterator[None]:
    """The command line's ``-q`` is process-wide (``mptlml._progress.set_quiet``): a test that
    runs ``main([..., "-q"])`` in-process leaves it on, and a later test of the same worker
    that expects a progress bar would see none (tests/test_quiet.py failed so, depending on
    how xdist shared the tests out). Every test ends not quiet."""
    yield
    from mptlml import _progress

    if _progress._QUIET:
        _progress.set_quiet(False)


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


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny random BERT masked LM saved with its tokenizer (tests/mlm_helpers.py)."""
    from .mlm_helpers import make_tiny_bert

    return make_tiny_bert(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    """That model as a MaskedLM."""
    from mptlml.models import MaskedLM

    return MaskedLM.from_pretrained(tiny_dir)


@pytest.fixture(scope="module")
def antiberty():
    """AntiBERTy (offline; skipped without the antiberty package)."""
    pytest.importorskip("antiberty")
    from mptlml.models import MaskedLM

    return MaskedLM.antiberty()


@pytest.fixture
def own_tasks_only(monkeypatch):
    """lm-eval's ``TaskManager`` indexes only the tasks of its ``include_path``, wherever lm-eval
    builds one (its command line, in this process), not its thousands of built-in tasks (about
    10 s on an idle core): for the tests of the command line on their own task folders."""
    from lm_eval.tasks import TaskManager

    init = TaskManager.__init__

    def own_only(self, *args, **kwargs):
        init(self, *args, **{**kwargs, "include_defaults": not kwargs.get("include_path")})

    monkeypatch.setattr(TaskManager, "__init__", own_only)
