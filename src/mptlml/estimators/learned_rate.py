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
A sequence whose 2^D - 1 masks are no more than a round's P + 1 masked inputs, or
``2^EXACT_LENGTH - 1``, is scored on every mask (exact:
:func:`~mptlml.estimators.sequential.scores_every_mask`). The draw of
:func:`mptlml.compare` (its default): one target standard error on one continuation costs
the same through ``estimate_lml(..., "learned-rate", context=, target_se=)`` and
``compare(..., target_se=)``.

Its parts are public, for every door that draws rates (the DPO margin of
:mod:`mptlml.hf.preference` and :class:`~mptlml.hf.MPTDPOTrainer`): the plan of a round
(:func:`~mptlml.estimators.sequential.stratified_rates`,
:func:`~mptlml.estimators.sequential.masks_at_rates`), the spread learning
(:func:`pair_spread`: a stratum's two draws' ``(y_1 - y_2)^2 / 2`` in the bin of their
rate, :func:`rate_bin`) and the density learned from it
(:func:`learned_density`: Neyman, floored, a group's own spread shrunk toward the pooled
one by :data:`~mptlml.estimators.sequential.PRIOR_PAIRS`); :class:`RateDraw` is the engine's
round of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .._scoring.ragged import run_pairs
from ..masks import every_mask
from ..models.protocols import RaggedMaskedModel
from .api import register
from .base import Estimator
from .sequential import (
    EXACT_LENGTH,
    NUM_RATE_BINS,
    PRIOR_PAIRS,
    RateDensity,
    RoundDraw,
    _round_dir,
    density_of,
    masks_at_rates,
    round_seed,
    scores_every_mask,
    stratified_rates,
    stratum_cells,
)
from .stats import enumerated_sum

__all__ = ["LearnedRate", "RateDraw", "learned_density", "pair_spread", "rate_bin"]



def rate_bin(rates: np.ndarray, bins: int = NUM_RATE_BINS) -> np.ndarray:
    """The bin of each rate in (0, 1]: bin b holds ``(b / B, (b + 1) / B]``, i.e.
    ``ceil(B r) - 1`` (a rate within 1e-9 of an edge falls in the lower bin), clipped to
    ``0..B-1``. The one convention of the rate density's strata (the rate draw's spread,
    :func:`pair_spread`, the DPO margin's and the block draw's)."""
    r = np.asarray(rates, dtype=np.float64)
    return np.clip(np.ceil(bins * r - 1e-9).astype(np.int64) - 1, 0, bins - 1)


def pair_spread(spread_sum: np.ndarray, spread_n: np.ndarray, rates: np.ndarray,
                terms: np.ndarray, density: RateDensity | None = None) -> None:
    """Add the spread of a stratified round's draws to the evidence by rate bin, in place.

    ``rates`` and ``terms`` are in stratum order (rows 2h, 2h+1 the two draws of stratum
    h); each stratum adds ``(y_h1 - y_h2)^2 / 2`` (an unbiased estimate of the variance of
    one draw's term within it) to ``spread_sum`` and 1 to ``spread_n`` in the bin of its
    first rate (:func:`rate_bin`). The evidence must not depend on the density the terms
    were drawn under: pass density-free terms (a mask's mean score ``s / M``), or
    importance-weighted ones with their ``density`` (the DPO margin's ``d_k``), which are
    then made density-free, ``d_k q(r_k)`` (q's density at the rate: its bin's mass times
    B).
    """
    bins = rate_bin(np.asarray(rates))
    y = np.asarray(terms, dtype=np.float64)
    if density is not None:
        y = y * density.mass[bins] * len(density.mass)
    b = bins.reshape(-1, 2)[:, 0]
    pair = y.reshape(-1, 2)
    np.add.at(spread_sum, b, (pair[:, 0] - pair[:, 1]) ** 2 / 2)
    np.add.at(spread_n, b, 1)


def learned_density(spread_sum: np.ndarray, spread_n: np.ndarray,
                    prior: np.ndarray | None = None) -> RateDensity:
    """The rate density learned from the spread by rate bin (Neyman: in proportion to its
    standard deviation, floored, :func:`~mptlml.estimators.sequential.density_of`).

    ``var_b = spread_sum[b] / spread_n[b]``; with ``prior`` (the pooled variances of the
    call) a group's own is shrunk toward it as if that were
    :data:`~mptlml.estimators.sequential.PRIOR_PAIRS` pairs per bin,
    ``(spread_sum[b] + PRIOR_PAIRS prior[b]) / (spread_n[b] + PRIOR_PAIRS)``. Uniform while
    a bin has no evidence (and no prior).
    """
    s, n = np.asarray(spread_sum, dtype=np.float64), np.asarray(spread_n, dtype=np.float64)
    if prior is not None:
        return density_of((s + PRIOR_PAIRS * prior) / (n + PRIOR_PAIRS))
    if n.min() <= 0:
        return RateDensity(np.ones(NUM_RATE_BINS))
    return density_of(s / n)


