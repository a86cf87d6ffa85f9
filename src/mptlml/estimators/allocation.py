"""A target standard error's options, and the strata a ragged allocation pools over.

A target standard error runs on the sequential engine
(:mod:`mptlml.estimators.sequential`) for every unbiased estimator, dense data
and ragged sequences alike (:meth:`mptlml.estimators.Estimator.estimate`,
:func:`mptlml.mpt_curve`, :func:`mptlml.compare`): rounds of draws that double,
and between rounds the draws of each stratum (a mask size of ``cumulative`` on
dense data and of its ragged rows) set in
proportion to its spread so far (Neyman: for strata of equal cost, ``c_h = P H
sd_h / sum_k sd_k`` minimises the round's variance ``sum_h sd_h^2 / c_h`` at P H
draws; :func:`~mptlml.estimators.sequential.neyman_counts`). What is here:

- :func:`check_target`: ``target_se``, ``max_masks`` (the budget, masked inputs
  per datum or sequence) and ``allocation`` (``"neyman"`` or ``"uniform"``)
  validated once for every front door;
- :func:`plan_remedy`: what a refusal of a target's run too large names;

Reference: Moreno-Munoz, Recasens, Hauberg, "On Masked Pre-training and the
Marginal Likelihood", NeurIPS 2023, Proposition 1 (the stratified sum over
mask sizes).
"""

from __future__ import annotations

import math
import numbers

from .._validation import ALLOCATIONS

__all__ = ["check_target", "plan_remedy"]


def plan_remedy(unit: str) -> str:
    """What to do when a target's run is too large (its cap, ``max_masks`` or the
    package's default, could score more than ``mptlml.settings.max_masked_inputs``): the
    draws are the package's, so the remedy names the target and its budget, not
    ``num_masks``.

    ``unit`` is what ``max_masks`` counts per: ``"datum"`` or ``"sequence"``.
    """
    return f"ask for a larger target_se, or bound the plan with max_masks= (masked inputs per " \
           f"{unit})"


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

