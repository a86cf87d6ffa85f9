"""Estimators of log p(x) for dense data: every datum has the same D tokens.

Proposition 1 of Moreno-Munoz, Recasens & Hauberg (NeurIPS 2023)::

    log p(x) = sum_{M=1..D} S(x; M),
    S(x; M)  = E_{|mask| = M} [ (1/M) sum_{j in mask} log p(x_j | x_R) ].

One function per estimator, registered in :data:`DENSE_ESTIMATORS`. Each takes
the validated ``(N, D)`` data and returns P i.i.d. estimates of log p(x_n),
``(P, N)``, with the per-size scores; :func:`estimate_dense` turns them into an
:class:`~mptlml.estimation.results.LMLEstimate`. They only call the model's
masked reductions through :mod:`mptlml.estimation.engine`, so they work for
any :class:`~mptlml.models.base.MaskedModel`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from .. import settings
from .._validation import check_positive_int, check_size, make_generator
from ..masks import all_masks, check_mask_size_args, count_masks, draw_mask_sizes
from ..models.base import MaskedModel
from .engine import (
    Counter,
    mc_stats,
    score_chain_rule,
    score_fixed_masks,
    score_grid,
    score_masks,
    score_nested,
)
from .registry import EstimatorSpec, check_options, lookup, register
from .results import LMLEstimate, MPTCurve

__all__ = ["DENSE_ESTIMATORS", "ESTIMATORS", "dense_curve", "estimate_dense"]

DENSE_ESTIMATORS: dict[str, EstimatorSpec] = {}

_KIND = "dense data (N, D)"
_HINTS = {"nested": "nested=True needs estimator='cumulative' (nested masks are the prefixes "
                    "of one order, one mask per size); got {estimator!r}.",
          "num_masks": "num_masks does not apply to estimator={estimator!r}: it scores every "
                       "mask once, exactly. Drop num_masks."}


class Draws(NamedTuple):
    """What an estimator function returns."""

    samples: torch.Tensor  # (P, N): i.i.d. estimates of log p(x_n)
    sizes: list[int]
    size_scores: torch.Tensor  # (len(sizes),)
    exact_enumeration: bool = False


@register(DENSE_ESTIMATORS, "exhaustive", "every mask of every size; exact; 2^D - 1 masks",
          ("max_masks", "share_masks"))
def exhaustive(model: MaskedModel, x: torch.Tensor, p: int, g: torch.Generator,
               counter: Counter, progress: bool, *, max_masks: int | None = None,
               **_: Any) -> Draws:
    """sum_M (1/C(D, M)) sum_{|mask| = M} (1/M) sum_{j in mask} log p(x_j | x_R), exactly."""
    d = x.shape[1]
    cap = check_positive_int(settings.max_masks.value() if max_masks is None else max_masks,
                             "max_masks")
    total = count_masks(d)
    if total > cap:
        raise ValueError(
            f"the exhaustive estimator needs 2^D - 1 = {total} masks for D={d}, more than "
            f"max_masks={cap}; use estimator='cumulative' (Monte Carlo) or raise max_masks "
            "(or mptlml.settings.max_masks)."
        )
    sizes = list(range(1, d + 1))
    s_by_size = torch.stack([score_fixed_masks(model, x, all_masks(d, m), counter, progress,
                                               g).mean(0) for m in sizes])  # (D, N)
    return Draws(s_by_size.sum(0, keepdim=True), sizes, s_by_size.mean(1), True)


@register(DENSE_ESTIMATORS, "cumulative",
          "sum_M S_hat(x; M), P uniform masks per size; unbiased", ("share_masks", "nested"))
def cumulative(model: MaskedModel, x: torch.Tensor, p: int, g: torch.Generator,
               counter: Counter, progress: bool, *, share_masks: bool = False,
               nested: bool = False, **_: Any) -> Draws:
    """sum_{M=1..D} S_hat(x; M) per draw: independent masks, or the prefixes of one order."""
    d = x.shape[1]
    sizes = draw_mask_sizes("cumulative", d, 1).tolist()
    if nested:
        s = score_nested(model, x, p, share_masks=share_masks, generator=g,
                         progress=progress, counter=counter)  # (P, D, N)
        return Draws(s.sum(1), sizes, s.mean((0, 2)))
    samples, size_sums = score_grid(model, x, sizes, p, share_masks=share_masks,
                                    generator=g, progress=progress, counter=counter)
    return Draws(samples, sizes, size_sums / p)


@register(DENSE_ESTIMATORS, "random-size", "D * S_hat(x; M), M ~ U{1..D}; unbiased",
          ("share_masks",))
def random_size(model: MaskedModel, x: torch.Tensor, p: int, g: torch.Generator,
                counter: Counter, progress: bool, *, share_masks: bool = False,
                **_: Any) -> Draws:
    """D * S_hat(x; M) with one uniform size M per draw (and per datum unless shared)."""
    n, d = x.shape
    m = draw_mask_sizes("random-size", d, p, num_data=None if share_masks else n, generator=g)
    s = score_masks(model, x, m, share_masks=share_masks, generator=g,
                    progress=progress, counter=counter)  # (P, N)
    mm = (m if m.ndim == 2 else m[:, None].expand(p, n)).to(s.device)
    idx = mm.reshape(-1).cpu() - 1
    tot = torch.zeros(d, dtype=torch.float64).index_add_(0, idx, s.reshape(-1).cpu())
    cnt = torch.bincount(idx, minlength=d).double()
    size_scores = torch.where(cnt > 0, tot / cnt.clamp_min(1), float("nan"))
    return Draws(d * s, list(range(1, d + 1)), size_scores)


@register(DENSE_ESTIMATORS, "fixed-rate", "D * S_hat(x; M) at one size M; biased",
          ("share_masks", "rate", "mask_size"))
def fixed_rate(model: MaskedModel, x: torch.Tensor, p: int, g: torch.Generator,
               counter: Counter, progress: bool, *, share_masks: bool = False,
               rate: float | None = None, mask_size: int | None = None, **_: Any) -> Draws:
    """D * S_hat(x; M) at M = ``mask_size`` or max(1, floor(rate * D))."""
    d = x.shape[1]
    m = draw_mask_sizes("fixed-rate", d, p, rate=rate, mask_size=mask_size)
    s = score_masks(model, x, m, share_masks=share_masks, generator=g, progress=progress,
                    counter=counter)
    return Draws(d * s, [int(m[0])], s.mean().reshape(1))


@register(DENSE_ESTIMATORS, "chain-rule",
          "sum_t log p(x_pi(t) | x_pi(t+1..D)) for random orders pi; exact in expectation",
          ("share_masks",))
def chain_rule(model: MaskedModel, x: torch.Tensor, p: int, g: torch.Generator,
               counter: Counter, progress: bool, *, share_masks: bool = False,
               **_: Any) -> Draws:
    """The chain rule along P random orders: exact for every order in a tractable model."""
    d = x.shape[1]
    samples = score_chain_rule(model, x, p, share_masks, g, counter, progress)
    return Draws(samples, list(range(1, d + 1)),
                 torch.full((d,), float("nan"), dtype=torch.float64))


#: names of the estimators for dense data, in the order of the paper's discussion
ESTIMATORS = tuple(DENSE_ESTIMATORS)


def estimate_dense(model: MaskedModel, x: Any, estimator: str, *, num_masks: int,
                   seed: int | torch.Generator | None, progress: bool,
                   options: dict[str, Any]) -> LMLEstimate:
    """:func:`mptlml.estimate_lml` for a :class:`MaskedModel` (see its docstring)."""
    spec = lookup(DENSE_ESTIMATORS, estimator, _KIND)
    if estimator == "exhaustive" and num_masks != 1:
        options = {**options, "num_masks": num_masks}
    check_options(spec, {k: v for k, v in options.items() if k not in ("rate", "mask_size")},
                  _KIND, _HINTS)
    xt = model.validate_data(x)
    n, d = xt.shape
    check_mask_size_args(estimator, d, rate=options.get("rate"),
                         mask_size=options.get("mask_size"))
    p = check_positive_int(num_masks, "num_masks")
    counter = Counter()
    with torch.no_grad(), model.reuse_data():
        out = spec.fn(model, xt, p, make_generator(seed), counter, progress, **options)
        exact = None
        if model.has_log_marginal and not model.stochastic:
            exact = float(model._log_marginal(xt).double().mean())
    per_sample, per_se = mc_stats(out.samples)
    if out.exact_enumeration:
        per_se, stderr = torch.zeros_like(per_sample), 0.0
    else:
        stderr = float(mc_stats(out.samples.mean(1, keepdim=True))[1][0])
    mean = float(per_sample.mean())
    return LMLEstimate(
        estimator=estimator,
        per_sample=per_sample.cpu(),
        per_sample_stderr=per_se.cpu(),
        mean=mean,
        stderr=stderr,
        stderr_data=float(per_sample.std(correction=1) / math.sqrt(n)) if n > 1 else float("nan"),
        sizes=out.sizes,
        size_scores=out.size_scores.cpu(),
        num_masks=out.samples.shape[0],
        num_model_calls=counter.calls,
        num_masked_rows=counter.rows,
        rate=_rate_used(estimator, options.get("rate"), out.sizes, d),
        exact=exact,
        bias=None if exact is None else mean - exact,
        shared_masks=bool(options.get("share_masks", False)) or out.exact_enumeration,
        nested=bool(options.get("nested", False)),
        seed=seed_of(seed),
    )


def dense_curve(model: MaskedModel, x: Any, *, num_masks: int, sizes: Sequence[int] | None,
                seed: int | torch.Generator | None, share_masks: bool, nested: bool,
                progress: bool) -> MPTCurve:
    """:func:`mptlml.mpt_curve` for a :class:`MaskedModel` (see its docstring)."""
    xt = model.validate_data(x)
    n, d = xt.shape
    p = check_positive_int(num_masks, "num_masks")
    size_list = list(range(1, d + 1)) if sizes is None else [check_size(m, d) for m in sizes]
    if not size_list:
        raise ValueError("sizes is empty; pass at least one mask size in 1..D.")
    g = make_generator(seed)
    counter = Counter()
    with torch.no_grad(), model.reuse_data():
        if nested:
            s = score_nested(model, xt, p, share_masks=share_masks, generator=g,
                             progress=progress, counter=counter)  # (P, D, N)
            idx = torch.tensor(size_list, dtype=torch.long, device=s.device) - 1
            per_sample = s[:, idx].mean(0).T.cpu()  # (N, S)
        else:
            s, _ = score_grid(model, xt, size_list, p, by="size", share_masks=share_masks,
                              generator=g, progress=progress, counter=counter)
            per_sample = (s / p).T.cpu()  # (N, S)
    mean = per_sample.mean(0)
    stderr = (per_sample.std(0, correction=1) / math.sqrt(n)) if n > 1 else torch.full_like(
        mean, float("nan"))
    exact_sum = sorted(set(size_list)) == list(range(1, d + 1)) and len(size_list) == d
    area_ps = per_sample.sum(1) if exact_sum else d * per_sample.mean(1)
    return MPTCurve(
        sizes=size_list,
        rates=[m / d for m in size_list],
        mean=mean,
        stderr=stderr,
        per_sample=per_sample,
        area=float(area_ps.mean()),
        area_stderr=float(area_ps.std(correction=1) / math.sqrt(n)) if n > 1 else float("nan"),
        area_is_exact_sum=exact_sum,
        num_tokens=d,
        num_masks=p,
        num_model_calls=counter.calls,
        nested=nested,
        seed=seed_of(seed),
        lml=area_ps,
    )


def _rate_used(estimator: str, rate: float | None, sizes: list[int], d: int) -> float | None:
    """The masking rate of "fixed-rate": as given, or M / D when M was given."""
    if estimator != "fixed-rate":
        return None
    return float(rate) if rate is not None else sizes[0] / d


def seed_of(seed: Any) -> int | None:
    """The seed as an int for the record (None for a generator or no seed)."""
    import numbers

    return int(seed) if isinstance(seed, numbers.Integral) else None
