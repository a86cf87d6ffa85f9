"""Estimators of the log-marginal likelihood from masked conditionals.

Proposition 1 of Moreno-Munoz, Recasens & Hauberg (NeurIPS 2023)::

    log p(x) = sum_{M=1..D} S(x; M),
    S(x; M)  = E_{|mask| = M} [ (1/M) sum_{j in mask} log p(x_j | x_R) ].

Every estimator here only calls ``model.masked_log_prob`` (the sum of the
masked conditionals per mask) or one of its reductions
(``grid_masked_log_prob``, ``nested_masked_log_prob``) and knows nothing of
the model family:

``"exhaustive"``   every mask of every size; exact; only for small D.
``"cumulative"``   P uniform masks for every size M = 1..D; unbiased.
``"random-size"``  M ~ U{1..D}, then D * S_hat(x; M); unbiased, one mask of work.
``"fixed-rate"``   D * S_hat(x; M) at one size M (BERT's 15%); biased.
``"chain-rule"``   sum_t log p(x_pi(t) | x_pi(t+1..D)) for a random order pi;
                   exact for every order in a tractable model.

Standard errors are Monte Carlo errors over the masks, conditional on the data:
they need at least two masks (P >= 2) per datum and size; with P = 1 they are
reported as NaN and ``stderr_data`` (the spread across data points) remains.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from ._heap import keep_heap
from ._validation import (
    check_positive_int,
    check_rate,
    check_size,
    make_generator,
)
from .masks import all_masks, count_masks, random_orders, sample_masks
from .models.base import MaskedModel

__all__ = [
    "ESTIMATORS",
    "LMLEstimate",
    "MPTCurve",
    "estimate_lml",
    "fixed_rate_size",
    "mpt_curve",
    "score_masks",
    "score_grid",
    "score_nested",
]

ESTIMATORS = ("exhaustive", "cumulative", "random-size", "fixed-rate", "chain-rule")

#: elements (masks x data x tokens) processed per model call; bounds temporaries.
BLOCK_ELEMENTS = 1 << 22
#: bytes of masks drawn in one call by :func:`score_grid` (several blocks at once: the
#: mask draws run on threads, and each separate draw waits for torch's spinning workers)
MASK_BYTES = 1 << 25
#: default cap on the number of masks the exhaustive estimator may enumerate.
DEFAULT_MAX_MASKS = 1 << 16


# ---------------------------------------------------------------------- results
def _tolist(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.detach().cpu().tolist()
    return v


@dataclass
class LMLEstimate:
    """An estimate of log p(x_n) for each datum.

    Attributes
    ----------
    estimator : str
    per_sample : torch.Tensor, (N,)
        Estimate of log p(x_n) per datum (float64).
    per_sample_stderr : torch.Tensor, (N,)
        Monte Carlo standard error of each per-sample estimate (NaN if P = 1).
    mean : float
        Mean of ``per_sample`` (the average LML per datum).
    stderr : float
        Monte Carlo standard error of ``mean`` over the masks (NaN if P = 1).
    stderr_data : float
        Standard error of ``mean`` across data points, std / sqrt(N).
    sizes : list of int
        Mask sizes that were evaluated.
    size_scores : torch.Tensor, (len(sizes),)
        Mean over data of S_hat(x; M) per evaluated size (NaN where a size was
        never drawn).
    num_masks : int
        P, masks (or orders) per size and datum.
    num_model_calls : int
        Calls to the model (blocks of masks).
    num_masked_rows : int
        (mask, datum) pairs evaluated.
    rate : float or None
        Masking rate (fixed-rate only).
    exact : float or None
        Mean exact log p(x) when the model has an exact ``log_marginal``.
    bias : float or None
        ``mean - exact`` when ``exact`` is known.
    """

    estimator: str
    per_sample: torch.Tensor
    per_sample_stderr: torch.Tensor
    mean: float
    stderr: float
    stderr_data: float
    sizes: list[int]
    size_scores: torch.Tensor
    num_masks: int
    num_model_calls: int
    num_masked_rows: int
    rate: float | None = None
    exact: float | None = None
    bias: float | None = None
    shared_masks: bool = False
    nested: bool = False
    seed: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dictionary (tensors become lists)."""
        return {k: _tolist(v) for k, v in asdict(self).items()}


