"""The adaptive-size estimator: M ~ q fitted to past scores, weight 1/q(M), still unbiased.

References are independent of the estimator: PPCA's exact log-marginal (a Gaussian
density), the cumulative estimate of :func:`mptlml.estimate_lml`, and the size
distribution q the weights assume (a chi-square test per sequence position).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from scipy import stats

import mptlml
from mptlml.estimators import AdaptiveSize, RandomSize, create
from mptlml.models import PPCA
from mptlml.objectives import MPTLoss


def _frozen(loss: MPTLoss, monkeypatch: pytest.MonkeyPatch) -> MPTLoss:
    """The objective with its size distribution frozen (observe does nothing)."""
    monkeypatch.setattr(loss.estimator_, "observe", lambda *args: None)
    return loss


@pytest.fixture(scope="module")
def ppca():
    """D = 20, K = 3: the RMS of S_hat(x; M) varies several-fold over M."""
    model = PPCA.random(20, 3, sigma2=0.1, seed=0)
    return model, model.sample(8, generator=1)


@pytest.fixture(scope="module")
def warmed(ppca) -> AdaptiveSize:
    """An adaptive-size estimator after 100 observed MPTLoss calls on ``ppca``."""
    model, x = ppca
    loss = MPTLoss(model, "adaptive-size", num_masks=1, decay=1.0)
    with torch.no_grad():
        for i in range(100):
            loss(x, generator=10_000 + i)
    return loss.estimator_


def _warm(model: PPCA, warmed: AdaptiveSize) -> MPTLoss:
    return MPTLoss(model, copy.deepcopy(warmed))


def test_registered_trainable_and_uniform_before_any_observation():
    assert issubclass(mptlml.estimators.get("adaptive-size"), RandomSize)
    assert "adaptive-size" in mptlml.estimators.available(trainable=True, per_sequence_sizes=True)
    est = AdaptiveSize()
    torch.testing.assert_close(est.size_probs(7), torch.full((7,), 1 / 7, dtype=torch.float64))


def test_frozen_q_is_unbiased_for_the_exact_lml_and_the_cumulative_estimate(ppca, warmed,
                                                                            monkeypatch):
    """E[objective] = log p(x) (exact, Gaussian) = estimate_lml's cumulative estimate."""
    model, x = ppca
    loss = _warm(model, warmed)
    q = loss.estimator_.size_probs(20)
    assert float(q.max() / q.min()) > 2  # really non-uniform
    loss = _frozen(loss, monkeypatch)
    with torch.no_grad():
        vals = torch.stack([loss(x, generator=s).double() for s in range(200)])
    torch.testing.assert_close(loss.estimator_.size_probs(20), q)  # stayed frozen
    exact = float(model._log_marginal(x).detach().double().mean())
    se = float(vals.std() / math.sqrt(vals.numel()))
    assert abs(float(vals.mean()) - exact) < 4 * se
    cum = mptlml.estimate_lml(model, x, "cumulative", num_masks=20, seed=0)
    assert abs(float(vals.mean()) - cum.mean) < 4 * math.hypot(se, cum.stderr)
    # the frozen estimator evaluates the same law with estimate_lml (no adaptation there)
    with pytest.warns(RuntimeWarning, match="1 Monte Carlo draw"):
        est = mptlml.estimate_lml(model, x, loss.estimator_, seed=1)
    assert est.estimator == "adaptive-size"
    torch.testing.assert_close(loss.estimator_.size_probs(20), q)


def test_adapting_run_stays_unbiased(ppca):
    """Each call's q depends only on past calls: the mean of an adapting run is unbiased."""
    model, x = ppca
    loss = MPTLoss(model, "adaptive-size", num_masks=1)
    with torch.no_grad():
        vals = torch.stack([loss(x, generator=s).double() for s in range(200)])
    exact = float(model._log_marginal(x).detach().double().mean())
    assert abs(float(vals.mean()) - exact) < 4 * float(vals.std()) / math.sqrt(200)


