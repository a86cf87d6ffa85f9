"""``max_masks`` has one meaning everywhere: the most masked inputs scored per sequence.

In :func:`mptlml.compare` per candidate (the rate draw's whole continuation, scored once,
included; ``M // T`` draws of an estimator whose draw scores T masked inputs), the same cap
as ``estimate_lml(..., target_se=, max_masks=)`` per sequence. A candidate short enough to
be scored on every mask costs its 2^T - 1 masks whatever the cap (exempt).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import mptlml
from mptlml.estimators import FixedRate, LLaDA, available, get
from mptlml.estimators.sequential import round_sizes

CONTEXT = "the cat sat on"
# 1, 4 (exact under every unbiased draw), 7 and 10 tokens: mixed lengths in one question
MIXED = [" a", " the big red mat", " the big red tree and a dog",
         " a small blue house or a big red tree and"]


def _estimator(name: str):
    """A ragged estimator as compare takes it (fixed-rate needs its rate: 0.5, whose
    C(T, T/2) masks are not enumerated on the long candidates; LLaDA's batches of 8, so that
    a round holds the two batches its standard error needs)."""
    if name == "llada":
        return LLaDA(16, batch=8)
    return FixedRate(rate=0.5) if name == "fixed-rate" else name


def _num_masks(name: str) -> int:
    """The first round's draws: LLaDA's draws come in whole batches (two of 8)."""
    return 16 if name == "llada" else 4


def _cap(name: str) -> int:
    """A cap the first round fits in for every candidate (riemann's draw is 99 masks)."""
    return 450 if name == "riemann" else 150


def _compare(lm, name: str, cap: int, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # budget spent, few dof: expected
        return mptlml.compare(lm, [CONTEXT, CONTEXT], [MIXED, MIXED[2:]],
                              estimator=_estimator(name), num_masks=_num_masks(name),
                              max_masks=cap, seed=3, **kw)


@pytest.mark.parametrize("name", available(ragged=True))
@pytest.mark.parametrize("mode", ["fixed", "target", "decide"])
def test_compare_never_scores_more_than_max_masks_per_candidate(tiny, name, mode):
    kw = {"target": {"target_se": 1e-4}, "decide": {"decide": True, "delta": 0.0},
          "fixed": {}}[mode]
    cap = _cap(name)
    res = _compare(tiny, name, cap, **kw)
    lengths = [len(t) for t in tiny.encode(MIXED)]
    for q, idx in enumerate([range(4), range(2, 4)]):
        rows, exact = res.candidate_masked_rows[q], res.exact[q]
        for k, i in enumerate(idx):
            if exact[k]:  # scored on every mask: exempt, its 2^T - 1 masks
                assert rows[k] == 2 ** lengths[i] - 1
            else:
                assert 0 < rows[k] <= cap, (name, mode, q, k, rows[k])
        drawn = rows[~exact[q]] if (~exact[q]).any() else np.zeros(0)
        if mode != "decide" and drawn.size and name != "exhaustive":  # the cap binds
            assert drawn.max() > cap // 2, (name, mode, rows)
    assert res.extra["max_masks"] == cap


@pytest.mark.parametrize("name", [n for n in available(ragged=True) if get(n).unbiased
                                  and n != "exhaustive"])
@pytest.mark.parametrize("cap", [64, 150])
def test_estimate_lml_and_compare_spend_the_same_cap(tiny, name, cap):
    """One meaning: the same ``max_masks`` through ``estimate_lml`` at a target and through
    ``compare`` at the same target spends the same masked inputs (a sequence of one
    question draws as that question does)."""
    cand = MIXED[3]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        est = mptlml.estimate_lml(tiny, [cand], name, context=CONTEXT, num_masks=4,
                                  target_se=1e-4, max_masks=cap, seed=0)
        cmp = mptlml.compare(tiny, [CONTEXT], [[cand]], estimator=name, num_masks=4,
                             target_se=1e-4, max_masks=cap, seed=0)
    assert est.stop_reason == "budget" and cmp.stop_reason == ["budget"]
    assert est.num_masked_rows == cmp.num_masked_rows[0] <= cap
    assert est.mean == pytest.approx(cmp.scores[0][0], rel=1e-9)


def test_the_rate_draws_whole_continuation_counts(tiny):
    """``max_masks=128`` of the rate draw: the whole continuation once and 126 draws
    (127 asked, in pairs): 127 masked inputs, 4 rounds (8, 8, 16, 32, 62 of num_masks=8:
    5 rounds)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        res = mptlml.compare(tiny, [CONTEXT], [[MIXED[3], MIXED[2]]], num_masks=8,
                             max_masks=128, seed=0)
    assert list(res.candidate_masked_rows[0]) == [127, 127]
    assert res.rounds == [5] and res.extra["max_draws"] == [127]


def test_a_cap_below_the_first_round_is_refused_in_masked_inputs(tiny):
    with pytest.raises(ValueError, match=r"max_masks=8 \(masked inputs per candidate\) is "
                                         r"below the first round's 9: 8 draws"):
        mptlml.compare(tiny, [CONTEXT], [MIXED], num_masks=8, max_masks=8)
    with pytest.raises(ValueError, match=r"below the first round's 40: 4 draws of a "
                                         r"10-token candidate .*'cumulative', 10 masked"):
        mptlml.compare(tiny, [CONTEXT], [MIXED], num_masks=4, max_masks=30,
                       estimator="cumulative")
    # the same refusal at estimate_lml's ragged target (it drew past the cap before)
    with pytest.raises(ValueError, match=r"max_masks=30 \(masked inputs per sequence\) is "
                                         r"below the first round's 40: 4 draws of a 10-token "
                                         r"sequence \(sequence 0\)"):
        mptlml.estimate_lml(tiny, [MIXED[3]], "cumulative", context=CONTEXT, num_masks=4,
                            target_se=1e-4, max_masks=30, seed=0)
    # candidates all scored on every mask: no draw to cap
    res = mptlml.compare(tiny, [CONTEXT], [MIXED[:2]], num_masks=8, max_masks=8)
    assert res.stop_reason == ["exact"]


def test_each_question_takes_its_own_looks(tiny):
    """With an estimator whose draw costs T masked inputs, a question of long candidates
    gets fewer draws under one cap, so fewer looks: its Bonferroni threshold uses its own."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        res = mptlml.compare(tiny, [CONTEXT, CONTEXT], [[MIXED[2]] * 2, [MIXED[3]] * 2],
                             estimator="cumulative", num_masks=2, decide=True, delta=0.0,
                             max_masks=140, seed=0)
    assert res.extra["max_draws"] == [20, 14]
    assert [len(round_sizes(2, c)) for c in res.extra["max_draws"]] == [5, 4]
    # two copies of one candidate: paired SE 0, the threshold at infinite dof
    from scipy import special
    assert res.z_threshold == pytest.approx([-special.ndtri(0.05 / 10),
                                             -special.ndtri(0.05 / 8)])
