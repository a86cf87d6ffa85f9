"""PPCA: exact identities against independent references."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from sklearn.decomposition import PCA

import mptlml
from mptlml.masks import random_orders, sample_masks
from mptlml.models import PPCA
from mptlml.testing import ModelConformance


class TestPPCAConformance(ModelConformance):
    def make_model(self, dtype):
        return PPCA.random(7, 2, sigma2=0.3, seed=0, dtype=dtype)

    def make_data(self, model, n):
        return model.sample(n, generator=1)


def _naive_conditionals(model: PPCA, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Gaussian conditioning with a D x D covariance and a solve per mask (reference)."""
    c = model.covariance().detach().double()
    mu = model.mu.detach().double()
    x = x.double()
    out = torch.zeros(mask.shape[0], x.shape[0], x.shape[1], dtype=torch.float64)
    for b, m in enumerate(mask):
        mi, ri = torch.where(m)[0], torch.where(~m)[0]
        for j in mi.tolist():
            if len(ri):
                s_rr = c[ri][:, ri]
                s_jr = c[j, ri]
                coef = torch.linalg.solve(s_rr, s_jr)
                mean = mu[j] + (x[:, ri] - mu[ri]) @ coef
                var = c[j, j] - s_jr @ coef  # minus: the paper's eq. 7 has a sign erratum
            else:
                mean = mu[j].expand(x.shape[0])
                var = c[j, j]
            out[b, :, j] = torch.distributions.Normal(mean, var.sqrt()).log_prob(x[:, j])
    return out


@pytest.mark.parametrize("d,k", [(4, 1), (4, 3), (8, 2), (8, 5), (10, 1), (10, 2), (10, 3),
                                 (10, 5)])
def test_exhaustive_equals_exact_several_k(d, k):
    model = PPCA.random(d, k, sigma2=0.2, seed=d * 10 + k)
    model.mu.data = torch.linspace(-1, 1, d, dtype=torch.float64)
    # off-model data: heavy-tailed, shifted
    g = torch.Generator().manual_seed(k)
    x = torch.distributions.StudentT(3.0).sample((12, d)) * 2 + 0.5
    x = x.double() + torch.randn(12, d, generator=g, dtype=torch.float64)
    res = mptlml.estimate_lml(model, x, "exhaustive")
    exact = model.log_marginal(x).detach()
    torch.testing.assert_close(res.per_sample, exact, atol=1e-9, rtol=0)


def test_log_marginal_equals_sklearn_score_samples():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 10)) @ rng.normal(size=(10, 10)) + rng.normal(size=10)
    pca = PCA(n_components=3).fit(x)
    model = PPCA.from_sklearn(pca)
    np.testing.assert_allclose(model.log_marginal(x).detach().numpy(), pca.score_samples(x),
                               atol=1e-8, rtol=0)
    # and against a dense multivariate normal with sklearn's covariance
    mvn = torch.distributions.MultivariateNormal(torch.from_numpy(pca.mean_),
                                                 torch.from_numpy(pca.get_covariance()))
    np.testing.assert_allclose(model.log_marginal(x).detach().numpy(),
                               mvn.log_prob(torch.from_numpy(x)).numpy(), atol=1e-8, rtol=0)


def test_fit_is_the_mle():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(500, 6)) @ rng.normal(size=(6, 6))
    model = PPCA.fit(x, 2)
    # Tipping & Bishop MLE = sklearn's PCA with the N-1 -> N rescaling
    pca = PCA(n_components=2).fit(x)
    n = x.shape[0]
    torch.testing.assert_close(model.sigma2, torch.tensor(pca.noise_variance_ * (n - 1) / n,
                                                          dtype=torch.float64))
    c_ref = pca.get_covariance() * (n - 1) / n
    np.testing.assert_allclose(model.covariance().detach().numpy(), c_ref, atol=1e-10)
    # the MLE beats small perturbations
    base = model.log_marginal(x).sum()
    for _ in range(5):
        pert = PPCA(model.W.detach() + 0.01 * torch.randn(6, 2, dtype=torch.float64),
                    model.mu, model.sigma2.detach())
        assert pert.log_marginal(x).sum() < base


