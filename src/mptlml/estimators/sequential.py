"""The sequential engine: rounds of stratified draws, a rate density learned as they go, targets.

A quantity estimated by importance sampling over mask sizes (Proposition 1,
conditionally: ``sum_{M=1..T} S_T(x; M) = S_T(x; T) + E_{M ~ q}[S_T(x; M) / q(M)]``,
M < T) is drawn in **rounds**: round r draws P_r masks on H = P_r / 2 strata of
equal q-mass of the rate (two draws each: a variance estimate with H degrees
of freedom), a rate r giving the size ``M = ceil(r (T - 1))``. Rounds double
the draws so far (P, P, 2P, 4P, ...: :func:`round_sizes`, :func:`next_draws`),
so a sequential rule looks about log2(max / P) times; towards a target
standard error a round draws no more than the predicted remainder
(:func:`draws_needed`, :data:`NEED_MARGIN`). After each round the rate density
q is set in proportion to the spread of a mask's score by rate bin (Neyman:
:func:`density_of`, floored at :data:`DENSITY_FLOOR`); each round is unbiased
given the past, and rounds are combined with weights in proportion to their
draws (:func:`weighted_rounds`, :func:`combine_rounds`: estimate, standard
error, Welch degrees of freedom).

:func:`mptlml.compare` runs its questions on these pieces (its own are the
questions, common random numbers across candidates, the paired difference and
the decision).

Reference: Moreno-Munoz, Recasens, Hauberg, "On Masked Pre-training and the
Marginal Likelihood", NeurIPS 2023, Proposition 1.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .stats import welch_dof

__all__ = ["DENSITY_FLOOR", "NEED_MARGIN", "NUM_RATE_BINS", "PRIOR_PAIRS", "TARGET_MIN_DOF",
           "RateDensity", "at_target", "combine_rounds", "density_of", "draws_needed",
           "masks_at_rates", "next_draws", "round_seed", "round_sizes", "round_stats",
           "stratified_rates", "weighted_rounds"]

#: rate bins of the learned allocation
NUM_RATE_BINS = 10
#: the learned density never falls below this share of its largest bin (keeps every rate,
#: and bounds the importance weights: heavy tails make standard errors unstable)
DENSITY_FLOOR = 0.3
#: a question's spread by rate is shrunk toward the call's as if by this many pairs per bin
PRIOR_PAIRS = 8
#: a standard error counts as at its target only on at least this many degrees of freedom
TARGET_MIN_DOF = 10
#: a round towards a target SE draws this times the predicted remainder (fewer extra rounds)
NEED_MARGIN = 1.15


def round_seed(seed: int, q: int, r: int) -> int:
    """The seed of question q's round r in a call seeded by ``seed``."""
    return int(np.random.SeedSequence([int(seed), int(q), int(r)]).generate_state(1)[0])


class RateDensity:
    """A piecewise-constant rate density q on (0, 1): CDF, inverse CDF, size probabilities."""

    def __init__(self, weights: np.ndarray) -> None:
        w = np.asarray(weights, dtype=np.float64)
        self.mass = w / w.sum()
        self.edges = np.linspace(0.0, 1.0, w.size + 1)
        self.cdf_at_edges = np.concatenate([[0.0], np.cumsum(self.mass)])
        self.cdf_at_edges[-1] = 1.0

    def cdf(self, r: np.ndarray) -> np.ndarray:
        return np.interp(r, self.edges, self.cdf_at_edges)

    def inverse(self, u: np.ndarray) -> np.ndarray:
        return np.interp(u, self.cdf_at_edges, self.edges)

    def size_probs(self, sizes: np.ndarray, length: int) -> np.ndarray:
        """q(M) for M in ``sizes`` (1..T-1) of a continuation of T = ``length`` tokens."""
        n = length - 1
        return self.cdf(sizes / n) - self.cdf((sizes - 1) / n)


def round_stats(y: np.ndarray, strata: np.ndarray) -> tuple[float, float, np.ndarray]:
    """Mean of a stratified round (two draws per stratum), its variance, per-stratum pieces."""
    h = int(strata.max()) + 1
    pairs = y.reshape(h, 2)
    pieces = (pairs[:, 0] - pairs[:, 1]) ** 2 / (4.0 * h * h)
    return float(y.mean()), float(pieces.sum()), pieces


