"""A target standard error: a pilot, a Neyman allocation of masks over the strata, fresh draws.

The cumulative estimate of log p(x) is a stratified sum over mask sizes
(Proposition 1 of Moreno-Munoz, Recasens & Hauberg, NeurIPS 2023)::

    log p(x) = sum_{M=1..D} S(x; M),    S_hat(x; M) = mean of P_M masks of size M,

so with stratum variances v_h (the variance of one mask's term, divided by
the number of data it is averaged over) the Monte Carlo variance of the mean
LML is ``sum_h v_h / P_h`` at a cost of ``sum_h c_h P_h`` masked inputs per
datum (c_h: masked inputs per unit of P_h). For a target standard error t,
the counts that minimise the cost are Neyman's (Lagrange multipliers)::

    P_h = sqrt(v_h / c_h) * sum_k sqrt(v_k c_k) / t^2      ("neyman")

against ``P_h = sum_k v_k / t^2`` for every stratum (``"uniform"``: today's
``num_masks=P``). The spread of S_hat differs by orders of magnitude across
sizes (small at low masking rates, large at high ones), which is where the
saving comes from.

Procedure (:func:`plan_counts` and the estimators that call it):

1. a *pilot*: :func:`pilot_masks` masks per stratum (at least 2 and
   ``num_masks``; up to 16 with shared masks, whose spread is not pooled over
   data), on a random subset of at most :data:`PILOT_DATA` data (all data
   with shared masks), gives v_h;
2. counts from the pilot for the target (planned at :data:`PLAN_FACTOR`
   times it, so that the noise of the pilot rarely leaves the result above
   it), at least 2 per stratum (every stratum's spread stays estimable), cut
   to the budget ``max_masks`` (masked inputs per datum, the pilot included)
   when it is smaller;
3. the estimate and its standard error from *fresh* draws only: conditionally
   on the pilot, the counts are fixed, so the estimate is unbiased and the
   pooled standard error (:func:`mptlml.estimation.stats.strata_stderr`)
   honest. The pilot's cost is reported with the rest.

The result says whether the target was reached (``stop_reason="target"``),
the budget ran out first (``"budget"``), or the fresh draws came out above
the target although the plan met it (``"missed"``: the pilot underestimated
the spread); the last two warn.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
import torch

from ..estimation.results import MPTCurve
from ..estimation.stats import welch_dof

__all__ = ["ALLOCATIONS", "PILOT_DATA", "PLAN_FACTOR", "RATE_BINS", "check_target", "pilot_masks",
           "plan_counts", "ragged_curve_to_target", "ragged_sum_to_target", "stop_reason"]

#: allocations of masks over strata
ALLOCATIONS = ("neyman", "uniform")
#: most data (sequences) the pilot scores with independent masks
PILOT_DATA = 64
#: degrees of freedom per stratum the pilot aims at, and its most masks per stratum
PILOT_DOF = 64
PILOT_MAX = 16
#: the plan aims at this fraction of the target standard error
PLAN_FACTOR = 0.9
#: fewest masks per stratum (its spread must stay estimable)
MIN_COUNT = 2


def pilot_masks(num_masks: int, pooled_over: int) -> int:
    """Masks per stratum of the pilot: at least ``num_masks``, 2, and enough for
    :data:`PILOT_DOF` degrees of freedom per stratum when its spread is pooled over
    ``pooled_over`` data (sequences), at most :data:`PILOT_MAX` beyond ``num_masks``.

    A noisy pilot misallocates: a stratum whose spread it underestimates gets
    too few masks (with shared masks and 2 pilot masks per size, Neyman's
    counts left the SE at twice the target on a linear-Gaussian model).
    """
    need = 1 + math.ceil(PILOT_DOF / max(1, pooled_over))
    return max(num_masks, 2, min(need, PILOT_MAX))


def check_target(target_se: float | None, max_masks: int | None,
                 allocation: str | None) -> tuple[float | None, int | None, str]:
    """Validate ``target_se``, ``max_masks`` (budget) and ``allocation``; default ``"neyman"``."""
    if target_se is None:
        if allocation is not None:
            raise ValueError(f"allocation={allocation!r} applies with target_se= only (it "
                             "allocates the masks that reach a target standard error).")
        return None, max_masks, "uniform"
    if (isinstance(target_se, bool) or not isinstance(target_se, numbers.Real)
            or not math.isfinite(float(target_se)) or float(target_se) <= 0):
        raise ValueError(f"target_se must be a positive number (nats), got {target_se!r}.")
    if max_masks is not None and (isinstance(max_masks, bool)
                                  or not isinstance(max_masks, numbers.Integral)
                                  or int(max_masks) < 1):
        raise ValueError(f"max_masks must be a positive int (masked inputs per datum), got "
                         f"{max_masks!r}.")
    allocation = "neyman" if allocation is None else allocation
    if allocation not in ALLOCATIONS:
        raise ValueError(f"allocation must be one of {ALLOCATIONS}, got {allocation!r}.")
    return float(target_se), None if max_masks is None else int(max_masks), allocation


def plan_counts(variances: np.ndarray, costs: np.ndarray, target_se: float, allocation: str,
                budget: float | None) -> tuple[np.ndarray, bool, float]:
    """Masks per stratum for a target standard error, within a budget.

    Parameters
    ----------
    variances : (H,) array
        v_h: variance contributed to the estimate by one mask per stratum
        (so that the estimate's variance is ``sum_h v_h / P_h``).
    costs : (H,) array
        c_h: masked inputs per datum per unit of P_h.
    target_se : float
    allocation : {"neyman", "uniform"}
    budget : float or None
        Most masked inputs per datum left for the counts.

    Returns
    -------
    (counts (H,) int64, capped, wanted)
        ``capped``: the budget cut the plan; ``wanted``: the cost per datum
        the plan needed.
    """
    v = np.clip(np.nan_to_num(np.asarray(variances, dtype=np.float64), nan=0.0), 0.0, None)
    c = np.asarray(costs, dtype=np.float64)
    t2 = (PLAN_FACTOR * target_se) ** 2
    if allocation == "neyman":
        raw = np.sqrt(v / c) * np.sqrt(v * c).sum() / t2
    else:
        raw = np.full(v.shape, v.sum() / t2)
    counts = np.maximum(np.ceil(raw - 1e-9), MIN_COUNT).astype(np.int64)
    wanted = float((counts * c).sum())
    if budget is None or wanted <= budget:
        return counts, False, wanted
    floor_cost = float(MIN_COUNT * c.sum())
    if budget < floor_cost:
        raise ValueError(
            f"max_masks is too small: after the pilot, {budget:.0f} masked inputs per datum are "
            f"left, but every stratum needs at least {MIN_COUNT} masks ({floor_cost:.0f}). "
            f"Raise max_masks by at least {math.ceil(floor_cost - budget)}.")
    scaled = np.maximum(np.floor(counts * (budget / wanted)), MIN_COUNT).astype(np.int64)
    while float((scaled * c).sum()) > budget:  # the floors overshot: trim the largest
        scaled[int(np.argmax(np.where(scaled > MIN_COUNT, scaled, -1)))] -= 1
    return scaled, True, wanted


def stop_reason(stderr: float, target_se: float, capped: bool) -> str:
    """``"budget"`` when the budget cut the plan, else ``"target"`` or ``"missed"``."""
    if capped and not stderr <= target_se:
        return "budget"
    return "target" if stderr <= target_se else "missed"


def _pilot_subset(n: int, seed: int) -> np.ndarray:
    """The sequences a ragged pilot scores: at most :data:`PILOT_DATA`, at random."""
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 24]))
    return np.sort(rng.permutation(n)[:PILOT_DATA])


def _fresh_seed(seed: int) -> int:
    """The seed of the fresh draws after a pilot drawn with ``seed``."""
    return int(np.random.SeedSequence([int(seed), 25]).generate_state(1)[0] >> 1)


def _rate_bin(sizes: np.ndarray, length: int, bins: int) -> np.ndarray:
    """Rate bin of each size M of a sequence of ``length`` units: ceil(B M / D) - 1."""
    return np.minimum(bins - 1, np.ceil(bins * sizes / length - 1e-9).astype(np.int64) - 1)


#: rate bins over which a ragged pilot pools the spread of S_hat (and the counts are shared)
RATE_BINS = 10


def ragged_sum_to_target(model: Any, toks: list[torch.Tensor], target_se: float,
                         max_masks: int | None, allocation: str, num_masks: int, seed: int,
                         **run: Any) -> dict[str, Any]:
    """The cumulative sum of ragged sequences at a target SE of the mean LML.

    Strata are the (sequence, size) cells; the pilot (:func:`pilot_masks`
    masks per size on at most :data:`PILOT_DATA` sequences) pools each cell's
    spread within :data:`RATE_BINS` bins of the rate M / D_i, and the counts
    are shared within a bin. The estimate comes from fresh draws.
    """
    from ..estimation.ragged import size_cells

    n = len(toks)
    lengths = np.array([len(t) for t in toks], dtype=np.int64)
    sub = _pilot_subset(n, seed)
    p0 = pilot_masks(num_masks, int(lengths[sub].sum()) // RATE_BINS)
    cells, calls = size_cells(model, [toks[i] for i in sub],
                              [np.full(int(lengths[i]), p0) for i in sub], seed,
                              tag="exact_pilot", **run)
    pilot_rows = int(p0 * lengths[sub].sum())
    tot = np.zeros(RATE_BINS)
    cnt = np.zeros(RATE_BINS)
    for i, cell in zip(sub, cells, strict=True):
        d = int(lengths[i])
        if d == 0:
            continue
        b = _rate_bin(np.arange(1, d + 1), d, RATE_BINS)
        np.add.at(tot, b, [c.var(ddof=1) for c in cell])
        np.add.at(cnt, b, 1)
    var = np.where(cnt > 0, tot / np.maximum(cnt, 1), np.nan)
    var = np.where(np.isnan(var), np.nanmax(var) if np.isfinite(var).any() else 0.0, var)
    n_cells = np.zeros(RATE_BINS)
    for d in lengths:
        if d:
            np.add.at(n_cells, _rate_bin(np.arange(1, d + 1), int(d), RATE_BINS), 1)
    # variance of the mean LML with P_b masks per cell: sum_b var_b n_b / (N^2 P_b);
    # cost per datum: sum_b n_b P_b / N
    v = var * n_cells / n ** 2
    cost = np.maximum(n_cells / n, 1e-12)
    left = None if max_masks is None else max_masks - pilot_rows / n
    counts, capped, wanted = plan_counts(v, cost, target_se, allocation, left)
    per_seq = [counts[_rate_bin(np.arange(1, d + 1), int(d), RATE_BINS)] if d
               else np.zeros(0, dtype=np.int64) for d in lengths]
    cells, calls2 = size_cells(model, toks, per_seq, _fresh_seed(seed), tag="exact_target",
                               **run)
    lml = np.array([sum(float(c.mean()) for c in cell) for cell in cells])
    var_i = [np.array([c.var(ddof=1) / c.size for c in cell]) for cell in cells]
    se_i = np.sqrt([float(vi.sum()) for vi in var_i])
    terms = np.concatenate([vi for vi in var_i]) / n ** 2 if n else np.zeros(0)
    dofs = np.concatenate([np.array([c.size - 1 for c in cell], dtype=np.float64)
                           for cell in cells]) if n else np.zeros(0)
    stderr = float(np.sqrt(terms.sum())) if terms.size else 0.0
    rows = np.array([int(c.sum()) for c in per_seq], dtype=np.int64)
    rows[sub] += p0 * lengths[sub]
    return {"lml": lml, "stderr": se_i, "stderr_mean": stderr,
            "dof": welch_dof(torch.from_numpy(terms), torch.from_numpy(dofs)),
            "calls": calls + calls2, "rows": rows, "counts": counts.tolist(),
            "capped": capped, "wanted": wanted + pilot_rows / n,
            "stop_reason": stop_reason(stderr, target_se, capped)}


def ragged_curve_to_target(model: Any, sequences: Any, target_se: float, max_masks: int | None,
                           allocation: str, num_masks: int, seed: int,
                           **options: Any) -> MPTCurve:
    """The MPT curve of ragged sequences at a target SE of the mean LML ``D_i mean_k S_ik``.

    Strata are the rates of the grid; the pilot (:func:`pilot_masks` masks
    per rate on at most :data:`PILOT_DATA` sequences) gives each rate's spread
    of ``(D_i / K) S_hat``, the counts per rate follow
    (:func:`plan_counts`), and the curve is drawn afresh with them.
    """
    from ..estimation.ragged import mlm_curve

    if options.get("exact"):
        raise ValueError("exact=True does not combine with target_se (its sum over every size is "
                         "a separate estimate); use estimate_lml(..., target_se=) for it.")
    seqs = list(sequences)
    n = len(seqs)
    sub = _pilot_subset(n, seed)
    p0 = pilot_masks(num_masks, len(sub))
    pilot_options = {k: v for k, v in options.items() if k not in ("checkpoint_dir", "ids")}
    pilot = mlm_curve(model, [seqs[i] for i in sub], num_masks=p0, seed=seed, **pilot_options)
    assert pilot.per_sample_stderr is not None
    k = len(pilot.rates)
    d_sub = np.asarray(pilot.num_tokens, dtype=np.float64)
    s2 = (pilot.per_sample_stderr.numpy() ** 2) * p0  # (n_sub, K): variance of one mask
    v = np.nanmean((d_sub[:, None] / k) ** 2 * s2, axis=0) / n
    left = None if max_masks is None else max_masks - pilot.num_masked_rows / n
    counts, capped, wanted = plan_counts(v, np.ones(k), target_se, allocation, left)
    res = mlm_curve(model, seqs, num_masks=counts, seed=_fresh_seed(seed), **options)
    assert res.num_masked_rows_per_sample is not None and res.lml_stderr_mean is not None
    rows = res.num_masked_rows_per_sample.clone()
    rows[torch.as_tensor(sub)] += int(pilot.num_masked_rows // max(len(sub), 1))
    res.num_masked_rows += pilot.num_masked_rows
    res.num_masked_rows_per_sample = rows
    res.num_model_calls += pilot.num_model_calls
    res.target_se, res.allocation = target_se, allocation
    res.stop_reason = stop_reason(res.lml_stderr_mean, target_se, capped)
    res.extra["masks_per_rate"] = counts.tolist()
    res.extra["masks_wanted"] = wanted + pilot.num_masked_rows / n
    return res