@pytest.mark.parametrize("shared", [True, False])
def test_woodbury_equals_naive_conditioning(shared):
    model = PPCA.random(9, 3, sigma2=0.5, seed=3)
    model.mu.data = torch.randn(9, dtype=torch.float64)
    x = model.sample(5, generator=4) + 0.3
    sizes = torch.tensor([1, 2, 4, 8, 9])
    if shared:
        mask = sample_masks(9, sizes, generator=5)
        ref = _naive_conditionals(model, x, mask)
    else:
        mask = sample_masks(9, sizes, num_data=5, generator=5)
        ref = torch.stack([
            torch.stack([_naive_conditionals(model, x[n:n + 1], mask[b, n][None])[0, 0]
                         for n in range(5)]) for b in range(len(sizes))])
    out = model.log_conditionals(x, mask).detach()
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=0)


def test_fully_masked_row_gives_marginals():
    model = PPCA.random(6, 2, sigma2=0.4, seed=0)
    x = model.sample(4, generator=0)
    out = model.log_conditionals(x, torch.ones(6, dtype=torch.bool)).detach()
    c = model.covariance().detach()
    ref = torch.distributions.Normal(model.mu, c.diagonal().sqrt()).log_prob(x)
    torch.testing.assert_close(out, ref)


def test_chain_rule_exact_for_every_order():
    d = 5
    model = PPCA.random(d, 2, sigma2=0.3, seed=1)
    x = model.sample(3, generator=2)
    exact = model.log_marginal(x).detach()
    for order in itertools.permutations(range(d)):
        total = torch.zeros(3, dtype=torch.float64)
        for t in range(d):
            mask = torch.zeros(d, dtype=torch.bool)
            mask[list(order[: t + 1])] = True
            total += model.log_conditionals(x, mask).detach()[:, order[t]]
        torch.testing.assert_close(total, exact, atol=1e-10, rtol=0)
    # the estimator with random orders, per datum and shared
    for shared in (False, True):
        res = mptlml.estimate_lml(model, x, "chain-rule", num_masks=4, seed=0, share_masks=shared)
        torch.testing.assert_close(res.per_sample, exact, atol=1e-10, rtol=0)


@pytest.mark.parametrize("estimator", ["cumulative", "random-size"])
@pytest.mark.parametrize("shared", [False, True])
def test_unbiased_estimators_within_four_se(estimator, shared):
    model = PPCA.random(12, 2, sigma2=0.2, seed=7)
    x = model.sample(40, generator=8)
    p = 20 if estimator == "cumulative" else 300
    res = mptlml.estimate_lml(model, x, estimator, num_masks=p, seed=9, share_masks=shared)
    exact = float(model.log_marginal(x).detach().mean())
    assert res.stderr > 0
    assert abs(res.mean - exact) < 4 * res.stderr, (res.mean, exact, res.stderr)
    assert res.exact_lml == pytest.approx(exact)


def test_fixed_rate_is_biased_upwards():
    model = PPCA.random(20, 2, sigma2=0.2, seed=7)
    x = model.sample(50, generator=8)
    res = mptlml.estimate_lml(model, x, "fixed-rate", num_masks=200, rate=0.15, seed=1)
    exact = float(model.log_marginal(x).detach().mean())
    assert res.sizes == [3]
    assert res.mean - exact > 10 * res.stderr  # small masks see more context: optimistic
    assert res.bias == pytest.approx(res.mean - exact)