def weighted_rounds(rounds: dict[int, tuple[int, np.ndarray, np.ndarray]]
              ) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Each round's draws times its weight (its share of the candidate's draws)."""
    total = sum(n for n, _, _ in rounds.values())
    return {r: (y * (n / total), s) for r, (n, y, s) in rounds.items()} if total else {}


def combine_rounds(terms: list[tuple[np.ndarray, np.ndarray]]) -> tuple[float, float, float]:
    """Sum of stratified rounds' means (weighted draws): estimate, standard error, Welch dof."""
    if not terms:
        return 0.0, 0.0, math.inf
    est, var, pieces = 0.0, 0.0, []
    for z, s in terms:
        m, v, p = round_stats(z, s)
        est += m
        var += v
        pieces.append(p)
    return est, math.sqrt(var), welch_dof(torch.from_numpy(np.concatenate(pieces)), 1.0)


def round_sizes(p: int, max_masks: int) -> list[int]:
    """Masks per candidate of each round: p, p, 2p, 4p, ... (the total doubles), <= max_masks.

    Few looks (about log2(max_masks / p)) keep the Bonferroni threshold low, and
    every round's pairs add degrees of freedom fast; the last round takes what is left
    of ``max_masks`` (rounded down to an even count).
    """
    sizes, total = [p], p
    while total + 2 <= max_masks:
        sizes.append(next_draws(total, max_masks))
        total += sizes[-1]
    return sizes


def at_target(se: float, dof: float, target: float) -> bool:
    """Whether a candidate's SE is at the target: at most ``target``, on at least
    :data:`TARGET_MIN_DOF` degrees of freedom (an SE that dipped below the target on
    few draws is most often an underestimate: stopping on it would break the promise)."""
    return se <= target and dof >= TARGET_MIN_DOF


def draws_needed(drawn: float, se: float, dof: float, target: float) -> float:
    """Draws a candidate needs for :func:`at_target`: SE^2 falls as 1 / n, the dof grow as n."""
    need = drawn * (se / target) ** 2
    if math.isfinite(dof) and dof > 0:
        need = max(need, drawn * TARGET_MIN_DOF / dof)
    return need


def density_of(variance: np.ndarray) -> RateDensity:
    """The rate density in proportion to the spread by rate bin, floored (Neyman)."""
    sd = np.sqrt(variance)
    return RateDensity(np.maximum(sd, DENSITY_FLOOR * sd.max()) if sd.max() > 0
                    else np.ones(NUM_RATE_BINS))


def next_draws(drawn: int, max_masks: int, need: float | None = None) -> int:
    """Masks per candidate of the next round: double the draws so far, within ``max_masks``.

    Towards a target standard error (``need``: the draws it needs, ``n (se /
    target)^2`` from the draws so far, SE^2 falling as 1 / n), no more than the
    predicted remainder, with a margin of :data:`NEED_MARGIN`: the last round
    stops near the target instead of overshooting it up to twofold.
    """
    nxt = min(drawn, max_masks - drawn) // 2 * 2
    if need is not None and math.isfinite(need):
        nxt = min(nxt, 2 * math.ceil(NEED_MARGIN * (need - drawn) / 2))
    return max(2, nxt)


def stratified_rates(g: torch.Generator, p: int, tmax: int, density: RateDensity
          ) -> tuple[np.ndarray, np.ndarray, torch.Tensor]:
    """Stratified rates (two per stratum of equal q-mass) and a random order of positions."""
    h = p // 2
    v = torch.rand(h, 2, generator=g, dtype=torch.float64).numpy()
    u = (np.arange(h)[:, None] + v) / h
    rates = density.inverse(u.reshape(-1))
    order = torch.rand(p, tmax, generator=g).argsort(dim=1)
    return np.repeat(np.arange(h), 2), rates, order


def masks_at_rates(length: int, rates: np.ndarray, order: torch.Tensor
           ) -> tuple[torch.Tensor, np.ndarray]:
    """Masks ``(P, T)`` of sizes ceil(r (T-1)) on the first positions of the shared order."""
    p = len(rates)
    sizes = np.clip(np.ceil(rates * (length - 1)), 1, length - 1).astype(np.int64)
    keep = order[order < length].reshape(p, length)  # the shared order restricted to T
    rank = torch.empty_like(keep)
    rank.scatter_(1, keep, torch.arange(length).expand(p, -1))
    m = rank < torch.as_tensor(sizes)[:, None]
    return m, sizes
