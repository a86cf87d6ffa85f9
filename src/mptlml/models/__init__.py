"""Models that expose masked conditionals (see :mod:`mptlml.models.base`)."""

from .base import MaskedModel
from .masked_lm import MaskedLM
from .ppca import PPCA

__all__ = ["PPCA", "MaskedLM", "MaskedModel"]