def test_curve_area_equals_cumulative():
    model = PPCA.random(10, 2, sigma2=0.2, seed=0)
    x = model.sample(30, generator=0)
    curve = mptlml.mpt_curve(model, x, num_masks=4, seed=11)
    cum = mptlml.estimate_lml(model, x, "cumulative", num_masks=4, seed=11)
    assert curve.area_is_exact_sum
    assert curve.area == pytest.approx(cum.mean, abs=1e-10)
    assert curve.rates[0] == pytest.approx(0.1) and curve.rates[-1] == 1.0
    sub = mptlml.mpt_curve(model, x, num_masks=2, sizes=[2, 5, 8], seed=0)
    assert not sub.area_is_exact_sum and len(sub.mean) == 3


def test_float32_accuracy_ill_conditioned():
    """float32 stays finite and within 1e-4 per token of float64 at cond(S) ~ 5e5."""
    d, k, s2 = 512, 2, 1e-3
    m64 = PPCA.random(d, k, sigma2=s2, seed=0)
    m64.W.data = m64.W.data / np.sqrt(d) * 10
    c = m64.covariance().detach()
    cond = float(torch.linalg.cond(c))
    assert 1e5 < cond < 5e6
    m32 = PPCA(m64.W.detach().float(), m64.mu.float(), s2)
    x = m64.sample(20, generator=1)
    masks = sample_masks(d, torch.tensor([1, 76, 256, 500, 512]), num_data=20, generator=2)
    out64 = m64.log_conditionals(x, masks).detach()
    out32 = m32.log_conditionals(x.float(), masks).detach()
    assert torch.isfinite(out32).all()
    assert (out32.double() - out64).abs().max() < 1e-4
    shared = masks[:, 0]
    diff = (m32.log_conditionals(x.float(), shared).detach().double()
            - m64.log_conditionals(x, shared).detach())
    assert diff.abs().max() < 1e-4


def test_dtype_kept_from_numpy_and_default_float64():
    w32 = np.ones((4, 1), dtype=np.float32)
    assert PPCA(w32, sigma2=1.0).dtype == torch.float32
    assert PPCA([[1.0], [2.0]], sigma2=1.0).dtype == torch.float64


