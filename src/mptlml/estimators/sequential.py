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

The same engine (:func:`run_rounds`) runs any estimator's own draws: on ragged
sequences (:class:`CellDraw`, each sequence a member) and on dense ``(N, D)``
data (:class:`DenseDraw`, the data set one member), their draws per stratum (a
mask size of ``cumulative``, dense or ragged) Neyman's after each
round (:func:`neyman_sd`, :func:`neyman_counts`). Every target standard error
(:func:`mptlml.estimate_lml`, :func:`mptlml.mpt_curve`) and
:func:`mptlml.compare` run on it (compare's own are the questions, common random
numbers across candidates, the paired difference and the decision).

Reference: Moreno-Munoz, Recasens, Hauberg, "On Masked Pre-training and the
Marginal Likelihood", NeurIPS 2023, Proposition 1.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._scoring.checkpoints import check_meta
from .._scoring.dense import check_masked_inputs
from .._scoring.ragged import check_run_size, run_pairs
from ..masks import every_mask
from ..seeds import spawn
from .stats import ExactCell, cell_error, enumerated_sum, welch_dof

__all__ = ["DENSITY_FLOOR", "EXACT_LENGTH", "MAX_TARGET_DRAWS", "NEED_MARGIN", "NUM_RATE_BINS",
           "PRIOR_PAIRS", "STOP_REASONS", "TARGET_MIN_DOF", "CellDraw", "DenseDraw",
           "RateDensity", "RoundDraw", "RoundError", "Rule", "SequentialRun", "Tally",
           "at_target", "cell_draws", "cells_error", "check_run_fingerprint", "combine_rounds",
           "complement_cells", "density_of", "draw_caps", "draws_needed", "fixed_rule",
           "masks_at_rates", "merge_stops", "next_draws", "neyman_counts", "neyman_sd", "paired",
           "round_seed", "round_sizes", "run_rounds", "scores_every_mask", "stratified_rates",
           "stratum_cells", "target_rule", "weighted_rounds"]

#: rate bins of the learned rate density (its strata):
#: :func:`~mptlml.estimators.learned_rate.rate_bin`
NUM_RATE_BINS = 10
#: sequences (continuations) of at most this many units are scored on every mask (exact,
#: standard error 0): their 2^D - 1 <= 15 masks cost no more than a few draws
EXACT_LENGTH = 4
#: the learned density never falls below this share of its largest bin (keeps every rate,
#: and bounds the importance weights: heavy tails make standard errors unstable). The rate
#: density's only: Neyman's counts (:func:`neyman_sd`) are not floored, their draws weigh
#: nothing by importance and every stratum keeps at least 2 draws a round
DENSITY_FLOOR = 0.3
#: a group's own spread by rate bin is shrunk toward the call's as if by this many measures
#: per bin (the rate density's pairs, :func:`~mptlml.estimators.learned_rate.learned_density`;
#: Neyman's counts of a draw's rows, :func:`neyman_sd`)
PRIOR_PAIRS = 8
#: a standard error counts as at its target only on at least this many degrees of freedom
TARGET_MIN_DOF = 10
#: a round towards a target SE draws this times the predicted remainder (fewer extra rounds)
NEED_MARGIN = 1.15
#: most draws per sequence (candidate; per stratum of dense data) towards a target SE, unless
#: ``max_masks`` (masked inputs) says: the default cap is this many draws' masked inputs
MAX_TARGET_DRAWS = 512


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


def scores_every_mask(length: int, asked: int, exact_length: int = EXACT_LENGTH) -> bool:
    """The one exactness rule: a sequence of ``length`` units is scored on every mask
    (exact, standard error 0) when its ``2^D - 1`` masks are no more than the ``asked``
    masked inputs its draws would score, or than ``2^exact_length - 1``
    (:data:`EXACT_LENGTH`: a few); a sequence of at most one unit always (one mask).
    Both estimate the same sum."""
    d = int(length)
    return d <= 1 or 2.0 ** d - 1 <= max(int(asked), 2 ** int(exact_length) - 1)


def round_seed(key: tuple[int, ...], r: int) -> int:
    """The seed of round r of the sequence keyed ``key = (seed, q, *member)``:
    :func:`mptlml.seeds.spawn` ``(seed, q, r, *member)``. The round comes before the member's
    own keys, so the streams of a group (``(seed, q, r)``) and of its members
    (``(seed, q, r, j)``, ``j >= 1``) never meet (SeedSequence pads its entropy with zeros:
    ``(seed, q, r)`` is ``(seed, q, r, 0)``)."""
    return spawn(key[0], key[1], int(r), *key[2:])


def cells_error(cells: list[np.ndarray]) -> tuple[float, np.ndarray, np.ndarray]:
    """A round's estimate ``sum_c mean(cell_c)``, each cell's variance of the mean and its dof.

    A cell holds independent draws of one term (:func:`~mptlml.estimators.stats.cell_error`:
    ``var(ddof=1) / n`` on ``n - 1`` degrees of freedom; an
    :class:`~mptlml.estimators.stats.ExactCell` 0). A stratified round of the rate draw is
    H cells of two draws of ``y / H`` each: its variance ``sum_h (y_h1 - y_h2)^2 / (4 H^2)``
    on H degrees of freedom.
    """
    errs = [cell_error(c) for c in cells]
    return (float(sum(m for m, _, _ in errs)), np.array([v for _, v, _ in errs]),
            np.array([d for _, _, d in errs], dtype=np.float64))


def stratum_cells(y: np.ndarray) -> list[np.ndarray]:
    """A stratified round's draws (H strata of two, in stratum order) as :func:`cells_error`'s
    cells: stratum h is the cell ``(y_h1 / H, y_h2 / H)``, so the round's variance is
    ``sum_h (y_h1 - y_h2)^2 / (4 H^2)`` on H degrees of freedom."""
    h = len(y) // 2
    return list((y / h).reshape(h, 2))


