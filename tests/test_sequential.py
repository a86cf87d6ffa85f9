"""The sequential engine (``estimators/sequential.py``) under ``estimate_lml(target_se=)``,
``compare`` and their stop reasons.

References: the exhaustive conditional MPT sum of short continuations (``BertForMaskedLM``
called directly, every mask of every size inside the continuation, the context visible:
``tests/mlm_helpers.exhaustive_masked_sum``), and the spread of seeded runs.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import mptlml
from mptlml._validation import InvalidOptionError
from mptlml.estimators import FixedRate, LLaDA, RandomSize, Riemann, register, unregister
from mptlml.estimators.sequential import (
    STOP_REASONS,
    CellDraw,
    combine_rounds,
    fixed_rule,
    round_seed,
    run_rounds,
    target_rule,
    weighted_rounds,
)
from mptlml.estimators.stats import ExactCell, exact_cell

from .test_compare import exhaustive_conditional

CONTEXT = "the cat sat on"
#: 11 tokens: drawn, not enumerated
LONG = " the big red mat and the small blue house"
#: 5 and 6 tokens: drawn at the masks asked here, short enough to enumerate for a reference
SHORT = [" the big red mat and", " a small blue house or the"]


@pytest.fixture(scope="module")
def reference(tiny):
    return np.array([exhaustive_conditional(tiny, CONTEXT, c) for c in SHORT])


@pytest.mark.parametrize("estimator", ["learned-rate", "cumulative", "random-size"])
def test_one_target_costs_the_same_through_estimate_lml_and_compare(tiny, estimator):
    """One continuation at one target SE: the same draws, rounds and masked inputs through
    both doors. Before the engine, estimate_lml planned from a pilot (at target 0.25 on this
    continuation: 524-568 masked inputs for cumulative, 332-1200 for random-size, over 3
    seeds) and compare drew its rounds (513): two costs for one question."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a target past the cap says so
        for seed in (0, 1):
            e = mptlml.estimate_lml(tiny, [LONG], estimator, context=CONTEXT, target_se=0.5,
                                    num_masks=4, seed=seed)
            c = mptlml.compare(tiny, [CONTEXT], [[LONG]], target_se=0.5, num_masks=4,
                               seed=seed, estimator=estimator)
            assert e.num_masked_rows == c.num_masked_rows[0] > 0
            assert e.mean == pytest.approx(float(c.scores[0][0]), abs=1e-12)
            assert e.stderr == pytest.approx(float(c.stderr[0][0]), abs=1e-12)
            assert e.stop_reason == c.stop_reason[0] in ("target", "budget")


@pytest.mark.slow
def test_the_engine_s_standard_error_at_target_covers_the_exhaustive_value(tiny, reference):
    """Rounds until each SE is at the target (the rate density learned as they go): over
    80 seeds each continuation is centred on its exhaustive sum and ``|z| > 2`` in at most
    about 5% of the runs (calibrated SEs on at least TARGET_MIN_DOF dof)."""
    n, target = 80, 0.3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        runs = [mptlml.estimate_lml(tiny, SHORT, "learned-rate", context=CONTEXT,
                                    target_se=target, num_masks=4, seed=s) for s in range(n)]
    est = np.stack([r.per_sample.numpy() for r in runs])
    se = np.stack([r.per_sample_stderr.numpy() for r in runs])
    assert np.all(se > 0)  # drawn, not enumerated
    z = (est - reference) / se
    assert np.mean(np.abs(z) > 2) <= 0.10, np.mean(np.abs(z) > 2, axis=0)
    assert np.all(np.abs(est.mean(0) - reference) < 4 * est.std(0, ddof=1) / math.sqrt(n))
    reached = [r for r in runs if r.stop_reason == "target"]
    assert len(reached) > n / 2 and all(r.stderr <= target for r in reached)


