"""The Riemann estimator on ragged sequences: D_i times the mean of the MPT curve on a rate grid.

With M = r * D_i, ``sum_{M=1..D_i} S(x_i; M) ~ D_i * mean_k S(x_i; M_ik)`` over
a grid of masking rates r_1 < ... < r_K, M_ik = max(1, round(r_k D_i))
(:mod:`mptlml.estimators.rates`): the Riemann form of Proposition 1 that the
paper's Table 2 areas use (Moreno-Munoz, Recasens & Hauberg, NeurIPS 2023,
Sec. 4). Biased by the grid. Its draws, P masks per (sequence, rate)
(:func:`rate_grid_scores`), are the points of the ragged MPT curve
(:func:`mptlml.mpt_curve`), whose ``lml`` is this estimate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._scoring.ragged import check_run_size, encode_units, run_pairs, unit_counts
from .._validation import check_positive_int
from ..masks import all_masks, distinct_masks, sample_masks
from ..models.protocols import RaggedMaskedModel
from .api import register
from .base import Estimator
from .rates import check_rates, mask_sizes
from .stats import mean_stderr, sum_stderr, welch_dof

__all__ = ["GridScores", "Riemann", "balanced_masks", "grid_masks", "rate_counts",
           "rate_grid_scores"]


@dataclass
class GridScores:
    """S_hat(x_i; M_ik) on a rate grid and the Riemann LML ``D_i * mean_k S_ik``, per sequence.

    Attributes
    ----------
    rates : numpy.ndarray, (K,)
    counts : numpy.ndarray, (K,)
        Masks per (sequence, rate).
    lengths : numpy.ndarray, (N,)
        D_i, in scoring units (tokens, or words).
    sizes : numpy.ndarray, (N, K)
        M_ik = max(1, round(r_k D_i)).
    scores, scores_stderr : numpy.ndarray, (N, K)
        S_ik (the mean over its masks) and its Monte Carlo standard error.
    lml, lml_stderr : numpy.ndarray, (N,)
        ``D_i * mean_k S_ik`` and its standard error (successive differences
        over the rates when one mask per rate).
    num_model_calls : int
    """

    rates: np.ndarray
    counts: np.ndarray
    lengths: np.ndarray
    sizes: np.ndarray
    scores: np.ndarray
    scores_stderr: np.ndarray
    lml: np.ndarray
    lml_stderr: np.ndarray
    num_model_calls: int

    @property
    def dof(self) -> float | None:
        """Welch-Satterthwaite degrees of freedom of the mean ``lml``'s standard error."""
        if self.counts.min() < 2:
            return None
        k = self.rates.size
        terms = ((self.lengths[:, None] / k) * self.scores_stderr) ** 2
        dofs = np.broadcast_to(self.counts - 1.0, terms.shape)
        return welch_dof(torch.from_numpy(terms), torch.from_numpy(np.ascontiguousarray(dofs)))


def rate_counts(num_masks: int | Sequence[int] | np.ndarray, num_rates: int) -> np.ndarray:
    """Masks per rate: one int for every rate, or one per rate (each >= 1)."""
    if isinstance(num_masks, int | np.integer) and not isinstance(num_masks, bool):
        return np.full(num_rates, check_positive_int(num_masks, "num_masks"), dtype=np.int64)
    counts = np.asarray(num_masks)
    if counts.shape != (num_rates,) or counts.dtype.kind not in "iu" or (counts < 1).any():
        raise ValueError(f"num_masks must be a positive int or {num_rates} positive ints (one "
                         f"per entry of rates); got {num_masks!r}.")
    return counts.astype(np.int64)


def rate_grid_scores(model: RaggedMaskedModel, sequences: Any, rates: Any,
                     num_masks: int | Sequence[int] | np.ndarray, seed: int, *,
                     whole_word: bool = False, remedy: str | None = None, encoded: bool = False,
                     **run: Any
                     ) -> tuple[GridScores, list[torch.Tensor], list[torch.Tensor] | None]:
    """P uniform masks of M_ik units per (sequence, rate), scored: the Riemann draws.

    The P masks of a cell never repeat while the C = C(D_i, M_ik) masks of its size last
    (:func:`balanced_masks`: a sample without replacement, then every mask as often as P
    allows and the rest without replacement), so that the cell's spread is 0 only where
    its masks score alike (C = 1). Its standard error is that of i.i.d. draws,
    ``s / sqrt(P)``: for draws without replacement it errs on the large side (by
    ``1 / sqrt(1 - P / C)`` while P <= C), and ``s^2`` stays the spread of one mask, which
    a target's rounds allocate by.

    Returns the scores, the content ids and (``whole_word``) the word of each
    token: the units of the run, for a further sum over every size. ``encoded``:
    ``sequences`` are the model's own content ids already (``model.encode``'s, as an
    estimate's run holds them: a conditioned model knows their contexts by them), scored
    as they are. A run too
    large is refused first (:func:`~mptlml._scoring.ragged.check_run_size`) with
    ``remedy``; by default the caller's own counts: lower ``num_masks`` or take
    fewer rates.
    """
    r = check_rates(rates)
    counts = rate_counts(num_masks, r.size)
    p = int(counts.max())
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise TypeError(f"seed must be an int, got {seed!r}.")
    if not isinstance(whole_word, bool):
        raise TypeError(f"whole_word must be bool, got {whole_word!r}.")
    if encoded and whole_word:
        raise ValueError("encoded=True takes token ids: whole-word units need the texts.")
    toks, words = ((list(sequences), None) if encoded
                   else encode_units(model, sequences, words=whole_word)[:2])
    lengths = unit_counts(toks, words)
    if remedy is None:
        remedy = f"{'lower num_masks or ' if p > 1 else ''}take fewer rates (now {r.size})"
    check_run_size([int(counts.sum())] * len(lengths), lengths, "this MPT curve", remedy)
    sizes = np.stack([mask_sizes(int(d), r) for d in lengths])  # (N, K)
    k = r.size
    unit = {"unit": "word"} if whole_word else {}

    def curve_masks(i: int, d: int, g: torch.Generator) -> torch.Tensor:
        return grid_masks(d, sizes[i], counts, g)

    out = run_pairs(model, toks, curve_masks, seed=int(seed),
                    tag="curve" + ("_whole_word" if whole_word else ""), units=words,
                    spec={"kind": "curve", "rates": r.tolist(),
                          "num_masks": p if (counts == p).all() else counts.tolist(),
                          "total_pairs": int(len(toks) * counts.sum()), **unit},
                    desc="MPT curve", **run)
    bounds = np.cumsum(counts)[:-1]
    stats = [[mean_stderr(c) for c in np.split(sm, bounds)] for sm in out.sums]
    scores = np.array([[m for m, _ in row] for row in stats]) / sizes  # (N, K)
    scores_se = np.array([[e for _, e in row] for row in stats]) / sizes
    lml_se = np.array([lengths[i] / k * float(sum_stderr(scores_se[i] if counts.min() > 1
                                                         else None, scores[i]))
                       for i in range(len(toks))])
    grid = GridScores(r, counts, lengths, sizes, scores, scores_se,
                      lengths * scores.mean(axis=1), lml_se, out.num_model_calls)
    return grid, toks, words


