"""The learned-rate estimator: the rate draw of the sequential engine, as an estimator.

Proposition 1 of Moreno-Munoz, Recasens & Hauberg (NeurIPS 2023), with the last term
apart::

    log p(x) = sum_{M=1..D} S(x; M) = S(x; D) + E_{M ~ q}[ S_hat(x; M) / q(M) ]   (M < D),

S(x; D) scored once, exactly (the whole sequence masked: one mask), the other sizes drawn
by importance sampling over a rate density q on (0, 1): a rate r gives M = ceil(r (D-1)),
so q(M) is the q-mass of ((M-1)/(D-1), M/(D-1)]. P draws are stratified (two per stratum
of equal q-mass: a standard error on P/2 degrees of freedom); at a target standard error
the rounds of :func:`~mptlml.estimators.sequential.run_rounds` learn q as they go, in
proportion to the spread of a mask's score by rate bin (Neyman), pooled over the call.
A sequence whose 2^D - 2 other masks are no more than ``max(P, 2^EXACT_LENGTH - 2)`` is
scored on every mask (exact). The draw of :func:`mptlml.compare` (its default): one target
standard error on one continuation costs the same through ``estimate_lml(...,
"learned-rate", context=, target_se=)`` and ``compare(..., target_se=)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..models.protocols import RaggedMaskedModel
from .api import register
from .base import Estimator, RaggedScores
from .runs import EXACT_LENGTH
from .sequential import RateDraw, fixed_rule, run_rounds
from .stats import welch_dof

__all__ = ["LearnedRate"]


@register
class LearnedRate(Estimator):
    """``S(x; D) + S_hat(x; M) / q(M)``, stratified rates r ~ q, q learned over rounds.

    Unbiased; ragged sequences only (a masked LM, with or without a context).

    Parameters
    ----------
    num_masks : int
        P, stratified draws (even: two per stratum) besides the whole-sequence mask; at a
        target standard error, the first round's.

    Examples
    --------
    >>> import mptlml
    >>> from mptlml.estimators import LearnedRate
    >>> LearnedRate(16).name
    'learned-rate'
    """

    name = "learned-rate"
    summary = "S(x; D) + S_hat(x; M) / q(M), stratified rates r ~ q learned; unbiased"
    dense = False
    ragged = True
    rate_draw = True

    def __init__(self, num_masks: int = 16) -> None:
        super().__init__(num_masks)
        if self.num_masks % 2:
            raise ValueError(f"num_masks must be even for 'learned-rate' (two draws per rate "
                             f"stratum), got {num_masks}.")

    def enumerates_sequence(self, num_tokens: int) -> bool:
        return RateDraw(self.num_masks, exact_length=EXACT_LENGTH).enumerates(int(num_tokens))

    def scored_rows(self, num_tokens: int, counts: np.ndarray) -> int:
        return int(np.max(counts)) + 1

    def score_sequences(self, model: RaggedMaskedModel, toks: list[torch.Tensor], seed: int,
                        progress: bool, run: dict[str, Any]) -> RaggedScores:
        """One round of P stratified draws per sequence (uniform q), and the whole mask."""
        n = len(toks)
        out = run_rounds(RateDraw(self.num_masks, "uniform", EXACT_LENGTH), model, toks,
                         [[i] for i in range(n)], [(seed, i) for i in range(n)],
                         num_masks=self.num_masks, max_masks=[self.num_masks] * n,
                         rule=fixed_rule, run={**run, "progress": progress})
        stats = [t.stats() for t in out.tallies]
        se = np.array([s for _, s, _ in stats])
        dof = np.array([d for _, _, d in stats])
        rows = np.array([t.rows for t in out.tallies], dtype=np.int64)
        return RaggedScores(np.array([e for e, _, _ in stats]), se, out.num_model_calls,
                            int(rows.sum()), rows,
                            welch_dof(torch.from_numpy(se ** 2), torch.from_numpy(dof))
                            if n else None)

    def sequence_cells(self, model: RaggedMaskedModel, toks: list[torch.Tensor],
                       counts: Sequence[np.ndarray], seed: int,
                       **run: Any) -> tuple[list[list[np.ndarray]], int]:
        raise NotImplementedError("'learned-rate' draws in rounds (score_sequences, or the "
                                  "sequential engine's RateDraw).")
