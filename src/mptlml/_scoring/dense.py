"""The block engine: score fresh masks in blocks that bound memory, through the model's reductions.

The machinery under the estimators of dense ``(N, D)`` data (it knows none of
them): masks of given sizes are drawn uniformly (:mod:`mptlml.masks`) and the
model is asked for ``masked_log_prob`` (the sum of log p(x_j | x_R) over each mask) or one of
its reductions (``masked_log_prob_mean``, ``grid_masked_log_prob``,
``nested_masked_log_prob``); the engine cuts the masks into blocks of at most
``mptlml.settings.block_elements`` temporaries (``model.block_cost`` per mask)
and divides by the mask size, S_hat(x; M) = (1/M) sum_{j in mask} log p(x_j | x_R)
(Moreno-Munoz, Recasens & Hauberg, NeurIPS 2023, Proposition 1).

The block sizes never change a result: the masks are drawn from the generator
in the same order whatever the blocks.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from .. import settings
from .._progress import progress_bar
from .._validation import check_positive_int, make_generator
from ..masks import random_orders, sample_masks
from ..models.base import MaskedModel

__all__ = [
    "Counter",
    "blocks",
    "check_masked_inputs",
    "rows_per_block",
    "score_fixed_masks",
    "score_grid",
    "score_masks",
    "score_nested",
]


def check_masked_inputs(total: int, what: str, remedy: str) -> None:
    """Refuse, before any work, a run of more than ``settings.max_masked_inputs`` masked inputs.

    ``total`` (mask, datum) pairs, or (sequence, masked input) pairs, would be
    scored by ``what``; past the cap the run is refused with its cost and
    ``remedy`` (what to lower), dense data and ragged sequences alike.
    """
    cap = settings.max_masked_inputs.value()
    if total > cap:
        raise ValueError(
            f"{what} would score {total:,} masked inputs, more than "
            f"mptlml.settings.max_masked_inputs = {cap:,}; {remedy}, or raise that setting "
            "(with mptlml.settings.max_masked_inputs(n): ...) if you mean it.")


class Counter:
    """Model calls and (mask, datum) pairs scored so far."""

    def __init__(self) -> None:
        self.calls = 0
        self.rows = 0


def blocks(total: int, per_block: int, progress: bool, desc: str) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` of consecutive blocks of ``per_block`` out of ``total`` (with a bar)."""
    starts = range(0, total, per_block)
    for s in progress_bar(starts, enabled=progress and len(starts) > 1, desc=desc):
        yield s, min(s + per_block, total)


