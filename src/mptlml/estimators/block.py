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

from ..masks import every_mask
from ..models.sequence_input import encode
from .results import LMLEstimate, announce_estimate, as_float64
from .sequential import (
    MAX_TARGET_DRAWS,
    NUM_RATE_BINS,
    RateDensity,
    RoundDraw,
    density_of,
    fixed_rule,
    round_seed,
    run_rounds,
    stratified_rates,
    stratum_cells,
    target_rule,
)
from .stats import enumerated_sum, mean_stderr, welch_dof

__all__ = ["BlockDraw", "antithetic_pairs", "block_estimate", "block_model", "refuse_block_model"]


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
    """A progress sink that counts the forward passes and the inputs they scored."""

    def __init__(self) -> None:
        self.calls, self.inputs = 0, 0

    def update(self, n: int) -> None:
        self.calls += 1
        self.inputs += int(n)


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
        cap = MAX_TARGET_DRAWS if max_masks is None else draw.draws_within(0, int(max_masks))
        if cap < p:
            raise ValueError(f"max_masks={max_masks} (masked rows per sequence) is below the "
                             f"first round's {p + 1}: raise it, or lower num_masks.")
        caps, rule = [cap] * n, target_rule([target_se * math.sqrt(n)] * n)
    out = run_rounds(draw, model, toks, [[i] for i in range(n)], keys, num_masks=p,
                     max_masks=caps, rule=rule, run=run,
                     what=f"the block bound ({est.name!r} inside each block)",
                     remedy="lower num_masks or max_masks")
    stats = [t.stats() for t in out.tallies]
    lml = np.array([e for e, _, _ in stats])
    se_i = np.array([s for _, s, _ in stats])
    dofs = np.array([d for _, _, d in stats])
    rows = np.array([t.rows for t in out.tallies], dtype=np.int64)
    drawn = se_i > 0
    blocks = np.array([draw.blocks.get(i, (0, 0)) for i in range(n)], dtype=np.int64)
    exact_all = bool((blocks[:, 0] == blocks[:, 1]).all())
    stop = None if target_se is None else (
        "exact" if exact_all else "budget" if "budget" in out.stop_reason else "target")
    return announce_estimate(LMLEstimate(
        estimator=est.name, per_sample=as_float64(lml), per_sample_stderr=as_float64(se_i),
        mean=float(lml.mean()), stderr=float(np.sqrt(np.sum(se_i ** 2))) / n,
        stderr_data=float(mean_stderr(lml)[1]), sizes=None, size_scores=None,
        num_masks=int(max(out.drawn)), num_model_calls=out.num_model_calls,
        num_masked_rows=int(rows.sum()), num_masked_rows_per_sample=torch.as_tensor(rows),
        stderr_dof=welch_dof(torch.from_numpy(se_i[drawn] ** 2), torch.from_numpy(dofs[drawn]))
        if drawn.any() else math.inf, target_se=target_se, stop_reason=stop,
        allocation=draw.allocation if target_se is not None else None, seed=int(seed),
        model=getattr(model, "name", None), num_blocks=torch.as_tensor(blocks[:, 0]),
        exact_blocks=torch.as_tensor(blocks[:, 1])))
