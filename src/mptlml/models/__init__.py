"""Models that expose masked conditionals (see :mod:`mptlml.models.base`)."""

from .base import MaskedModel
from .ppca import PPCA

__all__ = ["PPCA", "MaskedModel"]
