"""The one mean / standard-error helper of the package, for torch tensors and numpy arrays.

Every Monte Carlo estimate of mptlml is a mean of independent draws, or a sum
of independent terms (strata: mask sizes, rates, or data points), each a mean
of independent draws. Its standard error follows from two rules:

- the mean of n i.i.d. draws y_1..y_n has ``se = s / sqrt(n)``, with s the
  sample standard deviation (``correction=1``); NaN when n < 2;
- a sum of independent terms has ``se = sqrt(sum_k se_k^2)`` (times a
  constant for a scaled sum, e.g. 1/N for a mean over N data points).

When every term holds a single draw, the per-term spread is unknown; for a
smooth curve of terms (the MPT curve over sizes) :func:`sum_stderr` then
estimates the local variance from successive differences,
``var ~ mean_k (v_{k+1} - v_k)^2 / 2`` (von Neumann's estimator), which
includes the curve's slope and so errs on the large side.

Reference: Moreno-Munoz, Recasens, Hauberg, "On Masked Pre-training and the
Marginal Likelihood", NeurIPS 2023, Proposition 1 (the estimators whose
errors these are).
"""

from __future__ import annotations

import math
from typing import TypeVar

import numpy as np
import torch

__all__ = ["mean_stderr", "sum_stderr"]

A = TypeVar("A", torch.Tensor, np.ndarray)


def mean_stderr(draws: A, axis: int = 0) -> tuple[A, A]:
    """Mean of i.i.d. draws along ``axis`` and its standard error ``s / sqrt(n)``.

    Parameters
    ----------
    draws : torch.Tensor or numpy.ndarray
        Independent, identically distributed draws along ``axis``.
    axis : int

    Returns
    -------
    (mean, stderr)
        Both with ``axis`` removed, of the input's kind; the standard error is
        NaN where fewer than two draws exist.
    """
    n = draws.shape[axis]
    if isinstance(draws, torch.Tensor):
        mean = draws.mean(axis)
        if n < 2:
            return mean, torch.full_like(mean, float("nan"))
        return mean, draws.var(axis, correction=1).div(n).sqrt()
    mean = draws.mean(axis=axis)
    if n < 2:
        return mean, np.full(np.shape(mean), np.nan)
    return mean, draws.std(axis=axis, ddof=1) / math.sqrt(n)


def sum_stderr(stderrs: A | None, values: A | None = None, axis: int = -1) -> A | float:
    """Standard error of a sum of independent terms: ``sqrt(sum_k se_k^2)``.

    Parameters
    ----------
    stderrs : tensor or array, or None
        The terms' standard errors along ``axis``. None (or any NaN with
        ``values`` given) means each term is a single draw.
    values : tensor or array, optional
        The terms themselves, 1-D: used only when ``stderrs`` is unknown, for
        the successive-difference estimate ``sqrt(K * mean_k (v_{k+1}-v_k)^2 / 2)``.
    axis : int

    Returns
    -------
    tensor, array or float
        NaN when neither route applies (a single term of a single draw).
    """
    if stderrs is not None:
        finite = (bool(torch.isfinite(stderrs).all()) if isinstance(stderrs, torch.Tensor)
                  else bool(np.all(np.isfinite(stderrs))))
        if finite or values is None:
            if isinstance(stderrs, torch.Tensor):
                return stderrs.pow(2).sum(axis).sqrt()
            return np.sqrt(np.sum(np.asarray(stderrs) ** 2, axis=axis))
    if values is None:
        raise ValueError("sum_stderr needs stderrs or values.")
    v = np.asarray(values.detach().cpu() if isinstance(values, torch.Tensor) else values,
                   dtype=np.float64)
    if v.size < 2:
        return float("nan")
    var = float(np.mean(np.diff(v) ** 2) / 2.0)  # one draw per term: local variance
    return math.sqrt(v.size * var)