def _every_ragged_estimator() -> list:
    """Every registered ragged estimator, as a name or (options it needs) an instance."""
    need = {"fixed-rate": FixedRate(rate=0.3), "llada": LLaDA(8, batch=4),
            "riemann": Riemann(rates=[0.2, 0.5, 0.8])}
    return [need.get(n, n) for n in mptlml.estimators.available(ragged=True)]


@pytest.mark.parametrize("estimator", _every_ragged_estimator(),
                         ids=lambda e: getattr(e, "name", e))
def test_compare_takes_every_ragged_estimator_on_common_random_numbers(tiny, reference,
                                                                       estimator):
    """Each ragged estimator scores compare's candidates in its rounds: two copies of one
    candidate get the same draws (a paired SE 0), an exact estimator gives the exhaustive
    sums, and an unbiased one is centred on them over seeds."""
    name = getattr(estimator, "name", estimator)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # few dof at 8 masks
        twin = mptlml.compare(tiny, [CONTEXT], [[SHORT[0], SHORT[0]]], num_masks=8, seed=3,
                              estimator=estimator)
        # equal to float rounding: torch's threads may sum a row's logits in another order
        assert abs(twin.scores[0][0] - twin.scores[0][1]) < 1e-5
        assert twin.paired_stderr[0][1] < 1e-5
        assert twin.extra["estimator"] == name
        runs = [mptlml.compare(tiny, [CONTEXT], [SHORT], num_masks=8, seed=s,
                               estimator=estimator) for s in range(12)]
    scores = np.stack([r.scores[0] for r in runs])
    assert np.all(np.isfinite(scores))
    if name == "exhaustive":
        assert np.allclose(scores, reference, atol=1e-5) and runs[0].stop_reason == ["exact"]
    elif mptlml.estimators.get(name).unbiased:
        spread = scores.std(0, ddof=1) / math.sqrt(len(runs))
        assert np.all(np.abs(scores.mean(0) - reference) < 4.5 * spread + 1e-5), (
            scores.mean(0), reference)


#: questions whose twins (one candidate twice) sit among every mix of candidate lengths:
#: equal lengths, one token, a short candidate first and long twins after it, long twins
#: around short ones (LONG: drawn at 8 masks by every estimator but 'exhaustive')
TWIN_QUESTIONS = [[LONG, " the small blue house and the big red mat", LONG],
                  [" mat", " dog", " mat"],
                  [" a mat", LONG, LONG],
                  [LONG, " a mat", LONG, " tree"]]


@pytest.mark.parametrize("estimator", _every_ragged_estimator(),
                         ids=lambda e: getattr(e, "name", e))
def test_common_random_numbers_for_every_mix_of_candidate_lengths(tiny, estimator):
    """Two copies of one candidate draw the same masks whatever the other candidates' lengths
    and their places: the same score and SE (to float rounding of threaded sums), the same
    paired SE against the leader, and a paired SE 0 when one of them leads. Their SE is not
    0 (drawn, not enumerated) where the estimator draws, so the test is not vacuous."""
    name = getattr(estimator, "name", estimator)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # few dof at 8 masks
        res = mptlml.compare(tiny, [CONTEXT] * len(TWIN_QUESTIONS), TWIN_QUESTIONS,
                             num_masks=8, seed=5, estimator=estimator)
    drawn = 0
    for q, cands in enumerate(TWIN_QUESTIONS):
        i, j = [k for k, c in enumerate(cands) if cands.count(c) == 2]
        sc, se, pse = res.scores[q], res.stderr[q], res.paired_stderr[q]
        assert abs(sc[i] - sc[j]) < 1e-5 * (1 + abs(sc[i])), (name, q, sc)
        assert abs(se[i] - se[j]) < 1e-5 and abs(pse[i] - pse[j]) < 1e-5, (name, q, se, pse)
        if res.choice[q] in (i, j):
            assert max(pse[i], pse[j]) < 1e-5, (name, q, pse)
        drawn += bool(se[i] > 1e-3)
    enumerates = name == "exhaustive"
    assert drawn == (0 if enumerates else 3), (name, res.stderr)  # the long twins


