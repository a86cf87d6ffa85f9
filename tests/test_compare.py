"""``mptlml.compare``: candidates scored on common masks, paired standard errors, a stop rule.

References: the exhaustive conditional MPT sum of a short continuation, computed here with
``BertForMaskedLM`` called directly (every mask of every size inside the continuation, the
context visible), and the spread of many independently seeded runs.
"""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
import torch

import mptlml
from mptlml.estimators import LLaDA

from .mlm_helpers import exhaustive_masked_sum

CONTEXT = "the cat sat on"
CANDIDATES = [" the big red mat and", " the big red tree and", " a small blue house or"]


def exhaustive_conditional(lm, context: str, continuation: str) -> float:
    """sum_M mean over masks of size M in T of (1/M) sum log p(x_j | rest), by direct forwards."""
    tok, model = lm.tokenizer, lm.model
    c = tok(context, add_special_tokens=False)["input_ids"]
    full = tok(context + continuation, add_special_tokens=False)["input_ids"]
    assert full[:len(c)] == c
    ids = torch.tensor([tok.cls_token_id, *full, tok.sep_token_id])
    scored = list(range(1 + len(c), 1 + len(full)))
    return exhaustive_masked_sum(ids, scored, tok.mask_token_id,
                                 lambda x: torch.log_softmax(model(input_ids=x).logits.double(),
                                                             -1))


@pytest.fixture(scope="module")
def reference(tiny):
    """The exhaustive conditional sums of CANDIDATES given CONTEXT."""
    return np.array([exhaustive_conditional(tiny, CONTEXT, c) for c in CANDIDATES])


@pytest.fixture(scope="module")
def runs(tiny):
    """200 seeded runs of one question in one call (one seed per copy of the question)."""
    n = 200
    res = mptlml.compare(tiny, [CONTEXT] * n, [CANDIDATES] * n, num_masks=6,
                         seed=list(range(n)))
    ind = mptlml.compare(tiny, [CONTEXT] * n, [CANDIDATES] * n, num_masks=6,
                         seed=list(range(n)), common_masks=False)
    return res, ind


def test_each_candidate_is_centred_on_the_exhaustive_conditional_sum(reference, runs):
    res, _ = runs
    scores = np.stack(res.scores)  # (runs, K)
    ref = reference
    spread = scores.std(0, ddof=1) / math.sqrt(len(scores))
    assert np.all(np.abs(scores.mean(0) - ref) < 4 * spread), (scores.mean(0), ref, spread)


def test_standard_errors_and_paired_standard_errors_are_calibrated(runs):
    res, _ = runs
    scores, se = np.stack(res.scores), np.stack(res.stderr)
    ratio = scores.std(0, ddof=1) / np.sqrt((se ** 2).mean(0))
    assert np.all((ratio > 0.8) & (ratio < 1.25)), ratio
    lead = np.array(res.choice)
    # the paired SE is reported to the leader; take the runs of the most frequent leader
    a = int(np.bincount(lead).argmax())
    for b in (k for k in range(len(CANDIDATES)) if k != a):
        diff = scores[:, a] - scores[:, b]
        pse = np.array([p[b] for p, c in zip(res.paired_stderr, lead, strict=True) if c == a])
        assert len(pse) > 50
        ratio = diff.std(ddof=1) / math.sqrt((pse ** 2).mean())
        assert 0.75 < ratio < 1.33, (a, b, ratio)


def test_common_masks_shrink_the_spread_of_a_difference(runs):
    """At equal cost, the difference on common masks has well below the independent spread.

    Candidates 0 and 1 differ in their last word: common masks give both the same sizes
    and positions, so the scores of the shared word cancel in the difference.
    """
    res, ind = runs
    assert res.num_masked_rows == ind.num_masked_rows
    common = np.stack(res.scores)[:, 0] - np.stack(res.scores)[:, 1]
    indep = np.stack(ind.scores)[:, 0] - np.stack(ind.scores)[:, 1]
    assert common.std() < 0.6 * indep.std(), (common.std(), indep.std())
    # the naive sqrt(se_a^2 + se_b^2) overstates the paired SE
    se = np.stack(res.stderr)
    naive = np.sqrt(se[:, 0] ** 2 + se[:, 1] ** 2)
    assert naive.mean() > 1.3 * common.std()


