"""The block draw: the rate draw of Proposition 1 inside each block of a block-diffusion LM.

A block-diffusion LM (BD3-LM, SDAR, LLaDA2.x, Fast-dLLM v2; :mod:`mptlml.models.blocks`)
factorises left to right over blocks and is a masked-diffusion model within each, so

    log p(x) = sum_b log p(x_b | x_<b)  >=  sum_b sum_{M=1..|b|} S_b(x; M),

each block's term the conditional MPT sum of its tokens given the clean earlier blocks
(equality for a consistent model). A continuation given a context is the same sum over
the continuation's blocks, the context clean; a continuation that starts inside a block
makes that block's term the sum over its own tokens there, the context's tokens of the
block clean and visible.

:class:`BlockDraw` draws each block's term as :class:`~mptlml.estimators.sequential.RateDraw`
draws a continuation's: ``sum_{M=1..k} S_b(x; M) = S_b(x; k) + E_{M ~ q}[S_b(x; M) / q(M)]``
(M < k), the whole block scored once (round 0) and P stratified rates per round (two per
stratum of equal q-mass, :func:`~mptlml.estimators.sequential.stratified_rates`; the two
of a stratum at opposite ends of one random order of the block, :func:`antithetic_pairs`),
drawn for every block of a sequence independently (stratified within each block, independent
across blocks: the round's variance is the sum of the blocks'). A block whose ``2^k - 2``
other masks are no more than ``max(P, 2^exact_length - 2)`` is scored on every mask
instead (exact, standard error 0). Row p of a round masks every drawn block with its own
p-th draw: with the ``x_t + x_0`` layout one forward of length 2L scores all the blocks of
a row, so a round costs P forwards per sequence whatever its number of blocks (the
enumerated blocks share their rows alike, ``2^k - 1`` for the longest of them).

Reference: Moreno-Munoz, Recasens, Hauberg, "On Masked Pre-training and the Marginal
Likelihood", NeurIPS 2023, Proposition 1; Arriola et al., "Block Diffusion" (BD3-LM),
ICLR 2025.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
import torch

from .._progress import progress_bar
from ..masks import all_masks, every_mask
from ..models.sequence_input import encode
from ..seeds import spawn
from .results import LMLEstimate
from .runs import rounds_estimate
from .sequential import (
    MAX_TARGET_DRAWS,
    NUM_RATE_BINS,
    RateDensity,
    RoundDraw,
    density_of,
    draw_caps,
    fixed_rule,
    merge_stops,
    round_seed,
    run_rounds,
    stratified_rates,
    stratum_cells,
    target_rule,
)
from .stats import enumerated_sum, mean_stderr

__all__ = ["BlockDraw", "antithetic_pairs", "block_curve", "block_estimate", "block_model",
           "block_pll", "refuse_block_model"]


def block_model(model: Any) -> bool:
    """Whether ``model`` (a masked LM, or one seen through contexts) is a block-diffusion LM."""
    return getattr(model, "block_size", None) is not None


def refuse_block_model(model: Any, what: str) -> None:
    """Refuse ``what`` (a door that draws masks over whole sequences) on a block model."""
    if block_model(model):
        inner = getattr(model, "inner", model)
        inner.refuse_full_attention(what)


def antithetic_pairs(length: int, rates: np.ndarray, order: torch.Tensor
                     ) -> tuple[torch.Tensor, np.ndarray]:
    """Masks ``(P, k)`` of sizes ``ceil(r (k - 1))``, each stratum's two at opposite ends of
    one random order of the k positions: draw 2h masks the first ``M_2h`` positions of row
    2h's order, draw 2h + 1 its last ``M_2h+1``.

    Each draw is a uniform mask of its size (the pair's law is invariant under permutations
    of the positions), so the estimate is unbiased; the two overlap as little as their sizes
    allow (never equal: M < k), so a position's own spread, which a small mask's score
    carries, cancels within the pair. Their covariance is then at most 0 and the pair's
    ``(y_1 - y_2)^2 / 4`` errs on the large side as an estimate of its mean's variance
    (``sigma^2 (1 - rho) / 2 >= sigma^2 (1 + rho) / 2``).
    """
    p = len(rates)
    sizes = np.clip(np.ceil(rates * (length - 1)), 1, length - 1).astype(np.int64)
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(length).expand(p, -1))
    first = rank[0::2]
    size = torch.as_tensor(sizes)
    m = torch.empty(p, length, dtype=torch.bool)
    m[0::2] = first < size[0::2, None]
    m[1::2] = first >= length - size[1::2, None]
    return m, sizes


class _Forwards:
    """A progress sink that counts the forward passes and the inputs they scored (and
    moves ``bar``, a progress bar of the inputs, when given)."""

    def __init__(self, bar: Any = None) -> None:
        self.calls, self.inputs, self.bar = 0, 0, bar

    def update(self, n: int) -> None:
        self.calls += 1
        self.inputs += int(n)
        if self.bar is not None:
            self.bar.update(int(n))


class BlockDraw(RoundDraw):
    """The rate draw inside every block of a block-diffusion LM, all blocks in each row.

    Parameters
    ----------
    num_masks : int
        P, draws per block of the first round (even: two per rate stratum).
    allocation : {"neyman", "uniform"}
        ``"neyman"``: after each round the rate density follows the spread of a draw's
        score by rate bin, pooled over every drawn block of the call
        (:func:`~mptlml.estimators.sequential.density_of`); ``"uniform"``: q uniform.
    exact_length : int
        Blocks of up to this many tokens (or whose other masks are no more than P) are
        enumerated.

    Attributes
    ----------
    blocks : dict of int to (int, int)
        Per sequence scored, its blocks and how many of them were enumerated (exact).
    """

    name = "block-rate"

    def __init__(self, num_masks: int, allocation: str = "neyman", exact_length: int = 4
                 ) -> None:
        self.p, self.allocation, self.exact_length = int(num_masks), allocation, exact_length
        self.blocks: dict[int, tuple[int, int]] = {}
        self.forwards = 0

    def bind(self, lengths: np.ndarray, groups: list[list[int]],
             keys: list[tuple[int, int]]) -> None:
        super().bind(lengths, groups, keys)
        self.density = RateDensity(np.ones(NUM_RATE_BINS))
        self.spread_sum = np.zeros(NUM_RATE_BINS)
        self.spread_n = np.zeros(NUM_RATE_BINS)
        self.spans: dict[int, list[tuple[int, int]]] = {}

    def exact_block(self, k: int) -> bool:
        """Whether a block of ``k`` scored tokens is enumerated."""
        return bool(2.0 ** k - 2 <= max(self.p, 2 ** self.exact_length - 2) or k <= 1)

    def enumerates(self, length: int) -> bool:
        return False  # by block, known once the sequence's blocks are (score)

    def most_rows(self, length: int, draws: int) -> int:
        k = max((k for k in range(1, length + 1) if self.exact_block(k)), default=1)
        return int(draws) + 1 + 2 ** min(k, length) - 1

    def draws_within(self, length: int, rows: int) -> int:
        return int(rows) - 1  # the whole blocks' row, scored once, counts

    def draw_text(self, length: int, draws: int) -> str:
        return " in each block, and the whole blocks' row"

    def score(self, scorer: Any, ids: list[torch.Tensor], todo: list[tuple[int, int]], r: int,
              run: dict[str, Any]) -> tuple[dict[int, tuple[list[np.ndarray] | None, float, int]],
                                            int]:
        if run.get("checkpoint_dir") is not None:
            raise ValueError("checkpoint_dir does not apply to a block-diffusion LM's block "
                             "bound (its rounds are not checkpointed); drop it.")
        new = [i for i, _ in todo if i not in self.spans]
        if new:
            for i, sp in zip(new, scorer.block_spans([ids[i] for i in new]), strict=True):
                self.spans[i] = sp
        masks: dict[int, torch.Tensor] = {}
        plan: dict[int, list[tuple[str, int, int, Any]]] = {}
        for i, p in todo:
            t = int(self.lengths[i])
            g = torch.Generator().manual_seed(round_seed(self.keys[i], r))
            exact = [(a, e) for a, e in self.spans[i] if self.exact_block(e - a)]
            drawn = [(a, e) for a, e in self.spans[i] if not self.exact_block(e - a)]
            self.blocks[i] = (len(self.spans[i]), len(exact))
            parts, steps = [], []
            if r == 0 and exact:  # every mask of every short block, the blocks sharing rows
                kmax = max(e - a for a, e in exact)
                codes = torch.arange(1, 2 ** kmax)
                m = torch.zeros(len(codes), t, dtype=torch.bool)
                for a, e in exact:
                    k = e - a
                    m[: 2 ** k - 1, a:e] = every_mask(k)
                parts.append(m)
                steps += [("exact", a, e, None) for a, e in exact]
            rows0 = sum(x.shape[0] for x in parts)
            if r == 0 and drawn:  # S_b(x; k) of every drawn block, in one row
                m = torch.zeros(1, t, dtype=torch.bool)
                for a, e in drawn:
                    m[0, a:e] = True
                parts.append(m)
                steps += [("whole", a, e, rows0) for a, e in drawn]
                rows0 += 1
            if drawn:
                m = torch.zeros(p, t, dtype=torch.bool)
                for a, e in drawn:
                    k = e - a
                    _, rates, order = stratified_rates(g, p, k, self.density)
                    mm, sizes = antithetic_pairs(k, rates, order)
                    m[:, a:e] = mm
                    steps.append(("draw", a, e, (rows0, rates, sizes)))
                parts.append(m)
            masks[i] = torch.cat(parts) if parts else torch.zeros(0, t, dtype=torch.bool)
            plan[i] = steps
        order_ = [i for i, _ in todo]
        sink = _Forwards()
        lp = scorer.block_position_log_probs(
            [ids[i] for i in order_], [masks[i] for i in order_],
            token_budget=int(run.get("token_budget", 8192)), batch_size=run.get("batch_size"),
            progress=sink) if order_ else []
        self.forwards += sink.calls
        res: dict[int, tuple[list[np.ndarray] | None, float, int]] = {}
        for i, v in zip(order_, lp, strict=True):
            v = v.numpy()
            exact_part, cells = 0.0, []
            for kind, a, e, extra in plan[i]:
                s = v[:, a:e].sum(1)
                k = e - a
                if kind == "exact":
                    em = every_mask(k)
                    exact_part += enumerated_sum(s[: 2 ** k - 1], em.sum(1).numpy())
                elif kind == "whole":
                    exact_part += float(s[extra]) / k
                else:
                    start, rates, sizes = extra
                    s = s[start:start + len(sizes)]
                    y = s / (sizes * self.density.size_probs(sizes, k))
                    cells += stratum_cells(y)
                    score = s / sizes
                    b = np.minimum((rates * NUM_RATE_BINS).astype(int), NUM_RATE_BINS - 1)
                    pair = score.reshape(-1, 2)
                    np.add.at(self.spread_sum, b.reshape(-1, 2)[:, 0],
                              (pair[:, 0] - pair[:, 1]) ** 2 / 2)
                    np.add.at(self.spread_n, b.reshape(-1, 2)[:, 0], 1)
            rows = int(masks[i].shape[0])
            res[i] = (cells if cells else None, exact_part, rows)
        return res, sink.calls

    def learn(self, active: list[int]) -> None:
        if self.allocation != "neyman" or self.spread_n.min() <= 0:
            return
        self.density = density_of(self.spread_sum / self.spread_n)


def block_estimate(est: Any, model: Any, sequences: Any, *, seed: int, progress: bool,
                   run: dict[str, Any] | None, target_se: float | None,
                   max_masks: int | None, allocation: str | None,
                   exact_length: int) -> LMLEstimate:
    """A block model's block bound per sequence, on the sequential engine (:class:`BlockDraw`).

    ``est`` is the rate draw's estimator (``"learned-rate"``: ``num_masks`` draws per block
    per round, even). Without ``target_se`` one round of ``num_masks`` (uniform q); with it,
    rounds until each sequence's standard error is at most ``target_se * N / sqrt(N)``
    (``se(mean) <= target_se``) on at least
    :data:`~mptlml.estimators.sequential.TARGET_MIN_DOF` degrees of freedom, or
    ``max_masks`` masked rows per sequence are spent. The result's ``num_blocks`` and
    ``exact_blocks`` say per sequence how many blocks it has and how many were enumerated.
    """
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
        raise TypeError(f"for ragged sequences pass an int seed, got {seed!r}.")
    run = {**dict(run or {}), "progress": progress}
    toks = encode(model, sequences)
    n = len(toks)
    p = max(2, 2 * math.ceil(est.num_masks / 2))
    draw = BlockDraw(p, allocation or ("neyman" if target_se is not None else "uniform"),
                     exact_length)
    keys = [(int(seed), i) for i in range(n)]
    if target_se is None:
        caps, rule = [p] * n, fixed_rule
    else:
        lengths = np.array([len(t) for t in toks], dtype=np.int64)
        caps = draw_caps(draw, p, lengths, [[i] for i in range(n)], max_masks,
                         default=MAX_TARGET_DRAWS)
        rule = target_rule([target_se * math.sqrt(n)] * n)
    out = run_rounds(draw, model, toks, [[i] for i in range(n)], keys, num_masks=p,
                     caps=caps, rule=rule, run=run,
                     what=f"the block bound ({est.name!r} inside each block)",
                     remedy="lower num_masks or max_masks")
    blocks = np.array([draw.blocks.get(i, (0, 0)) for i in range(n)], dtype=np.int64)
    exact_all = bool((blocks[:, 0] == blocks[:, 1]).all())
    stop = None if target_se is None else "exact" if exact_all else merge_stops(out.stop_reason)
    return rounds_estimate(
        est, out, target_se=target_se, stop_reason=stop,
        allocation=draw.allocation if target_se is not None else None, seed=int(seed),
        model=getattr(model, "name", None), num_blocks=torch.as_tensor(blocks[:, 0]),
        exact_blocks=torch.as_tensor(blocks[:, 1]))


def _block_log_probs(model: Any, toks: list[torch.Tensor], masks: list[torch.Tensor], *,
                     token_budget: int, batch_size: int | None, progress: bool, desc: str
                     ) -> tuple[list[np.ndarray], int]:
    """Each row's per-position block-causal log-probs
    (the model's ``block_position_log_probs``) and the forwards spent."""
    bar = progress_bar(None, enabled=progress, desc=desc, total=sum(int(m.shape[0])
                                                                     for m in masks))
    sink = _Forwards(bar)
    try:
        lp = model.block_position_log_probs(toks, masks, token_budget=int(token_budget),
                                            batch_size=batch_size, progress=sink)
    finally:
        bar.close()
    return [v.numpy() for v in lp], sink.calls


def block_pll(model: Any, toks: list[torch.Tensor], *, token_budget: int = 8192,
              batch_size: int | None = None, progress: bool = False
              ) -> tuple[list[np.ndarray], int]:
    """A block model's pseudo-log-likelihood terms, block-causal: ``log p(x_j | x_{b - j},
    x_<b)`` for every content token j of block b, the rest of its block and the earlier
    blocks visible, the later blocks not (the M = 1 term of each block's MPT sum times |b|).

    Row q of a sequence masks the q-th token of every block (each block's row is scored
    against its own block and the clean earlier ones), so a sequence costs ``max_b |b|``
    rows (B), not D: with the ``"xt_x0"`` layout one forward of length 2L scores every
    block of a row. Returns the per-token log-probs ``(D_i,)`` per sequence and the
    forwards spent.
    """
    masks = []
    for t, spans in zip(toks, model.block_spans(toks), strict=True):
        m = torch.zeros(max((e - a for a, e in spans), default=0), len(t), dtype=torch.bool)
        for a, e in spans:
            m[torch.arange(e - a), torch.arange(a, e)] = True
        masks.append(m)
    lp, calls = _block_log_probs(model, toks, masks, token_budget=token_budget,
                                 batch_size=batch_size, progress=progress, desc="PLL (blocks)")
    return [v.sum(0) for v in lp], calls


def block_curve(model: Any, toks: list[torch.Tensor], rates: np.ndarray, counts: np.ndarray,
                seed: int, *, token_budget: int = 8192, batch_size: int | None = None,
                progress: bool = False) -> dict[str, Any]:
    """A block model's MPT curve on a rate grid, the masks drawn inside each block.

    Rate r_k masks ``M_bk = max(1, round(r_k |b|))`` tokens of each block b (half-up, at
    most |b|: the ragged curve's rule, :func:`~mptlml.estimators.rates.mask_sizes`, per
    block), scored block-causally (its own block's other tokens and the clean earlier
    blocks visible, the later blocks not): ``S_hat_b(x; M_bk)``, the mean over the
    block's masks of ``(1/M) sum_{j in mask} log p(x_j | x_{b - mask}, x_<b)``. A block
    whose ``C(|b|, M_bk)`` masks of the size are no more than ``counts[k]`` is scored on
    each of them once (exact, standard error 0); the others on ``counts[k]`` uniform
    masks drawn i.i.d. (standard error ``s / sqrt(P)``; NaN, announced, at one mask).
    The sequence's point is the token-weighted mean of its blocks' curves,

        S_ik = (1 / D_i) sum_b |b| S_hat_b(x; M_bk),

    so that ``D_i mean_k S_ik = sum_b |b| mean_k S_hat_b(x; M_bk)``, the Riemann estimate of
    the block bound ``sum_b sum_{M=1..|b|} S_b(x; M)``. Row q of a rate masks every block
    with its own q-th mask: a rate costs ``max_b`` (masks of block b) rows per sequence,
    each one forward with the ``"xt_x0"`` layout. The masks of sequence i come from a
    generator seeded by ``(seed, i)``.

    Returns a dict with ``scores``, ``scores_stderr``, ``sizes`` (``sum_b M_bk``, a row's
    masked tokens), ``lml``, ``lml_stderr``, ``rows`` (per sequence), ``calls``,
    ``num_blocks`` and ``exact`` (per sequence, the (block, rate) cells enumerated).
    """
    n, k = len(toks), len(rates)
    spans = model.block_spans(toks)
    masks, plans = [], []
    for i, (t, sp) in enumerate(zip(toks, spans, strict=True)):
        g = torch.Generator().manual_seed(spawn(int(seed), i, 0))
        parts, plan = [], []
        rows0 = 0
        for r, p in zip(rates.tolist(), counts.tolist(), strict=True):
            cells = []
            for a, e in sp:
                kb = e - a
                m = int(min(max(math.floor(r * kb + 0.5), 1), kb))
                mm = (all_masks(kb, m) if math.comb(kb, m) <= p
                      else torch.rand(int(p), kb, generator=g).argsort(1) < m)
                cells.append((a, e, m, mm))
            rows = max(c[3].shape[0] for c in cells)
            block = torch.zeros(rows, len(t), dtype=torch.bool)
            for a, e, _, mm in cells:
                block[: mm.shape[0], a:e] = mm
            parts.append(block)
            plan.append((rows0, cells))
            rows0 += rows
        masks.append(torch.cat(parts))
        plans.append(plan)
    lp, calls = _block_log_probs(model, toks, masks, token_budget=token_budget,
                                 batch_size=batch_size, progress=progress,
                                 desc="MPT curve (blocks)")
    lengths = np.array([len(t) for t in toks], dtype=np.float64)
    scores, var, sizes = np.zeros((n, k)), np.zeros((n, k)), np.zeros((n, k), dtype=np.int64)
    exact = np.zeros(n, dtype=np.int64)
    for i in range(n):
        for j, (rows0, cells) in enumerate(plans[i]):
            for a, e, m, mm in cells:
                s = lp[i][rows0:rows0 + mm.shape[0], a:e].sum(1) / m  # S_hat per mask
                kb = e - a
                mean, se = mean_stderr(s)
                scores[i, j] += kb * mean
                sizes[i, j] += m
                if mm.shape[0] == math.comb(kb, m):
                    exact[i] += 1
                else:
                    var[i, j] += kb ** 2 * se ** 2
    scores /= lengths[:, None]
    scores_se = np.sqrt(var) / lengths[:, None]
    lml = lengths * scores.mean(1)
    lml_se = lengths / k * np.sqrt((scores_se ** 2).sum(1))
    return {"scores": scores, "scores_stderr": scores_se, "sizes": sizes, "lml": lml,
            "lml_stderr": lml_se, "rows": np.array([int(m.shape[0]) for m in masks]),
            "calls": calls, "num_blocks": np.array([len(sp) for sp in spans]),
            "exact": exact, "lengths": lengths.astype(np.int64)}