def test_compare_refuses_an_estimator_of_dense_data_only_naming_the_argument(tiny):
    class DenseOnly(RandomSize):
        name = "dense-only"
        ragged = False

    register(DenseOnly, replace=True)
    try:
        with pytest.raises(ValueError, match="estimator='dense-only' estimates dense"):
            mptlml.compare(tiny, [CONTEXT], [SHORT], estimator="dense-only")
        with pytest.raises(ValueError, match="estimator='no-such' is not a registered"):
            mptlml.compare(tiny, [CONTEXT], [SHORT], estimator="no-such")
        with pytest.raises(ValueError, match="allocation='uniform' does not apply to the "
                                             "estimator 'random-size'"):
            mptlml.compare(tiny, [CONTEXT], [SHORT], estimator="random-size",
                           allocation="uniform")
        with pytest.raises(InvalidOptionError, match="compare: allocation must be one of"):
            mptlml.compare(tiny, [CONTEXT], [SHORT], allocation="learned")
    finally:
        unregister("dense-only")


def test_every_result_reports_a_stop_reason_of_the_one_vocabulary(tiny):
    """estimate_lml, mpt_curve and compare name why they stopped from STOP_REASONS (None:
    no stop rule was asked)."""
    from mptlml.models import PPCA

    ppca = PPCA.random(6, 2, sigma2=0.3, seed=0)
    x = ppca.sample(8, generator=0)
    seen: list = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        seen.append(mptlml.estimate_lml(ppca, x, num_masks=2, seed=0).stop_reason)
        seen.append(mptlml.estimate_lml(ppca, x, target_se=0.05, seed=0).stop_reason)
        seen.append(mptlml.estimate_lml(ppca, x, target_se=1e-4, max_masks=80,
                                        seed=0).stop_reason)
        seen.append(mptlml.mpt_curve(ppca, x, target_se=0.05, seed=0).stop_reason)
        for est in ("learned-rate", "cumulative"):
            seen.append(mptlml.estimate_lml(tiny, SHORT, est, context=CONTEXT, target_se=0.5,
                                            seed=0).stop_reason)
            # 20 masked inputs: past learned-rate's first round (16 draws and the whole
            # continuation's row; 16 is refused) and cumulative's (2 draws of 5)
            seen.append(mptlml.estimate_lml(tiny, SHORT, est, context=CONTEXT, target_se=0.01,
                                            max_masks=20, seed=0).stop_reason)
        seen.append(mptlml.estimate_lml(tiny, [" a mat"], "learned-rate", context=CONTEXT,
                                        target_se=0.5, seed=0).stop_reason)
        seen.append(mptlml.mpt_curve(tiny, SHORT, rates=[0.3, 0.7], target_se=0.5,
                                     seed=0).stop_reason)
        for kw in ({}, {"max_masks": 32}, {"decide": True}, {"target_se": 0.5}):
            seen += mptlml.compare(tiny, [CONTEXT] * 2, [SHORT, [" a mat", " a dog"]],
                                   num_masks=8, seed=0, **kw).stop_reason
    assert set(seen) - {None} <= set(STOP_REASONS), set(seen) - set(STOP_REASONS)
    assert {"fixed", "target", "budget", "exact"} <= set(seen)


class _OneByOne(CellDraw):
    """The reference: each sequence of a round scored by its own call (the engine before its
    rounds were batched), its generator seeded by its round seed as sequence 0."""

    def score(self, scorer, ids, todo, r, run):
        res, calls = {}, 0
        for i, p in todo:
            est = self.est.with_draws(int(p))
            counts = self.counts(i, p)
            cells, c = est.sequence_cells(scorer, [ids[i]], [counts],
                                          round_seed(self.keys[i], r), **run)
            calls += c
            res[i] = (list(cells[0]), 0.0, int(est.scored_rows(int(self.lengths[i]), counts)))
            if len(self.strata[i]) == len(cells[0]):
                q = self.group_of[i]  # the spread by stratum of the sequence's group
                for h, cell in zip(self.strata[i], cells[0], strict=True):
                    if not isinstance(cell, ExactCell) and cell.size > 1:
                        self.spread_sum[q, h] += float(np.var(cell, ddof=1))
                        self.spread_n[q, h] += 1
        return res, calls


