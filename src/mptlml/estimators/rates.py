"""Masking-rate grids and the paper's area under the MPT curve.

On a grid of masking rates 0 < r_1 < ... < r_K < 1 (the paper: 1%, ..., 99%)
a sequence of D tokens gets M_k = max(1, round(r_k D)) masked tokens (half-up
rounding), and the area under the MPT curve is

    area = L * sum_k w_k curve_k,   w_k = r_k - r_{k-1}  (r_0 = 0),

which on the paper's grid is ``(L/100) * sum_k curve_k`` with L the nominal
sequence length (512 for BERT in Table 2).

Reference: Moreno-Munoz, Recasens, Hauberg, "On Masked Pre-training and the
Marginal Likelihood", NeurIPS 2023, Sec. 4, Table 2.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._validation import check_positive_int, check_rate

__all__ = ["MAX_RATES", "check_rates", "default_rates", "mask_sizes", "mpt_area", "rate_grid",
           "rate_widths"]

#: the most masking rates a grid may hold (the paper's has 99; a grid finer than
#: 1 / D_i repeats sizes, and each rate costs a masked input per sequence and mask)
MAX_RATES = 10_000


def _check_grid_size(size: float) -> None:
    """Refuse a grid of more than :data:`MAX_RATES` rates, before it is built or scored."""
    if size > MAX_RATES:
        raise ValueError(f"a grid of {size:,.0f} masking rates is more than {MAX_RATES:,} (each "
                         "rate costs at least one masked input per sequence and mask); take a "
                         "larger step, e.g. start 0.01, step 0.01 (the paper's 99 rates), or "
                         "fewer rates.")


def default_rates() -> np.ndarray:
    """The paper's masking-rate grid 0.01, 0.02, ..., 0.99 (K = 99)."""
    return np.round(np.arange(1, 100) / 100.0, 2)


def rate_grid(start: float, step: float, stop: float = 0.99) -> np.ndarray:
    """The rates ``start, start + step, ...`` up to ``stop`` inclusive, rounded to 10 decimals.

    ``rate_grid(0.01, 0.01)`` is the paper's grid (:func:`default_rates`). A
    ``stop`` that the steps miss by less than 1e-9 of a step is still included.
    A grid of more than :data:`MAX_RATES` rates is refused before it is built.
    """
    check_rate(float(start), "start")
    check_rate(float(stop), "stop")
    if not 0 < step < 1:
        raise ValueError(f"step must lie in (0, 1), got {step!r}.")
    if start > stop:
        raise ValueError(f"start={start} lies above stop={stop}; the grid would be empty.")
    size = np.floor((stop - start) / step + 1e-9) + 1
    _check_grid_size(size)
    n = int(size)
    return np.round(start + step * np.arange(n), 10)


def check_rates(rates: Any) -> np.ndarray:
    """The rates as a strictly increasing 1-D float array in (0, 1) (None: the paper's grid).

    At most :data:`MAX_RATES` rates.
    """
    if rates is None:
        return default_rates()
    r = np.atleast_1d(np.asarray(rates, dtype=np.float64))
    if r.ndim != 1 or r.size == 0:
        raise ValueError("rates must be a non-empty 1-D list of masking rates in (0, 1).")
    _check_grid_size(r.size)
    for v in r:
        check_rate(float(v), "every masking rate")
    if np.any(np.diff(r) <= 0):
        raise ValueError("rates must be strictly increasing, e.g. [0.05, 0.10, ..., 0.95].")
    return r


def rate_widths(rates: Any) -> np.ndarray:
    """Riemann widths w_k = r_k - r_{k-1} with r_0 = 0 (0.01 each on the paper's grid)."""
    r = check_rates(rates)
    return np.diff(np.concatenate([[0.0], r]))


def mpt_area(mean_log_prob: Any, rates: Any = None, nominal_length: float = 512) -> float:
    """The paper's area under the MPT curve, ``L * sum_k w_k curve_k``.

    On the paper's grid (rates 0.01..0.99) this is ``(L/100) * sum_k curve_k``
    (Table 2 uses L = 512).

    Parameters
    ----------
    mean_log_prob : array-like of shape (K,)
        Mean log-probability of the masked tokens at each rate.
    rates : array-like of shape (K,), optional
        The rates (default: the paper's grid).
    nominal_length : float
        L, the nominal sequence length.
    """
    c = np.asarray(mean_log_prob, dtype=np.float64)
    w = rate_widths(rates)
    if c.shape != w.shape:
        raise ValueError(f"mean_log_prob has shape {c.shape} but there are {w.size} rates.")
    if not np.all(np.isfinite(c)):
        raise ValueError("mean_log_prob holds NaN/inf; drop the empty rate-0 row first.")
    return float(nominal_length * np.sum(w * c))


def mask_sizes(num_tokens: int, rates: Any) -> np.ndarray:
    """M = max(1, round(r D)) for each rate (half-up rounding, at most D)."""
    d = check_positive_int(num_tokens, "num_tokens")
    r = check_rates(rates)
    m = np.floor(r * d + 0.5).astype(np.int64)
    return np.clip(m, 1, d)

