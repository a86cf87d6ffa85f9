"""Models that expose masked conditionals (see :mod:`mptlml.models.base`)."""

from .base import MaskedModel

__all__ = ["MaskedModel"]