@pytest.mark.parametrize("kwargs,exc,match", [
    ({"sigma2": 0.0}, ValueError, "sigma2 must be a finite positive"),
    ({"sigma2": -1.0}, ValueError, "sigma2 must be a finite positive"),
    ({"mu": np.zeros(3)}, ValueError, "mu must have shape"),
])
def test_constructor_errors(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        PPCA(np.ones((4, 2)), **kwargs)


def test_gradients_flow():
    model = PPCA.random(6, 2, sigma2=0.3, seed=0, learn_mu=True, learn_sigma2=True)
    x = model.sample(10, generator=0)
    mask = sample_masks(6, torch.tensor([1, 3, 6]), num_data=10, generator=0)
    loss = model.log_conditionals(x, mask).sum() + model.log_marginal(x).sum()
    loss.backward()
    for p in (model.W, model.mu, model.log_sigma2):
        assert p.grad is not None and torch.isfinite(p.grad).all()


@pytest.mark.parametrize("shared", [True, False])
def test_nested_cumulative_unbiased_and_curve_area(shared):
    """Nested masks (prefixes of one order per draw): within 4 SE of the exact LML."""
    model = PPCA.random(12, 2, sigma2=0.2, seed=7)
    x = model.sample(40, generator=8)
    exact = float(model.log_marginal(x).detach().mean())
    res = mptlml.estimate_lml(model, x, "cumulative", num_masks=40, seed=9, share_masks=shared,
                              nested=True)
    assert res.nested and res.stderr > 0
    assert abs(res.mean - exact) < 4 * res.stderr, (res.mean, exact, res.stderr)
    curve = mptlml.mpt_curve(model, x, num_masks=40, seed=9, share_masks=shared, nested=True)
    assert curve.nested and curve.area == pytest.approx(res.mean, abs=1e-10)
    torch.testing.assert_close(curve.mean, res.size_scores)


def test_nested_prefix_sums_equal_generic_path():
    """PPCA's prefix-sum path equals the base class's one-mask-per-prefix path."""
    from mptlml.models.base import MaskedModel

    for d, k in ((9, 1), (10, 3), (7, 2)):
        model = PPCA.random(d, k, sigma2=0.3, seed=d)
        model.mu.data = torch.randn(d, dtype=torch.float64)
        x = model.sample(6, generator=0) + 0.2
        orders = random_orders(d, 4, generator=1)
        with torch.no_grad():
            fast = model.nested_masked_log_prob(x, orders, None)
            ref = MaskedModel.nested_masked_log_prob(model, x, orders, None)
        torch.testing.assert_close(fast, ref, atol=1e-10, rtol=0)


@pytest.mark.parametrize("shared", [False, True])
def test_small_blocks_and_mask_groups_keep_the_estimate(shared):
    """Blocks split inside grid rows and masks drawn in several calls: same estimator."""
    from mptlml import settings

    model = PPCA.random(12, 2, sigma2=0.2, seed=7)
    x = model.sample(40, generator=8)
    with settings.block_elements(12 * 40 * 5), \
            settings.mask_bytes(12 * (1 if shared else 40) * 7):  # pieces of a draw; ~7 a call
        res = mptlml.estimate_lml(model, x, "cumulative", num_masks=30, seed=3,
                                  share_masks=shared)
        curve = mptlml.mpt_curve(model, x, num_masks=30, seed=3, share_masks=shared)
    exact = float(model.log_marginal(x).detach().mean())
    assert res.num_model_calls > 30 and res.num_masked_rows == 30 * 12 * 40
    assert abs(res.mean - exact) < 4 * res.stderr
    assert float(res.size_scores.sum()) == pytest.approx(res.mean, abs=1e-10)
    assert abs(curve.area - exact) < 4 * res.stderr * 3


# ---------------------------------------------------------------- degenerate fits and inputs
@pytest.mark.parametrize("n,k", [(2, 2), (3, 2), (3, 5), (6, 5)])
def test_fit_with_too_few_rows_is_an_error(n, k):
    """N <= k + 1 centred rows span at most k dimensions: sigma2 = 0, refused."""
    x = np.random.default_rng(0).normal(size=(n, 8))
    with pytest.raises(ValueError, match=r"more than k \+ 1"):
        PPCA.fit(x, k)


def test_fit_rank_deficient_sample_is_an_error():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(50, 3)) @ rng.normal(size=(3, 7)) + 2.0  # rank 3 after centring
    for k in (3, 4):
        with pytest.raises(ValueError, match=f"rank 3 <= k={k}"):
            PPCA.fit(x, k)
    model = PPCA.fit(x + 1e-3 * rng.normal(size=x.shape), 3)  # full rank: a proper fit
    assert float(model.sigma2) > 0 and PPCA.fit(x, 2).sigma2 > 0
    assert PPCA.fit(rng.normal(size=(4, 8)), 2).sigma2 > 0  # N = k + 2: rank k + 1 suffices


@pytest.mark.parametrize("sigma2", [[0.5, 0.5], np.ones((2, 2)), torch.ones(3)])
def test_non_scalar_sigma2_is_an_error(sigma2):
    with pytest.raises(ValueError, match="sigma2 must be one number"):
        PPCA(np.ones((4, 2)), sigma2=sigma2)
    assert float(PPCA(np.ones((4, 2)), sigma2=torch.tensor([0.5])).sigma2) == 0.5


# ---------------------------------------------------------------- float32 at extreme conditioning
def _extreme_pair(k, s2=1e-7, d=512, n=20):
    """A float32 model and the float64 model with the same (float32) numbers, float32 data."""
    w = PPCA.random(d, k, sigma2=s2, seed=k).W.detach().float()
    m32 = PPCA(w, None, s2)
    m64 = PPCA(w.double(), None, float(torch.tensor(s2, dtype=torch.float32)))
    return m32, m64, m64.sample(n, generator=1).float()


