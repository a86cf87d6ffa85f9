"""The estimators by name: the registry, and the front door :func:`estimate_lml`.

The registry (:func:`register`, :func:`get`, :func:`available`,
:func:`create`) is the only list of the estimators' names:
:func:`estimate_lml`, :func:`mptlml.mpt_curve`,
:class:`mptlml.objectives.MPTLoss` and :class:`mptlml.hf.DataCollatorForMPT`
look estimators up here, so one registered from outside the package works in
all of them at once. :func:`create` builds an estimator from the caller's
arguments and refuses any it does not use (``rate=`` with ``"cumulative"``,
``share_masks=`` for ragged sequences, ...; nothing is silently ignored).

:func:`estimate_lml` looks the estimator up, builds it and lets it estimate
(:meth:`mptlml.estimators.Estimator.estimate`). The model's protocol, never
its family, decides between dense ``(N, D)`` data
(:class:`~mptlml.models.base.MaskedModel`) and ragged sequences
(:class:`~mptlml.models.protocols.RaggedMaskedModel`, e.g. a masked LM).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

import torch

from .._validation import Interval, check_checkpoint_dir, check_options
from ..models.conditional import with_context
from ..models.protocols import RaggedMaskedModel
from .base import Estimator, accepted_options
from .results import LMLEstimate

__all__ = ["RAGGED_HINTS", "available", "create", "estimate_lml", "get", "given",
           "ragged_seed", "refuse_for_ragged", "register", "unregister"]

_REGISTRY: dict[str, type[Estimator]] = {}
_HINTS = {"nested": "nested=True needs estimator='cumulative' (nested masks are the "
                    "prefixes of one order, one mask per size); got {estimator!r}.",
          "rate": "rate / mask_size only apply to estimator='fixed-rate'; the "
                  "{estimator!r} estimator does not use one mask size. Drop them or pass "
                  "estimator='fixed-rate'.",
          "rates": "rates= applies to ragged sequences (a masked LM) with "
                   "estimator='riemann'; for (N, D) data use mpt_curve(model, x, sizes=...)."}
_HINTS["mask_size"] = _HINTS["rate"]
#: why an argument does not apply to ragged sequences (a masked LM), by argument
RAGGED_HINTS = {
    "nested": "nested=True is not available for ragged sequences (a masked LM): their masks "
              "are drawn per sequence; leave nested=False.",
    "share_masks": "share_masks=True does not apply to ragged sequences (a masked LM): each "
                   "sequence has its own length and its own masks; leave it False.",
    "rate": "rate= applies to ragged sequences (a masked LM) with estimator='fixed-rate' "
            "only (M_i = max(1, floor(rate * D_i)) per sequence); the {estimator!r} estimator "
            "draws no fixed size. For a curve over rates pass rates=[...] to "
            "mptlml.mpt_curve, or estimator='riemann'.",
    "mask_size": "mask_size= does not apply to ragged sequences (a masked LM): each sequence "
                 "has its own length D_i. Pass rate= with estimator='fixed-rate' "
                 "(M_i = max(1, floor(rate * D_i))).",
    "max_masks": "max_masks applies to the exhaustive estimator of dense data, or with "
                 "target_se=; drop it.",
    "sizes": "a curve on ragged sequences is drawn over masking rates; pass rates=[...] "
             "instead of sizes (M = max(1, round(r * D_i)) per sequence).",
}
_RUN_OPTIONS = ("token_budget", "batch_size", "chunk_size", "checkpoint_dir")
#: estimate_lml's own allowed values where they differ from the shared table
#: (:data:`mptlml._validation.MONTE_CARLO_OPTIONS`)
_ESTIMATE_OPTIONS: dict[str, list[Any]] = {
    "num_masks": [Interval(numbers.Integral, 1, None), None]}


def register(cls: type[Estimator], *, replace: bool = False) -> type[Estimator]:
    """Add an estimator class to the registry under ``cls.name`` (usable as a decorator).

    After this, ``estimate_lml(model, x, cls.name)``, ``MPTLoss(model, cls.name)``
    and ``DataCollatorForMPT(tokenizer, cls.name)`` find it (where it applies).

    Raises
    ------
    ValueError
        If ``cls.name`` is empty or already taken (pass ``replace=True``).
    """
    if not (isinstance(cls, type) and issubclass(cls, Estimator)):
        raise TypeError(f"register takes an Estimator subclass, got {cls!r}.")
    if not isinstance(cls.name, str) or not cls.name:
        raise ValueError(f"{cls.__name__} needs a class attribute name = '...' to register.")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls and not replace:
        raise ValueError(f"an estimator named {cls.name!r} is registered already "
                         f"({_REGISTRY[cls.name].__name__}); pick another name or pass "
                         "replace=True.")
    _REGISTRY[cls.name] = cls
    return cls


def unregister(name: str) -> None:
    """Remove ``name`` from the registry (for estimators registered at run time)."""
    _REGISTRY.pop(name, None)


def get(name: str | Estimator | type[Estimator]) -> type[Estimator]:
    """The estimator class registered under ``name`` (a class or instance passes through)."""
    if isinstance(name, Estimator):
        return type(name)
    if isinstance(name, type) and issubclass(name, Estimator):
        return name
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"unknown estimator {name!r}; choose one of {', '.join(_REGISTRY)}.")
    return _REGISTRY[name]


def available(*, dense: bool | None = None, ragged: bool | None = None,
              trainable: bool | None = None,
              per_sequence_sizes: bool | None = None) -> tuple[str, ...]:
    """Names of the registered estimators with the given properties (None: any)."""
    want = {"dense": dense, "ragged": ragged, "trainable": trainable,
            "per_sequence_sizes": per_sequence_sizes}
    return tuple(n for n, c in _REGISTRY.items()
                 if all(v is None or getattr(c, k) == v for k, v in want.items()))


def create(estimator: str | Estimator | type[Estimator], *, for_ragged: bool = False,
           hints: Mapping[str, str] | None = None, **options: Any) -> Estimator:
    """An estimator instance from a name (or class), refusing options it does not accept.

    ``options`` are the caller's arguments that were set (None and False mean
    "not given" and are dropped). An option the estimator does not take is
    refused with ``hints[option]`` when given (by default the package's
    messages for dense data), else a message naming the options it does take;
    never ignored. An instance passes through, and then
    no option may be given.
    """
    given = {k: v for k, v in options.items() if v is not None and v is not False}
    if isinstance(estimator, Estimator):
        extra = {k for k in given if k != "num_masks" or given[k] != estimator.num_masks}
        if extra:
            raise TypeError(f"an Estimator instance carries its options; got {sorted(extra)} "
                            f"besides {estimator!r}. Set them on the instance instead.")
        return estimator
    cls = get(estimator)
    accepted = set(accepted_options(cls))
    if for_ragged:
        accepted -= set(cls.dense_only)
    bad = sorted(set(given) - accepted)
    hints = _HINTS if hints is None and not for_ragged else (hints or {})
    for opt in bad:
        if opt in hints:
            raise ValueError(hints[opt].format(estimator=cls.name))
    if bad:
        kind = "ragged sequences" if for_ragged else "dense data (N, D)"
        uses = ", ".join(sorted(accepted - {"num_masks"})) or "none"
        raise TypeError(f"argument(s) {bad} do not apply to estimator {cls.name!r} on {kind} "
                        f"(its options: {uses}); drop them.")
    return cls(**given)


def given(**kwargs: Any) -> dict[str, Any]:
    """The arguments the caller set (None and False mean "not given")."""
    return {k: v for k, v in kwargs.items() if v is not None and v is not False}


def refuse_for_ragged(arguments: Mapping[str, Any]) -> None:
    """Refuse, with :data:`RAGGED_HINTS`, set arguments that ragged sequences never take."""
    for name in arguments:
        if name in RAGGED_HINTS:
            raise (TypeError if name == "sizes" else ValueError)(
                RAGGED_HINTS[name].format(estimator=None))


def ragged_seed(seed: Any) -> int:
    """Ragged runs need an int seed (masks are a function of (seed, sequence index))."""
    if seed is None:
        return int(torch.randint(0, 2**31 - 1, ()).item())
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
        if int(seed) < 0:
            raise ValueError(f"seed must be a non-negative int (the masks of sequence i come "
                             f"from (seed, i)), got {seed}.")
        return int(seed)
    raise TypeError(f"for ragged sequences (a masked LM) pass an int seed (or None), got "
                    f"{type(seed).__name__}.")


def estimate_lml(model: Any, x: Any, estimator: str | Estimator = "cumulative", *,
                 num_masks: int | None = None, rate: float | None = None,
                 mask_size: int | None = None,
                 seed: int | torch.Generator | None = None, share_masks: bool = False,
                 nested: bool = False, max_masks: int | None = None,
                 target_se: float | None = None, allocation: str | None = None,
                 progress: bool = False, context: Any = None, cfg_scale: float = 0.0,
                 **options: Any) -> LMLEstimate:
    """Estimate log p(x_n) for each datum from the model's masked conditionals.

    Proposition 1 of Moreno-Munoz, Recasens & Hauberg (NeurIPS 2023)::

        log p(x) = sum_{M=1..D} S(x; M),
        S(x; M)  = E_{|mask| = M} [ (1/M) sum_{j in mask} log p(x_j | x_R) ].

    Parameters
    ----------
    model : MaskedModel or RaggedMaskedModel
    x : array-like (N, D) for a MaskedModel; a list of texts or token-id
        sequences for a RaggedMaskedModel (each sequence its own D_i).
    estimator : str
        ``"exhaustive"`` (every mask, exact, small D; dense data),
        ``"cumulative"`` (P masks per size, unbiased), ``"random-size"``
        (M ~ U{1..D}, weight D/M, unbiased), ``"adaptive-size"`` (M ~ q, q
        adapted to the spread of the sizes, unbiased), ``"fixed-rate"`` (one
        size, biased), ``"chain-rule"`` (random orders, unbiased; ragged
        sequences need ``ragged_target_log_prob``), ``"riemann"`` (ragged
        sequences: D_i times the mean over a rate grid). On ragged sequences
        the size-drawing estimators draw each sequence's sizes from its own
        D_i. ``mptlml.estimators.available()`` lists them (and any registered
        by the user).
    num_masks : int, optional
        P: masks per size (cumulative), draws of (M, mask) (random-size,
        adaptive-size), masks (fixed-rate) or orders (chain-rule) per datum.
        Exhaustive: only 1. Default 1 (an Estimator instance: its own).
    rate : float in (0, 1)
        Masking rate of ``"fixed-rate"``; M = max(1, floor(rate * D)) (D_i
        per sequence).
    mask_size : int, optional
        Give M directly instead of ``rate`` (``"fixed-rate"``, dense data).
    seed : int or torch.Generator, optional
        Makes the masks reproducible (ragged sequences: an int).
    share_masks : bool
        Share each mask across the data (the paper's code) rather than draw
        independent masks per datum (default; lower variance). Dense data.
    nested : bool
        ``"cumulative"`` on dense data only: the P masks of the D sizes are
        the prefixes of P random orders (still unbiased; dependent across sizes).
    max_masks : int, optional
        The most masked inputs per datum (a ragged sequence; the unit of
        :func:`mptlml.compare`'s per candidate): the cap of ``"exhaustive"`` (its 2^D - 1
        masks; default ``mptlml.settings.max_masks``), or the budget of ``target_se``
        (default :data:`~mptlml.estimators.sequential.MAX_TARGET_DRAWS` draws' masked
        inputs: on dense data per stratum, lowered to what
        ``mptlml.settings.max_masked_inputs`` allows; ragged sequences: the rate draw's
        whole-sequence row included; a sequence scored on every mask costs its 2^D - 1
        whatever the cap).
    target_se : float, optional
        Any unbiased estimator: draw until the Monte Carlo standard error of
        ``mean`` is about this (nats), instead of ``num_masks`` per stratum.
        Rounds of the sequential engine (the first of ``max(2, num_masks)``
        draws per stratum, then doubling) until the standard error is at the
        target on at least 10 degrees of freedom; between rounds the draws are
        allocated over the strata (``allocation``: the sizes of
        ``"cumulative"``) by their spread so far. Each round is unbiased given
        the past. The result says whether the target was reached
        (``stop_reason``) and what it cost (``num_masked_rows``); see
        :meth:`mptlml.estimators.Estimator.estimate`.
    allocation : {None, "neyman", "uniform"}
        With ``target_se``: draws per stratum in proportion to its spread
        (``"neyman"``, the default: fewest masks for the target) or the same
        for every stratum (``"uniform"``).
    progress : bool
        Show a progress bar.
    context : optional
        Score the conditional log p(x_T | x_C) instead: for sequences one context per
        sequence (text or ids; one string for all), always visible and never scored,
        the sequences being the continuations T (sizes, rates and D_i refer to their
        tokens; see :func:`mptlml.models.sequence_input.encode_with_context`); for
        dense data the always-visible dimensions C (bool mask or indices), masks
        drawn inside the others (``exact`` is then the exact conditional, where known).
    cfg_scale : float
        Classifier-free guidance of a masked LM by ``context`` (LLaDA's ``cfg``): every
        masked input is scored with the logits ``u + (cfg_scale + 1) (c - u)``, u those
        of the same input with the context masked too
        (:mod:`mptlml.models.conditional`). The result is then a guided score, not a
        bound on or estimate of log p(x_T | x_C). 0 (default): no guidance; refused
        without ``context`` or for a dense model.
    **options
        Ragged sequences: ``rates`` (riemann), other options of the estimator
        (e.g. ``stratified``, ``eps``), and the run options ``token_budget``,
        ``batch_size``, ``chunk_size``, ``checkpoint_dir`` (see
        :func:`mptlml.mpt_curve`).

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
        ``num_masks=1``: ``stderr`` is NaN) or rests on few degrees of freedom.
    """
    check_options("estimate_lml", overrides=_ESTIMATE_OPTIONS, num_masks=num_masks, rate=rate,
                  mask_size=mask_size, seed=seed, share_masks=share_masks, nested=nested,
                  max_masks=max_masks, target_se=target_se, allocation=allocation,
                  progress=progress)
    check_options("estimate_lml", **{k: v for k, v in options.items() if k in _RUN_OPTIONS
                                     and k != "checkpoint_dir"})
    check_checkpoint_dir(options.get("checkpoint_dir"), "estimate_lml")
    model = with_context(model, context, cfg_scale=cfg_scale)
    args = given(rate=rate, mask_size=mask_size, share_masks=share_masks, nested=nested,
                 max_masks=max_masks if target_se is None else None)
    budget = max_masks if target_se is not None else None
    if isinstance(model, RaggedMaskedModel):
        run = {k: options.pop(k) for k in list(options) if k in _RUN_OPTIONS}
        get(estimator).check_applies(ragged=True)  # before its options are checked
        est = create(estimator, for_ragged=True, hints=RAGGED_HINTS, num_masks=num_masks,
                     **args, **options)
        return est.estimate(model, x, seed=ragged_seed(seed), progress=progress, run=run,
                            target_se=target_se, max_masks=budget, allocation=allocation)
    if options:
        raise TypeError(f"unexpected arguments {sorted(options)} (only for ragged sequences).")
    est = create(estimator, num_masks=num_masks, **args)
    return est.estimate(model, x, seed=seed, progress=progress, target_se=target_se,
                        max_masks=budget, allocation=allocation)