class RateDraw(RoundDraw):
    """The rate draw of Proposition 1 conditionally, with a rate density learned over rounds.

    ``sum_{M=1..T} S_T(x; M) = S_T(x; T) + E_{M ~ q}[S_T(x; M) / q(M)]`` (M < T): the whole
    continuation scored once (exactly, in round 0), and per round P draws on H = P/2 strata
    of equal q-mass (:func:`stratified_rates`, :func:`masks_at_rates`: M = ceil(r (T-1)));
    the candidates of a group share the rates and the order of positions (common random
    numbers, from the group's key unless the caller gives each candidate its own). A short
    sequence, whose ``2^T - 2`` other masks are no more than ``max(P, 2^EXACT_LENGTH - 2)``,
    is scored on every mask instead (exact). With ``allocation="neyman"`` q follows the
    spread of a mask's score by rate bin (Neyman, :func:`density_of`), a group's own spread
    shrunk toward the call's as if that were
    :data:`~mptlml.estimators.sequential.PRIOR_PAIRS` pairs per bin.
    """

    name = "learned-rate"

    def __init__(self, num_masks: int, allocation: str = "neyman", exact_length: int = 4
                 ) -> None:
        self.p, self.allocation, self.exact_length = num_masks, allocation, exact_length

    def bind(self, lengths: np.ndarray, groups: list[list[int]],
             keys: list[tuple[int, ...]]) -> None:
        super().bind(lengths, groups, keys)
        self.density = RateDensity(np.ones(NUM_RATE_BINS))  # the call's (pooled), reported
        self.densities = [self.density] * len(groups)  # each group's, for its next round
        self.spread_sum = np.zeros((len(groups), NUM_RATE_BINS))
        self.spread_n = np.zeros((len(groups), NUM_RATE_BINS))
        self.tmax = [int(lengths[m].max()) for m in groups]
        # per sequence, per size M: sum of (s_1 - s_2)^2 / 2 over its stratum pairs of equal
        # size M (s the sum of the masked log-probabilities), and their number
        self.within_sum = [np.zeros(int(t) + 1) for t in lengths]
        self.within_n = [np.zeros(int(t) + 1) for t in lengths]

    def fingerprint(self) -> dict[str, Any]:
        return {**super().fingerprint(), "num_masks": self.p, "exact_length": self.exact_length}

    def enumerates(self, length: int) -> bool:
        """:func:`~mptlml.estimators.sequential.scores_every_mask` of the P + 1 masked inputs
        of a round of P draws and the whole sequence."""
        return scores_every_mask(int(length), self.p + 1, self.exact_length)

    def reference_var(self, i: int) -> tuple[float, int]:
        """LLaDA's variance of one draw of sequence i, its within-size part, and the pairs
        it rests on.

        LLaDA's draw (Nie et al. 2025) of a continuation of T tokens takes M uniform in 1..T
        and a uniform mask of M positions, and scores ``f = (T / M) s_M``, ``s_M`` the sum of
        the masked log-probabilities; its variance is at least the within-size part
        ``W = E_M[(T / M)^2 v_M] = sum_{M=1..T-1} T v_M / M^2``, ``v_M = Var(s_M | M)``
        (``v_T = 0``: one mask), whatever its sizes (independent, or LLaDA's systematic
        counts, which remove the between-size part at most). ``v_M`` is estimated by
        ``(s_1 - s_2)^2 / 2`` averaged over this sequence's stratum pairs that fell on the
        same size M (two uniform masks of size M; a swapped repeat only adds to it by
        ``v_M / (C(T, M) - 1)`` at most); a size never seen in a pair counts 0, so ``W`` errs
        small (a stricter reference). An enumerated sequence: ``(0.0, 0)``.
        """
        n = self.within_n[i]
        t = int(self.lengths[i])
        sizes = np.arange(len(n))
        seen = (n > 0) & (sizes >= 1) & (sizes < t)
        if not seen.any():
            return 0.0, 0
        v = self.within_sum[i][seen] / n[seen]
        return float(np.sum(t * v / sizes[seen] ** 2)), int(n[seen].sum())

    def most_rows(self, length: int, draws: int) -> int:
        return 2 ** length - 1 if self.enumerates(length) else draws + 1

    def draws_within(self, length: int, rows: int) -> int:
        return int(rows) - 1  # the whole continuation's row, scored once, counts

    def draw_text(self, length: int, draws: int) -> str:
        return " and the whole continuation's row"

    def score(self, scorer: Any, ids: list[torch.Tensor], todo: list[tuple[int, int]], r: int,
              run: dict[str, Any]) -> tuple[dict[int, tuple[list[np.ndarray] | None, float, int]],
                                            int]:
        masks: dict[int, torch.Tensor] = {}
        meta: dict[int, tuple[np.ndarray, np.ndarray] | None] = {}
        for i, p in todo:
            t, q = int(self.lengths[i]), self.group_of[i]
            if self.enumerates(t):  # every mask, once
                masks[i], meta[i] = every_mask(t), None
                continue
            g = torch.Generator().manual_seed(round_seed(self.keys[i], r))
            _, rates, order = stratified_rates(g, p, self.tmax[q], self.densities[q])
            one_length = bool((self.lengths[self.groups[q]] == t).all())
            m, sizes = masks_at_rates(t, rates, order, distinct_pairs=one_length)
            if r == 0:  # the whole continuation: S_T(x; |T|) exactly, once
                m = torch.cat([m, torch.ones(1, t, dtype=torch.bool)])
            masks[i], meta[i] = m, (rates, sizes)
        order_ = sorted(masks)
        out = run_pairs(scorer, [ids[i] for i in order_],
                        lambda k, d, g: masks[order_[k]], seed=0, tag="sequential",
                        spec={"kind": "sequential", "round": r,
                              "total_pairs": int(sum(m.shape[0] for m in masks.values()))},
                        desc="sequential draws", **_round_dir(run, r))
        res: dict[int, tuple[list[np.ndarray] | None, float, int]] = {}
        for i, s in zip(order_, out.sums, strict=True):
            t, s = int(self.lengths[i]), np.asarray(s, dtype=np.float64)
            rows = int(masks[i].shape[0])
            if meta[i] is None:
                res[i] = (None, enumerated_sum(s, masks[i].sum(1).numpy()), rows)
                continue
            rates, sizes = meta[i]
            top = 0.0
            if r == 0:
                top, s = float(s[-1]) / t, s[:-1]
            q = self.group_of[i]
            y = s / (sizes * self.densities[q].size_probs(sizes, t))
            res[i] = (stratum_cells(y), top, rows)
            pair_s, pair_m = s.reshape(-1, 2), sizes.reshape(-1, 2)
            same = pair_m[:, 0] == pair_m[:, 1]
            np.add.at(self.within_sum[i], pair_m[same, 0],
                      (pair_s[same, 0] - pair_s[same, 1]) ** 2 / 2)
            np.add.at(self.within_n[i], pair_m[same, 0], 1)
            pair_spread(self.spread_sum[q], self.spread_n[q], rates, s / sizes)
        return res, out.num_model_calls

    def learn(self, active: list[int]) -> None:
        if self.allocation != "neyman" or self.spread_n.sum(0).min() <= 0:
            return
        self.density = learned_density(self.spread_sum.sum(0), self.spread_n.sum(0))
        pooled = self.spread_sum.sum(0) / self.spread_n.sum(0)
        for q in active:  # its own spread, shrunk toward the call's by PRIOR_PAIRS
            self.densities[q] = learned_density(self.spread_sum[q], self.spread_n[q], pooled)



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
        return scores_every_mask(int(num_tokens), self.num_masks + 1)

    def scored_rows(self, num_tokens: int, counts: np.ndarray) -> int:
        return int(np.max(counts)) + 1

    def round_draw(self, num_masks: int, allocation: str | None = "neyman") -> RoundDraw:
        """The rate draw: rounds of ``num_masks`` stratified draws, the density learned
        (``"neyman"``) or kept uniform."""
        return RateDraw(int(num_masks), allocation or "uniform", EXACT_LENGTH)

    def sequence_cells(self, model: RaggedMaskedModel, toks: list[torch.Tensor],
                       counts: Sequence[np.ndarray], seed: int,
                       **run: Any) -> tuple[list[list[np.ndarray]], int]:
        raise NotImplementedError("'learned-rate' draws in rounds: the sequential engine's "
                                  "RateDraw (round_draw).")
