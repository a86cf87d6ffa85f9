"""Models that expose masked conditionals (see :mod:`mptlml.models.base`)."""

from .base import MaskedModel
from .masked_lm import MaskedLM

__all__ = ["MaskedLM", "MaskedModel"]
