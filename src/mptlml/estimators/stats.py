"""The one mean / standard-error helper of the package, for torch tensors and numpy arrays.

Every Monte Carlo estimate of mptlml is a mean of independent draws, or a sum
of independent terms (strata: mask sizes, rates, or data points), each a mean
of independent draws. Its standard error follows from two rules:

- the mean of n i.i.d. draws y_1..y_n has ``se = s / sqrt(n)``, with s the
  sample standard deviation (``correction=1``); NaN when n < 2;
- a sum of independent terms has ``se = sqrt(sum_k se_k^2)`` (times a
  constant for a scaled sum, e.g. 1/N for a mean over N data points).

An estimate that is a sum over independent strata (mask sizes, and data
with independent masks) is best given its variance stratum by stratum:
:func:`strata_stderr` pools each stratum's spread over the P draws and sums
them, so its variance estimate rests on many more degrees of freedom than the
P - 1 of the P draws of the whole sum (Welch-Satterthwaite,
:func:`welch_dof`). With P = 2 draws of the mean the z-score is Student's t
with one degree of freedom (|z| > 2 in 30% of runs); pooled over the data and
the sizes it is close to normal.

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
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np
import torch

__all__ = ["ExactCell", "SampledCell", "cell_error", "cell_spread", "cell_sums", "des_raj",
           "enumerated_sum", "exact_cell", "mean_stderr", "pooled_size_error",
           "sampled_cell", "strata_stderr",
           "sum_stderr", "welch_dof"]

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


def cell_sums(cell: Sequence[np.ndarray], single_draws: bool = False
              ) -> tuple[float, float, np.ndarray, np.ndarray]:
    """One sequence's sum of independent terms, each the mean of its own draws (a cell).

    Returns the sum of the cells' means, its standard error
    (:func:`sum_stderr`; with ``single_draws``, one draw per cell, from the
    successive differences of the means), each cell's variance of the mean and
    its degrees of freedom (its draws minus one).
    """
    stats = [(float(np.mean(c)), 0.0) if isinstance(c, ExactCell) else mean_stderr(c)
             for c in cell]
    mean = np.array([m for m, _ in stats])
    # a sample without replacement: the finite-population correction (cell_error's)
    fpc = np.array([1.0 - len(c) / c.population if isinstance(c, SampledCell) else 1.0
                    for c in cell], dtype=np.float64)
    se = np.array([e for _, e in stats], dtype=np.float64) * np.sqrt(fpc)
    total_se = sum_stderr(None if single_draws else se, mean)
    dofs = np.array([cell_error(c)[2] for c in cell], dtype=np.float64)
    return float(mean.sum()), float(total_se), se ** 2, dofs


def pooled_size_error(cells: Sequence[np.ndarray]) -> tuple[float, float] | None:
    """A draw of every size's variance, pooled over the sizes by a finite-population model.

    ``cells[M-1]`` holds P_M scores ``S_hat(x; M)`` (the mean log-probability of a uniform
    mask of M of the T = ``len(cells)`` tokens; an :class:`ExactCell`: the size enumerated,
    no error). If the T tokens' log-probabilities were a fixed population of variance
    sigma^2, the mean of M of them drawn without replacement would have variance
    ``sigma^2 f_M``, ``f_M = (T - M) / (M (T - 1))``; so each drawn size's sample variance
    gives ``s_M^2 / f_M`` an estimate of sigma^2 on P_M - 1 degrees of freedom, pooled
    ``sigma^2_hat = sum_M (P_M - 1) s_M^2 / f_M / sum_M (P_M - 1)`` on ``nu = sum_M (P_M -
    1)`` degrees of freedom (instead of P_M - 1 per size), and the sum's variance is
    ``sum_M sigma^2_hat f_M / P_M``. Returns that variance and nu; None with fewer than two
    drawn sizes, or a drawn size of fewer than two draws (then the sizes' own variances).
    """
    t = len(cells)
    drawn = [(m, np.asarray(c, dtype=np.float64)) for m, c in enumerate(cells, start=1)
             if not isinstance(c, ExactCell) and m < t]
    if len(drawn) < 2 or any(c.size < 2 for _, c in drawn):
        return None
    shape = {m: (t - m) / (m * (t - 1)) for m, _ in drawn}
    nu = float(sum(c.size - 1 for _, c in drawn))
    sigma2 = sum((c.size - 1) * float(c.var(ddof=1)) / shape[m] for m, c in drawn) / nu
    return float(sum(sigma2 * shape[m] / c.size for m, c in drawn)), nu


def enumerated_sum(sums: np.ndarray, sizes: np.ndarray) -> float:
    """The MPT sum from every mask: ``sum_M mean_{|mask| = M} (sum_{j in mask} log p) / M``.

    ``sums[r]`` is the summed log-probability of mask r, ``sizes[r]`` its size; every mask of
    every size 1..D must be there once (e.g. :func:`mptlml.masks.every_mask`). Exact: no
    Monte Carlo error (Proposition 1 of Moreno-Munoz, Recasens & Hauberg, NeurIPS 2023).
    """
    s = np.asarray(sums, dtype=np.float64)
    m = np.asarray(sizes)
    return float(sum(s[m == k].mean() / k for k in np.unique(m)))


class ExactCell(np.ndarray):
    """The scores of every member of a finite population (each distinct mask of a size
    once): its mean is the term exactly (standard error 0, no degrees of freedom), and its
    spread is the spread of one draw (what a plan needs)."""


def exact_cell(values: Any) -> ExactCell:
    """``values`` (every distinct mask's score, once each) as an :class:`ExactCell`."""
    return np.asarray(values, dtype=np.float64).view(ExactCell)


class SampledCell(np.ndarray):
    """Draws made without replacement from a finite population of ``population`` equally
    likely members (distinct random orders, say): the mean of n of them is unbiased and its
    variance is ``(1 - n / N) S^2 / n`` (the finite-population correction; S^2 the population
    variance with divisor N - 1, estimated without bias by the sample variance)."""

    population: float = math.inf

    def __array_finalize__(self, obj: Any) -> None:
        self.population = getattr(obj, "population", math.inf)


def sampled_cell(values: Any, population: float) -> SampledCell:
    """``values``, n distinct members of a population of ``population``, as a
    :class:`SampledCell`."""
    out = np.asarray(values, dtype=np.float64).view(SampledCell)
    try:
        out.population = float(population)
    except OverflowError:  # more members than a float holds (C(D, M), D! of long sequences)
        out.population = math.inf
    return out


def des_raj(ratios: Any, probs: Any) -> np.ndarray:
    """des Raj's ordered terms of P draws made one by one without replacement.

    Draw k is made from the members not drawn before, with probability ``p_u / (1 -
    sum_{j<k} p_j)`` for a member u of draw probability p_u (one draw of the with-replacement
    design, rejected while it repeats an earlier one). With ``ratios[k] = y_k / p_k`` (the
    with-replacement estimate of the total ``Y = sum_u y_u`` from draw k alone)::

        t_1 = y_1 / p_1,    t_k = sum_{j<k} y_j + (y_k / p_k) (1 - sum_{j<k} p_j).

    Each t_k is unbiased for Y given the draws before it, so the t_k are uncorrelated, their
    mean is unbiased and ``sum_k (t_k - t_mean)^2 / (P (P - 1))`` is an unbiased estimate of
    its variance on P - 1 degrees of freedom (des Raj, "Some estimators in sampling with
    varying probabilities without replacement", JASA 51, 1956). Unlike i.i.d. draws, no two
    draws repeat a member, so the variance estimate is 0 only when the members' ratios are
    equal, and what is drawn first is known exactly thereafter (t_k for k >= 2 shrinks as
    the drawn probability grows).

    Parameters
    ----------
    ratios, probs : array-like, (P,)
        ``y_k / p_k`` and ``p_k`` of the draws in the order drawn.

    Returns
    -------
    numpy.ndarray, (P,)
        t_1 .. t_P.
    """
    r = np.asarray(ratios, dtype=np.float64)
    p = np.asarray(probs, dtype=np.float64)
    y = r * p
    before_y = np.concatenate([[0.0], np.cumsum(y)[:-1]])
    before_p = np.concatenate([[0.0], np.cumsum(p)[:-1]])
    return before_y + r * (1.0 - before_p)


def cell_spread(cell: np.ndarray) -> float:
    """The variance of one draw of a cell's term: the sample variance of its draws, or, for
    an :class:`ExactCell` (the whole population), the population variance."""
    c = np.asarray(cell, dtype=np.float64)
    return float(c.var(ddof=0 if isinstance(cell, ExactCell) else 1))


def cell_error(cell: np.ndarray) -> tuple[float, float, float]:
    """Mean of a cell's draws, the variance of that mean and its degrees of freedom.

    An :class:`ExactCell` has variance 0 (weighing nothing in :func:`welch_dof`); other
    cells ``var(ddof=1) / n`` on ``n - 1`` (NaN below two draws), times ``1 - n / N`` for
    a :class:`SampledCell` of a population of N.

    A 2-D cell ``(P, K)`` is K independent columns of P draws each (a stratum of dense
    data drawn with independent masks per datum, each column a datum's draws over N): its
    mean is the sum of the column means, its variance ``sum_k var_k(ddof=1) / P`` and its
    degrees of freedom Welch-Satterthwaite's over the columns,
    ``(sum_k v_k)^2 / sum_k (v_k^2 / (P - 1))`` (so that ``V^2 / nu = sum_k v_k^2 / nu_k``:
    a sum of such cells has the dof of all their columns, :func:`strata_stderr`'s).
    """
    c = np.asarray(cell, dtype=np.float64)
    if isinstance(cell, ExactCell):
        return float(c.mean()), 0.0, 1.0
    if c.ndim == 2:  # K independent columns of P draws each
        p, k = c.shape
        if p < 2:
            return float(c.mean(0).sum()), float("nan"), 0.0
        v = c.var(0, ddof=1) / p
        dof = (welch_dof(torch.from_numpy(v), float(p - 1)) if float((v ** 2).sum()) > 0
               else float((p - 1) * k))
        return float(c.mean(0).sum()), float(v.sum()), dof
    if c.size < 2:
        return float(c.mean()), float("nan"), 0.0
    fpc = 1.0 - c.size / cell.population if isinstance(cell, SampledCell) else 1.0
    return float(c.mean()), fpc * float(c.var(ddof=1)) / c.size, float(c.size - 1)


def welch_dof(variances: torch.Tensor, dofs: torch.Tensor | float) -> float:
    """Effective degrees of freedom of a sum of independent variance estimates.

    Welch-Satterthwaite: ``(sum_k v_k)^2 / sum_k (v_k^2 / nu_k)`` for
    estimates v_k with nu_k degrees of freedom (``dofs``, one each or one for
    all). It is ``sum_k nu_k`` when the terms are alike and falls to one
    term's nu_k when that term dominates (a heavy-tailed datum, one noisy
    mask size). Infinite when every v_k is 0 (an exact sum).
    """
    v = variances.double().reshape(-1)
    nu = torch.as_tensor(dofs, dtype=torch.float64).expand_as(v) if not isinstance(
        dofs, torch.Tensor) else dofs.double().reshape(-1)
    den = float((v.pow(2) / nu).sum())
    return float("inf") if den == 0.0 else float(v.sum()) ** 2 / den


def strata_stderr(cells: torch.Tensor | Sequence[torch.Tensor], shared: bool = False
                  ) -> tuple[torch.Tensor, float, float]:
    """Standard errors of a stratified Monte Carlo sum, pooled over strata (and data).

    ``cells[h][p, n]`` is the term of stratum h (a mask size) in draw p of
    datum n; the estimate of datum n is ``sum_h mean_p cells[h][p, n]``, the
    strata are independent and the P_h draws of a stratum i.i.d. Then, with
    ``s2[h, n]`` the sample variance over the P_h draws::

        per-datum  se_n^2 = sum_h s2[h, n] / P_h
        mean over data, independent masks:  se^2 = sum_n se_n^2 / N^2
        mean over data, shared masks:       se^2 = sum_h var_p(mean_n cells[h][p, n]) / P_h

    (shared masks correlate the data, so only the data means of a stratum are
    independent across draws). Each is unbiased for the variance, as the
    sample variance of P draws of the whole sum is, but pools H (times N)
    variance estimates instead of relying on P - 1 degrees of freedom.

    Parameters
    ----------
    cells : torch.Tensor (H, P, N), or a sequence of H tensors (P_h, N)
    shared : bool
        Whether one mask per (stratum, draw) served every datum.

    Returns
    -------
    (per_datum_se (N,), se_of_mean, dof)
        ``dof`` is the Welch-Satterthwaite effective degrees of freedom of
        ``se_of_mean`` (:func:`welch_dof`); the SEs are NaN where a stratum has
        fewer than two draws.
    """
    per_datum: torch.Tensor | float = 0.0
    terms, dofs = [], []
    for cell in cells:
        c = cell.double()
        p, n = c.shape
        if p < 2:
            nan = float("nan")
            return torch.full((n,), nan, dtype=torch.float64, device=c.device), nan, nan
        s2 = c.var(0, correction=1)  # (N,)
        per_datum = per_datum + s2 / p
        terms.append(c.mean(1).var(correction=1).reshape(1) / p if shared else s2 / (p * n * n))
        dofs.append(torch.full_like(terms[-1], float(p - 1)))
    if not terms:
        raise ValueError("strata_stderr needs at least one stratum.")
    v = torch.cat(terms)
    assert isinstance(per_datum, torch.Tensor)
    return per_datum.sqrt(), float(v.sum().sqrt()), welch_dof(v, torch.cat(dofs))