def test_a_clear_question_stops_early_and_a_tie_spends_the_budget(tiny):
    """Without an indifference zone (delta=0) a tie spends max_masks where no precision stop
    applies (an estimator other than the rate draw); with the rate draw the same tie (two
    copies: the difference 0 on every draw) is known as precisely as LLaDA's scheme would know
    it long before, and stops "precision"; with the default zone it stops as soon as the pair
    is confidently within delta, reported tied."""
    clear = mptlml.compare(tiny, [CONTEXT], [[" a mat", " the the the the the"]],
                           num_masks=8, decide=True, max_masks=128, seed=0)
    with pytest.warns(RuntimeWarning, match="1 of 1 questions undecided after max_masks=128"):
        tie = mptlml.compare(tiny, [CONTEXT], [[CANDIDATES[0]] * 2], num_masks=8, decide=True,
                             delta=0.0, max_masks=128, seed=0, estimator="random-size")
    assert clear.stop_reason == ["decided"] and clear.rounds[0] <= 2
    # 128 masked inputs per candidate, 8, 8, 16, 32, 64 draws of one masked input each
    assert tie.stop_reason == ["budget"] and tie.rounds == [5]
    assert tie.num_masked_rows[0] == 2 * 128
    assert tie.num_masked_rows[0] > 4 * clear.num_masked_rows[0]
    assert not tie.decided[0] and not tie.tied[0].any()
    with pytest.warns(RuntimeWarning, match="1 of 1 questions undecided at LLaDA's precision"):
        precise = mptlml.compare(tiny, [CONTEXT], [[CANDIDATES[0]] * 2], num_masks=8,
                                 decide=True, delta=0.0, max_masks=128, seed=0)
    assert precise.stop_reason == ["precision"] and not precise.decided[0]
    assert precise.num_masked_rows[0] < tie.num_masked_rows[0] / 2
    zone = mptlml.compare(tiny, [CONTEXT], [[CANDIDATES[0]] * 2], num_masks=8, decide=True,
                          max_masks=128, seed=0)
    assert zone.stop_reason == ["tied"] and list(zone.tied[0]) == [False, True]
    assert not zone.decided[0] and zone.num_masked_rows[0] < tie.num_masked_rows[0] / 4


def test_short_continuations_are_scored_on_every_mask(tiny):
    """Up to EXACT_LENGTH tokens the bound is the exhaustive sum itself, SE 0, one round."""
    cands = [" a mat", " the red house", " a big red tree"]  # 2, 3 and 4 tokens
    res = mptlml.compare(tiny, [CONTEXT], [cands], num_masks=4, decide=True, seed=3)
    ref = np.array([exhaustive_conditional(tiny, CONTEXT, c) for c in cands])
    np.testing.assert_allclose(res.scores[0], ref, atol=1e-5)
    assert np.all(res.exact[0]) and np.all(res.stderr[0] == 0)
    assert res.stop_reason == ["exact"] and res.rounds == [1]
    assert res.num_masked_rows == [3 + 7 + 15]  # 2^T - 1 masks each
    # a tie of exact candidates is reported as such, not drawn on forever
    tie = mptlml.compare(tiny, [CONTEXT], [[" a mat", " a mat"]], decide=True, seed=0)
    assert tie.stop_reason == ["exact"] and not tie.decided[0]


