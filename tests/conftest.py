"""Test-session settings: the tests never download (Hugging Face's own offline switch).

``HF_HUB_OFFLINE`` is read when ``huggingface_hub``/``datasets`` are imported,
so it is set here, before any test module imports them. Without it a hub id
that is not cached is retried over the network for about a minute.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")


import pytest  # noqa: E402  (after the environment is set)


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
