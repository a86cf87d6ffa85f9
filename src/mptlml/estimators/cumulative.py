"""The cumulative estimator: sum over every size M of a Monte Carlo average of S_hat(x; M).

Proposition 1 of Moreno-Munoz, Recasens & Hauberg (NeurIPS 2023)::

    log p(x) = sum_{M=1..D} S(x; M),
    S(x; M)  = E_{|mask| = M} [ (1/M) sum_{j in mask} log p(x_j | x_R) ].

Draw p holds one uniform mask of every size, and its estimate is
``sum_{M=1..D} S_hat_p(x; M)``: unbiased (the paper's "cumulative MPT loss").
``nested=True`` takes the D masks of a draw as the prefixes of one random
order (still unbiased per size, dependent across sizes, cheaper per mask).
On ragged sequences each sequence sums its own sizes 1..D_i.

Its strata are the mask sizes: independent terms, each with its own spread
(small at low masking rates, large at high ones). The standard error pools
them (:func:`mptlml.estimators.stats.strata_stderr`), and a target standard
error allocates masks over them as its rounds go
(:mod:`mptlml.estimators.sequential`): per size, on dense data and on ragged
sequences (there each sequence's spreads shrunk toward the call's of the same size).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .._scoring.dense import Counter, score_grid, score_masks, score_nested
from .._scoring.ragged import run_pairs
from ..masks import all_masks, sample_masks
from ..models.base import MaskedModel
from ..models.protocols import RaggedMaskedModel
from .api import register
from .base import Draws, Estimator
from .stats import ExactCell, cell_sums, exact_cell, pooled_size_error

__all__ = ["Cumulative", "enumerated_sizes"]


@register
class Cumulative(Estimator):
    """``sum_{M=1..D} (1/P) sum_p S_hat_p(x; M)``, P uniform masks per size. Unbiased.

    Parameters
    ----------
    num_masks : int
        P masks per size (and datum).
    share_masks : bool
        One mask per (size, draw) shared by every datum (dense data).
    nested : bool
        The masks of a draw are the prefixes of one random order (dense data).

    Examples
    --------
    >>> import mptlml
    >>> from mptlml.models import PPCA
    >>> model = PPCA.random(6, 2, sigma2=0.2, seed=0)
    >>> x = model.sample(30, generator=0)
    >>> est = mptlml.estimate_lml(model, x, "cumulative", num_masks=8, seed=0)
    >>> abs(est.mean - est.exact_lml) < 5 * est.stderr + 1e-9
    True
    """

    name = "cumulative"
    summary = "sum_M S_hat(x; M), P uniform masks per size; unbiased"
    ragged = True
    trainable = True
    dense_only = ("share_masks", "nested")
    ragged_tag = "exact"

    def __init__(self, num_masks: int = 1, *, share_masks: bool = False,
                 nested: bool = False) -> None:
        super().__init__(num_masks, share_masks=share_masks)
        if not isinstance(nested, bool):
            raise TypeError(f"nested must be True or False, got {nested!r}.")
        self.nested = nested

    def sizes(self, num_tokens: int | torch.Tensor, *, num_data: int | None = None,
              generator: torch.Generator | None = None) -> torch.Tensor:
        if isinstance(num_tokens, torch.Tensor):
            raise ValueError("the cumulative estimator draws every size of each sequence; per-"
                             "sequence sizes are drawn by 'random-size' or 'fixed-rate'.")
        if self.nested:
            raise ValueError("nested masks are scored as prefixes of random orders; they have "
                             "no independent size rule (use nested=False to train).")
        return torch.arange(1, int(num_tokens) + 1).repeat_interleave(self.num_masks)

    def weights(self, sizes: torch.Tensor, num_tokens: int | torch.Tensor) -> torch.Tensor:
        return torch.ones(sizes.shape, dtype=torch.float64)

    def masks_per_draw(self, num_tokens: int) -> int:
        """One mask of every size 1..D."""
        return int(num_tokens)

    # ---------------------------------------------------------------- dense data
    def evaluate(self, model: MaskedModel, x: torch.Tensor, generator: torch.Generator,
                 counter: Counter, progress: bool) -> Draws:
        """Every size's P masks, kept by size (the strata of the standard error), or nested orders.

        The masks of different sizes are independent, so the variance of a
        draw is the sum of the sizes' variances, each estimated from its P
        masks (and pooled over the data): see
        :func:`mptlml.estimators.stats.strata_stderr`. Nested masks are
        dependent across sizes, so their draws are one stratum. Shared masks
        go through the model's grid reduction (a whole grid of sizes per call,
        2-5x faster for a linear-Gaussian model at D = 512); their SE rests on
        the P draws of the data mean, and the estimate warns below 5 degrees
        of freedom.
        """
        d, p = model.num_tokens, self.num_masks
        sizes = list(range(1, d + 1))
        if self.nested:
            s = score_nested(model, x, p, share_masks=self.share_masks, generator=generator,
                             progress=progress, counter=counter)  # (P, D, N)
            return Draws(s.sum(1), sizes, s.mean((0, 2)))
        if self.share_masks:
            # shared masks: a whole grid of sizes per model call (the model's fast reduction,
            # e.g. one quadratic form per draw); the SE then rests on the P draws of the data
            # mean (P - 1 degrees of freedom), and the estimate warns when they are too few
            samples, size_sums = score_grid(model, x, sizes, p, share_masks=True,
                                            generator=generator, progress=progress,
                                            counter=counter)
            assert size_sums is not None
            return Draws(samples, sizes, size_sums / p)
        return super().evaluate(model, x, generator, counter, progress)

    def strata(self, num_tokens: int) -> list[int] | None:
        """The sizes 1..D: one independent term of a draw each (nested masks: one stratum)."""
        return None if self.nested else list(range(1, int(num_tokens) + 1))

    def stratum_draws(self, model: MaskedModel, x: torch.Tensor, counts: Sequence[int],
                      generator: torch.Generator, counter: Counter,
                      progress: bool, sizes: Sequence[int] | None = None) -> list[torch.Tensor]:
        """S_hat(x_n; M) of ``counts[h]`` fresh masks of each size M = ``sizes[h]``: ``(P_h, N)``.

        ``sizes`` defaults to every size 1..D (the strata of the estimate);
        the MPT curve asks for a subset.
        """
        size_t = torch.as_tensor(list(range(1, model.num_tokens + 1)) if sizes is None else sizes,
                                 dtype=torch.long)
        c = torch.as_tensor(list(counts), dtype=torch.long)
        s = score_masks(model, x, size_t.repeat_interleave(c), share_masks=self.share_masks,
                        generator=generator, progress=progress, counter=counter)
        return list(s.split(c.tolist()))

    def check_targetable(self) -> None:
        """Nested masks are dependent across sizes: their counts cannot be allocated per size."""
        if self.nested:
            raise ValueError("target_se needs independent masks per size (nested=False).")
        super().check_targetable()

    # ---------------------------------------------------------------- ragged sequences
    def ragged_strata(self, lengths: np.ndarray) -> tuple[list[np.ndarray], int]:
        """Rows of a draw: the sizes 1..D_i, each its own stratum (size M is stratum M - 1;
        a sequence's spreads shrunk toward the call's of the same size). Sizes of one rate
        bin differ several-fold in spread: Neyman's counts by size spend 1.84x fewer masked
        inputs than uniform at equal SE on a score table of AntiBERTy's germlines, 1.66x by
        the ten rate bins."""
        return ([np.arange(int(d), dtype=np.int64) for d in lengths],
                max([int(d) for d in lengths] + [1]))

    def ragged_cells(self, model: RaggedMaskedModel, toks: list[torch.Tensor],
                     counts: Sequence[np.ndarray], seed: int, *, tag: str,
                     units: list[torch.Tensor] | None = None,
                     **run: Any) -> tuple[list[list[np.ndarray]], int]:
        """S_hat(x_i; M) of ``counts[i][M-1]`` uniform masks of each size M = 1..D_i of sequence i.

        Returns, per sequence, the list over M of the per-mask scores
        ``(1/M) sum_{j in mask} log p(x_j | x_R)``, and the model calls. With
        ``units`` (the word of each token) the units are words: M words masked.
        """
        counts = [np.asarray(c, dtype=np.int64) for c in counts]
        uniform = len({int(v) for c in counts for v in np.unique(c)}) <= 1
        # a size whose distinct masks are no more than its draws is enumerated (exact)
        whole = [enumerated_sizes(len(c), c) for c in counts]

        def all_sizes(i: int, d: int, g: torch.Generator) -> torch.Tensor:
            drawn = torch.as_tensor(np.where(whole[i], 0, counts[i]))
            parts = [all_masks(d, m) if whole[i][m - 1] else
                     torch.zeros(0, d, dtype=torch.bool) for m in range(1, d + 1)]
            rand = sample_masks(d, torch.arange(1, d + 1).repeat_interleave(drawn), generator=g) \
                if int(drawn.sum()) else torch.zeros(0, d, dtype=torch.bool)
            # row order: by size, each size's enumerated masks or its draws
            split = list(rand.split(drawn.tolist()))
            return torch.cat([parts[m] if whole[i][m] else split[m] for m in range(d)])

        unit = {} if units is None else {"unit": "word"}
        total = int(sum(self.scored_rows(len(c), c) for c in counts))
        spec_p: Any = int(counts[0][0]) if uniform and counts and counts[0].size else [
            c.tolist() for c in counts]
        ex = run_pairs(model, toks, all_sizes, seed=seed,
                       tag=tag + ("_whole_word" if unit else ""), units=units,
                       spec={"kind": "exact", "num_masks": spec_p, "total_pairs": total, **unit},
                       desc="exact sum over M", **run)
        cells = []
        for s, d, c, w in zip(ex.sums, ex.lengths, counts, whole, strict=True):
            n = np.array([math.comb(len(c), m) if w[m - 1] else c[m - 1]
                          for m in range(1, len(c) + 1)], dtype=np.int64)
            parts = np.split(np.asarray(s, dtype=np.float64), np.cumsum(n)[:-1])
            cells.append([exact_cell(part / m) if w[m - 1] else part / m
                          for m, part in enumerate(parts, start=1)][:int(d)])
        return cells, ex.num_model_calls

    def sequence_error(self, cells: list[np.ndarray], single_draws: bool
                       ) -> tuple[float, float, np.ndarray, np.ndarray]:
        """One sequence's estimate and SE; at two draws a size, the SE the larger of the sizes'
        own and the pooled one (errs large).

        The sizes' own: ``sum_M s_M^2 / P`` (:func:`~mptlml.estimators.stats.cell_sums`), P - 1
        degrees of freedom per size, combined by Welch (few at small P: at P = 2 one per
        size, and |z| > 2 in 15% of (seed, continuation) pairs of 5-7 tokens on a tiny BERT).
        Pooled: the sizes' variances as one sigma^2 times the finite-population shape
        ``(T - M) / (M (T - 1))`` (:func:`~mptlml.estimators.stats.pooled_size_error`), on
        the sizes' dof together. At two draws a size the larger of the two is reported,
        with its own dof (with more draws, the sizes' own alone): the
        pooled one steadies the SE where the sizes' own are few and noisy, the sizes' own
        keep it honest where the model's shape is wrong (9% there, the spread over seeds
        0.64-0.96 of the RMS SE).
        """
        tot, se, var, dof = cell_sums(cells, single_draws)
        drawn = [c for c in cells if not isinstance(c, ExactCell)]
        # at two draws a size (one dof each) only: with more the sizes' own are steady enough,
        # and the model's shape, wrong on a real model, would only inflate them
        pooled = (pooled_size_error(cells) if drawn and all(len(c) == 2 for c in drawn)
                  else None)
        if pooled is None or not pooled[0] > se ** 2:
            return tot, se, var, dof
        return tot, math.sqrt(pooled[0]), np.array([pooled[0]]), np.array([pooled[1]])

    def scored_rows(self, num_tokens: int, counts: np.ndarray) -> int:
        """Masked inputs of ``counts[M-1]`` masks of each size M: C(D, M) where that size is
        enumerated (:func:`enumerated_sizes`), else its count."""
        c = np.asarray(counts, dtype=np.int64)
        whole = enumerated_sizes(int(num_tokens), c)
        return int(sum(math.comb(len(c), m) if whole[m - 1] else int(c[m - 1])
                       for m in range(1, len(c) + 1)))


def enumerated_sizes(num_tokens: int, counts: np.ndarray) -> np.ndarray:
    """Which sizes M = 1..D are scored on every mask: those asked at least two masks whose
    C(D, M) distinct masks are no more than that (a finite population: its mean is exact,
    standard error 0, no degrees of freedom spent on it)."""
    c = np.asarray(counts, dtype=np.int64)
    return np.array([c[m - 1] >= 2 and math.comb(num_tokens, m) <= c[m - 1]
                     for m in range(1, len(c) + 1)], dtype=bool)