#: sequences of 7 to 12 tokens: drawn by every estimator here (none enumerated)
BATCH_TEXTS = ["the cat sat on the big red mat", "a small blue house or the big red tree",
               "the big red mat and the small blue house and the cat"]


@pytest.mark.parametrize(("name", "options"), [
    ("cumulative", {}), ("riemann", {"rates": [0.3, 0.7]}), ("random-size", {"stratified": True}),
    ("chain-rule", {})])
def test_a_round_s_sequences_are_scored_in_one_batched_call(tiny_dir, name, options):
    """Every sequence drawing in a round is scored by one call (per round size) through the
    ragged runner: the same draws and numbers as one call per sequence (to 1e-10, the module
    in float64: in float32 padding a sequence beside longer ones moves its scores by ~1e-7),
    and at most ``ceil(masked inputs / batch_size)`` forwards per round (counted by a hook
    on the module, the runner's own count aside)."""
    from mptlml.estimators import get
    from mptlml.models import MaskedLM
    from mptlml.models.sequence_input import encode

    tiny = MaskedLM.from_pretrained(tiny_dir)
    tiny.model.double()

    est = get(name)(4, **options)
    toks = encode(tiny, BATCH_TEXTS)
    n, batch = len(toks), 64
    run = {"batch_size": batch, "token_budget": 10 ** 7, "chunk_size": 64}
    forwards = []
    module = tiny._base if tiny._split else tiny.model  # the body each forward runs
    hook = module.register_forward_hook(lambda *a: forwards.append(1))
    try:
        outs = {}
        for kind in (CellDraw, _OneByOne):
            for rule, cap in ((target_rule([0.4] * n), 32), (fixed_rule, 16)):
                forwards.clear()
                out = run_rounds(kind(est), tiny, toks, [[i] for i in range(n)],
                                 [(3, i) for i in range(n)], num_masks=4, caps=[cap] * n,
                                 rule=rule, run=run)
                outs[kind, cap] = (out, len(forwards))
    finally:
        hook.remove()
    for cap in (32, 16):
        (new, f_new), (old, f_old) = outs[CellDraw, cap], outs[_OneByOne, cap]
        assert new.rounds == old.rounds and new.stop_reason == old.stop_reason
        np.testing.assert_allclose([t.stats() for t in new.tallies],
                                   [t.stats() for t in old.tallies], rtol=0, atol=1e-10)
        assert [t.rows for t in new.tallies] == [t.rows for t in old.tallies]
        assert f_new == new.num_model_calls and f_old == old.num_model_calls
        assert f_old >= n * max(old.rounds)  # one call (a forward at least) per sequence
    new, f_new = outs[CellDraw, 16]  # the fixed rule: every sequence draws every round alike
    rows = sum(t.rows for t in new.tallies)  # sum over rounds of ceil(rows_r / batch)
    assert f_new <= rows / batch + max(new.rounds)
    assert f_new < outs[_OneByOne, 16][1]


