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

Procedure (:meth:`mptlml.estimators.Estimator.estimate` with ``target_se`` for every
unbiased estimator, dense and ragged, and :func:`mptlml.mpt_curve`; the
strata are an estimator's: mask sizes for ``cumulative``, bins of the rate
M / D_i on ragged sequences, one stratum of draws for ``random-size``):

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
   pooled standard error (:func:`mptlml.estimators.stats.strata_stderr`)
   honest. The pilot's cost is reported with the rest.

The result says whether the target was reached (``stop_reason="target"``),
the budget ran out first (``"budget"``), or the fresh draws came out above
the target although the plan met it (``"missed"``: the pilot underestimated
the spread); the last two warn
(:func:`mptlml.estimators.results.warn_target_missed`).
"""

from __future__ import annotations

import logging
import math
import numbers

import numpy as np
import torch

from .._validation import ALLOCATIONS

__all__ = ["MAX_PLAN", "PILOT_DATA", "PLAN_FACTOR", "RATE_BINS", "check_target",
           "fresh_seed", "pilot_data", "pilot_masks", "pilot_subset", "plan_counts", "rate_bin",
           "plan_remedy", "show_plan", "stop_reason", "stratum_variances"]

_log = logging.getLogger(__name__)

#: most data (sequences) the pilot scores with independent masks
PILOT_DATA = 64
#: degrees of freedom per stratum the pilot aims at, and its most masks per stratum
PILOT_DOF = 64
PILOT_MAX = 16
#: the plan aims at this fraction of the target standard error
PLAN_FACTOR = 0.9
#: fewest masks per stratum (its spread must stay estimable)
MIN_COUNT = 2
#: most masked inputs per datum a plan may ask for (beyond it the target is refused)
MAX_PLAN = 2.0 ** 53


def plan_remedy(unit: str) -> str:
    """What to do when a plan for a target standard error is too large: the plan is the
    package's, so the remedy names the target and its budget, not ``num_masks``.

    ``unit`` is what ``max_masks`` counts per: ``"datum"`` or ``"sequence"``.
    """
    return f"ask for a larger target_se, or bound the plan with max_masks= (masked inputs per " \
           f"{unit})"


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
    allocation : str
        ``"neyman"`` or ``"uniform"``.
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
    with np.errstate(over="ignore", invalid="ignore"):
        counts_f = np.maximum(np.ceil(raw - 1e-9), MIN_COUNT)  # float: no int64 overflow
        wanted = float((counts_f * c).sum())
    if budget is None or wanted <= budget:
        if not wanted <= MAX_PLAN:
            raise ValueError(
                f"target_se={target_se:g} would need about {wanted:.3g} masked inputs per datum "
                f"(the pilot's spread over the target squared), far beyond what can run; raise "
                f"target_se, or pass max_masks= to spend at most that many (the result then says "
                f"how close it got).")
        return counts_f.astype(np.int64), False, wanted
    floor_cost = float(MIN_COUNT * c.sum())
    if budget < floor_cost:
        raise ValueError(
            f"max_masks is too small: after the pilot, {budget:.0f} masked inputs per datum are "
            f"left, but every stratum needs at least {MIN_COUNT} masks ({floor_cost:.0f}). "
            f"Raise max_masks by at least {math.ceil(floor_cost - budget)}.")
    scaled = np.maximum(np.floor(counts_f * (budget / wanted)), MIN_COUNT).astype(np.int64)
    while float((scaled * c).sum()) > budget:  # the floors overshot: trim the largest
        scaled[int(np.argmax(np.where(scaled > MIN_COUNT, scaled, -1)))] -= 1
    return scaled, True, wanted


def show_plan(what: str, target_se: float, allocation: str, counts: np.ndarray,
              per_datum: float, spent: float, num_data: int, capped: bool,
              progress: bool) -> None:
    """Say what a target will cost before it is spent: logged (INFO), and shown with ``progress``.

    The package decides this cost itself (from the pilot), so the user sees it,
    and can bound it with ``max_masks`` (masked inputs per datum).
    """
    msg = (f"{what} at target_se={target_se:g} ({allocation}): the pilot scored "
           f"{spent:.0f} masked inputs per datum; the plan draws {int(counts.min())}.."
           f"{int(counts.max())} per stratum over {len(counts)} strata, {per_datum:,.0f} masked "
           f"inputs per datum ({per_datum * num_data:,.0f} in all)"
           + ("; cut to max_masks" if capped else "") + ".")
    _log.info(msg)
    if progress:
        from tqdm.auto import tqdm

        tqdm.write(msg)


def stop_reason(stderr: float, target_se: float, capped: bool) -> str:
    """``"budget"`` when the budget cut the plan, else ``"target"`` or ``"missed"``."""
    if capped and not stderr <= target_se:
        return "budget"
    return "target" if stderr <= target_se else "missed"


# ---------------------------------------------------------------------- the pilot
def pilot_data(x: torch.Tensor, shared: bool,
               generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The data a dense pilot scores and their indices: all (None) with shared masks, else
    at most :data:`PILOT_DATA` at random."""
    n = x.shape[0]
    if shared or n <= PILOT_DATA:
        return x, None
    idx = torch.randperm(n, generator=generator)[:PILOT_DATA]
    return x[idx.to(x.device)], idx


def stratum_variances(pilot: torch.Tensor, num_data: int, shared: bool) -> np.ndarray:
    """v_h of a dense pilot ``(H, P0, N0)``: the variance one draw per stratum adds to the mean.

    Independent masks: the spread over draws, averaged over the pilot's data,
    over N (the data the estimate averages); shared masks: the spread of the
    draws' data means.
    """
    v = pilot.mean(2).var(1) if shared else pilot.var(1).mean(1) / num_data
    return v.cpu().numpy()


def pilot_subset(n: int, seed: int) -> np.ndarray:
    """The sequences a ragged pilot scores: at most :data:`PILOT_DATA`, at random."""
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 24]))
    return np.sort(rng.permutation(n)[:PILOT_DATA])


def fresh_seed(seed: int) -> int:
    """The seed of the fresh draws after a pilot drawn with ``seed``."""
    return int(np.random.SeedSequence([int(seed), 25]).generate_state(1)[0] >> 1)


#: rate bins over which a ragged pilot pools the spread of S_hat (and the counts are shared)
RATE_BINS = 10


def rate_bin(sizes: np.ndarray, length: int, bins: int = RATE_BINS) -> np.ndarray:
    """Rate bin of each size M of a sequence of ``length`` units: ceil(B M / D) - 1."""
    return np.minimum(bins - 1, np.ceil(bins * sizes / length - 1e-9).astype(np.int64) - 1)
