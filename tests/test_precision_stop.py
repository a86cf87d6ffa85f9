"""``compare(decide=True)``'s precision stop, and a missing standard error never a decision.

References: LLaDA's scheme written here from its description (Nie et al. 2025: per candidate
128 draws in batches of 32, a start k ~ U{1..T} and the systematic counts
``round(linspace(k, k + 31 T / 32, 32))`` wrapped into 1..T, uniform positions, each draw
``(T / M) sum_{masked} log p``, each candidate its own masks), the exhaustive conditional sums
and the within-size variance of LLaDA's draw enumerated over every mask of the toy model of
``tests/test_compare.py``, and scipy's chi-square quantiles.
"""

from __future__ import annotations

import importlib
import itertools
import math
import warnings

import numpy as np
import pytest
import torch
from scipy import stats

import mptlml
from mptlml.estimators import LLaDA
from mptlml.estimators.learned_rate import RateDraw
from mptlml.estimators.sequential import Tally, fixed_rule, run_rounds
from mptlml.models.conditional import with_context

from .test_compare import TOY, TOY_CONTEXT, toy_exhaustive

compare_module = importlib.import_module("mptlml.estimators.compare")

A = [3, 4, 5, 6, 7, 8, 9, 4]


def llada_estimate(model, context: list[int], cand: list[int], g: torch.Generator,
                   n: int = 128, batch: int = 32) -> float:
    """LLaDA's estimate of log p(cand | context): n draws in batches of systematic counts."""
    x = torch.tensor(context + cand)
    t, c = len(cand), len(context)
    vals = []
    for _ in range(n // batch):
        k = int(torch.randint(1, t + 1, (), generator=g))
        counts = (np.round(np.linspace(k, k + (batch - 1) * t / batch, batch)).astype(int)
                  - 1) % t + 1
        m = torch.zeros(batch, len(x), dtype=torch.bool)
        for r, cnt in enumerate(counts):
            m[r, c + torch.randperm(t, generator=g)[:cnt]] = True
        s = (model.log_probs(x, m) * m).sum(1)
        vals.append(s * t / torch.as_tensor(counts))
    return float(torch.cat(vals).mean())


def within_size_variance(model, context: list[int], cand: list[int]) -> float:
    """``sum_{M=1..T-1} T Var(s_M | M) / M^2`` over every mask of each size (enumerated)."""
    x = torch.tensor(context + cand)
    c, t = len(context), len(cand)
    w = 0.0
    for m in range(1, t):
        subsets = list(itertools.combinations(range(c, c + t), m))
        mask = torch.zeros(len(subsets), len(x), dtype=torch.bool)
        for r, sub in enumerate(subsets):
            mask[r, list(sub)] = True
        s = (model.log_probs(x, mask) * mask).sum(1).numpy()
        w += t * float(s.var()) / m ** 2
    return w


def test_the_precision_bound_is_the_chi_square_upper_bound():
    for se, dof, alpha in [(0.3, 4.7, 0.05), (1.0, 12.0, 0.1), (2.0, 1.5, 0.05)]:
        want = se * math.sqrt(dof / stats.chi2.ppf(alpha, dof))
        assert compare_module.precision_bound(se, dof, alpha) == pytest.approx(want, rel=1e-10)
    assert compare_module.precision_bound(0.3, math.inf, 0.05) == 0.3
    for se, dof in [(math.nan, 5.0), (0.3, 0.0), (0.3, math.nan), (math.inf, 5.0)]:
        assert math.isnan(compare_module.precision_bound(se, dof, 0.05))


def test_the_reference_is_llada_s_within_size_variance_and_llada_s_spread_is_at_least_it():
    """The rate draw's estimate of the within-size variance of one LLaDA draw, from its own
    equal-size pairs over 2,000 draws, matches the enumerated value; LLaDA's own estimate (128
    systematic draws) spreads over 300 seeds at least as much as sqrt(W / 128) says."""
    b = [3, 4, 5, 6, 7, 8, 9, 9]
    scorer = with_context(TOY, [TOY_CONTEXT, TOY_CONTEXT])
    ids = scorer.encode([A, b])
    draw = RateDraw(16, "uniform", 4)
    run_rounds(draw, scorer, ids, [[0, 1]], [(0, 0), (0, 0)], num_masks=16,
               caps=[2000], rule=fixed_rule, run={})
    g = torch.Generator().manual_seed(0)
    for i, cand in enumerate((A, b)):
        exact = within_size_variance(TOY, TOY_CONTEXT, cand)
        est, pairs = draw.reference_var(i)
        assert pairs > 500
        assert est == pytest.approx(exact, rel=0.2), (est, exact)
        spread = np.std([llada_estimate(TOY, TOY_CONTEXT, cand, g) for _ in range(300)], ddof=1)
        # the chi-square's lower 1% quantile on 299 dof: 0.83 of the variance
        assert spread ** 2 >= 0.83 * exact / 128, (spread ** 2, exact / 128)


def test_a_near_tie_stops_at_llada_s_precision_announced_and_undecided():
    b = list(A)
    b[2] = 3  # 0.28 nats from A
    with pytest.warns(RuntimeWarning, match=r"undecided at LLaDA's precision"):
        res = mptlml.compare(TOY, [TOY_CONTEXT] * 8, [[A, b]] * 8, decide=True,
                             seed=list(range(8)))
    stop = np.array(res.stop_reason)
    assert (stop == "precision").sum() >= 4, stop
    assert not any(res.decided[q] for q in np.flatnonzero(stop == "precision"))
    # well within LLaDA's 128 masked inputs per candidate
    assert np.mean(res.num_masked_rows) < 0.6 * 2 * 128
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        off = mptlml.compare(TOY, [TOY_CONTEXT] * 8, [[A, b]] * 8, decide=True,
                             seed=list(range(8)), precision=False)
    assert "precision" not in off.stop_reason and off.extra["precision"] is False
    with pytest.raises(ValueError, match="precision=False is a stop rule of decide=True"):
        mptlml.compare(TOY, [TOY_CONTEXT], [[A, b]], precision=False)


@pytest.mark.slow  # about 40 s
def test_agreement_with_the_exhaustive_choice_is_at_least_llada_s_over_seeds():
    """Near ties and close pairs (0.19 to 0.63 nats): over 200 seeds each, compare at its
    defaults (decide=True) picks the exhaustive leader at least as often as LLaDA's 128 draws
    per candidate (binomial slack), most undecided questions stop at LLaDA's precision, and
    the whole costs less than half LLaDA's masked inputs."""
    n = 200
    g = torch.Generator().manual_seed(1)
    rows, stops = [], []
    for pos, token in [(7, 5), (2, 3), (2, 2)]:
        b = list(A)
        b[pos] = token
        ref = np.array([toy_exhaustive(TOY, TOY_CONTEXT, c) for c in (A, b)])
        best = int(np.argmax(ref))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            res = mptlml.compare(TOY, [TOY_CONTEXT] * n, [[A, b]] * n, decide=True,
                                 seed=list(range(n)))
        ours = float(np.mean(np.array(res.choice) == best))
        theirs = float(np.mean([np.argmax([llada_estimate(TOY, TOY_CONTEXT, c, g)
                                           for c in (A, b)]) == best for _ in range(n)]))
        slack = 2 * math.sqrt(theirs * (1 - theirs) / n)
        assert ours >= theirs - slack, (ref, ours, theirs)
        rows.append(np.mean(res.num_masked_rows))
        stops += res.stop_reason
    assert np.mean(rows) < 0.5 * 2 * 128, rows
    assert np.mean(np.array(stops) == "precision") > 0.3


# ---------------------------------------------------------------- a missing SE
def one_draw_tally(values: list[float]) -> Tally:
    """A candidate of a draw that gives one draw per cell (no spread: SE NaN)."""
    t = Tally()
    t.rounds[0] = (1, [np.array([v]) for v in values])
    return t


def test_a_missing_standard_error_is_never_a_decision_in_the_rule():
    """The rule itself, whatever the estimator: a pair whose SE is NaN (one draw per cell), or
    0 from draws that are not exact while the estimates differ, passes no threshold, ties
    nothing, and its margin is NaN, never infinite; an exact SE 0 still decides."""
    thresholds = lambda dof: 2.0  # noqa: E731
    one = [one_draw_tally([-1.0, -2.0]), one_draw_tally([-3.0, -4.0])]
    zero = [Tally(rounds={0: (2, [np.array([-1.0, -1.0])])}),
            Tally(rounds={0: (2, [np.array([-3.0, -3.0])])})]
    for tallies in (one, zero):
        res = compare_module._question(tallies, [0, 1])
        assert res["lead"] == 0 and math.isnan(res["margin"])
        assert compare_module._passed(res, thresholds) == {0}  # the leader only
        assert compare_module._tied(res, thresholds, 100.0) == set()
    exact = [Tally(exact=-1.0, enumerated=True), Tally(exact=-3.0, enumerated=True)]
    res = compare_module._question(exact, [0, 1])
    assert res["margin"] == math.inf and compare_module._passed(res, thresholds) == {0, 1}
    same = [Tally(rounds={0: (2, [np.array([-1.0, -2.0])])}) for _ in range(2)]
    assert compare_module._question(same, [0, 1])["margin"] == 0.0  # two copies: no evidence


def test_a_missing_standard_error_is_never_a_decision_through_compare():
    """Two inputs of the cause: LLaDA's draw with a single batch per candidate (its SE from
    batch means would be NaN: refused before any work, with and without decide), and nested
    masks of candidates of two lengths at num_masks=2 (a pair's two draws can fall on one
    mask: an SE 0 that is not exact). Neither is ever decided on a missing SE, no margin is
    infinite, and the missing SE is announced."""
    b = [3, 4, 5, 6, 7, 8, 9, 9]
    one_batch = LLaDA(32, batch=32)
    for decide in (False, True):
        kw = {"decide": True, "max_masks": 32} if decide else {}
        with pytest.raises(ValueError, match="one batch \\(no spread\\)"):
            mptlml.compare(TOY, [TOY_CONTEXT] * 3, [[A, b]] * 3, num_masks=32,
                           estimator=one_batch, seed=[0, 1, 2], **kw)
    n = 200
    short, longer = [3, 4, 5, 6, 7], [3, 4, 5, 6, 7, 8]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = mptlml.compare(TOY, [TOY_CONTEXT] * n, [[short, longer]] * n, num_masks=2,
                             seed=list(range(n)))
    assert not np.isinf(res.margin_z).any()
    zero = [q for q in range(n) if res.paired_stderr[q][1 - res.choice[q]] == 0]
    assert zero, "no pair of draws fell on one mask: the input does not test the cause"
    assert not any(res.decided[q] for q in zero)
    assert all(math.isnan(res.margin_z[q]) for q in zero)
    assert any("missing standard error" in str(w.message) for w in caught)
