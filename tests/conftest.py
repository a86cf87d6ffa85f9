"""Test-session settings: the tests never download (Hugging Face's own offline switch).

``HF_HUB_OFFLINE`` is read when ``huggingface_hub``/``datasets`` are imported,
so it is set here, before any test module imports them. Without it a hub id
that is not cached is retried over the network for about a minute.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
