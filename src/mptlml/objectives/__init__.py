"""Training objectives (values to maximise, per datum), in the style of GPyTorch's ``mlls``."""

from .base import Objective

__all__ = ["Objective"]