def complement_cells(y: np.ndarray) -> list[np.ndarray]:
    """:func:`stratum_cells` of complementary draws (:func:`stratified_rates` with
    ``complement``): stratum h and its mirror ``H - 1 - h`` are one cell of two independent
    antithetic pairs ``((y_h1 + y_m1) / H, (y_h2 + y_m2) / H)``, so the round's variance is
    ``sum_{h < H/2} ((y_h1 + y_m1) - (y_h2 + y_m2))^2 / (4 H^2)`` on H / 2 degrees of freedom.
    """
    h = len(y) // 2
    pairs = (y / h).reshape(h, 2)
    return list(pairs[: h // 2] + pairs[h // 2:][::-1])


def weighted_rounds(rounds: dict[int, tuple[int, list[np.ndarray]]], by_cell: bool = False
                    ) -> dict[int, list[np.ndarray]]:
    """Each round's cells times its weight: ``sum_r w_r est_r``.

    ``w_r`` is the round's share of the draws (``n_r / sum_s n_s``). With ``by_cell`` (the
    cells of every round are the same strata in the same order, their draws allocated per
    round: :attr:`RoundDraw.cells_are_strata`) and as many cells in every round, cell k of
    round r weighs its own share of that stratum's draws, ``a_rk / sum_s a_sk``
    (:func:`cell_draws`): each stratum's draws pooled over the rounds, as if drawn at once,
    whatever the rounds' allocations (with equal counts, ``a_rk = n_r``, the same weights).
    Each round stays unbiased given its counts, fixed before its draws; the weights depend
    on the counts of every round, as a round's share does on where the rule stops.
    """
    total = sum(n for n, _ in rounds.values())
    if not total:
        return {}
    sizes = {len(cells) for _, cells in rounds.values()}
    if not by_cell or len(sizes) != 1:
        return {r: [c * (n / total) for c in cells] for r, (n, cells) in rounds.items()}
    draws = {r: [cell_draws(c, n) for c in cells] for r, (n, cells) in rounds.items()}
    per_cell = [sum(a[k] for a in draws.values()) for k in range(sizes.pop())]
    return {r: [c * (draws[r][k] / per_cell[k]) for k, c in enumerate(cells)]
            for r, (_, cells) in rounds.items()}


def cell_draws(cell: np.ndarray, asked: int) -> int:
    """The draws of a cell that weigh it among the rounds (:func:`weighted_rounds`): its
    rows (a cell of ``(P_h,)`` or ``(P_h, N)`` draws), or the round's ``asked`` draws for an
    :class:`~mptlml.estimators.stats.ExactCell` (its mean is the term itself, whatever it
    weighs)."""
    return int(asked) if isinstance(cell, ExactCell) else int(np.shape(cell)[0])


#: a round's error from its cells: ``error(cells) -> (estimate, variances, dofs)`` (the
#: variances of independent parts of the round, each on its dof): :func:`cells_error`, or an
#: estimator's own (:meth:`RoundDraw.round_error`)
RoundError = Callable[[list[np.ndarray]], tuple[float, np.ndarray, np.ndarray]]


def combine_rounds(terms: list[list[np.ndarray]], error: RoundError | None = None
                   ) -> tuple[float, float, float]:
    """Sum of rounds' (weighted) cells: estimate, standard error, Welch dof.

    Each round's error is ``error(cells)`` (default :func:`cells_error`); the rounds are
    independent, so their variances add, and the dof are Welch-Satterthwaite's over every
    round's parts."""
    error = error or cells_error
    est, var, dof = 0.0, [], []
    for cells in terms:
        m, v, d = error(cells)
        est += m
        var.append(v)
        dof.append(d)
    if not var:
        return 0.0, 0.0, math.inf
    v, d = np.concatenate(var), np.concatenate(dof)
    return est, math.sqrt(float(v.sum())), welch_dof(torch.from_numpy(v), torch.from_numpy(d))


def round_sizes(p: int, cap: int) -> list[int]:
    """Draws per member of each round: p, p, 2p, 4p, ... (the total doubles), <= ``cap``.

    Few looks (about log2(cap / p)) keep the Bonferroni threshold low, and every round's
    pairs add degrees of freedom fast; the last round takes what is left of the cap
    (rounded down to an even count).
    """
    sizes, total = [p], p
    while total + 2 <= cap:
        sizes.append(next_draws(total, cap))
        total += sizes[-1]
    return sizes


def at_target(se: float, dof: float, target: float) -> bool:
    """Whether a candidate's SE is at the target: at most ``target``, on at least
    :data:`TARGET_MIN_DOF` degrees of freedom (an SE that dipped below the target on
    few draws is most often an underestimate: stopping on it would break the promise)."""
    return se <= target and dof >= TARGET_MIN_DOF


def draws_needed(drawn: float, se: float, dof: float, target: float) -> float:
    """Draws a candidate needs for :func:`at_target`: SE^2 falls as 1 / n, the dof grow as n
    (unknown without dof: infinite, the next round doubles)."""
    if not dof > 0:
        return math.inf
    ratio = se / target
    need = drawn * ratio * ratio  # inf past a float (x ** 2 raised OverflowError)
    if math.isfinite(dof) and dof > 0:
        need = max(need, drawn * TARGET_MIN_DOF / dof)
    return need


def density_of(variance: np.ndarray) -> RateDensity:
    """The rate density in proportion to the spread by rate bin, floored (Neyman)."""
    sd = np.sqrt(variance)
    return RateDensity(np.maximum(sd, DENSITY_FLOOR * sd.max()) if sd.max() > 0
                    else np.ones(NUM_RATE_BINS))


def neyman_sd(spread_sum: np.ndarray, spread_n: np.ndarray,
              prior: np.ndarray | None = None) -> np.ndarray | None:
    """Each stratum's spread of one draw for Neyman's counts, pooled, not floored.

    ``sd_h = sqrt(spread_sum[h] / spread_n[h])`` (the variances of one draw measured so far,
    averaged); with ``prior`` (the call's variances, a group's own shrunk toward them as
    the rate density's are) ``sqrt((spread_sum[h] + PRIOR_PAIRS prior[h]) / (spread_n[h] +
    PRIOR_PAIRS))``; a stratum never measured is given the largest. None when nothing was
    measured or every spread is 0 (then equal counts).

    Notes
    -----
    Unlike the rate density (:func:`density_of`) the spreads are not floored at
    :data:`DENSITY_FLOOR` of the largest: a count does not weigh a draw by importance, so a
    small one cannot make the standard error heavy-tailed, and every stratum keeps at least
    2 draws a round (:func:`neyman_counts`). Spreads across a draw's rows differ by far more
    than ``1 / DENSITY_FLOOR`` (``cumulative`` on AntiBERTy's germlines: about 10 times
    between the rate bins), where a floor gave the quiet strata the draws the loud ones
    needed.
    """
    s, n = np.asarray(spread_sum, dtype=np.float64), np.asarray(spread_n, dtype=np.float64)
    if prior is not None:
        p = np.asarray(prior, dtype=np.float64)
        known = np.isfinite(p)
        s = s + np.where(known, PRIOR_PAIRS * np.nan_to_num(p), 0.0)
        n = n + np.where(known, PRIOR_PAIRS, 0.0)
    seen = n > 0
    if not seen.any():
        return None
    sd = np.sqrt(s / np.maximum(n, 1e-300))
    sd[~seen] = sd[seen].max()
    return sd if sd.max() > 0 else None


def neyman_counts(sd: np.ndarray, draws: int) -> np.ndarray:
    """Neyman's draws per stratum for a round of ``draws`` per stratum on average.

    ``c_h = P H w_h / sum_k w_k`` (rounded, at least 2: every stratum's spread stays
    estimable) with ``w_h = sd_h / sqrt(cost_h)``, the strata here of equal cost (a size of
    ``cumulative``, a row of a ragged draw: one masked input each), so ``w_h = sd_h``
    (:func:`neyman_sd`). For a fixed number of draws ``sum_h c_h`` these minimise the
    round's variance ``sum_h sd_h^2 / c_h`` (Lagrange multipliers).
    """
    w = np.asarray(sd, dtype=np.float64)
    return np.maximum(2, np.round(draws * len(w) * w / w.sum())).astype(np.int64)


def next_draws(drawn: int, cap: int, need: float | None = None) -> int:
    """Draws per member of the next round: double the draws so far, within ``cap``.

    Towards a target standard error (``need``: the draws it needs, ``n (se /
    target)^2`` from the draws so far, SE^2 falling as 1 / n), no more than the
    predicted remainder, with a margin of :data:`NEED_MARGIN`: the last round
    stops near the target instead of overshooting it up to twofold.
    """
    nxt = min(drawn, cap - drawn) // 2 * 2
    if need is not None and math.isfinite(need):
        nxt = min(nxt, 2 * math.ceil(NEED_MARGIN * (need - drawn) / 2))
    return max(2, nxt)


def stratified_rates(g: torch.Generator, p: int, tmax: int, density: RateDensity,
                     complement: bool = False, per_stratum: int = 2
                     ) -> tuple[np.ndarray, np.ndarray, torch.Tensor]:
    """Stratified rates (two per stratum of equal q-mass) and a random order of positions.

    ``per_stratum=1``: P strata of one draw each (any P; no variance estimator of the
    stratified mean is unbiased then, the draws' i.i.d. one errs on the large side), for
    the GRPO log-ratios' draw (:mod:`mptlml.hf.logratio`).

    With ``complement`` (P a multiple of 4, q symmetric: ``q(r) = q(1 - r)``) only the lower
    half of the strata draw: stratum ``H - 1 - h`` takes the rates ``1 - r`` of stratum h
    and the reversed orders, so its masks are the complements of stratum h's (size
    ``ceil((1 - r)(T - 1)) = T - ceil(r (T - 1))`` almost surely, positions the others of
    the order, for every T): antithetic draws, each still a uniform mask at a stratified
    rate, whose pair sums :func:`complement_cells` reads.
    """
    if per_stratum == 1 and not complement:
        v = torch.rand(p, generator=g, dtype=torch.float64).numpy()
        rates = density.inverse((np.arange(p) + v) / p)
        return np.arange(p), rates, torch.rand(p, tmax, generator=g).argsort(dim=1)
    if per_stratum != 2:
        raise ValueError(f"per_stratum must be 1 (not with complement) or 2, got "
                         f"{per_stratum!r}.")
    h = p // 2
    if complement:
        if p % 4 or not np.allclose(density.mass, density.mass[::-1]):
            raise ValueError(f"complementary masks need a multiple of 4 draws and a "
                             f"symmetric rate density; got {p} draws.")
        v = torch.rand(h // 2, 2, generator=g, dtype=torch.float64).numpy()
        lo = density.inverse(((np.arange(h // 2)[:, None] + v) / h).reshape(-1))
        first = torch.rand(p // 2, tmax, generator=g).argsort(dim=1)
        rates = np.concatenate([lo, (1.0 - lo).reshape(-1, 2)[::-1].reshape(-1)])
        order = torch.cat([first, first.flip(1).reshape(h // 2, 2, tmax).flip(0)
                           .reshape(-1, tmax)])
        return np.repeat(np.arange(h), 2), rates, order
    v = torch.rand(h, 2, generator=g, dtype=torch.float64).numpy()
    u = (np.arange(h)[:, None] + v) / h
    rates = density.inverse(u.reshape(-1))
    order = torch.rand(p, tmax, generator=g).argsort(dim=1)
    return np.repeat(np.arange(h), 2), rates, order


def masks_at_rates(length: int, rates: np.ndarray, order: torch.Tensor,
                   distinct_pairs: bool = True) -> tuple[torch.Tensor, np.ndarray]:
    """Masks ``(P, T)`` of sizes ceil(r (T-1)) on the first positions of the shared order.

    With ``distinct_pairs`` (a sequence drawn alone, or a group of candidates of one length,
    which then swap alike and stay equal draw for draw; candidates of several lengths keep
    their nested masks instead, and a repeat's standard error 0 is announced as not exact)
    the two draws of a stratum (rows 2h, 2h+1) never repeat each other: where both have
    size M and the second order's first M positions are the first's, the second takes its
    positions ranked 0..M-2 and M (its last masked position swapped for its first visible
    one; M < T). Each draw stays a uniform mask of its size (the swap commutes with the
    positions' permutations), so the estimate is unbiased; the pair's covariance becomes
    ``y^T (K - I) y / N^2 <= 0`` (K the averaging over masks one swap apart, a symmetric
    stochastic matrix), so its variance falls and the pair's ``(y_1 - y_2)^2 / 4`` errs on
    the large side. Without it a short continuation's pair repeated one mask (1 in T at
    M = 1 or T - 1) and reported a standard error of 0.
    """
    p = len(rates)
    sizes = np.clip(np.ceil(rates * (length - 1)), 1, length - 1).astype(np.int64)
    keep = order[order < length].reshape(p, length)  # the shared order restricted to T
    rank = torch.empty_like(keep)
    rank.scatter_(1, keep, torch.arange(length).expand(p, -1))
    size = torch.as_tensor(sizes)[:, None]
    m = rank < size
    if p >= 2 and distinct_pairs:
        first, second = m[0::2][: p // 2], m[1::2][: p // 2]
        same = (first == second).all(1).nonzero().flatten()
        for h in same.tolist():
            k = 2 * h + 1
            m[k] = (rank[k] < size[k] - 1) | (rank[k] == size[k])
    return m, sizes


# ---------------------------------------------------------------------- the engine
#: every ``stop_reason`` a result of :func:`mptlml.estimate_lml`, :func:`mptlml.mpt_curve` or
#: :func:`mptlml.compare` may carry (None: no stop rule was asked), by meaning
STOP_REASONS: dict[str, str] = {
    "exact": "every draw is an enumeration (each sequence short enough to score on every "
             "mask): the result is exact, standard error 0",
    "fixed": "no stop rule: the draws asked (num_masks, or max_masks alone) were spent",
    "target": "every standard error at target_se (on at least TARGET_MIN_DOF degrees of "
              "freedom)",
    "budget": "max_masks was spent before the target or the decision: the standard error is "
              "above the target, or the question undecided",
    "decided": "compare(decide=True): the leader is ahead of every other candidate beyond the "
               "threshold",
    "tied": "compare(decide=True): every other candidate behind the leader or confidently "
            "within delta of it, at least one tied",
    "precision": "compare(decide=True): undecided, but every pair of the leader and a candidate "
                 "not behind it nor tied known at least as precisely (paired standard error, "
                 "on at least TARGET_MIN_DOF degrees of freedom) as LLaDA's scheme would know "
                 "it on max_masks masked inputs per candidate: more draws cannot make the "
                 "choice less accurate than LLaDA's",
}


@dataclass
class Tally:
    """One sequence's (candidate's) draws so far.

    ``exact``: the terms known exactly, added once (the whole-continuation term of the rate
    draw, or the enumerated sum of a sequence scored on every mask); ``rounds``: round index
    -> (draws, cells), each round an unbiased estimate of the rest; ``rows``: masked inputs
    scored for it; ``enumerated``: scored on every mask (exact, no rounds); ``by_cell``: its
    rounds' cells are strata whose draws were allocated (:attr:`RoundDraw.cells_are_strata`),
    combined cell by cell (:func:`weighted_rounds`).
    """

    exact: float = 0.0
    rounds: dict[int, tuple[int, list[np.ndarray]]] = field(default_factory=dict)
    rows: int = 0
    enumerated: bool = False
    by_cell: bool = False
    #: a round's error from its cells (the draw's :meth:`RoundDraw.round_error`)
    error: RoundError | None = field(default=None, repr=False, compare=False)

    def stats(self) -> tuple[float, float, float]:
        """Estimate ``exact + sum_r w_r est_r`` (``w_r`` its share of the draws), SE, dof.

        A standard error 0 from draws that are not all enumerations (every pair of a few
        draws fell on one mask) says nothing of the spread: its dof are 0, so it is never
        taken as at a target (:func:`at_target`)."""
        est, se, dof = combine_rounds(list(weighted_rounds(self.rounds, self.by_cell).values()),
                                      self.error)
        if se == 0 and any(not isinstance(c, ExactCell)
                           for _, cells in self.rounds.values() for c in cells):
            dof = 0.0
        return est + self.exact, se, dof


def paired(lead: Tally, other: Tally) -> tuple[float, float, float]:
    """``lead - other`` on the rounds both drew in (common random numbers): estimate, SE, dof.

    A round's cells are differenced draw by draw when both candidates' cells line up (the
    same number of cells of the same sizes: the same stratified rates and mask positions, or
    an estimator's draws on two sequences of one length from one seed); otherwise the two
    rounds count as independent (their variances add). A candidate that stopped drawing is
    compared on its own rounds, the leader's draws of those rounds weighted the same; an
    exact candidate (no rounds) with all the leader's rounds.
    """
    ra, rb = set(lead.rounds), set(other.rounds)
    common = ra & rb if ra and rb else ra | rb
    a = weighted_rounds({r: lead.rounds[r] for r in common if r in ra}, lead.by_cell)
    b = weighted_rounds({r: other.rounds[r] for r in common if r in rb}, other.by_cell)
    diff = []
    for r in sorted(common):
        ca, cb = a.get(r, []), b.get(r, [])
        if ca and cb and len(ca) == len(cb) and all(x.shape == y.shape
                                                    for x, y in zip(ca, cb, strict=True)):
            diff.append([(x - y) if isinstance(x, ExactCell) and isinstance(y, ExactCell)
                         else np.asarray(x) - np.asarray(y) for x, y in zip(ca, cb, strict=True)])
        else:
            diff.append(ca + [-c for c in cb])
    est, se, dof = combine_rounds(diff)
    return est + lead.exact - other.exact, se, dof


class RoundDraw:
    """What the engine asks of an estimator's draw: which sequences it enumerates, the
    cells of one round, and what it learns between rounds (base class: nothing)."""

    #: the allocation reported in the result (``"neyman"`` or ``"uniform"``; None: one row per
    #: draw, nothing to allocate)
    allocation: str | None = None
    #: the estimator whose draws these are (None: the rate draw)
    name: str | None = None

    @property
    def cells_are_strata(self) -> bool:
        """Whether every round's cells are the same strata, in the same order, with draws
        allocated to each (Neyman's counts): the rounds are then combined cell by cell
        (:func:`weighted_rounds`). False here (the rate draw's cells are its round's own
        strata of equal q-mass)."""
        return False

    def bind(self, lengths: np.ndarray, groups: list[list[int]],
             keys: list[tuple[int, ...]]) -> None:
        """The sequences' lengths, their groups (questions) and each one's seed key."""
        self.lengths, self.groups, self.keys = lengths, groups, keys
        self.group_of = {i: q for q, m in enumerate(groups) for i in m}

    def lengths_of(self, ids: list[Any]) -> np.ndarray:
        """The length of each sequence (its units; dense data: D)."""
        return np.array([len(t) for t in ids], dtype=np.int64)

    def fingerprint(self) -> dict[str, Any]:
        """What decides the draws besides the seeds and the data, for a checkpoint: the
        draw (its estimator and options) and its allocation."""
        return {"draw": self.name, "allocation": self.allocation}

    def check_size(self, lengths: np.ndarray, caps: list[int], what: str,
                   remedy: str | None) -> None:
        """Refuse, before any draw, a run whose cap (``caps[i]`` draws of sequence i) could
        score more than ``mptlml.settings.max_masked_inputs`` masked inputs
        (:func:`~mptlml._scoring.ragged.check_run_size`)."""
        check_run_size([self.most_rows(int(d), self.round_size(c))
                        for d, c in zip(lengths, caps, strict=True)], lengths.tolist(), what,
                       remedy)

    def enumerates(self, length: int) -> bool:
        raise NotImplementedError

    def round_size(self, draws: int) -> int:
        """The draws a round takes when ``draws`` are asked (an estimator drawing whole
        batches rounds up to a multiple of its batch)."""
        return draws

    def most_rows(self, length: int, draws: int) -> int:
        """The most masked inputs ``draws`` draws of a sequence of ``length`` can score."""
        raise NotImplementedError

    def draws_within(self, length: int, rows: int) -> int:
        """The most draws of a sequence of ``length`` (one the draw does not enumerate) whose
        masked inputs stay within ``rows``: ``max_masks``, masked inputs per sequence, as the
        engine's cap in draws (a whole number of :meth:`round_size` units)."""
        raise NotImplementedError

    def fit_cap(self, first: int, cap: int) -> int:
        """A cap (draws per member) every round within which the draw can take, from a first
        round of ``first`` draws: unchanged unless overridden (:meth:`CellDraw.fit_cap`)."""
        return int(cap)

    def round_error(self, cells: list[np.ndarray]) -> tuple[float, np.ndarray, np.ndarray]:
        """A round's estimate of one sequence, and the variances and dof of its independent
        parts: :func:`cells_error` (each cell's ``var(ddof=1) / n``) unless overridden
        (:meth:`CellDraw.round_error`: the estimator's own)."""
        return cells_error(cells)

    def draw_text(self, length: int, draws: int) -> str:
        """How ``draws`` draws of a sequence of ``length`` score their masked inputs, for a
        refusal (the rate draw: the whole continuation's row besides)."""
        return ""

    def score(self, scorer: Any, ids: list[torch.Tensor], todo: list[tuple[int, int]], r: int,
              run: dict[str, Any]) -> tuple[dict[int, tuple[list[np.ndarray] | None, float, int]],
                                            int]:
        """Round r of the sequences ``todo`` ((sequence, draws) pairs): per sequence its
        cells (None when enumerated), the exact part to add, the masked inputs; and the
        model calls."""
        raise NotImplementedError

    def learn(self, active: list[int]) -> None:
        """After a round of the groups ``active``."""

    def reference_var(self, i: int) -> tuple[float, int] | None:
        """LLaDA's variance of one draw of sequence i (within-size part) and the pairs it rests
        on, where the draw can estimate it (:meth:`RateDraw.reference_var`); None where not
        (no ``"precision"`` stop)."""
        return None


class CellDraw(RoundDraw):
    """Any ragged estimator's own draws as rounds, its rows allocated as the rounds learn.

    A round of ``P`` draws scores :meth:`~mptlml.estimators.Estimator.sequence_cells` of
    ``est.with_draws(P)``, seeded by the sequence's key and the round (sequences sharing a
    key, equal-length candidates of a question, get the same draws); the sequences of a
    round drawing ``P`` each are scored in one call of the ragged runner (batched by its
    token budget), each sequence's generator that of its own seed; a sequence it would
    score on every mask (:meth:`~mptlml.estimators.Estimator.enumerates_sequence`) is
    enumerated once (exact). An estimator whose draw is a sum of several rows (the sizes
    1..D_i of ``cumulative``, pooled in the strata of
    :meth:`~mptlml.estimators.Estimator.ragged_strata`) gets, after the first round, the
    ``R P`` masks of a round over its R rows in proportion to the spread of a row's term in
    its stratum (Neyman: ``c_k = R P s_h(k) / sum_j s_h(j)``, at least 2, not floored:
    :func:`neyman_sd`), the spread its group's own (its sequences' rows so far), shrunk
    toward the call's by :data:`PRIOR_PAIRS`, a stratum never drawn given the largest; each
    round is unbiased given the counts, fixed before its draws, and the rounds are combined
    row by row, each row's draws pooled over the rounds (:func:`weighted_rounds` with
    ``by_cell``).
    """

    def __init__(self, est: Any, allocation: str | None = "neyman") -> None:
        self.est, self.allocation, self.name = est, allocation, est.name
        #: a plain estimate's one round (no allocation): the estimator's own error
        self.plain = allocation is None

    @property
    def cells_are_strata(self) -> bool:
        """A round's cells are the rows of a draw, allocated by Neyman's counts."""
        return self.allocation == "neyman"

    def bind(self, lengths: np.ndarray, groups: list[list[int]],
             keys: list[tuple[int, ...]]) -> None:
        super().bind(lengths, groups, keys)
        self.strata, h = self.est.ragged_strata(lengths)
        #: each group's spread of a row's term by stratum (sum of variances, their number)
        self.spread_sum, self.spread_n = np.zeros((len(groups), h)), np.zeros((len(groups), h))
        #: each group's spreads for Neyman's counts (None: equal counts)
        self.sd: list[np.ndarray | None] = [None] * len(groups)
        if h < 2:  # one row per draw: nothing to allocate
            self.allocation = None

    def enumerates(self, length: int) -> bool:
        return bool(self.est.enumerates_sequence(int(length)))

    def fingerprint(self) -> dict[str, Any]:
        return {**super().fingerprint(), "estimator": self.est.fingerprint()}

    def round_size(self, draws: int) -> int:
        unit = int(self.est.draw_unit)
        return -(-int(draws) // unit) * unit

    def most_rows(self, length: int, draws: int) -> int:
        if self.enumerates(length):
            return 2 ** length - 1
        return int(self.est.masks_per_draw(int(length))) * int(draws)

    def draws_within(self, length: int, rows: int) -> int:
        unit = int(self.est.draw_unit)
        return int(rows) // int(self.est.masks_per_draw(int(length))) // unit * unit

    def round_error(self, cells: list[np.ndarray]) -> tuple[float, np.ndarray, np.ndarray]:
        """A plain estimate's round (``allocation=None``): the estimator's own error of a
        sequence's cells (:meth:`~mptlml.estimators.Estimator.sequence_error`:
        ``cumulative``'s pooled sizes at two draws a size; with one draw a cell, the
        successive differences over the rows, on unknown (NaN) degrees of freedom), as one
        variance on its Welch dof. A target's rounds: the cells' (:func:`cells_error`), the
        error the stop rule reads round after round (``cumulative``'s pooled error exists
        for two draws a size, a target's first round only: taking it there would raise
        the first round's SE alone and draw a round more)."""
        if not self.plain:
            return cells_error(cells)
        drawn = [c for c in cells if not isinstance(c, ExactCell)]
        single = bool(drawn) and all(np.asarray(c).shape[0] == 1 for c in drawn)
        tot, se, var, dofs = self.est.sequence_error(cells, single)
        dof = math.nan if single else welch_dof(
            torch.as_tensor(np.asarray(var, dtype=np.float64)),
            torch.as_tensor(np.asarray(dofs, dtype=np.float64)))
        return tot, np.array([se * se]), np.array([dof], dtype=np.float64)

    def draw_text(self, length: int, draws: int) -> str:
        return (f" of estimator {self.name!r}, "
                f"{int(self.est.masks_per_draw(int(length)))} masked inputs each")

    def fit_cap(self, first: int, cap: int) -> int:
        """The cap at which every round of an estimator drawing whole batches (``draw_unit``
        b > 1, LLaDA's) holds at least two batches.

        The rounds double the draws so far (:func:`next_draws`) and the last takes what is
        left of the cap: a last round of one batch would have no spread of its batch means,
        a NaN standard error. The cap is lowered to the draws before such a round (and to a
        whole number of batches); other draws pass unchanged.
        """
        unit = int(self.est.draw_unit)
        if unit == 1:
            return int(cap)
        cap = int(cap) // unit * unit
        drawn = self.round_size(first)
        while drawn + 2 <= cap:
            nxt = self.round_size(next_draws(drawn, cap))
            if nxt < 2 * unit:
                cap = drawn
                break
            drawn += nxt
        return max(cap, self.round_size(first))

    def counts(self, i: int, p: int) -> np.ndarray:
        """Draws per row of sequence i's round of ``p``: ``p`` each, or Neyman's."""
        rows = self.strata[i]
        sd = self.sd[self.group_of[i]]
        if sd is None or len(rows) < 2:
            return np.full(len(rows), int(p), dtype=np.int64)
        return neyman_counts(sd[rows], p)

    def score(self, scorer: Any, ids: list[torch.Tensor], todo: list[tuple[int, int]], r: int,
              run: dict[str, Any]) -> tuple[dict[int, tuple[list[np.ndarray] | None, float, int]],
                                            int]:
        res: dict[int, tuple[list[np.ndarray] | None, float, int]] = {}
        calls = 0
        whole = [i for i, _ in todo if self.enumerates(int(self.lengths[i]))]
        if whole:
            out = run_pairs(scorer, [ids[i] for i in whole],
                            lambda k, d, g: every_mask(d), seed=0, tag="every_mask",
                            spec={"kind": "every_mask",
                                  "total_pairs": int(sum(2 ** len(ids[i]) - 1 for i in whole))},
                            desc="every mask", **_round_dir(run, r, "every_mask"))
            calls += out.num_model_calls
            for i, s in zip(whole, out.sums, strict=True):
                t = int(self.lengths[i])
                res[i] = (None, enumerated_sum(np.asarray(s), every_mask(t).sum(1).numpy()),
                          2 ** t - 1)
        by_draws: dict[int, list[int]] = {}
        for i, p in todo:
            if i not in res:
                by_draws.setdefault(int(p), []).append(i)
        for p, seqs in sorted(by_draws.items()):  # one batched call per round size
            est = self.est.with_draws(p)
            counts = [self.counts(i, p) for i in seqs]
            # sequence i's generator as if drawn alone from its round seed (sequence 0)
            seeds = [spawn(round_seed(self.keys[i], r), 0) for i in seqs]
            cells, c = est.sequence_cells(scorer, [ids[i] for i in seqs], counts, seeds,
                                          **_round_dir(run, r, f"draws_{p:06d}"))
            calls += c
            for i, cnt, cl in zip(seqs, counts, cells, strict=True):
                res[i] = (list(cl), 0.0, int(est.scored_rows(int(self.lengths[i]), cnt)))
                if len(self.strata[i]) == len(cl):
                    q = self.group_of[i]
                    for h, cell in zip(self.strata[i], cl, strict=True):
                        if not isinstance(cell, ExactCell) and cell.size > 1:
                            self.spread_sum[q, h] += float(np.var(cell, ddof=1))
                            self.spread_n[q, h] += 1
        return res, calls

    def learn(self, active: list[int]) -> None:
        n = self.spread_n.sum(0)
        if self.allocation != "neyman" or len(n) < 2 or not (n > 0).any():
            return
        # the call's variances (NaN where never drawn); a stratum never drawn keeps the most
        pooled = np.where(n > 0, self.spread_sum.sum(0) / np.maximum(n, 1), np.nan)
        for q in active:  # its own spread, shrunk toward the call's by PRIOR_PAIRS
            self.sd[q] = neyman_sd(self.spread_sum[q], self.spread_n[q], pooled)


class DenseDraw(RoundDraw):
    """An estimator's draws on dense ``(N, D)`` data as rounds: the data set is one member of
    one group.

    A round of ``P`` draws per stratum scores
    :meth:`~mptlml.estimators.Estimator.stratum_draws` (``counts[h]`` draws of each stratum
    h of a draw: a mask size of ``cumulative``; the whole draw of a one-stratum estimator)
    from the run's one generator, in order (the same seed, the same rounds). Its cells, one
    per stratum, give the variance of :func:`~mptlml.estimators.stats.strata_stderr`: with
    independent masks per datum the ``(P_h, N)`` draws over N (N independent columns:
    ``sum_n var_n / (P_h N^2)`` on P_h - 1 dof each), with shared masks the data means
    ``(P_h,)`` (``var / P_h``). After each round the spread of one draw of each stratum
    (averaged over the data, or of the data means with shared masks) is pooled over the
    rounds, and the next round's counts are Neyman's (:func:`neyman_sd`,
    :func:`neyman_counts`: ``c_h = P H sd_h / sum_k sd_k``, at least 2, not floored),
    trimmed from the largest so that a round never draws more than ``P H`` (``max_masks``
    stays a bound), and the rounds are combined stratum by stratum, each stratum's draws
    pooled over the rounds (:func:`weighted_rounds` with ``by_cell``);
    ``allocation="uniform"`` keeps ``P`` each. Each round is unbiased given its counts,
    fixed before its draws.

    Parameters
    ----------
    est : Estimator
    num_tokens, num_data : int
        D and N.
    generator : torch.Generator
        The run's generator: every round draws from it in turn.
    counter : Counter
        The run's model calls and masked inputs.
    progress : bool
    allocation : {"neyman", "uniform"}
    sizes : list of int, optional
        The sizes drawn (:func:`mptlml.mpt_curve`'s subset; default the estimator's strata).
    scale : float
        A factor on every draw (the curve's ``D / len(sizes)`` of a subset's area).
    """

    def __init__(self, est: Any, num_tokens: int, num_data: int, generator: torch.Generator,
                 counter: Any, *, progress: bool = False, allocation: str = "neyman",
                 sizes: list[int] | None = None, scale: float = 1.0) -> None:
        self.est, self.d, self.n = est, int(num_tokens), int(num_data)
        self.generator, self.counter, self.progress = generator, counter, progress
        self.allocation, self.sizes, self.scale = allocation, sizes, float(scale)
        strata = est.strata(self.d) if sizes is None else sizes
        self.num_strata = 1 if strata is None else len(strata)
        #: masked inputs per datum of one draw of every stratum
        self.per_draw = len(sizes) if sizes is not None else int(est.masks_per_draw(self.d))
        self.spread_sum, self.spread_n = np.zeros(self.num_strata), np.zeros(self.num_strata)
        self.sd: np.ndarray | None = None
        #: round -> (per-stratum, per-datum means (H, N), their variances (H, N), counts (H,))
        self.per_datum: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        if self.num_strata < 2:  # one stratum: nothing to allocate
            self.allocation = None

    @property
    def cells_are_strata(self) -> bool:
        """A round's cells are the strata of a draw, allocated by Neyman's counts."""
        return self.allocation == "neyman"

    def lengths_of(self, ids: list[Any]) -> np.ndarray:
        return np.array([self.d] * len(ids), dtype=np.int64)

    def check_size(self, lengths: np.ndarray, caps: list[int], what: str,
                   remedy: str | None) -> None:
        """Refuse, before any draw, a cap of more than ``mptlml.settings.max_masked_inputs``
        masked inputs (:func:`~mptlml._scoring.dense.check_masked_inputs`)."""
        per_datum = sum(self.most_rows(int(d), self.round_size(c))
                        for d, c in zip(lengths, caps, strict=True))
        check_masked_inputs(per_datum * self.n, f"{what} ({per_datum:,} masked inputs per "
                            "datum at most)", remedy or "lower max_masks")

    def enumerates(self, length: int) -> bool:
        return False

    def most_rows(self, length: int, draws: int) -> int:
        return self.per_draw * int(draws)

    def draws_within(self, length: int, rows: int) -> int:
        return int(rows) // self.per_draw

    def draw_text(self, length: int, draws: int) -> str:
        return (f" of every stratum, {self.per_draw} masked inputs per datum each"
                if self.num_strata > 1 else f", {self.per_draw} masked inputs per datum each")

    def counts(self, p: int) -> np.ndarray:
        """Draws per stratum of a round of ``p``: ``p`` each, or Neyman's within ``p H``."""
        h = self.num_strata
        if self.sd is None:
            return np.full(h, int(p), dtype=np.int64)
        c = neyman_counts(self.sd, p)
        while c.sum() > p * h:  # rounding up overshot: keep the round within p H draws
            c[int(np.argmax(c))] -= 1
        return c

    def score(self, scorer: Any, ids: list[Any], todo: list[tuple[int, int]], r: int,
              run: dict[str, Any]) -> tuple[dict[int, tuple[list[np.ndarray] | None, float, int]],
                                            int]:
        ((i, p),) = todo
        counts = self.counts(p)
        rows, calls = self.counter.rows, self.counter.calls
        kw = {} if self.sizes is None else {"sizes": self.sizes}
        draws = self.est.stratum_draws(scorer, ids[i], counts.tolist(), self.generator,
                                       self.counter, self.progress, **kw)
        cells, means, var = [], [], []
        shared = bool(self.est.share_masks)
        for h, c in enumerate(draws):
            y = c.detach().double().cpu().numpy() * self.scale  # (P_h, N)
            means.append(y.mean(0))
            var.append(y.var(0, ddof=1) / y.shape[0])
            if shared:  # one mask per draw for every datum: the data means are independent
                cells.append(y.mean(1))
                self.spread_sum[h] += float(cells[-1].var(ddof=1))
            else:  # N independent columns
                cells.append(y / self.n)
                self.spread_sum[h] += float(y.var(0, ddof=1).mean())
            self.spread_n[h] += 1
        self.per_datum[r] = (np.stack(means), np.stack(var), counts)
        return ({i: (cells, 0.0, self.counter.rows - rows)},
                self.counter.calls - calls)

    def learn(self, active: list[int]) -> None:
        if self.allocation == "neyman":
            self.sd = neyman_sd(self.spread_sum, self.spread_n)

    def combined(self, tally: Tally) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per stratum and datum, the rounds' means combined by their draws (the weights of
        :func:`weighted_rounds`: a round's share of the draws, or with Neyman's counts
        (:attr:`cells_are_strata`) a stratum's round's share of that stratum's draws), the
        variance of that (``sum_r w_r^2 var_r``), and the draws of each stratum over the
        rounds: ``(H, N)``, ``(H, N)``, ``(H,)``."""
        total = sum(n for n, _ in tally.rounds.values())
        counts = np.zeros(self.num_strata, dtype=np.int64)
        for r in tally.rounds:
            counts += self.per_datum[r][2]
        mean = np.zeros((self.num_strata, self.n))
        var = np.zeros((self.num_strata, self.n))
        for r, (n, _) in tally.rounds.items():
            m, v, c = self.per_datum[r]
            w = (c / counts)[:, None] if tally.by_cell else n / total
            mean += m * w
            var += v * w ** 2
        return mean, var, counts


def _round_dir(run: dict[str, Any], r: int, part: str = "") -> dict[str, Any]:
    """The runner's options for one call of round r: a checkpoint folder of its own under
    ``checkpoint_dir/sequential`` (a rerun of the same call redraws the same rounds from the
    same seeds and reuses their finished chunks)."""
    if run.get("checkpoint_dir") is None:
        return run
    return {**run, "checkpoint_dir": Path(run["checkpoint_dir"]) / "sequential"
            / f"round_{r:03d}" / part}


#: a stop rule: ``rule(group, members, tallies, at_cap) -> (drawing, status, need)``: the
#: members still drawing, the group's stop reason (None: go on) and the draws per member the
#: next round is predicted to need (None: double)
Rule = Callable[[int, list[int], list[Tally], bool], tuple[set[int], "str | None", "float | None"]]


@dataclass
class SequentialRun:
    """What :func:`run_rounds` returns: per sequence its tally, per group its rounds, draws
    per member and stop reason, and the model calls."""

    tallies: list[Tally]
    rounds: list[int]
    drawn: list[int]
    stop_reason: list[str]
    num_model_calls: int
    enumerated: np.ndarray


def check_run_fingerprint(draw: RoundDraw, scorer: Any, ids: list[torch.Tensor],
                          groups: list[list[int]], keys: list[tuple[int, ...]], num_masks: int,
                          caps: Sequence[int], run: dict[str, Any]) -> None:
    """Refuse, before the first round, a ``checkpoint_dir`` that holds another run's rounds.

    The run's fingerprint is everything that decides its draws: the draw
    (:meth:`RoundDraw.fingerprint`: the estimator, its options, the allocation), every
    sequence's seed key, the groups, the first round's draws and the caps, the data (a
    SHA-256 of the ids) and the model. It is written to ``checkpoint_dir/sequential/
    meta.json`` by the first run and compared by every later one
    (:func:`~mptlml._scoring.checkpoints.check_meta`): a mismatch is a
    :class:`~mptlml._scoring.checkpoints.CheckpointError` naming the keys that differ
    (``seeds``, ``allocation``, ...). Each round's chunks keep their own fingerprint too.
    """
    h = hashlib.sha256()
    for t in ids:
        h.update(np.asarray(t.detach().cpu() if isinstance(t, torch.Tensor) else t,
                            dtype=np.int64).tobytes())
        h.update(b"|")
    model = scorer.fingerprint() if hasattr(scorer, "fingerprint") else {}
    meta = {**draw.fingerprint(), "seeds": [[int(k) for k in key] for key in keys],
            "groups": [[int(i) for i in m] for m in groups], "num_masks": int(num_masks),
            "caps": [int(c) for c in caps], "data_sha256": h.hexdigest(),
            "model": model}
    ckpt = Path(run["checkpoint_dir"]) / "sequential"
    ckpt.mkdir(parents=True, exist_ok=True)
    check_meta(ckpt, json.loads(json.dumps(meta, default=str)), write=True)


def target_rule(targets: Sequence[float]) -> Rule:
    """Stop a group once every member's SE is at its target (:func:`at_target`): members at
    it stop drawing; the next round draws what the slowest needs (:func:`draws_needed`);
    at the cap ``"budget"``."""

    def rule(q: int, members: list[int], tallies: list[Tally], at_cap: bool
             ) -> tuple[set[int], str | None, float | None]:
        stats = {i: tallies[i].stats() for i in members if not tallies[i].enumerated}
        drawing = {i for i, (_, se, dof) in stats.items() if not at_target(se, dof, targets[i])}
        if not drawing:
            return drawing, "target", None
        if at_cap:
            return drawing, "budget", None
        drawn = max(sum(n for n, _ in tallies[i].rounds.values()) for i in drawing)
        return drawing, None, max(draws_needed(float(drawn), stats[i][1], stats[i][2],
                                               targets[i]) for i in drawing)

    return rule


def fixed_rule(q: int, members: list[int], tallies: list[Tally], at_cap: bool
               ) -> tuple[set[int], str | None, float | None]:
    """No stop rule: draw until the cap (:func:`draw_caps`: ``max_masks``, or one round of
    ``num_masks``)."""
    return {i for i in members if not tallies[i].enumerated}, "fixed" if at_cap else None, None


def draw_caps(draw: RoundDraw, num_masks: int, lengths: np.ndarray, groups: list[list[int]],
              max_masks: int | None, *, default: int, noun: str = "sequence",
              group_noun: str = "sequence") -> list[int]:
    """``max_masks`` (masked inputs per member) as the engine's caps: draws per member of each
    group; the one conversion, and the one refusal below the first round.

    A group's cap is the most draws (:meth:`RoundDraw.draws_within`) that keep every member
    it draws within ``max_masks``, the fewest over its members (they draw together); a member
    the draw enumerates (2^T - 1 masks) is exempt, and a group of such members gets the first
    round. Without ``max_masks``, ``default`` draws (at least the first round's). Each cap is
    then fitted to the draw (:meth:`RoundDraw.fit_cap`: an estimator drawing whole batches).

    Raises
    ------
    ValueError
        Before any draw, naming the member, when the first round alone (``num_masks`` draws,
        :meth:`RoundDraw.round_size`) passes ``max_masks``.
    """
    first = draw.round_size(int(num_masks))
    if max_masks is None:
        caps = [max(first, int(default))] * len(groups)
    else:
        caps = []
        for q, idx in enumerate(groups):
            drawn = {int(lengths[i]) for i in idx if not draw.enumerates(int(lengths[i]))}
            if not drawn:  # every member exact: nothing to cap
                caps.append(first)
                continue
            t = min(drawn, key=lambda d: (draw.draws_within(d, max_masks), -d))
            cap = draw.draws_within(t, max_masks)
            if cap < first:
                need = draw.most_rows(t, first)
                where = f" ({group_noun} {q})" if group_noun else ""
                raise ValueError(
                    f"max_masks={max_masks} (masked inputs per {noun}) is below the first "
                    f"round's {need}: {first} draws of a {t}-token {noun}{where}"
                    f"{draw.draw_text(t, first)}. Raise max_masks to at least {need}, or "
                    "lower num_masks.")
            caps.append(cap)
    return [draw.fit_cap(first, c) for c in caps]


def merge_stops(reasons: Sequence[str]) -> str | None:
    """The stop reason of a result over several groups: ``"budget"`` when any group spent
    its cap, ``"exact"`` when every one was exact, else the first other reason (``"target"``,
    ``"fixed"``, ...); None for no group."""
    reasons = [str(r) for r in reasons]
    if not reasons:
        return None
    if "budget" in reasons:
        return "budget"
    return next((r for r in reasons if r != "exact"), reasons[0])


def run_rounds(draw: RoundDraw, scorer: Any, ids: list[torch.Tensor], groups: list[list[int]],
               keys: list[tuple[int, ...]], *, num_masks: int, caps: Sequence[int],
               rule: Rule, run: dict[str, Any], what: str = "the sequential draws",
               remedy: str | None = "lower max_masks") -> SequentialRun:
    """The sequential engine: rounds of ``draw`` over groups of sequences until each stops.

    Every group (a question's candidates; one sequence for an estimate) starts with
    ``num_masks`` draws per member (a member enumerated by the draw is scored on every mask
    once, exact); after each round the draw learns (the rate density, pooled over the call)
    and ``rule`` says which members go on drawing and whether the group stops; the next
    round doubles the draws so far (:func:`next_draws`), or draws what the rule predicts it
    needs, within ``caps[q]`` draws per member (at the cap the rule names the stop).
    The rounds of all active groups are scored together (one batch of masks per round).

    Parameters
    ----------
    draw : RoundDraw
        :class:`~mptlml.estimators.learned_rate.RateDraw` or :class:`CellDraw` (an
        estimator's draws on ragged sequences),
        or :class:`DenseDraw` (an estimator's draws on dense data: one member, the data set).
    scorer : RaggedMaskedModel or MaskedModel
        The model (with its contexts, :func:`mptlml.models.conditional.with_context`).
    ids : list of LongTensor
        The sequences' (continuations') content ids (dense: ``[x]``, the ``(N, D)`` data).
    groups : list of list of int
        The sequences of each group (common random numbers within it).
    keys : list of (int, int)
        The seed key of each sequence: round r of sequence i draws from
        :func:`round_seed` ``(keys[i], r)``.
    num_masks : int
        Draws per member in the first round.
    caps : list of int
        Most draws per member of each group (:func:`draw_caps`: ``max_masks``, masked inputs
        per member, converted).
    rule : callable
        :func:`target_rule`, :func:`fixed_rule` or the caller's (compare's decision).
    run : dict
        The runner's options (``token_budget``, ``batch_size``, ``chunk_size``, ``progress``).
    what : str
        The run, named in the refusal, before any draw, of a run whose cap (``caps[q]``
        draws of every member) could score more than ``mptlml.settings.max_masked_inputs``
        masked inputs (:meth:`RoundDraw.check_size`).
    remedy : str, optional
        What its caller can lower, in that refusal.

    Returns
    -------
    SequentialRun
    """
    lengths = draw.lengths_of(ids)
    if run.get("checkpoint_dir") is not None:
        check_run_fingerprint(draw, scorer, ids, groups, keys, num_masks, caps, run)
    draw.bind(lengths, groups, keys)
    enumerated = np.array([draw.enumerates(int(d)) for d in lengths], dtype=bool)
    cap = {i: caps[q] for q, m in enumerate(groups) for i in m}
    draw.check_size(lengths, [cap[i] for i in range(len(lengths))], what, remedy)
    tallies = [Tally(by_cell=draw.cells_are_strata, error=draw.round_error) for _ in ids]
    n = len(groups)
    rounds, drawn = [0] * n, [0] * n
    round_draws = [draw.round_size(int(num_masks))] * n
    status = ["fixed"] * n
    drawing = [set(m) for m in groups]
    calls, r = 0, 0
    active = list(range(n))
    while active:
        todo: list[tuple[int, int]] = [(i, round_draws[q]) for q in active for i in groups[q]
                if i in drawing[q] and not (enumerated[i] and r > 0)]
        out, c = draw.score(scorer, ids, todo, r, run) if todo else ({}, 0)
        calls += c
        asked = dict(todo)
        for i, (cells, exact, rows) in out.items():
            t = tallies[i]
            t.exact += exact
            t.rows += rows
            if cells is None:
                t.enumerated = True
            else:
                t.rounds[r] = (asked[i], cells)
        for q in active:
            rounds[q] += 1
            drawn[q] += round_draws[q]
        draw.learn(active)
        r += 1
        still = []
        for q in active:
            if enumerated[groups[q]].all():  # nothing to draw: every member exact
                status[q] = "exact"
                continue
            at_cap = drawn[q] + 2 > caps[q]
            drawing[q], stop, need = rule(q, groups[q], tallies, at_cap)
            drawing[q] -= {i for i in groups[q] if enumerated[i]}
            if stop is None and at_cap:
                stop = "budget"
            if stop is not None:
                status[q] = stop
                continue
            still.append(q)
            round_draws[q] = draw.round_size(next_draws(drawn[q], caps[q], need))
        active = still
    return SequentialRun(tallies, rounds, drawn, status, calls, enumerated)
