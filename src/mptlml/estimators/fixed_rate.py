"""The fixed-rate estimator: D * S_hat(x; M) at one mask size, BERT's practice (biased).

With M = max(1, floor(rate * D)) (15% of D = 512 gives M = 76, as the paper's
code floors), ``D * S_hat(x; M)`` estimates ``D * S(x; M)``, which differs from
log p(x) = sum_{M'} S(x; M') by a bias that does not depend on the masks
(Moreno-Munoz, Recasens & Hauberg, NeurIPS 2023, Sec. 3 and Fig. 2; the
paper's training code uses exactly this objective). On ragged sequences each
sequence gets ``M_i = max(1, floor(rate * D_i))``, and its P masks are distinct: a
simple random sample without replacement from the C(D_i, M_i) masks of that size, whose
mean has variance ``(1 - P / C(D_i, M_i)) s^2 / P`` (the finite-population correction);
where C(D_i, M_i) is no more than P, or than ``2^EXACT_LENGTH - 1`` = 15 (a few: the
rule that enumerates short sequences, :data:`~mptlml.estimators.runs.EXACT_LENGTH`), every
mask of the size is scored once instead (its term exact, standard error 0): from a
population of 3 masks, 2 draws give a t-statistic far from Student's (their spread
says little of the third). Drawn with replacement, the two masks of a 2-token continuation at
P = 2 were the same one in half the sequences: a standard error of 0 for an estimate
that was not D * S(x; M).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .._scoring.dense import Counter
from .._scoring.ragged import run_pairs
from .._validation import check_positive_int, check_rate, check_size
from ..masks import all_masks, distinct_masks, fixed_rate_size
from ..models.base import MaskedModel
from ..models.protocols import RaggedMaskedModel
from .api import register
from .base import Draws, Estimator
from .runs import EXACT_LENGTH
from .stats import exact_cell, sampled_cell

__all__ = ["FixedRate"]


@register
class FixedRate(Estimator):
    """``D * S_hat(x; M)`` at M = ``mask_size`` or ``max(1, floor(rate * D))``. Biased.

    Parameters
    ----------
    num_masks : int
        P masks per datum.
    rate : float in (0, 1), optional
        The masking rate (0.15 for BERT, 0.2 in the paper's Fig. 2).
    mask_size : int, optional
        M directly, instead of ``rate`` (dense data; a sequence of its own D_i
        takes ``rate``).
    share_masks : bool
        One mask per draw shared by every datum (dense data).

    Examples
    --------
    >>> import mptlml
    >>> from mptlml.models import PPCA
    >>> model = PPCA.random(10, 2, sigma2=0.2, seed=0)
    >>> est = mptlml.estimate_lml(model, model.sample(50, generator=0), "fixed-rate",
    ...                           rate=0.2, num_masks=4, seed=0)
    >>> est.rate, est.sizes
    (0.2, [2])
    """

    name = "fixed-rate"
    summary = "D * S_hat(x; M) at one size M; biased"
    unbiased = False
    ragged = True
    trainable = True
    per_sequence_sizes = True
    dense_only = ("share_masks", "mask_size")

    def __init__(self, num_masks: int = 1, *, rate: float | None = None,
                 mask_size: int | None = None, share_masks: bool = False) -> None:
        super().__init__(num_masks, share_masks=share_masks)
        if mask_size is not None and rate is not None:
            raise ValueError("give either rate or mask_size for 'fixed-rate', not both.")
        if mask_size is None and rate is None:
            raise ValueError("estimator='fixed-rate' needs rate= (BERT's practice: 0.15) or "
                             "mask_size=.")
        self.rate = None if rate is None else check_rate(rate)
        self.mask_size = None if mask_size is None else check_positive_int(mask_size,
                                                                           "mask_size")

    def size(self, num_tokens: int) -> int:
        """M for D = ``num_tokens``: ``mask_size`` (checked <= D) or max(1, floor(rate D))."""
        if self.mask_size is not None:
            return check_size(self.mask_size, num_tokens, "mask_size")
        assert self.rate is not None
        return fixed_rate_size(self.rate, num_tokens)

    def check_num_tokens(self, num_tokens: int) -> None:
        self.size(num_tokens)

    def recorded_rate(self, num_tokens: int) -> float | None:
        return self.rate if self.rate is not None else self.size(num_tokens) / num_tokens

    def sizes(self, num_tokens: int | torch.Tensor, *, num_data: int | None = None,
              generator: torch.Generator | None = None) -> torch.Tensor:
        if isinstance(num_tokens, torch.Tensor):  # one size per sequence
            d = self.sequence_lengths(num_tokens)
            if self.rate is None:
                raise ValueError("per-sequence sizes of 'fixed-rate' need rate= (each "
                                 "sequence has its own D_i), not mask_size=.")
            return torch.tensor([fixed_rate_size(self.rate, int(n)) if int(n) > 0 else 0
                                 for n in d.tolist()], dtype=torch.long)
        d = check_positive_int(num_tokens, "num_tokens")
        return torch.full((self.num_masks,), self.size(d), dtype=torch.long)

    def weights(self, sizes: torch.Tensor, num_tokens: int | torch.Tensor) -> torch.Tensor:
        if isinstance(num_tokens, torch.Tensor):
            return torch.where(sizes > 0, num_tokens.flatten().double(), 0.0)
        return torch.full(sizes.shape, float(num_tokens), dtype=torch.float64)

    def evaluate(self, model: MaskedModel, x: torch.Tensor, generator: torch.Generator,
                 counter: Counter, progress: bool) -> Draws:
        rows, s = self._score_rows(model, x, generator, progress, counter)
        return Draws(self._combine(rows, s, model.num_tokens), [int(rows[0])], s.mean().reshape(1))

    def ragged_cells(self, model: RaggedMaskedModel, toks: list[torch.Tensor],
                     counts: Sequence[np.ndarray], seed: int, *, tag: str,
                     units: list[torch.Tensor] | None = None,
                     **run: Any) -> tuple[list[list[np.ndarray]], int]:
        """``counts[i][0]`` distinct masks of size M_i of sequence i, each term
        ``D_i * S_hat(x_i; M_i)``: a :class:`~mptlml.estimators.stats.SampledCell` of the
        C(D_i, M_i) masks, or every mask of the size once (an exact cell) where the draws
        would be as many (module docstring)."""
        draws = [int(c[0]) for c in counts]

        def masks(i: int, d: int, g: torch.Generator) -> torch.Tensor:
            m = self.size(d)
            if self._enumerates(d, draws[i]):
                return all_masks(d, m)
            return distinct_masks(d, m, draws[i], g)

        total = sum(self.scored_rows(len(t), np.array([p])) for t, p in zip(toks, draws,
                                                                         strict=True))
        out = run_pairs(model, toks, masks, seed=seed, tag=tag, units=units,
                        spec={"kind": "draws", "estimator": self.fingerprint(),
                              "num_masks": draws[0] if len(set(draws)) == 1 else draws,
                              "total_pairs": total}, desc=f"{self.name} draws", **run)
        cells = []
        for s, d, p in zip(out.sums, out.lengths, draws, strict=True):
            m = self.size(int(d))
            terms = int(d) * np.asarray(s, dtype=np.float64) / m
            n = math.comb(int(d), m)
            cells.append([exact_cell(terms) if self._enumerates(int(d), p)
                          else sampled_cell(terms, n)])
        return cells, out.num_model_calls

    def scored_rows(self, num_tokens: int, counts: np.ndarray) -> int:
        """Masked inputs of a sequence: its draws, or the C(D, M) masks of its size where
        they are no more (every one scored once)."""
        d = int(num_tokens)
        p = int(np.max(counts))
        return math.comb(d, self.size(d)) if self._enumerates(d, p) else p

    def _enumerates(self, num_tokens: int, draws: int) -> bool:
        """Whether the C(D, M) masks of a sequence's size are scored, each once, instead of
        ``draws``: where they are no more than the draws or than 2^EXACT_LENGTH - 1."""
        n = math.comb(num_tokens, self.size(num_tokens))
        return n <= max(draws, 2 ** EXACT_LENGTH - 1)