def test_a_zero_standard_error_that_is_not_exact_is_announced(tiny):
    """The rate draw's two draws of a stratum never fall on one mask (5 tokens, 2 masks: one
    stratum; they did on some of 400 seeds, an SE of 0); LLaDA's draws with replacement
    still can, and the 0 they give is announced as not exact."""
    res = mptlml.compare(tiny, [CONTEXT] * 400, [[" a a a a a"]] * 400, num_masks=2,
                         seed=list(range(400)))
    assert all(res.stderr[q][0] > 0 for q in range(400))
    with pytest.warns(RuntimeWarning, match="with a standard error 0 that is not exact"):
        res = mptlml.compare(tiny, [CONTEXT] * 100, [[" a a a a a"]] * 100, num_masks=2,
                             seed=list(range(100)), estimator=LLaDA(2, batch=1))
    zero = [q for q in range(100) if res.stderr[q][0] == 0]
    assert zero and not any(res.exact[q][0] for q in zero)


def test_target_se_is_met(tiny):
    res = mptlml.compare(tiny, [CONTEXT], [CANDIDATES], num_masks=8, target_se=0.6,
                         max_masks=512, seed=1)
    assert res.stop_reason == ["target"]
    assert float(res.stderr[0].max()) <= 0.6


def test_no_context_scores_the_whole_sequence(tiny):
    res = mptlml.compare(tiny, ["", ""], [["the cat sat"], ["a mat"]], num_masks=4, seed=0)
    assert [len(s) for s in res.scores] == [1, 1]
    assert res.decided == [True, True]  # one candidate: nothing to decide against


def test_refusals(tiny):
    with pytest.raises(ValueError, match="even"):
        mptlml.compare(tiny, [CONTEXT], [CANDIDATES], num_masks=5)
    with pytest.raises(ValueError, match="one list of candidates per context"):
        mptlml.compare(tiny, [CONTEXT, CONTEXT], [CANDIDATES])
    with pytest.raises(ValueError, match="at least one candidate"):
        mptlml.compare(tiny, [CONTEXT], [[]])
    with pytest.raises(ValueError, match="target_se"):
        mptlml.compare(tiny, [CONTEXT], [CANDIDATES], target_se=-1.0)
    with pytest.raises(ValueError, match="max_masks"):
        mptlml.compare(tiny, [CONTEXT], [CANDIDATES], num_masks=8, max_masks=4)


def test_a_candidate_far_behind_stops_drawing_while_the_close_ones_go_on(tiny):
    """Successive elimination: only the candidates still in contention pay for more rounds."""
    cands = [CANDIDATES[0], CANDIDATES[1], " the the the the the"]
    res = mptlml.compare(tiny, [CONTEXT], [cands], num_masks=8, decide=True, max_masks=256,
                         seed=0)
    rows = res.candidate_masked_rows[0]
    assert res.rounds[0] > 1
    assert rows[2] <= 2 * 8 + 1  # out after a round or two (8 masks each, the full one once)
    assert rows[0] == rows[1] > 4 * rows[2]
    # its paired SE comes from the rounds it drew in, with the leader's draws of those rounds
    assert res.paired_stderr[0][2] > 0


def test_the_sequential_rule_rarely_decides_for_the_wrong_candidate(tiny):
    """A near tie (0.16 nats apart): over 200 seeds, wrong decisions stay below alpha = 0.05."""
    cands = [CANDIDATES[0], CANDIDATES[1]]
    ref = np.array([exhaustive_conditional(tiny, CONTEXT, c) for c in cands])
    n = 200
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # undecided questions are expected
        res = mptlml.compare(tiny, [CONTEXT] * n, [cands] * n, num_masks=4, decide=True,
                             max_masks=64, seed=list(range(n)))
    assert abs(ref[0] - ref[1]) < 0.2
    decided = np.array(res.decided)
    wrong = decided & (np.array(res.choice) != int(np.argmax(ref)))
    assert wrong.mean() <= 0.08, wrong.mean()  # alpha = 0.05, with binomial slack


