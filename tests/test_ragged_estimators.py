"""Every estimator on ragged sequences, against sums over every mask computed by transformers.

random-size, adaptive-size and fixed-rate draw one size per draw from each
sequence's own D_i, as they do for dense data; with cumulative and chain-rule
they estimate a masked LM's sequences. On a tiny random BERT and sequences of
D_i = 6, 6 and 5 tokens, the exact S(x; M) of every size is the mean over all
C(D, M) masks, each masked input run through ``BertForMaskedLM`` directly
(``tests/mlm_helpers.py``), never through mptlml's scoring. Over many seeds:

- each unbiased estimator is centred on the exact MPT sum sum_M S(x; M)
  (within 4 standard errors of the seeds' spread), and its reported
  per-sequence standard error matches that spread;
- fixed-rate is centred on D_i * S(x_i; M_i), M_i = max(1, floor(rate D_i)),
  and each of its estimates is the mean of (D_i / M_i) sum_{j in mask} log p
  over masks reconstructed from the seed, scored by transformers;
- random-size reaches a target standard error, on PPCA and on sequences;
- stratified random-size (systematic sizes, two per quantile stratum) is centred,
  its pair-based standard error calibrated over 150 seeds, and its spread no larger than
  that of i.i.d. sizes at the same cost.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import mptlml
from mptlml._scoring.checkpoints import CheckpointError
from mptlml.estimators import AdaptiveSize
from mptlml.estimators.sequential import round_seed
from mptlml.masks import all_masks, distinct_masks, fixed_rate_size, sample_masks
from mptlml.models import PPCA
from mptlml.seeds import spawn

from .mlm_helpers import SENTENCES, exact_size_scores

pytestmark = pytest.mark.usefixtures("one_thread")

# D = 6, 6 and 5 tokens: drawn (at most 4 tokens, a sequence is scored on every mask,
# exact: tests/test_conditional.py)
TEXTS = [SENTENCES[0], SENTENCES[1], "the small red house and"]
SEEDS = 30


@pytest.fixture(scope="module")
def exact(tiny_dir):
    return exact_size_scores(tiny_dir, TEXTS)


def _adapted() -> AdaptiveSize:
    """An adaptive-size estimator whose q is far from uniform (weights 1/q(M) matter)."""
    est = AdaptiveSize(8, num_bins=4, eps=0.2)
    d = torch.full((4,), 4)
    est.observe(torch.tensor([1, 2, 3, 4]), torch.tensor([-1.0, -2.0, -6.0, -12.0]), d)
    q = est.size_probs(4)
    assert float(q.max() / q.min()) > 3
    return est


def _runs(tiny, estimator, num_masks, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a low-dof warning in a few seeds
        return [mptlml.estimate_lml(tiny, TEXTS, estimator, num_masks=num_masks, seed=s, **kw)
                for s in range(SEEDS)]


def _centred(values: np.ndarray, truth: np.ndarray, label: str) -> None:
    """Per sequence, the mean over seeds is within 4 standard errors of ``truth`` (equal to it
    where every seed gives the same value: a sequence scored on every mask)."""
    mean = values.mean(0)
    se = values.std(0, ddof=1) / np.sqrt(values.shape[0])
    drawn = se > 1e-9  # else every seed gave the same value (up to float noise of batching)
    z = np.where(drawn, (mean - truth) / np.where(drawn, se, 1), 0.0)
    assert np.all(np.abs(z) < 4), f"{label}: z = {np.round(z, 2)} (mean {mean}, exact {truth})"
    assert np.all(drawn | (np.abs(mean - truth) < 1e-5)), (label, mean, truth)


@pytest.mark.parametrize("estimator, options", [
    ("random-size", {}),
    ("random-size", {"stratified": True}),
    ("adaptive-size", {}),
    ("cumulative", {}),
    ("chain-rule", {}),
], ids=["random-size", "random-size-stratified", "adaptive-size", "cumulative", "chain-rule"])
def test_unbiased_estimators_are_centred_on_the_sum_over_every_mask(tiny, exact, estimator,
                                                                    options):
    est = _adapted() if estimator == "adaptive-size" else estimator
    runs = _runs(tiny, est, 8, **options)
    values = np.stack([r.per_sample.numpy() for r in runs])  # (seeds, N)
    _centred(values, np.array([s.sum() for s in exact]), str(estimator))
    # the reported per-sequence standard error is the seeds' spread (stratified with an even
    # num_masks: two sizes per stratum, the SE from the pairs)
    reported = np.sqrt(np.mean([r.per_sample_stderr.numpy() ** 2 for r in runs], axis=0))
    drawn = reported > 0  # the others were scored on every mask: no spread, SE 0
    assert np.all(values.std(0)[~drawn] < 1e-6)
    ratio = values.std(0, ddof=1)[drawn] / reported[drawn]
    assert np.all((ratio > 0.55) & (ratio < 1.8)), f"spread / reported SE = {ratio}"
    r = runs[0]
    assert r.estimator == (est if isinstance(est, str) else est.name)
    assert r.stderr_dof is not None and r.stderr_dof > 1 and r.sizes is None
    assert int(r.num_masked_rows_per_sample.sum()) == r.num_masked_rows
    lengths = np.array([len(s) for s in exact])
    per_draw = lengths if estimator == "chain-rule" else np.ones_like(lengths)
    rows = (8 * per_draw).tolist()
    obj = est if not isinstance(est, str) else mptlml.estimators.create(est, num_masks=8,
                                                                        **options)
    if estimator == "cumulative":  # sizes of no more than 8 masks are enumerated (exact)
        rows = [obj.scored_rows(int(d), np.full(d, 8)) for d in lengths]
    # a sequence whose 2^D - 1 masks are no more than its draws' is scored on every mask
    rows = [2 ** int(d) - 1 if obj.enumerates_sequence(int(d)) else r
            for d, r in zip(lengths, rows, strict=True)]
    assert r.num_masked_rows_per_sample.tolist() == rows


@pytest.mark.slow  # seeded runs on a BERT: over 3 s on an idle core
def test_systematic_random_size_has_a_calibrated_se_and_less_spread_than_iid(tiny, exact):
    """LLaDA-style systematic sizes, with the standard error LLaDA does not give."""
    n = 150
    truth = np.array([s.sum() for s in exact])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        runs = {strat: [mptlml.estimate_lml(tiny, TEXTS, "random-size", num_masks=8, seed=s,
                                            stratified=strat) for s in range(n)]
                for strat in (True, False)}
    values = {k: np.stack([r.per_sample.numpy() for r in v]) for k, v in runs.items()}
    _centred(values[True], truth, "systematic random-size")
    reported = np.sqrt(np.mean([r.per_sample_stderr.numpy() ** 2 for r in runs[True]], axis=0))
    ratio = values[True].std(0, ddof=1) / reported
    assert np.all((ratio > 0.75) & (ratio < 1.33)), f"spread / reported SE = {ratio}"
    assert runs[True][0].stderr_dof <= 3 * 4  # four pairs per sequence, three sequences
    # at the same cost. No variance comparison with i.i.d. sizes any more: those draws are
    # now distinct masks (des Raj's terms, random_size's docstring), which on these 5- and
    # 6-token sequences spread less than the systematic pairs (summed variance over 150
    # seeds 23.0 against 27.4); on this random BERT the mask noise dominates the spread
    # between sizes that stratification removes (on a 15-token sentence: 49.4 and 49.2)
    assert [r.num_masked_rows for r in runs[True][:1]] == [r.num_masked_rows
                                                            for r in runs[False][:1]]


def test_fixed_rate_is_d_times_s_at_its_one_size(tiny, tiny_dir, exact):
    from transformers import BertForMaskedLM, BertTokenizer

    lengths = [len(s) for s in exact]
    sizes = [fixed_rate_size(0.5, d) for d in lengths]  # 3, 2, 1
    truth = np.array([d * s[m - 1] for d, s, m in zip(lengths, exact, sizes, strict=True)])
    runs = _runs(tiny, "fixed-rate", 6, rate=0.5)
    _centred(np.stack([r.per_sample.numpy() for r in runs]), truth, "fixed-rate")
    assert not np.allclose(truth, [s.sum() for s in exact], atol=0.5)  # the bias is there
    # each estimate: the masks of round 0 of sequence i's stream (seed, i) on the engine, as
    # CellDraw seeds them, each scored by transformers directly
    tok = BertTokenizer.from_pretrained(tiny_dir)
    net = BertForMaskedLM.from_pretrained(tiny_dir).eval()
    est = runs[3]
    for i, (text, d, m) in enumerate(zip(TEXTS, lengths, sizes, strict=True)):
        # 6 distinct masks among C(D, M) = 20, or all C(5, 2) = 10 (no more than 15: exact)
        pop = math.comb(d, m)
        masks = all_masks(d, m) if pop <= 15 else distinct_masks(
            d, m, 6, torch.Generator().manual_seed(spawn(round_seed((3, i), 0), 0)))
        assert len({k.numpy().tobytes() for k in masks}) == len(masks)
        ids = torch.tensor(tok(text)["input_ids"])
        draws = []
        for mask in masks:
            pos = (mask.nonzero()[:, 0] + 1).tolist()  # after [CLS]
            inp = ids.clone()
            inp[pos] = tok.mask_token_id
            with torch.no_grad():
                lp = net(inp[None]).logits[0].double().log_softmax(-1)
            draws.append(d / m * sum(float(lp[j, ids[j]]) for j in pos))
        assert float(est.per_sample[i]) == pytest.approx(np.mean(draws), abs=1e-4)
        se = 0.0 if pop <= 15 else np.std(draws, ddof=1) / np.sqrt(6) * np.sqrt(1 - 6 / pop)
        assert float(est.per_sample_stderr[i]) == pytest.approx(se, abs=1e-4)


def test_random_size_meets_a_target_on_dense_data():
    model = PPCA.random(8, 2, sigma2=0.3, seed=1)
    x = model.sample(20, generator=1)
    exact = float(model.log_marginal(x).detach().mean())
    runs = [mptlml.estimate_lml(model, x, "random-size", target_se=0.1, seed=s)
            for s in range(40)]
    means, ses = np.array([r.mean for r in runs]), np.array([r.stderr for r in runs])
    assert abs(((means - exact) / ses).mean()) < 3.5 / np.sqrt(len(runs))
    assert 0.7 < means.std(ddof=1) / np.sqrt(np.mean(ses ** 2)) < 1.4
    assert np.all(ses <= 0.1) and {r.stop_reason for r in runs} == {"target"}
    r = runs[0]
    assert r.target_se == 0.1 and r.sizes is None and len(r.masks_per_size) == 1
    # one stratum: nothing to allocate; every datum scores the draws of every round
    assert r.allocation is None and r.num_masked_rows == r.masks_per_size[0] * x.shape[0]


def test_random_size_meets_a_target_on_sequences(tiny, exact):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        runs = [mptlml.estimate_lml(tiny, TEXTS, "random-size", target_se=0.6, seed=s)
                for s in range(SEEDS)]
    _centred(np.stack([r.per_sample.numpy() for r in runs]),
             np.array([s.sum() for s in exact]), "random-size to a target")
    # the error of the mean is at the target: the seeds' spread and the typical reported SE
    # (the sequential engine: rounds per sequence until its SE is at its share of the
    # target on at least 10 dof; a run that spends its cap says so with "budget")
    means, ses = np.array([r.mean for r in runs]), np.array([r.stderr for r in runs])
    assert means.std(ddof=1) <= 0.6 * 1.1 and np.median(ses) <= 0.6
    assert 0.7 < means.std(ddof=1) / np.sqrt(np.mean(ses ** 2)) < 1.4
    assert all(r.stop_reason == ("target" if r.stderr <= 0.6 else "budget") for r in runs)
    r = runs[0]
    assert r.allocation is None and r.masks_per_size is None and r.stderr_dof > 5
    assert int(r.num_masked_rows_per_sample.sum()) == r.num_masked_rows


def test_few_degrees_of_freedom_are_said(tiny):
    with pytest.warns(RuntimeWarning, match="effective degrees of freedom"):
        est = mptlml.estimate_lml(tiny, TEXTS[:2], "random-size", num_masks=2, seed=0)
    assert est.stderr_dof < 5
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        est = mptlml.estimate_lml(tiny, TEXTS, "random-size", num_masks=32, seed=0)
    assert est.stderr_dof > 5


def test_ragged_options_are_refused_where_they_do_not_apply(tiny):
    with pytest.raises(ValueError, match="needs rate="):
        mptlml.estimate_lml(tiny, TEXTS, "fixed-rate", seed=0)
    with pytest.raises(ValueError, match="mask_size= does not apply to ragged"):
        mptlml.estimate_lml(tiny, TEXTS, "fixed-rate", mask_size=2, seed=0)
    with pytest.raises(ValueError, match="share_masks=True does not apply to ragged"):
        mptlml.estimate_lml(tiny, TEXTS, "random-size", share_masks=True, seed=0)
    with pytest.raises(ValueError, match="rate= applies to ragged sequences"):
        mptlml.estimate_lml(tiny, TEXTS, "random-size", rate=0.5, seed=0)
    with pytest.raises(ValueError, match="target_se= needs an unbiased estimator"):
        mptlml.estimate_lml(tiny, TEXTS, "fixed-rate", rate=0.5, target_se=0.5, seed=0)


def test_checkpoints_of_draws_are_reused_and_belong_to_their_estimator(tiny, tmp_path):
    kw = dict(num_masks=4, seed=2, checkpoint_dir=tmp_path)
    first = mptlml.estimate_lml(tiny, TEXTS, "random-size", **kw)
    again = mptlml.estimate_lml(tiny, TEXTS, "random-size", **kw)
    assert torch.equal(first.per_sample, again.per_sample) and again.num_model_calls == 0
    with pytest.raises(CheckpointError, match="different run"):
        mptlml.estimate_lml(tiny, TEXTS, "random-size", stratified=True, **kw)


def test_library_errors_give_no_command_line_advice_and_name_a_negative_seed(tiny, tmp_path):
    """Before: a checkpoint of another run said "pass --overwrite" to a Python caller;
    seed=-1 surfaced numpy's "expected non-negative integer"."""
    kw = dict(num_masks=2, seed=2, checkpoint_dir=tmp_path)
    mptlml.estimate_lml(tiny, TEXTS, "random-size", **kw)
    with pytest.raises(CheckpointError, match="empty checkpoint_dir") as err:
        mptlml.estimate_lml(tiny, TEXTS, "random-size", stratified=True, **kw)
    assert "--" not in str(err.value)
    with pytest.raises(ValueError, match="seed must be a non-negative int"):
        mptlml.estimate_lml(tiny, TEXTS, "random-size", seed=-1)


