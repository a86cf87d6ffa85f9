"""The chain-rule estimator: log p(x) along random orders of the tokens.

    log q_pi(x) = sum_{t=1..D} log q(x_pi(t) | x_pi(t+1..D))

Step t of order pi hides the first t positions of pi and scores pi(t) given
the remaining D - t. For a uniformly random pi the t-th term scores a uniform
mask of size t, so ``E_pi[log q_pi(x)] = sum_M S(x; M)`` for any conditionals
q (Moreno-Munoz, Recasens & Hauberg, NeurIPS 2023, Proposition 1 and its
proof). For a consistent model every single order is exact (zero variance),
which makes it a strong check of a model's conditionals; for a masked LM it is
the any-order autoregressive bound (``docs/notes.md``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..estimation.engine import Counter, score_chain_rule
from ..estimation.runner import check_run_size, run_pairs
from ..estimation.stats import mean_stderr
from ..estimation.words import targeted
from ..masks import prefix_masks, random_orders
from ..models.base import MaskedModel
from ..models.protocols import RaggedMaskedModel
from ..models.sequence_input import encode
from .base import Draws, Estimator, RaggedScores, register

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
    >>> abs(est.mean - est.exact) < 1e-8
    True
    """

    name = "chain-rule"
    summary = ("sum_t log p(x_pi(t) | x_pi(t+1..D)) for random orders pi; "
               "unbiased for sum_M S(x; M)")
    ragged = True

    def masks_per_draw(self, num_tokens: int) -> int:
        """One mask of every size 1..D (cumulative) or one per step of an order (chain rule)."""
        return int(num_tokens)

    def evaluate(self, model: MaskedModel, x: torch.Tensor, generator: torch.Generator,
                 counter: Counter, progress: bool) -> Draws:
        d = x.shape[1]
        samples = score_chain_rule(model, x, self.num_masks, self.share_masks, generator,
                                   counter, progress)
        return Draws(samples, list(range(1, d + 1)),
                     torch.full((d,), float("nan"), dtype=torch.float64))

    def score_sequences(self, model: RaggedMaskedModel, sequences: Any, seed: int,
                        progress: bool, run: dict[str, Any]) -> RaggedScores:
        """P random orders of each sequence's D_i tokens, one scored position per step."""
        p = self.num_masks
        toks = encode(model, sequences)
        scorer = targeted(model, "the 'chain-rule' estimator on ragged sequences")

        def order_codes(i: int, d: int, g: torch.Generator) -> torch.Tensor:
            orders = random_orders(d, p, generator=g)  # (P, D)
            codes = prefix_masks(orders).to(torch.int8)  # [q, t, j]: j among the first t + 1
            codes.view(p * d, d)[torch.arange(p * d), orders.reshape(-1)] = 2  # score pi(t)
            return codes.reshape(p * d, d)

        lengths = [len(t) for t in toks]
        check_run_size([d * p for d in lengths], lengths, "the chain rule")
        pairs = int(sum(lengths) * p)  # one (sequence, prefix mask) pair per scored position
        out = run_pairs(scorer, toks, order_codes, seed=seed, tag="chain_rule",
                        spec={"kind": "chain-rule", "num_masks": p, "total_pairs": pairs},
                        desc="chain rule", progress=progress, **run)
        stats = [mean_stderr(s.reshape(p, d).sum(axis=1))
                 for s, d in zip(out.sums, lengths, strict=True)]
        return RaggedScores(np.array([float(m) for m, _ in stats]),
                            np.array([float(e) for _, e in stats]), out.num_model_calls, pairs,
                            np.array(lengths, dtype=np.int64) * p)