@dataclass
class MPTCurve:
    """The MPT curve S(x; M) against the masking rate M / D, and its area.

    Attributes
    ----------
    sizes : list of int
    rates : list of float
        ``M / D``.
    mean : torch.Tensor, (S,)
        Mean over data of S_hat(x; M).
    stderr : torch.Tensor, (S,)
        Standard error of ``mean`` across data points.
    per_sample : torch.Tensor, (N, S)
        S_hat(x_n; M), averaged over the P masks.
    area : float
        ``sum_M mean(M)`` over all sizes: the cumulative estimate of the mean
        LML. With a subset of sizes it is the Riemann estimate
        ``D * average over the sizes`` (``area_is_exact_sum`` is then False).
    area_stderr : float
        Standard error of ``area`` across data points.
    """

    sizes: list[int]
    rates: list[float]
    mean: torch.Tensor
    stderr: torch.Tensor
    per_sample: torch.Tensor
    area: float
    area_stderr: float
    area_is_exact_sum: bool
    num_tokens: int
    num_masks: int
    num_model_calls: int
    nested: bool = False
    seed: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dictionary (tensors become lists)."""
        return {k: _tolist(v) for k, v in asdict(self).items()}


# ---------------------------------------------------------------------- engine
class _Counter:
    def __init__(self) -> None:
        self.calls = 0
        self.rows = 0


def _blocks(total: int, per_block: int, progress: bool, desc: str) -> Iterator[tuple[int, int]]:
    starts = range(0, total, per_block)
    for s in tqdm(starts, desc=desc, disable=not progress or len(starts) <= 1, leave=False):
        yield s, min(s + per_block, total)


def _rows_per_block(n: int, d: int, model: MaskedModel | None = None,
                    shared: bool = False) -> int:
    cost = model.block_cost(n, shared) if model is not None else n * d
    return max(1, BLOCK_ELEMENTS // max(1, cost))


def score_masks(model: MaskedModel, x: torch.Tensor, sizes: torch.Tensor, *,
                share_masks: bool = False, generator: torch.Generator | None = None,
                progress: bool = False, counter: _Counter | None = None,
                mean_over_data: bool = False) -> torch.Tensor:
    """Per-mask scores S_hat = (1/M) sum_{j in mask} log p(x_j | x_R) for fresh uniform masks.

    Parameters
    ----------
    model : MaskedModel
    x : torch.Tensor, (N, D)
        Validated data on the model's device and dtype.
    sizes : LongTensor, (B,) or (B, N)
        Mask size of each row (per datum when 2-D).
    share_masks : bool
        One mask per row shared by every datum (the paper's code) instead of
        independent masks per datum.
    mean_over_data : bool
        Return the mean over the data of each row's scores, ``(B,)``, through
        the model's ``masked_log_prob_mean`` (shared masks only; PPCA computes
        it from sufficient statistics). The masks drawn are the same.

    Returns
    -------
    torch.Tensor, (B, N) or (B,) float64
        Differentiable with respect to the model's parameters.
    """
    n, d = x.shape
    g = make_generator(generator)
    keep_heap()
    if share_masks and sizes.ndim == 2:
        raise ValueError("per-datum sizes need share_masks=False.")
    if mean_over_data and not share_masks:
        raise ValueError("mean_over_data needs share_masks=True.")
    per = _rows_per_block(n, d, model, share_masks)
    out = []
    for s, e in _blocks(sizes.shape[0], per, progress, "masks"):
        sz = sizes[s:e]
        mask = sample_masks(d, sz, num_data=None if share_masks else n, generator=g)
        if mean_over_data:
            lp = model.masked_log_prob_mean(x, mask.to(x.device), g).double()
        else:
            lp = model.masked_log_prob(x, mask.to(x.device), g).double()
        div = sz.to(device=lp.device, dtype=torch.float64)
        out.append(lp / (div[:, None] if div.ndim == 1 and not mean_over_data else div))
        if counter is not None:
            counter.calls += 1
            counter.rows += lp.numel()
    return torch.cat(out, dim=0)


def _score_fixed_masks(model: MaskedModel, x: torch.Tensor, masks: torch.Tensor,
                       counter: _Counter, progress: bool) -> torch.Tensor:
    """(1/M) sum over masked positions for given shared masks ``(B, D)`` -> ``(B, N)``."""
    n, d = x.shape
    out = []
    per = _rows_per_block(n, d, model, True)
    for s, e in _blocks(masks.shape[0], per, progress, "masks"):
        m = masks[s:e].to(x.device)
        lp = model.masked_log_prob(x, m, None).double()
        out.append(lp / m.sum(-1, keepdim=True).double())
        counter.calls += 1
        counter.rows += lp.numel()
    return torch.cat(out, dim=0)


def score_grid(model: MaskedModel, x: torch.Tensor, sizes: Sequence[int], num_draws: int, *,
               by: str = "draw", share_masks: bool = False,
               generator: torch.Generator | None = None, progress: bool = False,
               counter: _Counter | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scores of fresh uniform masks of every given size, ``num_draws`` per size, reduced.

    Each of the P draws holds one independent uniform mask of each size M in
    ``sizes``, with score S_hat = (1/M) sum_{j in mask} log p(x_j | x_R).
    The reduction goes through :meth:`MaskedModel.grid_masked_log_prob`, so a
    model can sum a whole grid row at once (PPCA: one quadratic form).

    Parameters
    ----------
    by : {"draw", "size"}
        ``"draw"``: per draw, the sum of the scores over the sizes (the
        cumulative estimate of log p(x_n) of that draw), ``(P, N)``, and per
        size the sum over the draws of the data mean of S_hat, ``(S,)``.
        ``"size"``: per size, the sum of the scores over the draws, ``(S, N)``
        (and None).

    Returns
    -------
    tuple of torch.Tensor (float64)
    """
    if by not in ("draw", "size"):
        raise ValueError(f"by must be 'draw' or 'size', got {by!r}.")
    num_draws = check_positive_int(num_draws, "num_draws")
    n, d = x.shape
    g = make_generator(generator)
    size_t = torch.as_tensor(list(sizes), dtype=torch.long)
    inv = 1.0 / size_t.double()
    by_draw = by == "draw"
    outer, inner = (num_draws, len(size_t)) if by_draw else (len(size_t), num_draws)
    rows_out = torch.zeros(outer, n, dtype=torch.float64, device=x.device)
    cols_out = torch.zeros(inner, dtype=torch.float64, device=x.device) if by_draw else None
    per = _rows_per_block(n, d, model, share_masks)
    if per >= inner:  # blocks of whole grid rows, else pieces of one row
        spans = [(a, min(a + per // inner, outer), 0, inner)
                 for a in range(0, outer, per // inner)]
    else:
        spans = [(a, a + 1, c, min(c + per, inner)) for a in range(outer)
                 for c in range(0, inner, per)]

    def span_sizes(span: tuple[int, int, int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        a0, a1, c0, c1 = span
        if by_draw:  # drawn size-major (equal sizes contiguous), one grid row per draw after
            return size_t[c0:c1].repeat_interleave(a1 - a0), inv[c0:c1].repeat(a1 - a0)
        return size_t[a0:a1].repeat_interleave(c1 - c0), inv[a0:a1].repeat_interleave(c1 - c0)

    # masks of several blocks are drawn in one call (up to MASK_BYTES): fewer, larger draws
    per_mask = d * (1 if share_masks else n)
    bar = tqdm(total=len(spans), desc="masks", leave=False,
               disable=not progress or len(spans) <= 1)
    for group in _span_groups(spans, max(1, MASK_BYTES // per_mask)):
        drawn = [span_sizes(sp) for sp in group]
        masks = sample_masks(d, torch.cat([sz for sz, _ in drawn]),
                             num_data=None if share_masks else n, generator=g)
        start = 0
        for (a0, a1, c0, c1), (sz, wt) in zip(group, drawn, strict=True):
            mask, start = masks[start:start + sz.shape[0]], start + sz.shape[0]
            if by_draw:
                mask = mask.reshape(c1 - c0, a1 - a0, *mask.shape[1:]).transpose(0, 1)
                mask, wt = mask.contiguous(), wt.reshape(a1 - a0, c1 - c0)
            else:
                mask, wt = mask.reshape(a1 - a0, c1 - c0, *mask.shape[1:]), wt.reshape(
                    a1 - a0, c1 - c0)
            rows, cols = model.grid_masked_log_prob(x, mask.to(x.device), wt, g,
                                                     data_means=by_draw)
            rows_out[a0:a1] += rows
            if cols_out is not None:
                cols_out[c0:c1] += cols
            if counter is not None:
                counter.calls += 1
                counter.rows += mask.shape[0] * mask.shape[1] * n
            bar.update()
    bar.close()
    return rows_out, cols_out


def _span_groups(spans: list[tuple[int, int, int, int]], max_masks: int
                 ) -> list[list[tuple[int, int, int, int]]]:
    """Consecutive blocks of the grid whose masks together stay within ``max_masks``."""
    groups: list[list[tuple[int, int, int, int]]] = []
    count = max_masks
    for sp in spans:
        masks = (sp[1] - sp[0]) * (sp[3] - sp[2])
        if count + masks > max_masks:
            groups.append([])
            count = 0
        groups[-1].append(sp)
        count += masks
    return groups


def score_nested(model: MaskedModel, x: torch.Tensor, num_orders: int, *,
                 share_masks: bool = False, generator: torch.Generator | None = None,
                 progress: bool = False, counter: _Counter | None = None) -> torch.Tensor:
    """S_hat(x; M) for nested masks: the first M tokens of one random order, every M.

    Each of the ``num_orders`` uniformly random orders pi (one per datum, or
    shared when ``share_masks``) gives one mask of every size, pi[:M] for
    M = 1..D. Each mask is uniform among the subsets of its size, so each
    S_hat(x; M), and their sum over M, is unbiased; the D masks of an order
    are dependent, which changes the variance (measured in
    ``benchmarks/bench_estimators.py``), and the model can reuse prefix sums
    (:meth:`MaskedModel.nested_masked_log_prob`).

    Returns
    -------
    torch.Tensor, (P, D, N) float64
        ``[p, M-1, n]`` = (1/M) sum_{j in pi_p[:M]} log p(x_nj | x_n,pi_p[M:]).
    """
    n, d = x.shape
    g = make_generator(generator)
    per = max(1, _rows_per_block(n, d, model, share_masks) // d)
    div = torch.arange(1, d + 1, dtype=torch.float64, device=x.device)[None, :, None]
    out = []
    for s, e in _blocks(num_orders, per, progress, "orders"):
        orders = random_orders(d, e - s, num_data=None if share_masks else n, generator=g)
        lp = model.nested_masked_log_prob(x, orders.to(x.device), g).double()
        out.append(lp / div)
        if counter is not None:
            counter.calls += 1
            counter.rows += lp.numel()
    return torch.cat(out, dim=0)


def _mc_stats(samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean over dim 0 and its standard error (NaN when fewer than two samples)."""
    p = samples.shape[0]
    mean = samples.mean(0)
    if p < 2:
        return mean, torch.full_like(mean, float("nan"))
    return mean, samples.var(0, correction=1).div(p).sqrt()


def fixed_rate_size(rate: float, num_tokens: int) -> int:
    """Mask size of a fixed masking rate: ``max(1, floor(rate * D))``.

    Floor, as the paper's code: 15% of D = 512 gives M = 76 (NOTES.md, Table 1).
    A tiny tolerance keeps exact products (0.2 * 10) from rounding down.
    """
    return max(1, min(num_tokens, int(math.floor(rate * num_tokens + 1e-9))))


def _seed_of(seed: Any) -> int | None:
    return int(seed) if isinstance(seed, numbers.Integral) else None


def _is_masked_lm(model: Any) -> bool:
    from .models.masked_lm import MaskedLM

    return isinstance(model, MaskedLM)


def _mlm_seed(seed: Any) -> int:
    """Masked-LM runs need an int seed (masks are a function of (seed, sequence index))."""
    if seed is None:
        return int(torch.randint(0, 2**31 - 1, ()).item())
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
        return int(seed)
    raise TypeError(f"for a MaskedLM pass an int seed (or None), got {type(seed).__name__}.")


def _no_nested_for_mlm(nested: bool) -> None:
    if nested:
        raise ValueError("nested=True is not available for a MaskedLM; its masks are drawn "
                         "per sequence (leave nested=False).")


def _prepare(model: Any, x: Any) -> tuple[MaskedModel, torch.Tensor]:
    if not isinstance(model, MaskedModel):
        raise TypeError(
            f"model must be an mptlml.models.MaskedModel (e.g. mptlml.models.PPCA), "
            f"got {type(model).__name__}."
        )
    keep_heap()
    return model, model.validate_data(x)


# ---------------------------------------------------------------------- public API
def estimate_lml(model: MaskedModel, x: Any, estimator: str = "cumulative", *,
                 num_masks: int = 1, rate: float | None = None, mask_size: int | None = None,
                 seed: int | torch.Generator | None = None, share_masks: bool = False,
                 nested: bool = False, max_masks: int = DEFAULT_MAX_MASKS,
                 progress: bool = False,
                 **mlm_options: Any) -> LMLEstimate:
    """Estimate log p(x_n) for each row of ``x`` from the model's masked conditionals.

    Parameters
    ----------
    model : MaskedModel
    x : array-like, (N, D)
    estimator : {"exhaustive", "cumulative", "random-size", "fixed-rate", "chain-rule"}
        See the module docstring for the formulas.
    num_masks : int
        P: masks per size (cumulative), draws of (M, mask) (random-size), masks
        (fixed-rate) or orders (chain-rule) per datum. Ignored by exhaustive.
    rate : float in (0, 1)
        Masking rate of ``"fixed-rate"``; M = max(1, floor(rate * D)).
    mask_size : int, optional
        Give M directly instead of ``rate`` (fixed-rate only).
    seed : int or torch.Generator, optional
        Makes the masks reproducible.
    share_masks : bool
        Share each mask across the data (the paper's code) rather than draw
        independent masks per datum (default; lower variance).
    nested : bool
        ``"cumulative"`` only: the P masks of the D sizes are the prefixes of
        P random orders (one order gives one mask of every size) instead of
        independent draws. Still unbiased; cheaper per mask (prefix sums, one
        permutation per D masks) but dependent across sizes, so compare it at
        equal standard error (``benchmarks/bench_estimators.py``).
    max_masks : int
        Budget of the exhaustive estimator, which needs 2^D - 1 masks.
    progress : bool
        Show a progress bar over blocks of masks.

    Returns
    -------
    LMLEstimate

    References
    ----------
    Moreno-Munoz, Recasens, Hauberg (2023), Proposition 1 and Sec. 3.
    """
    if _is_masked_lm(model):  # ragged text sequences: mptlml.sequences
        from .sequences import mlm_estimate_lml

        _no_nested_for_mlm(nested)
        return mlm_estimate_lml(model, x, estimator=estimator, num_masks=num_masks,
                                seed=_mlm_seed(seed), progress=progress, **mlm_options)
    if mlm_options:
        raise TypeError(f"unexpected arguments {sorted(mlm_options)} (only for a MaskedLM).")
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}; choose one of {', '.join(ESTIMATORS)}.")
    if nested and estimator != "cumulative":
        raise ValueError(f"nested=True needs estimator='cumulative' (nested masks are the "
                         f"prefixes of one order, one mask per size); got {estimator!r}.")
    model, xt = _prepare(model, x)
    n, d = xt.shape
    p = check_positive_int(num_masks, "num_masks")
    g = make_generator(seed)
    counter = _Counter()
    rate_used: float | None = None
    with torch.no_grad(), model.reuse_data():
        # samples: (P, N), i.i.d. over P, each an estimate of log p(x_n) on its own.
        if estimator == "exhaustive":
            max_masks = check_positive_int(max_masks, "max_masks")
            total = count_masks(d)
            if total > max_masks:
                raise ValueError(
                    f"the exhaustive estimator needs 2^D - 1 = {total} masks for D={d}, more than "
                    f"max_masks={max_masks}; use estimator='cumulative' (Monte Carlo) or raise "
                    "max_masks."
                )
            sizes = list(range(1, d + 1))
            s_by_size = torch.stack(
                [_score_fixed_masks(model, xt, all_masks(d, m), counter, progress).mean(0)
                 for m in sizes]
            )  # (D, N)
            samples = s_by_size.sum(0, keepdim=True)
            size_scores = s_by_size.mean(1)
            p = 1
        elif estimator == "cumulative" and nested:
            sizes = list(range(1, d + 1))
            s = score_nested(model, xt, p, share_masks=share_masks, generator=g,
                             progress=progress, counter=counter)  # (P, D, N)
            samples = s.sum(1)
            size_scores = s.mean((0, 2))
        elif estimator == "cumulative":
            sizes = list(range(1, d + 1))
            samples, size_sums = score_grid(model, xt, sizes, p, share_masks=share_masks,
                                            generator=g, progress=progress, counter=counter)
            size_scores = size_sums / p
        elif estimator == "random-size":
            sizes = list(range(1, d + 1))
            shape = (p,) if share_masks else (p, n)
            m = torch.randint(1, d + 1, shape, generator=g)
            s = score_masks(model, xt, m, share_masks=share_masks, generator=g,
                            progress=progress, counter=counter)  # (P, N)
            samples = d * s
            mm = (m if m.ndim == 2 else m[:, None].expand(p, n)).to(s.device)
            idx = mm.reshape(-1).cpu() - 1
            tot = torch.zeros(d, dtype=torch.float64).index_add_(0, idx, s.reshape(-1).cpu())
            cnt = torch.bincount(idx, minlength=d).double()
            size_scores = torch.where(cnt > 0, tot / cnt.clamp_min(1), float("nan"))
        elif estimator == "fixed-rate":
            if mask_size is not None:
                msize = check_size(mask_size, d, "mask_size")
                rate_used = msize / d
            else:
                rate_used = check_rate(rate)
                msize = fixed_rate_size(rate_used, d)
            sizes = [msize]
            s = score_masks(model, xt, torch.full((p,), msize, dtype=torch.long),
                            share_masks=share_masks, generator=g, progress=progress,
                            counter=counter)
            samples = d * s
            size_scores = s.mean().reshape(1)
        else:  # chain-rule
            sizes = list(range(1, d + 1))
            samples = _chain_rule(model, xt, p, share_masks, g, counter, progress)  # (P, N)
            size_scores = torch.full((d,), float("nan"), dtype=torch.float64)
        exact = bias = None
        if model.has_log_marginal and not model.stochastic:
            exact = float(model._log_marginal(xt).double().mean())
    per_sample, per_se = _mc_stats(samples)
    if estimator == "exhaustive":
        per_se = torch.zeros_like(per_sample)
        stderr = 0.0
    else:
        stderr = float(_mc_stats(samples.mean(1, keepdim=True))[1][0])
    mean = float(per_sample.mean())
    if exact is not None:
        bias = mean - exact
    return LMLEstimate(
        estimator=estimator,
        per_sample=per_sample.cpu(),
        per_sample_stderr=per_se.cpu(),
        mean=mean,
        stderr=stderr,
        stderr_data=float(per_sample.std(correction=1) / math.sqrt(n)) if n > 1 else float("nan"),
        sizes=sizes,
        size_scores=size_scores.cpu(),
        num_masks=p,
        num_model_calls=counter.calls,
        num_masked_rows=counter.rows,
        rate=rate_used,
        exact=exact,
        bias=bias,
        shared_masks=share_masks,
        nested=nested,
        seed=_seed_of(seed),
    )


def _chain_rule(model: MaskedModel, x: torch.Tensor, p: int, share: bool,
                g: torch.Generator, counter: _Counter, progress: bool) -> torch.Tensor:
    """sum_t log p(x_pi(t) | x_pi(t+1..D)) for P random orders: ``(P, N)``.

    Step t masks the first t positions of the order and scores position pi(t)
    given the remaining D - t ones.
    """
    n, d = x.shape
    orders = random_orders(d, p, num_data=None if share else n, generator=g)
    if share:
        orders = orders[:, None, :].expand(p, n, d)
    rank = orders.argsort(-1)  # rank[p, n, j]: step at which j is scored
    total = torch.zeros(p, n, dtype=torch.float64, device=x.device)
    steps = torch.arange(d)
    per = max(1, _rows_per_block(n, d) // p)
    for s, e in _blocks(d, per, progress, "chain rule"):
        t = steps[s:e]  # (T,)
        mask = rank[None] <= t[:, None, None, None]  # (T, P, N, D)
        target = orders[..., s:e].permute(2, 0, 1)  # (T, P, N): position scored at step t
        lc = model._log_conditionals(x, mask.reshape(-1, n, d).to(x.device), g)
        lc = lc.reshape(e - s, p, n, d).gather(-1, target[..., None].to(x.device))[..., 0]
        total += lc.double().sum(0)
        counter.calls += 1
        counter.rows += (e - s) * p * n
    return total


def mpt_curve(model: MaskedModel, x: Any, *, num_masks: int = 1,
              sizes: Sequence[int] | None = None, seed: int | torch.Generator | None = None,
              share_masks: bool = False, nested: bool = False, progress: bool = False,
              **mlm_options: Any) -> MPTCurve:
    """The MPT curve: S(x; M) against the masking rate M / D, with its area.

    For each size M, ``num_masks`` uniform masks per datum give
    S_hat(x_n; M) = mean over masks of (1/M) sum_{j in mask} log p(x_j | x_R).
    The area sum_{M=1..D} S(x; M) is the cumulative estimate of log p(x)
    (Proposition 1; Fig. 4 of the paper).

    Parameters
    ----------
    model : MaskedModel
    x : array-like, (N, D)
    num_masks : int
        P masks per size and datum.
    sizes : sequence of int, optional
        Mask sizes (default: all 1..D).
    seed : int or torch.Generator, optional
    share_masks : bool
        Share masks across data (the paper's code).
    nested : bool
        Masks of all sizes from the prefixes of P random orders (see
        :func:`estimate_lml`); every size is computed, ``sizes`` are kept.
    progress : bool

    Returns
    -------
    MPTCurve
    """
    if _is_masked_lm(model):  # ragged text sequences: rates grid, mptlml.sequences
        from .sequences import mlm_curve

        _no_nested_for_mlm(nested)
        if sizes is not None:
            raise TypeError("a MaskedLM curve is drawn over masking rates; pass rates=[...] "
                            "instead of sizes (M = max(1, round(r * D_i)) per sequence).")
        return mlm_curve(model, x, num_masks=num_masks, seed=_mlm_seed(seed),
                         progress=progress, **mlm_options)
    if mlm_options:
        raise TypeError(f"unexpected arguments {sorted(mlm_options)} (only for a MaskedLM).")
    model, xt = _prepare(model, x)
    n, d = xt.shape
    p = check_positive_int(num_masks, "num_masks")
    size_list = list(range(1, d + 1)) if sizes is None else [check_size(int(m), d) for m in sizes]
    if not size_list:
        raise ValueError("sizes is empty; pass at least one mask size in 1..D.")
    g = make_generator(seed)
    counter = _Counter()
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
        seed=_seed_of(seed),
    )
