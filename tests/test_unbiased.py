"""Means over many seeds equal independent references, for every Monte Carlo estimator.

Evaluation (``estimate_lml``: cumulative, nested cumulative, random-size,
fixed-rate, chain-rule; ``mpt_curve``) and training (``MPTLoss``: cumulative,
random-size, fixed-rate; ``per_datum`` and ``batch_mean``), with masks shared
across the data and per datum, for PPCA and the Bernoulli latent model.

The reference is the exact LML (``model.log_marginal``) for the unbiased
estimators and D * S(x; M) summed over all C(D, M) masks with conditionals
computed in ``mc_helpers`` (dense Gaussian conditioning / quadrature
logsumexp) for the fixed rate. The tolerance is 4 standard errors of the mean
over seeds, computed from the spread over seeds, never from the estimator's
own ``stderr`` (that one is checked in ``test_se_calibration.py``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import mptlml

from .mc_helpers import (
    MODELS,
    NUM_SEEDS,
    TRAINABLE,
    UNBIASED,
    curve_runs,
    eval_runs,
    exact_lml,
    fixed_size,
    mean_and_se,
    objective_runs,
    reference,
    reference_curve,
    setting,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _assert_within(values: np.ndarray, ref: float, what: str, k: float = 4.0,
                   zero_variance: bool = False) -> None:
    mean, se = mean_and_se(values)
    assert zero_variance or se > 0, what
    assert abs(mean - ref) < k * se + 1e-9, (
        f"{what}: mean over {len(values)} seeds {mean:.5f} vs reference {ref:.5f}: "
        f"{(mean - ref) / se:+.1f} SE (SE {se:.5f})")


# ---------------------------------------------------------------------- the references
@pytest.mark.parametrize("name", MODELS)
def test_references_agree(name):
    """The hand-computed curve sums to log p(x), and the fixed rate is far from it.

    So the fixed-rate reference is a different number, and a fixed-rate estimate
    that drifted to the LML (or the LML to the fixed rate) would fail.
    """
    curve = reference_curve(name)
    assert curve.sum() == pytest.approx(exact_lml(name), abs=1e-9)
    d = setting(name)[1].shape[1]
    assert d * curve[fixed_size(d) - 1] - exact_lml(name) > 0.1


# ---------------------------------------------------------------------- evaluation
EVAL = [(n, e, s) for n in MODELS for e in ("cumulative", "nested", "random-size", "fixed-rate")
        for s in (False, True)]


@pytest.mark.parametrize("name,estimator,shared", EVAL)
def test_estimate_lml_mean_equals_reference(name, estimator, shared):
    runs = eval_runs(name, estimator, shared)
    _assert_within(runs.mean, reference(name, estimator),
                   f"estimate_lml {estimator} ({name}, shared={shared})")
    d = setting(name)[1].shape[1]
    if estimator == "fixed-rate":
        assert runs.sizes == (fixed_size(d),)
    else:
        assert runs.sizes == tuple(range(1, d + 1))


@pytest.mark.parametrize("name,shared", [(n, s) for n in MODELS for s in (False, True)])
def test_estimate_lml_per_datum_means_equal_exact(name, shared):
    """Each datum's estimate is unbiased for its own log p(x_n) (not only the data mean)."""
    model, x = setting(name)
    with torch.no_grad():
        exact = model.log_marginal(x).double().numpy()
    for estimator in UNBIASED:
        ps = eval_runs(name, estimator, shared).per_sample  # (S, N)
        z = (ps.mean(0) - exact) / (ps.std(0, ddof=1) / math.sqrt(ps.shape[0]))
        # N = 16 z-scores of unbiased means: all within 4.5 (chance of a miss ~1e-4)
        assert np.abs(z).max() < 4.5, (estimator, z.round(1))
        # and jointly: their mean square is ~1 (chi-square with N dof / N)
        assert (z ** 2).mean() < 3.0, (estimator, (z ** 2).mean())


@pytest.mark.parametrize("name,shared", [(n, s) for n in MODELS for s in (False, True)])
def test_mpt_curve_sizes_and_area(name, shared):
    """Each point S_hat(x; M) of the curve is unbiased for S(x; M); its area for log p(x)."""
    areas, means = curve_runs(name, shared)
    _assert_within(areas, exact_lml(name), f"mpt_curve area ({name}, shared={shared})")
    ref = reference_curve(name)
    d = means.shape[1]
    for m in range(d):  # D = 6 tests: 4.5 SE keeps a chance miss below 1e-4
        # M = D has a single mask (all tokens): no variance, the marginals exactly
        _assert_within(means[:, m], ref[m], f"curve at M={m + 1}", k=4.5,
                       zero_variance=m == d - 1)


@pytest.mark.parametrize("name,shared", [(n, s) for n in MODELS for s in (False, True)])
def test_chain_rule_exact_for_every_order(name, shared):
    """Chain rule in a random order is exact per order for a tractable model: zero variance."""
    model, x = setting(name)
    with torch.no_grad():
        exact = model.log_marginal(x).double()
    for seed in range(5):
        res = mptlml.estimate_lml(model, x, "chain-rule", num_masks=3, seed=seed,
                                  share_masks=shared)
        torch.testing.assert_close(res.per_sample, exact, atol=1e-9, rtol=0)
        assert res.stderr < 1e-9


# ---------------------------------------------------------------------- training
OBJ = [(n, e, s, m) for n in MODELS for e in TRAINABLE
       for s in (False, True) for m in ("per_datum", "batch_mean")]


@pytest.mark.parametrize("name,estimator,shared,method", OBJ)
def test_mpt_loss_mean_equals_reference(name, estimator, shared, method):
    """E[MPTLoss] = log p(x) (unbiased estimators) or D * S(x; M) (fixed rate)."""
    vals = objective_runs(name, estimator, shared, method)
    batch = vals.mean(1) if vals.ndim == 2 else vals
    assert batch.shape == (NUM_SEEDS,)
    _assert_within(batch, reference(name, estimator),
                   f"MPTLoss {estimator}.{method} ({name}, shared={shared})")


@pytest.mark.parametrize("name,estimator", [(n, e) for n in MODELS for e in UNBIASED])
def test_mpt_loss_per_datum_unbiased_for_each_datum(name, estimator):
    model, x = setting(name)
    with torch.no_grad():
        exact = model.log_marginal(x).double().numpy()
    for shared in (False, True):
        v = objective_runs(name, estimator, shared, "per_datum")
        z = (v.mean(0) - exact) / (v.std(0, ddof=1) / math.sqrt(v.shape[0]))
        assert np.abs(z).max() < 4.5, (shared, z.round(1))
        assert (z ** 2).mean() < 3.0, (shared, (z ** 2).mean())