# ------------------------------------------------------------------ dense data
@pytest.mark.parametrize("shared", [False, True])
def test_a_dense_round_gives_strata_stderr_s_estimate_se_and_dof(shared):
    """The data set is one member of the engine (DenseDraw): one round's estimate, standard
    error and degrees of freedom are strata_stderr's on the same draws (independent masks:
    the (P, N) draws over N, N independent columns; shared masks: the data means)."""
    import torch

    from mptlml._scoring.dense import Counter
    from mptlml.estimators import Cumulative
    from mptlml.estimators.sequential import DenseDraw
    from mptlml.estimators.stats import strata_stderr
    from mptlml.models import PPCA

    model = PPCA.random(6, 2, sigma2=0.3, seed=0)
    x = model.sample(9, generator=0)
    est = Cumulative(3, share_masks=shared)
    draw = DenseDraw(est, 6, 9, torch.Generator().manual_seed(0), Counter())
    out = run_rounds(draw, model, [x], [[0]], [(0, 0)], num_masks=3, caps=[3],
                     rule=fixed_rule, run={})
    assert out.rounds == [1] and out.stop_reason == ["fixed"]
    mean, se, dof = out.tallies[0].stats()
    with torch.no_grad():
        cells = est.stratum_draws(model, x, [3] * 6, torch.Generator().manual_seed(0),
                                  Counter(), False)
    per_se, want_se, want_dof = strata_stderr(cells, shared=shared)
    per_sample = torch.stack([c.mean(0) for c in cells]).sum(0)
    assert mean == pytest.approx(float(per_sample.mean()), abs=1e-12)
    assert se == pytest.approx(want_se, abs=1e-12)
    assert dof == pytest.approx(want_dof, rel=1e-12)
    means, var, counts = draw.combined(out.tallies[0])
    assert np.allclose(means.sum(0), per_sample.numpy(), rtol=0, atol=1e-12)
    assert np.allclose(np.sqrt(var.sum(0)), per_se.numpy(), rtol=0, atol=1e-12)
    assert counts.tolist() == [3] * 6


def test_dense_rounds_learn_neyman_s_counts_pooled_over_rounds_and_data():
    """After each round a stratum's spread (of one draw, averaged over the data) is pooled
    over the rounds; the next round's counts are Neyman's (the ragged CellDraw's function),
    within P H draws; "uniform" keeps P each."""
    import torch

    from mptlml._scoring.dense import Counter
    from mptlml.estimators import Cumulative
    from mptlml.estimators.sequential import DenseDraw, neyman_counts, neyman_sd
    from mptlml.models import PPCA

    model = PPCA.random(8, 2, sigma2=0.3, seed=1)
    x = model.sample(12, generator=1)
    for allocation in ("neyman", "uniform"):
        draw = DenseDraw(Cumulative(), 8, 12, torch.Generator().manual_seed(0), Counter(),
                         allocation=allocation)
        out = run_rounds(draw, model, [x], [[0]], [(0, 0)], num_masks=4, caps=[32],
                         rule=fixed_rule, run={})
        assert out.drawn == [32] and sorted(draw.per_datum) == [0, 1, 2, 3]
        for r in range(1, 4):
            counts = draw.per_datum[r][2]
            assert counts.sum() <= out.tallies[0].rounds[r][0] * 8
            if allocation == "uniform":
                assert set(counts.tolist()) == {out.tallies[0].rounds[r][0]}
        if allocation == "neyman":
            sd = neyman_sd(draw.spread_sum, draw.spread_n)
            assert draw.spread_n.tolist() == [4] * 8
            assert np.allclose(draw.sd, sd)
            want = neyman_counts(sd, 32)
            assert len(set(want.tolist())) > 1  # the spreads differ by size
            got = draw.counts(32)
            assert np.abs(got - want).max() <= 1 and got.sum() <= 32 * 8



