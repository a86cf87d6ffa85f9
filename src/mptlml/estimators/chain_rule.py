"""The chain-rule estimator: log p(x) along random orders of the tokens.

    log q_pi(x) = sum_{t=1..D} log q(x_pi(t) | x_pi(t+1..D))

Step t of order pi hides the first t positions of pi and scores pi(t) given
the remaining D - t. For a uniformly random pi the t-th term scores a uniform
mask of size t, so ``E_pi[log q_pi(x)] = sum_M S(x; M)`` for any conditionals
q (Moreno-Munoz, Recasens & Hauberg, NeurIPS 2023, Proposition 1 and its
proof). For a consistent model every single order is exact (zero variance),
which makes it a strong check of a model's conditionals; for a masked LM it is
the any-order autoregressive bound (``docs/notes.md``).

On ragged sequences the P orders of a sequence of D tokens are distinct: a
uniformly random sample without replacement from the D! orders (an order that
repeats an earlier one is drawn again). The estimate is their mean, unbiased,
and its variance ``(1 - P / D!) s^2 / P`` (s^2 the sample variance of the P
order sums; the finite-population correction, :class:`~mptlml.estimators.stats.SampledCell`),
on P - 1 degrees of freedom. Drawn with replacement, two equal orders (1 in 120
sequences of 5 tokens at P = 2) gave a standard error of 0 and infinite degrees
of freedom: a promise of exactness for an estimate that is not exact.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .._scoring.dense import Counter, blocks, rows_per_block
from .._scoring.ragged import run_pairs, targeted
from ..masks import prefix_masks, random_orders
from ..models.base import MaskedModel
from ..models.protocols import RaggedMaskedModel
from .api import register
from .base import Draws, Estimator
from .stats import sampled_cell

__all__ = ["ChainRule"]


@register
class ChainRule(Estimator):
    """``sum_t log p(x_pi(t) | x_pi(t+1..D))`` over P random orders pi; exact in expectation.

    Parameters
    ----------
    num_masks : int
        P random orders per datum (sequence).
    share_masks : bool
        One order per draw shared by every datum (dense data).

    Examples
    --------
    >>> import mptlml
    >>> from mptlml.models import PPCA
    >>> model = PPCA.random(6, 2, sigma2=0.2, seed=0)
    >>> est = mptlml.estimate_lml(model, model.sample(10, generator=0), "chain-rule",
    ...                           num_masks=2, seed=0)
    >>> abs(est.mean - est.exact_lml) < 1e-8
    True
    """

    name = "chain-rule"
    summary = ("sum_t log p(x_pi(t) | x_pi(t+1..D)) for random orders pi; "
               "unbiased for sum_M S(x; M)")
    ragged = True

    def masks_per_draw(self, num_tokens: int) -> int:
        """One masked input per step of an order: D."""
        return int(num_tokens)

    def evaluate(self, model: MaskedModel, x: torch.Tensor, generator: torch.Generator,
                 counter: Counter, progress: bool) -> Draws:
        d = model.num_tokens
        (samples,) = self.stratum_draws(model, x, [self.num_masks], generator, counter, progress)
        return Draws(samples, list(range(1, d + 1)),
                     torch.full((d,), float("nan"), dtype=torch.float64))

    def stratum_draws(self, model: MaskedModel, x: torch.Tensor, counts: Sequence[int],
                      generator: torch.Generator, counter: Counter,
                      progress: bool) -> list[torch.Tensor]:
        """sum_t log p(x_pi(t) | x_pi(t+1..D)) for ``counts[0]`` random orders: ``[(P, N)]``.

        Step t masks the first t positions of the order and scores position
        pi(t) given the remaining D - t.
        """
        (p,) = counts
        n, d = x.shape[0], model.num_tokens
        share = self.share_masks
        orders = random_orders(d, p, num_data=None if share else n, generator=generator)
        if share:
            orders = orders[:, None, :].expand(p, n, d)
        rank = orders.argsort(-1)  # rank[p, n, j]: step at which j is scored
        total = torch.zeros(p, n, dtype=torch.float64, device=x.device)
        steps = torch.arange(d)
        per = max(1, rows_per_block(n, d) // p)
        for s, e in blocks(d, per, progress, "chain rule"):
            t = steps[s:e]  # (T,)
            mask = rank[None] <= t[:, None, None, None]  # (T, P, N, D)
            target = orders[..., s:e].permute(2, 0, 1)  # (T, P, N): position scored at step t
            lc = model._log_conditionals(x, mask.reshape(-1, n, d).to(x.device), generator)
            lc = lc.reshape(e - s, p, n, d).gather(-1, target[..., None].to(x.device))[..., 0]
            total += lc.double().sum(0)
            counter.calls += 1
            counter.rows += (e - s) * p * n
        return [total]

    def ragged_cells(self, model: RaggedMaskedModel, toks: list[torch.Tensor],
                     counts: Sequence[np.ndarray], seed: int, *, tag: str,
                     units: list[torch.Tensor] | None = None,
                     **run: Any) -> tuple[list[list[np.ndarray]], int]:
        """``counts[i][0]`` distinct random orders of each sequence's D_i tokens, one position
        per step: each sequence's cell is a :class:`~mptlml.estimators.stats.SampledCell` of
        its order sums (without replacement from the D_i! orders; with replacement where more
        orders are asked than exist)."""
        if units is not None:
            raise ValueError("the 'chain-rule' estimator orders tokens, not words.")
        draws = [int(c[0]) for c in counts]
        scorer = targeted(model, "the 'chain-rule' estimator on ragged sequences")

        def order_codes(i: int, d: int, g: torch.Generator) -> torch.Tensor:
            p = draws[i]
            orders = distinct_orders(d, p, g)  # (P, D)
            codes = prefix_masks(orders).to(torch.int8)  # [q, t, j]: j among the first t + 1
            codes.view(p * d, d)[torch.arange(p * d), orders.reshape(-1)] = 2  # score pi(t)
            return codes.reshape(p * d, d)

        lengths = [len(t) for t in toks]
        pairs = int(sum(d * p for d, p in zip(lengths, draws, strict=True)))
        out = run_pairs(scorer, toks, order_codes, seed=seed, tag=tag,
                        spec={"kind": "chain-rule",
                              "num_masks": draws[0] if len(set(draws)) == 1 else draws,
                              "total_pairs": pairs},
                        desc="chain rule", **run)
        cells = []
        for s, d, p in zip(out.sums, lengths, draws, strict=True):
            total = s.reshape(p, d).sum(axis=1)
            n = _orders(d)
            cells.append([sampled_cell(total, n) if p <= n else total])
        return cells, out.num_model_calls


def distinct_orders(num_tokens: int, num_orders: int, generator: torch.Generator
                    ) -> torch.Tensor:
    """``num_orders`` uniformly random orders of ``range(num_tokens)``, distinct where the
    D! orders are enough: a sample without replacement (an order that repeats an earlier
    one is drawn again from ``generator``; orders that repeat none are those of
    :func:`~mptlml.masks.random_orders`)."""
    orders = random_orders(num_tokens, num_orders, generator=generator)
    if num_orders > _orders(num_tokens):
        return orders
    seen: set[bytes] = set()
    for k in range(num_orders):
        key = orders[k].numpy().tobytes()
        while key in seen:
            orders[k] = torch.rand(num_tokens, generator=generator,
                                   dtype=torch.float64).argsort()
            key = orders[k].numpy().tobytes()
        seen.add(key)
    return orders


def _orders(num_tokens: int) -> float:
    """D!, the number of orders of D tokens (inf past what a float holds: D > 170)."""
    return float(math.factorial(num_tokens)) if num_tokens <= 170 else math.inf