def test_rounds_towards_a_target_are_unbiased_and_calibrated(tiny, reference):
    """Several rounds each (the allocation learned per question, the last round sized to the
    need): every candidate centred on its exhaustive sum, its SE calibrated over 150 runs."""
    n = 150
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        res = mptlml.compare(tiny, [CONTEXT] * n, [CANDIDATES] * n, num_masks=6,
                             target_se=0.35, max_masks=256, seed=list(range(n)))
    assert np.median(res.rounds) >= 3
    scores, se = np.stack(res.scores), np.stack(res.stderr)
    spread = scores.std(0, ddof=1)
    assert np.all(np.abs(scores.mean(0) - reference) < 4 * spread / math.sqrt(n)), (
        scores.mean(0), reference)
    ratio = spread / np.sqrt((se ** 2).mean(0))
    assert np.all((ratio > 0.75) & (ratio < 1.33)), ratio


def test_a_round_towards_a_target_draws_no_more_than_it_needs():
    from mptlml.estimators.sequential import NEED_MARGIN, next_draws, round_sizes

    # without a target: the doubling schedule, the last round what is left (even)
    assert round_sizes(16, 512) == [16, 16, 32, 64, 128, 256]
    assert round_sizes(16, 100) == [16, 16, 32, 36]
    # towards a target: at most the predicted remainder (with the margin), even, >= 2
    assert next_draws(64, 4096, need=100.0) == 2 * math.ceil(NEED_MARGIN * 36 / 2)
    assert next_draws(64, 4096, need=1e6) == 64  # never more than doubling
    assert next_draws(64, 4096, need=64.5) == 2


def test_max_masks_alone_is_a_budget_spent_whole(tiny):
    res = mptlml.compare(tiny, [CONTEXT], [CANDIDATES], num_masks=8, max_masks=65, seed=0)
    assert res.stop_reason == ["fixed"] and res.rounds == [4]  # 8 + 8 + 16 + 32
    assert list(res.candidate_masked_rows[0]) == [65, 65, 65]  # and the whole continuation
    # masked inputs, the whole continuation's included: 64 is 63 draws, in pairs 62
    res = mptlml.compare(tiny, [CONTEXT], [CANDIDATES], num_masks=8, max_masks=64, seed=0)
    assert res.rounds == [4] and list(res.candidate_masked_rows[0]) == [63, 63, 63]
    one = mptlml.compare(tiny, [CONTEXT], [CANDIDATES], num_masks=8, seed=0)
    assert one.stop_reason == ["fixed"] and list(one.candidate_masked_rows[0]) == [9] * 3


