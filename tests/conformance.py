"""Moved to :mod:`mptlml.testing` (shipped with the package); kept for old imports."""

from mptlml.testing import ModelConformance

__all__ = ["ModelConformance"]