def rows_per_block(n: int, d: int, model: MaskedModel | None = None,
                   shared: bool = False) -> int:
    """Masks per model call: ``settings.block_elements`` over the model's cost per mask."""
    cost = model.block_cost(n, shared) if model is not None else n * d
    return max(1, settings.block_elements.value() // max(1, cost))


def score_masks(model: MaskedModel, x: torch.Tensor, sizes: torch.Tensor, *,
                share_masks: bool = False, generator: torch.Generator | None = None,
                progress: bool = False, counter: Counter | None = None,
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
        the model's ``masked_log_prob_mean`` (shared masks only; a model may compute
        it from sufficient statistics of the data). The masks drawn are the same.

    Returns
    -------
    torch.Tensor, (B, N) or (B,) float64
        Differentiable with respect to the model's parameters.

    Notes
    -----
    The masks depend only on the generator, the sizes and ``share_masks``
    (they are drawn in chunks of ``settings.mask_bytes``, whatever the model's
    block size), so two models scored from one seed see the same masks.
    """
    n, d = x.shape[0], model.num_tokens
    g = make_generator(generator)
    if share_masks and sizes.ndim == 2:
        raise ValueError("per-datum sizes need share_masks=False.")
    if mean_over_data and not share_masks:
        raise ValueError("mean_over_data needs share_masks=True.")
    per = rows_per_block(n, d, model, share_masks)
    # masks are drawn in chunks that do not depend on the model (its block cost only
    # cuts a chunk into calls), so one generator state gives every model the same masks
    chunk = max(1, settings.mask_bytes.value() // (d * (1 if share_masks else n)))
    out = []
    bar = progress_bar(total=sizes.shape[0], enabled=progress and sizes.shape[0] > per,
                       desc="masks")
    for c0 in range(0, sizes.shape[0], chunk):
        c1 = min(c0 + chunk, sizes.shape[0])
        masks = sample_masks(d, sizes[c0:c1], num_data=None if share_masks else n, generator=g)
        for s in range(c0, c1, per):
            e = min(s + per, c1)
            sz, mask = sizes[s:e], masks[s - c0:e - c0].to(x.device)
            if mean_over_data:
                lp = model.masked_log_prob_mean(x, mask, g).double()
            else:
                lp = model.masked_log_prob(x, mask, g).double()
            div = sz.to(device=lp.device, dtype=torch.float64)
            out.append(lp / (div[:, None] if div.ndim == 1 and not mean_over_data else div))
            if counter is not None:
                counter.calls += 1
                counter.rows += lp.numel()
            bar.update(e - s)
    bar.close()
    return torch.cat(out, dim=0)


def score_fixed_masks(model: MaskedModel, x: torch.Tensor, masks: torch.Tensor,
                       counter: Counter, progress: bool,
                       generator: torch.Generator | None = None) -> torch.Tensor:
    """(1/M) sum over masked positions for given shared masks ``(B, D)`` -> ``(B, N)``.

    ``generator`` drives a model whose conditionals are themselves Monte
    Carlo estimates (importance samples of a VAE), so a seeded run repeats.
    """
    n, d = x.shape[0], model.num_tokens
    out = []
    per = rows_per_block(n, d, model, True)
    for s, e in blocks(masks.shape[0], per, progress, "masks"):
        m = masks[s:e].to(x.device)
        lp = model.masked_log_prob(x, m, generator).double()
        out.append(lp / m.sum(-1, keepdim=True).double())
        counter.calls += 1
        counter.rows += lp.numel()
    return torch.cat(out, dim=0)


def score_grid(model: MaskedModel, x: torch.Tensor, sizes: Sequence[int], num_draws: int, *,
               by: str = "draw", share_masks: bool = False,
               generator: torch.Generator | None = None, progress: bool = False,
               counter: Counter | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scores of fresh uniform masks of every given size, ``num_draws`` per size, reduced.

    Each of the P draws holds one independent uniform mask of each size M in
    ``sizes``, with score S_hat = (1/M) sum_{j in mask} log p(x_j | x_R).
    The reduction goes through :meth:`MaskedModel.grid_masked_log_prob`, so a
    model can sum a whole grid row at once (e.g. as one quadratic form).

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
    n, d = x.shape[0], model.num_tokens
    g = make_generator(generator)
    size_t = torch.as_tensor(list(sizes), dtype=torch.long)
    inv = 1.0 / size_t.double()
    by_draw = by == "draw"
    outer, inner = (num_draws, len(size_t)) if by_draw else (len(size_t), num_draws)
    rows_out = torch.zeros(outer, n, dtype=torch.float64, device=x.device)
    cols_out = torch.zeros(inner, dtype=torch.float64, device=x.device) if by_draw else None
    per = rows_per_block(n, d, model, share_masks)
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

    # masks of several blocks are drawn in one call (up to settings.mask_bytes): fewer, larger draws
    per_mask = d * (1 if share_masks else n)
    bar = progress_bar(total=len(spans), enabled=progress and len(spans) > 1, desc="masks")
    for group in _span_groups(spans, max(1, settings.mask_bytes.value() // per_mask)):
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
                 progress: bool = False, counter: Counter | None = None) -> torch.Tensor:
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
    n, d = x.shape[0], model.num_tokens
    g = make_generator(generator)
    per = max(1, rows_per_block(n, d, model, share_masks) // d)
    div = torch.arange(1, d + 1, dtype=torch.float64, device=x.device)[None, :, None]
    out = []
    for s, e in blocks(num_orders, per, progress, "orders"):
        orders = random_orders(d, e - s, num_data=None if share_masks else n, generator=g)
        lp = model.nested_masked_log_prob(x, orders.to(x.device), g).double()
        out.append(lp / div)
        if counter is not None:
            counter.calls += 1
            counter.rows += lp.numel()
    return torch.cat(out, dim=0)