def grid_masks(num_tokens: int, sizes: np.ndarray, counts: np.ndarray,
               generator: torch.Generator) -> torch.Tensor:
    """The masks of one sequence over a rate grid: ``counts[k]`` masks of ``sizes[k]`` per
    rate, drawn i.i.d. then made :func:`balanced_masks` (the one mask sampler of the curve,
    its target rounds and :class:`Riemann`)."""
    drawn = sample_masks(num_tokens, torch.as_tensor(sizes).repeat_interleave(
        torch.as_tensor(counts)), generator=generator).split(np.asarray(counts).tolist())
    return torch.cat([balanced_masks(num_tokens, int(m), int(c), generator, part)
                      for m, c, part in zip(sizes, counts, drawn, strict=True)])


def balanced_masks(num_tokens: int, size: int, count: int, generator: torch.Generator,
                   drawn: torch.Tensor) -> torch.Tensor:
    """``count`` masks of ``size`` that repeat none while the C = C(D, M) masks last.

    ``count <= C``: ``drawn`` (``count`` i.i.d. uniform masks) with its repeats drawn again
    (:func:`~mptlml.masks.distinct_masks`: a sample without replacement). ``count > C``:
    every mask ``count // C`` times and ``count % C`` more without replacement. Each row is
    a uniform mask of the size, so the mean of their scores is unbiased for S(x; M).
    """
    n = math.comb(num_tokens, size)
    if count <= n:
        return distinct_masks(num_tokens, size, count, generator, drawn=drawn)
    every = all_masks(num_tokens, size)
    extra = every[torch.randperm(n, generator=generator)[:count % n]]
    return torch.cat([every.repeat(count // n, 1), extra])


@register
class Riemann(Estimator):
    """``D_i * mean_k S_hat(x_i; M_ik)`` over a rate grid (ragged sequences). Biased by the grid.

    Parameters
    ----------
    num_masks : int
        P masks per (sequence, rate).
    rates : array-like, optional
        Masking rates in (0, 1), strictly increasing (default 0.01..0.99).
    """

    name = "riemann"
    summary = "D_i * mean_k S(x_i; M_ik) over a rate grid; biased by the grid"
    unbiased = False
    dense = False
    ragged = True
    ragged_tag = "curve"

    def __init__(self, num_masks: int = 1, *, rates: Any = None) -> None:
        super().__init__(num_masks)
        self.rates = rates

    def sequence_cells(self, model: RaggedMaskedModel, toks: list[torch.Tensor],
                       counts: Sequence[np.ndarray], seed: int,
                       **run: Any) -> tuple[list[list[np.ndarray]], int]:
        """One cell per rate: the P terms ``(D_i / K) S_hat(x_i; M_ik)`` of its masks (the
        draws of :func:`rate_grid_scores`, whose mean over the rates is ``lml_i``)."""
        grid_rates = check_rates(self.rates)
        k = grid_rates.size
        ps = [int(np.max(c)) for c in counts]  # P_i masks per rate of sequence i
        p = ps[0] if len(set(ps)) == 1 else ps
        lengths = [len(t) for t in toks]
        sizes = [mask_sizes(int(d), grid_rates) for d in lengths]

        def masks(i: int, d: int, g: torch.Generator) -> torch.Tensor:
            return grid_masks(d, sizes[i], np.full(k, ps[i]), g)

        out = run_pairs(model, toks, masks, seed=seed, tag=self.ragged_tag,
                        spec={"kind": "curve", "rates": grid_rates.tolist(), "num_masks": p,
                              "total_pairs": k * sum(ps)}, desc="MPT curve", **run)
        cells = [[(d / k) * c / m for c, m in zip(np.split(np.asarray(s, dtype=np.float64), k),
                                                  sizes[i], strict=True)]
                 for i, (s, d) in enumerate(zip(out.sums, lengths, strict=True))]
        return cells, out.num_model_calls

    def masks_per_draw(self, num_tokens: int) -> int:
        """One mask per rate of the grid."""
        return int(check_rates(self.rates).size)