def test_q_keeps_the_floor_whatever_it_observes():
    est = AdaptiveSize(eps=0.1, num_bins=8)
    # one bin enormous, the others zero
    est.observe(torch.arange(1, 9), torch.tensor([0.0] * 7 + [-1e6]), 8)
    for d in (1, 2, 3, 7, 20, 64, 300):
        q = est.size_probs(d)
        assert q.shape == (d,) and abs(float(q.sum()) - 1) < 1e-12
        assert bool((q >= 0.1 / d - 1e-15).all())
    assert float(est.size_probs(20)[-3:].sum()) > 0.9  # and it did adapt (bin 8 of 8)
    torch.testing.assert_close(AdaptiveSize(eps=1.0).size_probs(5),
                               torch.full((5,), 0.2, dtype=torch.float64))
    est.reset()
    torch.testing.assert_close(est.size_probs(4), torch.full((4,), 0.25, dtype=torch.float64))


def test_observe_refuses_what_it_cannot_use():
    est = AdaptiveSize()
    with pytest.raises(ValueError, match="not finite"):
        est.observe(torch.tensor([1, 2]), torch.tensor([-1.0, float("nan")]), 4)
    with pytest.raises(ValueError, match="do not match"):
        est.observe(torch.tensor([1, 2]), torch.tensor([-1.0, -2.0, -3.0]), 4)
    for bad in ({"eps": 0.0}, {"eps": 1.5}, {"decay": 0.0}, {"eps": True}):
        with pytest.raises(ValueError):
            create("adaptive-size", **bad)


@pytest.mark.slow  # 1500 collated batches: over 3 s on an idle core
def test_each_sequence_of_a_ragged_batch_draws_the_q_its_weight_assumes(tiny_dir):
    """Per position of a mixed-length batch: sizes ~ q_{D_i} (chi-square), weight 1/(q M)."""
    from transformers import AutoTokenizer

    from mptlml.hf import DataCollatorForMPT
    from mptlml.hf.loss import LABELS, WEIGHTS

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    est = AdaptiveSize(eps=0.1, num_bins=4)
    # larger |S_hat| at higher rates: q grows with the rate bin
    m = torch.arange(1, 9)
    est.observe(m, -(m.double() ** 2), 8)
    coll = DataCollatorForMPT(tok, estimator=est, seed=0)
    texts = ["the cat sat on a mat", "a cat", "the mat sat on the cat a cat", "the"]
    examples = [tok(t)["input_ids"] for t in texts]
    d = coll.maskable(coll.pad(examples)).sum(1)
    assert len(set(d.tolist())) == len(texts)  # mixed lengths
    reps = 1500
    sizes = torch.empty(reps, len(texts), dtype=torch.long)
    for r in range(reps):
        batch = coll(examples)
        mi = (batch[LABELS] != -100).sum(1)
        sizes[r] = mi
        if r < 20:  # the weight of each sequence is 1 / (q_{D_i}(M_i) M_i)
            want = torch.stack([1 / (est.size_probs(int(di))[int(k) - 1] * k)
                                for di, k in zip(d, mi, strict=True)])
            torch.testing.assert_close(batch[WEIGHTS].double(), want, rtol=1e-6, atol=0)
    for i, di in enumerate(d.tolist()):
        q = est.size_probs(di)
        if di > 1:
            assert float(q.max() / q.min()) > 1.5
        counts = torch.bincount(sizes[:, i], minlength=di + 1)[1:].double()
        assert int(counts.sum()) == reps
        if di == 1:
            continue
        p = stats.chisquare(counts.numpy(), (q * reps).numpy()).pvalue
        assert p > 1e-3, (i, di, counts.tolist(), (q * reps).tolist())


@pytest.mark.slow  # 800 objective calls: ~3 s on an idle core, more on a shared one
def test_adapted_q_lowers_the_variance_of_the_objective(ppca, warmed, monkeypatch):
    """Measured: over 400-500 seeds the variance ratio is about 0.55-0.6 on this PPCA (D = 20)."""
    model, x = ppca
    adapted = _frozen(_warm(model, warmed), monkeypatch)
    uniform = MPTLoss(model, "random-size", num_masks=1)
    with torch.no_grad():
        va = torch.stack([adapted(x, generator=s).double() for s in range(400)])
        vu = torch.stack([uniform(x, generator=s).double() for s in range(400)])
    ratio = float(va.var() / vu.var())
    assert ratio < 0.8, ratio