@pytest.mark.parametrize("estimator", ["learned-rate", "cumulative"])
def test_a_checkpoint_of_another_run_is_refused_by_name_at_the_first_round(tiny, tmp_path,
                                                                          estimator):
    """The engine's checkpoints are fingerprinted by what decides the draws: a rerun into one
    checkpoint_dir with another seed, or another allocation, is refused before any round,
    naming what differs; the same run again reuses its rounds and gives the same numbers."""
    from mptlml._scoring.checkpoints import CheckpointError

    kw = dict(context=CONTEXT, target_se=0.5, max_masks=64, checkpoint_dir=tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        first = mptlml.estimate_lml(tiny, [LONG], estimator, seed=0, **kw)
        again = mptlml.estimate_lml(tiny, [LONG], estimator, seed=0, **kw)
        assert again.mean == first.mean and again.stderr == first.stderr
        with pytest.raises(CheckpointError, match=r"differs in \[.*'seeds'"):
            mptlml.estimate_lml(tiny, [LONG], estimator, seed=1, **kw)
        with pytest.raises(CheckpointError, match=r"differs in \['allocation'"):
            mptlml.estimate_lml(tiny, [LONG], estimator, seed=0, allocation="uniform", **kw)
        with pytest.raises(CheckpointError, match=r"differs in \[.*'seeds'"):
            mptlml.estimate_lml(tiny, [LONG, LONG], estimator, seed=0, **kw)


def test_one_rate_bin_convention_and_one_exactness_rule():
    """rate_bin: bin b holds (b/B, (b+1)/B] (the rate draw's spreads, the DPO margin's);
    cumulative's rows are its sizes, size M stratum M - 1 whatever D; scores_every_mask:
    2^D - 1 masks no more than those asked, or 2^EXACT_LENGTH - 1."""
    from mptlml.estimators import create
    from mptlml.estimators.learned_rate import rate_bin
    from mptlml.estimators.sequential import EXACT_LENGTH, scores_every_mask

    assert rate_bin(np.array([0.0, 0.05, 0.1, 0.1000001, 0.95, 1.0])).tolist() == [0, 0, 0, 1,
                                                                                   9, 9]
    strata, h = create("cumulative").ragged_strata(np.array([20, 7]))
    assert h == 20 and strata[0].tolist() == list(range(20)) and strata[1].tolist() == list(
        range(7))
    assert scores_every_mask(EXACT_LENGTH, 1) and not scores_every_mask(EXACT_LENGTH + 1, 1)
    assert scores_every_mask(6, 63) and not scores_every_mask(6, 62)
    assert scores_every_mask(1, 0)


def test_rounds_of_neyman_s_counts_are_combined_stratum_by_stratum():
    """With counts allocated per stratum (``by_cell``), cell k of round r weighs its share of
    stratum k's draws over the rounds, ``a_rk / sum_s a_sk``: the estimate is each stratum's
    draws pooled (their plain mean, as if drawn at once), its variance
    ``sum_k sum_r w_rk^2 var_rk / a_rk``; an exact cell weighs its round's draws. With
    equal counts the weights are the rounds' shares, bit for bit."""
    rng = np.random.default_rng(3)
    counts = {0: [2, 2, 2], 1: [2, 9, 3], 2: [4, 30, 2]}
    rounds = {r: (2 * (r + 1), [rng.normal(size=c) for c in cs]) for r, cs in counts.items()}
    rounds[1][1][2] = exact_cell([0.5, 0.5, 0.5])  # an exact cell in round 1
    est, se, _ = combine_rounds(list(weighted_rounds(rounds, by_cell=True).values()))
    want, var = 0.0, 0.0
    for k in range(3):
        draws = [(rounds[r][0] if isinstance(rounds[r][1][k], ExactCell) else counts[r][k])
                 for r in rounds]
        for r, a in zip(rounds, draws, strict=True):
            w = a / sum(draws)
            cell = np.asarray(rounds[r][1][k])
            want += w * cell.mean()
            if not isinstance(rounds[r][1][k], ExactCell):
                var += w ** 2 * cell.var(ddof=1) / cell.size
    assert math.isclose(est, want, rel_tol=1e-12) and math.isclose(se, math.sqrt(var))
    # stratum 1 drawn in every round: its weighted means are the plain mean of its 41 draws
    pooled = sum(c[1].mean() for c in weighted_rounds(rounds, by_cell=True).values())
    assert math.isclose(pooled, np.concatenate([rounds[r][1][1] for r in rounds]).mean())
    equal = {r: (n, [rng.normal(size=n) for _ in range(3)]) for r, n in ((0, 2), (1, 2), (2, 4))}
    by_cell, by_round = weighted_rounds(equal, by_cell=True), weighted_rounds(equal)
    assert all(np.array_equal(a, b) for r in equal
               for a, b in zip(by_cell[r], by_round[r], strict=True))
