"""Experiments: one thin module per figure or table of the paper, and the jobs around them.

- :mod:`.registry`: ``EXPERIMENTS`` (reproduce name -> module) and what each module defines;
- :mod:`.driver`: :func:`run_experiment` (one part into a run directory) and :func:`run_all`;
- :mod:`.common`: run directories (:class:`~.common.RunDir`), results.json, printed tables;
- the jobs of the command line beside the reproductions: :mod:`.demo` (``mptlml demo``),
  :mod:`.select` (``mptlml select``), :mod:`.mlm` (``mptlml curve``).

Library modules (training, estimators, selection, models) never import this package.
"""

from __future__ import annotations

from .driver import run_all, run_experiment
from .registry import EXPERIMENTS, get_experiment

__all__ = ["EXPERIMENTS", "get_experiment", "run_all", "run_experiment"]