def test_parallel_ranks_draw_each_sequence_s_own_reproducible_masks(monkeypatch):
    """The masks of sequence i come from (seed, i) alone: the same whether one process or
    two ranks score it, and distinct between sequences (identical texts included) and
    seeds. A rank- or chunk-seeded generator would repeat masks across ranks or differ
    from the single process."""
    from mptlml._scoring import ragged
    from mptlml._scoring.distributed import DistContext

    class Recorder:
        """Returns, per mask, its bits as a number plus the generator's next uniform."""

        def ragged_masked_log_prob(self, ids, masks, gens, token_budget, progress):
            return [(m.long() * 2 ** torch.arange(m.shape[1])).sum(1).double()
                    + torch.rand(m.shape[0], generator=g, dtype=torch.float64)
                    for m, g in zip(masks, gens, strict=True)]

    n = 6
    ids = [torch.arange(5, 13)] * n  # identical sequences of 8 tokens

    def masks(i, d, g):
        return sample_masks(d, torch.full((4,), 3), generator=g)

    def run(seed):
        out = ragged.run_pairs(Recorder(), ids, masks, seed=seed, tag="t", spec={},
                               chunk_size=2)
        return [np.asarray(v) for v in out.sums]

    single = run(7)
    assert len({tuple(v) for v in single}) == n  # every sequence its own draws
    assert all(not np.array_equal(a, b) for a, b in zip(single, run(8), strict=True))
    for v in single:
        bits = np.floor(v).astype(np.int64)
        assert all(bin(int(b)).count("1") == 3 for b in bits)
    world = 2
    for rank in range(world):
        monkeypatch.setattr(ragged, "distributed_context",
                            lambda cpu=None, r=rank: DistContext(rank=r, world=world))
        monkeypatch.setattr(ragged, "shard", lambda items, ctx: items[ctx.rank::ctx.world])
        monkeypatch.setattr(ragged, "gather", lambda obj, ctx: [obj, (
            {i: np.full(4, np.nan) for i in range(n) if i not in obj[0]}, 0)])
        part = run(7)
        mine = [i for c in range(rank, n // 2, world) for i in (2 * c, 2 * c + 1)]  # chunks
        for i in mine:
            np.testing.assert_array_equal(part[i], single[i])
