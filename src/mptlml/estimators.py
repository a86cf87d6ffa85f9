"""Deprecated: the estimators moved to :mod:`mptlml.estimation`.

This module re-exports the old names so that existing imports keep working;
import from :mod:`mptlml` or :mod:`mptlml.estimation` instead. The block-size
constants are the defaults of the scoped settings in :mod:`mptlml.settings`
(``block_elements``, ``mask_bytes``, ``max_masks``); changing them here has
no effect, use ``with mptlml.settings.block_elements(n): ...``.
"""

from __future__ import annotations

from . import settings as _settings
from .estimation.api import estimate_lml, mpt_curve
from .estimation.dense import ESTIMATORS
from .estimation.engine import score_grid, score_masks, score_nested
from .estimation.results import LMLEstimate, MPTCurve
from .masks import fixed_rate_size

__all__ = [
    "ESTIMATORS",
    "LMLEstimate",
    "MPTCurve",
    "estimate_lml",
    "fixed_rate_size",
    "mpt_curve",
    "score_grid",
    "score_masks",
    "score_nested",
]

#: default of :class:`mptlml.settings.block_elements`
BLOCK_ELEMENTS = _settings.block_elements.default
#: default of :class:`mptlml.settings.mask_bytes`
MASK_BYTES = _settings.mask_bytes.default
#: default of :class:`mptlml.settings.max_masks`
DEFAULT_MAX_MASKS = _settings.max_masks.default