class Toy:
    """A ragged masked model with known, cheap conditionals (token ids 0..V-1):

    ``log p(x_j | x_R) = -w[x_j] (1 + |mask| / D) + eps u(j, x_j, mask)``, u in [-1, 1] a
    fixed hash of the mask's bits, the position and the token: deterministic, and equal on
    two candidates that share a token at a position under the same mask (so common masks
    cancel it). Its exhaustive conditional sum is enumerated here (:func:`toy_exhaustive`).
    """

    name = "toy"

    def __init__(self, w, eps: float) -> None:
        self.w, self.eps = torch.as_tensor(w, dtype=torch.float64), eps

    def encode(self, sequences):
        return [torch.as_tensor(s, dtype=torch.long) for s in sequences]

    def fingerprint(self):
        return {"name": self.name}

    def log_probs(self, x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        d = len(x)
        code = (m.long() * (2 ** torch.arange(d))).sum(1, keepdim=True).double()
        h = torch.sin(code * 12.9898 + torch.arange(d) * 78.233 + x.double() * 37.719)
        u = torch.frac(43758.5453 * h.abs()) * 2 - 1
        return -self.w[x] * (1 + m.sum(1, keepdim=True) / d) + self.eps * u

    def ragged_masked_log_prob(self, ids, masks, generators, *, token_budget=8192,
                               batch_size=None, progress=None):
        out = [(self.log_probs(x, m) * m).sum(1) for x, m in zip(ids, masks, strict=True)]
        if progress is not None:
            progress.update(sum(len(m) for m in masks))
        return out


def toy_exhaustive(model: Toy, context: list[int], cont: list[int]) -> float:
    """sum_M mean over every mask of M continuation positions of its mean log-prob."""
    x = torch.tensor(context + cont)
    c, t = len(context), len(cont)
    total = 0.0
    for m in range(1, t + 1):
        subsets = list(itertools.combinations(range(c, c + t), m))
        mask = torch.zeros(len(subsets), len(x), dtype=torch.bool)
        for r, sub in enumerate(subsets):
            mask[r, list(sub)] = True
        total += float(((model.log_probs(x, mask) * mask).sum(1) / m).mean())
    return total


TOY = Toy(torch.linspace(0.5, 3.0, 12), eps=1.5)
TOY_CONTEXT = [0, 1, 2]


@pytest.mark.slow
@pytest.mark.parametrize(("b_token", "delta"), [(3, 0.2), (5, 0.1), (5, 0.0)])
def test_the_indifference_zone_guarantee_holds_over_seeds_near_the_zone(b_token, delta):
    """Two 8-token candidates that differ in one token, their exhaustive sums just over delta
    apart (or delta = 0: the plain sequential rule): over 400 seeds, the chosen candidate is
    more than delta below the exhaustive best in at most alpha = 0.05 of the runs (binomial
    slack), counting every run; most runs stop (decided or tied) before max_masks."""
    a = [3, 4, 5, 6, 7, 8, 9, 4]
    b = [3, 4, 5, 6, 7, 8, 9, b_token]
    ref = np.array([toy_exhaustive(TOY, TOY_CONTEXT, c) for c in (a, b)])
    gap = abs(ref[0] - ref[1])
    assert delta < gap < delta + 0.2, (gap, delta)
    n = 400
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        res = mptlml.compare(TOY, [TOY_CONTEXT] * n, [[a, b]] * n, num_masks=4, decide=True,
                             delta=delta, max_masks=1024, seed=list(range(n)),
                             precision=False)  # the zone alone (the precision stop: below)
    wrong = ref.max() - ref[np.array(res.choice)] > delta
    stopped = np.isin(res.stop_reason, ["decided", "tied"])
    assert stopped.mean() > 0.5, np.unique(res.stop_reason, return_counts=True)
    assert (wrong & stopped).mean() <= 0.08, (wrong & stopped).mean()


def test_a_tie_within_the_zone_stops_tied_early():
    """Two candidates 0.19 nats apart (well inside delta = 0.5): most runs stop tied, after
    well before max_masks (or decided for the better one), the tie reported per
    candidate."""
    a = [3, 4, 5, 6, 7, 8, 9, 4]
    b = [3, 4, 5, 6, 7, 8, 9, 5]
    ref = np.array([toy_exhaustive(TOY, TOY_CONTEXT, c) for c in (a, b)])
    assert abs(ref[0] - ref[1]) < 0.25
    n = 40
    res = mptlml.compare(TOY, [TOY_CONTEXT] * n, [[a, b]] * n, num_masks=8, decide=True,
                         delta=0.5, max_masks=1024, seed=list(range(n)), precision=False)
    stop = np.array(res.stop_reason)
    assert set(stop) <= {"tied", "decided"} and (stop == "tied").mean() > 0.5
    assert all(res.choice[q] == int(np.argmax(ref)) for q in np.flatnonzero(stop == "decided"))
    rows = np.array([int(r.max()) for r in res.candidate_masked_rows])
    assert rows.mean() < 0.4 * 1024 and rows.max() < 1024, rows
    assert all(res.tied[q].sum() == 1 and not res.tied[q][res.choice[q]]
               for q in np.flatnonzero(stop == "tied"))