@pytest.mark.parametrize("shared", [False, True])
def test_mptloss_feeds_the_statistics_with_or_without_shared_masks(ppca, shared):
    model, x = ppca
    loss = MPTLoss(model, "adaptive-size", num_masks=3, share_masks=shared)
    value = loss(x, generator=0)
    (-value).backward()  # still differentiable
    est = loss.estimator_
    assert float(est._count.sum()) == (3 if shared else 3 * x.shape[0])
    assert int((~torch.isnan(est.bin_rms())).sum()) >= 1


def test_observe_refuses_sizes_that_cannot_have_been_drawn_and_takes_lists():
    """Before: M > D and M with D = 0 were recorded, 2.7 truncated to 2, lists a traceback."""
    est = AdaptiveSize(num_bins=4)
    before = est.fingerprint()
    for sizes, d, what in (([5], 4, "M=5 of D=4"), ([2], [0], "M=2 of D=0"),
                           ([-1], 4, "M=-1"), ([2.7], 4, "whole numbers")):
        with pytest.raises(ValueError, match=what):
            est.observe(sizes, [-1.0], d)
    assert est.fingerprint() == before  # nothing recorded
    est.observe([1, 4], [-2.0, -3.0], 4)  # lists: bins ceil(4 * M / D) - 1 = 0 and 3
    torch.testing.assert_close(est.bin_rms(), torch.tensor([2.0, math.nan, math.nan, 3.0],
                                                           dtype=torch.float64), equal_nan=True)
    with pytest.raises(TypeError, match="scores must be a tensor or a list"):
        est.observe([1], {"a": 1}, 4)


def test_a_finite_score_whose_square_overflows_is_refused_not_nan():
    """Before: observe(1e200) left every later q NaN (the square overflowed to inf)."""
    est = AdaptiveSize()
    with pytest.raises(ValueError, match="square overflows"):
        est.observe(torch.tensor([1]), torch.tensor([1e200], dtype=torch.float64), 4)
    q = est.size_probs(4)  # untouched: uniform, finite
    torch.testing.assert_close(q, torch.full((4,), 0.25, dtype=torch.float64))


def test_num_bins_is_bounded_before_anything_is_allocated():
    """Before: AdaptiveSize(num_bins=10**8) allocated 1.6 GB when built."""
    from mptlml.estimators.adaptive_size import MAX_BINS

    with pytest.raises(ValueError, match=f"num_bins <= {MAX_BINS}"):
        AdaptiveSize(num_bins=10**8)
    assert AdaptiveSize(num_bins=MAX_BINS).num_bins == MAX_BINS


@pytest.mark.slow  # 3000 draws of a batch's sizes: over 3 s on an idle core
def test_stratified_adaptive_sizes_are_stratified_per_batch_and_q_per_position():
    """Before: stratified=True was dropped for a non-uniform q on sequences (one size each).

    Stratified, the B uniforms of a batch fall in the B quantile strata once each, so
    #{i : M_i <= m} = #{i : U_i < cdf(m)} is floor or ceil of B cdf(m) for every m; and
    each position, over draws, still has M ~ q (its stratum is random).
    """
    est = AdaptiveSize(eps=0.2, num_bins=4, stratified=True)
    m = torch.arange(1, 9)
    est.observe(m, -(m.double() ** 2), 8)
    d, b = 8, 6
    q = est.size_probs(d)
    cdf = q.cumsum(0)
    g = torch.Generator().manual_seed(0)
    reps = 3000
    sizes = torch.stack([est.sizes(torch.full((b,), d), generator=g) for _ in range(reps)])
    below = (sizes[:, :, None] <= torch.arange(1, d + 1)).sum(1).double()  # (reps, D)
    assert ((below >= torch.floor(b * cdf - 1e-9)) & (below <= torch.ceil(b * cdf + 1e-9))).all()
    for i in range(b):
        counts = torch.bincount(sizes[:, i], minlength=d + 1)[1:].double()
        assert stats.chisquare(counts.numpy(), (q * reps).numpy()).pvalue > 1e-3, i