@pytest.mark.parametrize("k", [2, 3, 5])
def test_float32_extreme_conditioning_stays_accurate(k):
    """sigma2 = 1e-7, D = 512 (cond(A_R) up to ~5e9): the K x K latent terms go to float64,
    so float32 gives finite sums within 3e-3 nats per token of float64 (was NaN for K = 2
    and a raw LinAlgError for K >= 3)."""
    m32, m64, x = _extreme_pair(k)
    assert m32._latent_dtype() == torch.float64
    sizes = torch.tensor([1, 2, 76, 256, 508, 510, 511, 512])
    with torch.no_grad():
        for num_data in (None, x.shape[0]):
            mask = sample_masks(512, sizes, num_data=num_data, generator=2)
            out = m32.masked_log_prob(x, mask, None).double()
            ref = m64.masked_log_prob(x.double(), mask, None)
            assert torch.isfinite(out).all()
            assert ((out - ref).abs() / sizes[:, None]).max() < 3e-3
            lc = m32.log_conditionals(x, mask).double()
            assert torch.isfinite(lc).all()
            assert (lc - m64.log_conditionals(x.double(), mask)).abs().max() < 3e-3
        orders = random_orders(512, 1, generator=3)
        out = m32.nested_masked_log_prob(x, orders, None).double()
        ref = m64.nested_masked_log_prob(x.double(), orders, None)
        assert ((out - ref).abs() / torch.arange(1, 513)[None, :, None]).max() < 3e-3


@pytest.mark.parametrize("k", [2, 3])
def test_float32_extreme_conditioning_estimates(k):
    """The estimators on that float32 model agree with float64 to 0.05 nats (of ~3400)."""
    m32, m64, x = _extreme_pair(k, n=6)
    exact = float(m64.log_marginal(x.double()).detach().mean())
    for est, kw in (("cumulative", {"num_masks": 1}), ("chain-rule", {"num_masks": 1})):
        for shared in (True, False):
            r32 = mptlml.estimate_lml(m32, x, est, seed=0, share_masks=shared, **kw)
            r64 = mptlml.estimate_lml(m64, x.double(), est, seed=0, share_masks=shared, **kw)
            assert math.isfinite(r32.mean) and abs(r32.mean - r64.mean) < 0.05, (est, shared)
    assert abs(r64.mean - exact) < 1e-6  # chain rule: exact for any order


def test_ordinary_float32_keeps_float32_latent_terms():
    """The float64 latent terms are a fallback: the benchmark's float32 model does not use it."""
    assert PPCA.random(512, 2, sigma2=0.2, seed=0, dtype=torch.float32)._latent_dtype() \
        == torch.float32
    assert PPCA.random(50, 2, sigma2=0.2, seed=0)._latent_dtype() == torch.float64


@pytest.mark.parametrize("dtype,s2,match", [
    (torch.float32, 1e-9, "use a float64 model"),
    (torch.float64, 1e-11, "sigma2 is too small for the scale of W"),
])
def test_beyond_any_dtype_is_a_clear_error(dtype, s2, match):
    """Past the condition number a dtype can score, every reduction says so (no NaN, no
    LinAlgError): the message names the condition number and what to do."""
    model = PPCA.random(512, 3, sigma2=s2, seed=0, dtype=dtype)
    x = PPCA.random(512, 3, sigma2=1e-3, seed=0).sample(20, generator=1).to(dtype)
    mask = sample_masks(512, torch.tensor([1, 511]), generator=0)
    calls = [lambda: model.log_conditionals(x, mask),
             lambda: model.masked_log_prob(x, mask, None),
             lambda: model.masked_log_prob_mean(x, mask, None),
             lambda: model.nested_masked_log_prob(x, random_orders(512, 1, generator=0), None),
             lambda: mptlml.estimate_lml(model, x, "random-size", num_masks=4, seed=0)]
    for call in calls:
        with pytest.raises(ValueError, match="condition number") as info:
            call()
        assert match in str(info.value)
