"""The front doors: :func:`estimate_lml` and :func:`mpt_curve` for any model.

Both look the estimator up in the registry (:mod:`mptlml.estimators.base`),
build it from the caller's arguments (refusing any argument the estimator does
not use: ``rate=`` with ``"cumulative"``, ``sizes=`` for ragged sequences,
...; nothing is silently ignored) and let it estimate. The model's protocol,
never its family, decides between dense ``(N, D)`` data
(:class:`~mptlml.models.base.MaskedModel`) and ragged sequences
(:class:`~mptlml.models.protocols.RaggedMaskedModel`, e.g. a masked LM).
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from ..estimation.ragged import mlm_curve
from ..estimation.results import LMLEstimate, MPTCurve, announce_nonfinite, as_float64
from ..estimation.stats import mean_stderr
from ..models.base import MaskedModel
from ..models.protocols import RaggedMaskedModel
from ..models.sequence_input import encode
from .base import Estimator, create, get
from .cumulative import Cumulative
from .precision import check_target, ragged_curve_to_target, ragged_sum_to_target

__all__ = ["estimate_lml", "mpt_curve"]

_RAGGED_HINTS = {
    "nested": "nested=True is not available for ragged sequences (a masked LM): their masks "
              "are drawn per sequence; leave nested=False.",
    "share_masks": "share_masks=True does not apply to ragged sequences (a masked LM): each "
                   "sequence has its own length and its own masks; leave it False.",
    "rate": "rate= / mask_size= do not apply to ragged sequences (a masked LM): each "
            "sequence has its own length D_i. Pass rates=[...] with estimator='riemann' or "
            "use mptlml.mpt_curve(model, texts, rates=[...]).",
    "max_masks": "max_masks applies to the exhaustive estimator of dense data only; drop it.",
    "sizes": "a curve on ragged sequences is drawn over masking rates; pass rates=[...] "
             "instead of sizes (M = max(1, round(r * D_i)) per sequence).",
}
_RAGGED_HINTS["mask_size"] = _RAGGED_HINTS["rate"]
#: below this many effective degrees of freedom the reported standard error is flagged
#: (Student's t with 5 dof exceeds 2 in 10% of runs, with 3 in 14%, with 1 in 30%)
MIN_STDERR_DOF = 5
_RUN_OPTIONS = ("token_budget", "batch_size", "chunk_size", "checkpoint_dir")


def _given(**kwargs: Any) -> dict[str, Any]:
    """The arguments the caller set (None and False mean "not given")."""
    return {k: v for k, v in kwargs.items() if v is not None and v is not False}


def _refuse_for_ragged(given: dict[str, Any]) -> None:
    for name in given:
        if name in _RAGGED_HINTS:
            raise (TypeError if name == "sizes" else ValueError)(_RAGGED_HINTS[name])


def _ragged_seed(seed: Any) -> int:
    """Ragged runs need an int seed (masks are a function of (seed, sequence index))."""
    if seed is None:
        return int(torch.randint(0, 2**31 - 1, ()).item())
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
        return int(seed)
    raise TypeError(f"for ragged sequences (a masked LM) pass an int seed (or None), got "
                    f"{type(seed).__name__}.")


def _warn_target_missed(what: str, stop_reason: str | None, stderr: float,
                        target: float | None, *, wanted: float | None = None) -> bool:
    """Warn when a target standard error was not reached (estimates and curves alike).

    ``stop_reason`` "budget": ``max_masks`` ran out first; "missed": the
    pilot underestimated the spread. Returns whether it warned.
    """
    if stop_reason == "budget":
        plan = ("" if wanted is None else
                f"; the plan needed about {wanted:.0f} masked inputs per datum")
        msg = (f"max_masks was spent before the target: {what} {stderr:.4g} > target_se "
               f"{target:.4g}{plan}. Raise max_masks or the target.")
    elif stop_reason == "missed":
        msg = (f"{what} {stderr:.4g} came out above target_se {target:.4g}: the pilot "
               "underestimated the spread. Rerun with a larger pilot (num_masks) or another "
               "seed.")
    else:
        return False
    warnings.warn(msg, RuntimeWarning, stacklevel=4)
    return True


def _announce(est: LMLEstimate) -> LMLEstimate:
    """Never let a NaN leave silently: warn on a non-finite estimate and on an unknown SE."""
    bad = announce_nonfinite(est.per_sample, f"the {est.estimator!r} estimate of log p(x)",
                             stacklevel=4)
    if not bad and math.isnan(est.stderr):
        warnings.warn(
            f"the standard error of the {est.estimator!r} estimate cannot be computed from "
            f"{est.num_masks} Monte Carlo draw(s) per datum (it needs at least 2); stderr is "
            "NaN. Pass num_masks >= 2 to know how precise the estimate is.", RuntimeWarning,
            stacklevel=3)
    elif (not _warn_target_missed("stderr", est.stop_reason, est.stderr, est.target_se,
                                  wanted=est.masks_wanted)
          and est.stderr_dof is not None and est.stderr_dof < MIN_STDERR_DOF
          and est.stderr > 1e-9 * max(1.0, abs(est.mean))):  # not an exact sum
        warnings.warn(
            f"the standard error of the {est.estimator!r} estimate rests on about "
            f"{est.stderr_dof:.1f} effective degrees of freedom (fewer than {MIN_STDERR_DOF}): "
            "|mean - truth| > 2 stderr will happen far more often than 5% of the time. Use "
            "more masks (num_masks)" + (" or independent masks (share_masks=False)"
                                        if est.shared_masks else "") + ".",
            RuntimeWarning, stacklevel=3)
    return est


def _check_model(model: Any) -> None:
    if not isinstance(model, MaskedModel):
        raise TypeError(
            f"model must be an mptlml.models.MaskedModel (a model of (N, D) data) or a "
            f"RaggedMaskedModel (a masked LM), got {type(model).__name__}."
        )


def estimate_lml(model: MaskedModel | RaggedMaskedModel, x: Any,
                 estimator: str | Estimator = "cumulative", *, num_masks: int = 1,
                 rate: float | None = None, mask_size: int | None = None,
                 seed: int | torch.Generator | None = None, share_masks: bool = False,
                 nested: bool = False, max_masks: int | None = None,
                 target_se: float | None = None, allocation: str | None = None,
                 progress: bool = False, **options: Any) -> LMLEstimate:
    """Estimate log p(x_n) for each datum from the model's masked conditionals.

    Proposition 1 of Moreno-Munoz, Recasens & Hauberg (NeurIPS 2023)::

        log p(x) = sum_{M=1..D} S(x; M),
        S(x; M)  = E_{|mask| = M} [ (1/M) sum_{j in mask} log p(x_j | x_R) ].

    Parameters
    ----------
    model : MaskedModel or RaggedMaskedModel
    x : array-like (N, D) for a MaskedModel; a list of texts or token-id
        sequences for a RaggedMaskedModel.
    estimator : str
        Dense data: ``"exhaustive"`` (every mask, exact, small D),
        ``"cumulative"`` (P masks per size, unbiased), ``"random-size"``
        (M ~ U{1..D}, unbiased), ``"fixed-rate"`` (one size, biased),
        ``"chain-rule"`` (random orders). Ragged sequences: ``"cumulative"``,
        ``"riemann"`` (D_i times the mean over a rate grid), ``"chain-rule"``
        (P random orders, one position scored per step; needs
        ``ragged_target_log_prob``).
        ``mptlml.estimators.available()`` lists them (and any registered by the user).
    num_masks : int
        P: masks per size (cumulative), draws of (M, mask) (random-size), masks
        (fixed-rate) or orders (chain-rule) per datum. Exhaustive: only 1.
    rate : float in (0, 1)
        Masking rate of ``"fixed-rate"``; M = max(1, floor(rate * D)).
    mask_size : int, optional
        Give M directly instead of ``rate`` (``"fixed-rate"`` only).
    seed : int or torch.Generator, optional
        Makes the masks reproducible (ragged sequences: an int).
    share_masks : bool
        Share each mask across the data (the paper's code) rather than draw
        independent masks per datum (default; lower variance). Dense data.
    nested : bool
        ``"cumulative"`` on dense data only: the P masks of the D sizes are
        the prefixes of P random orders (still unbiased; dependent across sizes).
    max_masks : int, optional
        The most masks (masked inputs) per datum: the budget of
        ``"exhaustive"`` (default ``mptlml.settings.max_masks``), or of
        ``target_se`` (pilot included; none by default).
    target_se : float, optional
        ``"cumulative"`` only: draw masks until the Monte Carlo standard error
        of ``mean`` is about this (nats), instead of ``num_masks`` per size. A
        pilot (at least ``max(2, num_masks)`` masks per size) measures each size's
        spread, masks are allocated over the sizes (``allocation``), and the
        estimate comes from fresh draws (unbiased; its SE pooled). The result
        says whether the target was reached (``stop_reason``) and what it
        cost (``num_masked_rows``); see :mod:`mptlml.estimators.precision`.
    allocation : {"neyman", "uniform"}, optional
        With ``target_se``: masks per size in proportion to the size's spread
        (``"neyman"``, the default: fewest masks for the target) or the same
        for every size (``"uniform"``).
    progress : bool
        Show a progress bar.
    **options
        Ragged sequences: ``rates`` (riemann), ``token_budget``, ``chunk_size``,
        ``checkpoint_dir`` (see :func:`mptlml.estimation.ragged.mlm_curve`).

    Returns
    -------
    LMLEstimate

    Raises
    ------
    ValueError, TypeError
        For an unknown estimator or an argument the estimator does not use
        (e.g. ``rate=`` with ``"cumulative"``), never silently ignored.

    Warns
    -----
    RuntimeWarning
        When the estimate is NaN (the model gave NaN log-probabilities), or
        when its standard error cannot be computed (one draw per datum, e.g.
        ``num_masks=1``: ``stderr`` is NaN).
    """
    budget = max_masks if target_se is not None else None
    target_se, budget, allocation = check_target(target_se, budget, allocation)
    given = _given(rate=rate, mask_size=mask_size, share_masks=share_masks, nested=nested,
                   max_masks=max_masks if target_se is None else None)
    if isinstance(model, RaggedMaskedModel):
        _refuse_for_ragged(given)
        run = {k: options.pop(k) for k in list(options) if k in _RUN_OPTIONS}
        get(estimator).check_applies(ragged=True)  # before its options are checked
        est = create(estimator, for_ragged=True, num_masks=num_masks, **options)
        if target_se is None:
            return _announce(est.estimate(model, x, seed=_ragged_seed(seed), progress=progress,
                                          run=run))
        _check_targetable(est)
        return _announce(_ragged_to_target(model, x, est, target_se, budget, allocation,
                                           _ragged_seed(seed), progress, run))
    _check_model(model)
    if options:
        raise TypeError(f"unexpected arguments {sorted(options)} (only for ragged sequences).")
    est = create(estimator, num_masks=num_masks, **given)
    if target_se is None:
        return _announce(est.estimate(model, x, seed=seed, progress=progress))
    _check_targetable(est)
    assert isinstance(est, Cumulative)
    return _announce(est.estimate_to_target(model, x, target_se, max_masks=budget,
                                            allocation=allocation, seed=seed, progress=progress))


def _check_targetable(est: Estimator) -> None:
    if not isinstance(est, Cumulative) or est.nested:
        raise ValueError(
            f"target_se= needs estimator='cumulative' with independent masks per size (a "
            f"stratified sum over mask sizes whose masks can be allocated); got {est!r}.")


def _ragged_to_target(model: RaggedMaskedModel, x: Any, est: Estimator, target_se: float,
                      budget: int | None, allocation: str, seed: int, progress: bool,
                      run: dict[str, Any]) -> LMLEstimate:
    toks = encode(model, x)
    out = ragged_sum_to_target(model, toks, target_se, budget, allocation, est.num_masks, seed,
                               progress=progress, **run)
    lml = out["lml"]
    return LMLEstimate(
        estimator=est.name, per_sample=as_float64(lml), per_sample_stderr=as_float64(out["stderr"]),
        mean=float(lml.mean()), stderr=out["stderr_mean"],
        stderr_data=float(mean_stderr(lml)[1]),
        sizes=None, size_scores=None, num_masks=int(max(out["counts"])),
        num_model_calls=out["calls"], num_masked_rows=int(out["rows"].sum()),
        num_masked_rows_per_sample=torch.as_tensor(out["rows"]), stderr_dof=out["dof"],
        target_se=target_se, stop_reason=out["stop_reason"], allocation=allocation,
        masks_per_size=out["counts"], masks_wanted=out["wanted"], seed=seed, model=model.name)


def mpt_curve(model: MaskedModel | RaggedMaskedModel, x: Any, *, num_masks: int = 1,
              sizes: Sequence[int] | None = None, seed: int | torch.Generator | None = None,
              share_masks: bool = False, nested: bool = False, target_se: float | None = None,
              max_masks: int | None = None, allocation: str | None = None,
              progress: bool = False, **options: Any) -> MPTCurve:
    """The MPT curve: S(x; M) against the masking rate M / D, with its area.

    For each size M, ``num_masks`` uniform masks per datum give
    S_hat(x_n; M) = mean over masks of (1/M) sum_{j in mask} log p(x_j | x_R).
    The area sum_{M=1..D} S(x; M) is the cumulative estimate of log p(x)
    (Proposition 1; Fig. 4 of the paper).

    Parameters
    ----------
    model : MaskedModel or RaggedMaskedModel
    x : array-like (N, D), or a list of texts / token-id sequences (ragged)
    num_masks : int
        P masks per size (rate) and datum.
    sizes : sequence of int, optional
        Dense data: mask sizes, integers in 1..D (default all; 2.7 is refused).
    seed : int or torch.Generator, optional
    share_masks : bool
        Dense data: share masks across data (the paper's code).
    nested : bool
        Dense data: masks of all sizes from the prefixes of P random orders
        (see :func:`estimate_lml`); every size is computed, ``sizes`` are kept.
    target_se : float, optional
        Allocate the masks per size (rate) for this Monte Carlo standard
        error of the mean of the per-datum LML estimates ``lml`` (dense: the
        area; ragged: ``D_i * mean_k S_ik``), after a pilot of at least
        ``max(2, num_masks)`` masks per size (rate); see :func:`estimate_lml`.
        The counts are in ``extra["masks_per_size"]`` (``"masks_per_rate"``).
    max_masks : int, optional
        With ``target_se``: the most masked inputs per datum, pilot included.
    allocation : {"neyman", "uniform"}, optional
        With ``target_se`` (default ``"neyman"``).
    progress : bool
    **options
        Ragged sequences: ``rates``, ``nominal_length``, ``exact``,
        ``token_budget``, ``chunk_size``, ``checkpoint_dir``, ``ids`` (see
        :func:`mptlml.estimation.ragged.mlm_curve`, whose area is the paper's
        ``L * sum_k w_k curve_k``).

    Returns
    -------
    MPTCurve
    """
    if max_masks is not None and target_se is None:
        raise ValueError("max_masks applies to mpt_curve with target_se= only (the budget of "
                         "the masks allocated for a target standard error).")
    target_se, max_masks, allocation_ = check_target(target_se, max_masks, allocation)
    if isinstance(model, RaggedMaskedModel):
        _refuse_for_ragged(_given(sizes=sizes, share_masks=share_masks, nested=nested))
        if target_se is not None:
            return _announce_curve(ragged_curve_to_target(
                model, x, target_se, max_masks, allocation_, num_masks, _ragged_seed(seed),
                progress=progress, **options))
        return mlm_curve(model, x, num_masks=num_masks, seed=_ragged_seed(seed),
                         progress=progress, **options)
    _check_model(model)
    if options:
        raise TypeError(f"unexpected arguments {sorted(options)} (only for ragged sequences).")
    return _announce_curve(Cumulative(num_masks, share_masks=share_masks, nested=nested).curve(
        model, x, sizes=sizes, seed=seed, progress=progress, target_se=target_se,
        max_masks=max_masks, allocation=allocation))


def _announce_curve(res: MPTCurve) -> MPTCurve:
    """Say when a curve's target standard error was not reached."""
    _warn_target_missed("the curve's Monte Carlo standard error", res.stop_reason,
                        res.lml_stderr_mean, res.target_se)
    return res
