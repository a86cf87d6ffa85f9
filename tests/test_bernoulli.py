"""Bernoulli latent linear model and linear VAE: quadrature identities against references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import mptlml
from mptlml.masks import sample_masks
from mptlml.models import BernoulliLVM, LinearVAE, latent_quadrature
from mptlml.objectives import ELBO, IWAE
from mptlml.testing import ModelConformance


class TestBernoulliLVMConformance(ModelConformance):
    exhaustive_atol = 1e-9

    def make_model(self, dtype):
        return BernoulliLVM.random(7, 2, seed=0, dtype=dtype)

    def make_data(self, model, n):
        return model.sample(n, generator=1)


class TestBernoulliLVMGaussHermiteConformance(TestBernoulliLVMConformance):
    def make_model(self, dtype):
        return BernoulliLVM.random(6, 3, seed=2, dtype=dtype, quadrature="gauss-hermite",
                                   num_points=6)


class TestLinearVAEConformance(ModelConformance):
    exhaustive_atol = 1e-9

    def make_model(self, dtype):
        base = BernoulliLVM.random(7, 2, seed=3)
        return LinearVAE(base.W.detach(), base.b.detach(), dtype=dtype, encoder_seed=1)

    def make_data(self, model, n):
        return model.sample(n, generator=1)


def _token_loglik(model: BernoulliLVM, x: torch.Tensor, nodes: torch.Tensor) -> torch.Tensor:
    """log p(x_nd | z_g) computed directly as Bernoulli log-pmfs: ``(G, N, D)``."""
    p = torch.sigmoid(nodes @ model.W.detach().T + model.b.detach())  # (G, D)
    return torch.where(x[None] > 0.5, torch.log(p)[:, None], torch.log1p(-p)[:, None])


def _reference_conditionals(model, x, mask):
    """Loop over masks and positions; logsumexp over the nodes (the paper's formula)."""
    ll = _token_loglik(model, x, model.nodes)  # (G, N, D)
    lw = model.log_weights[:, None]
    out = torch.zeros(mask.shape[0], *x.shape, dtype=torch.float64)
    for b in range(mask.shape[0]):
        m = mask[b] if mask.ndim == 3 else mask[b].expand(x.shape)
        for n in range(x.shape[0]):
            obs = (ll[:, n] * (~m[n])).sum(-1)  # (G,)
            den = torch.logsumexp(model.log_weights + obs, 0)
            for j in torch.where(m[n])[0].tolist():
                out[b, n, j] = torch.logsumexp(model.log_weights + obs + ll[:, n, j], 0) - den
    del lw
    return out


@pytest.mark.parametrize("shared", [True, False])
def test_conditionals_equal_logsumexp_formula(shared):
    model = BernoulliLVM.random(9, 2, seed=5, scale=2.0)
    x = model.sample(4, generator=6)
    sizes = torch.tensor([1, 3, 8, 9])
    mask = sample_masks(9, sizes, num_data=None if shared else 4, generator=7)
    out = model.log_conditionals(x, mask).detach()
    torch.testing.assert_close(out, _reference_conditionals(model, x, mask), atol=1e-12, rtol=0)


@pytest.mark.parametrize("quadrature,num_points", [("grid", 20), ("gauss-hermite", 25)])
def test_quadrature_lml_matches_brute_force_monte_carlo(quadrature, num_points):
    d, k = 6, 2
    model = BernoulliLVM.random(d, k, seed=11, scale=1.0, quadrature=quadrature,
                                num_points=num_points)
    x = model.sample(5, generator=12)
    g = torch.Generator().manual_seed(13)
    z = torch.randn(1_000_000, k, generator=g, dtype=torch.float64)
    ll = _token_loglik(model, x, z).sum(-1)  # (S, N)
    top = ll.max(0).values
    w = torch.exp(ll - top)
    mc = torch.log(w.mean(0)) + top
    se = w.std(0) / (w.mean(0) * math.sqrt(z.shape[0]))  # delta method
    quad = model.log_marginal(x).detach()
    assert (se < 5e-3).all()
    assert ((quad - mc).abs() < 3 * se).all(), ((quad - mc) / se)


def test_gauss_hermite_and_grid_agree_as_grid_grows():
    base = BernoulliLVM.random(8, 2, seed=21, scale=1.5)
    x = base.sample(6, generator=22)

    def lml(kind, n, bound=5.0):
        m = BernoulliLVM(base.W.detach(), base.b.detach(), quadrature=kind, num_points=n,
                         bound=bound)
        return m.log_marginal(x).detach()

    ref = lml("gauss-hermite", 120)
    gh_errs = [float((lml("gauss-hermite", n) - ref).abs().max()) for n in (10, 20, 40, 80)]
    assert all(b < a for a, b in zip(gh_errs, gh_errs[1:], strict=False)), gh_errs
    assert gh_errs[-1] < 1e-7
    # the paper's grid on [-5, 5]: converges until the truncated prior mass (~1e-6) dominates
    errs = [float((lml("grid", n) - ref).abs().max()) for n in (8, 12, 20)]
    assert all(b < a for a, b in zip(errs, errs[1:], strict=False)), errs
    assert 1e-7 < errs[-1] < 1e-4, errs
    # growing the grid in extent and density: the two rules agree to 1e-8
    assert float((lml("grid", 100, bound=9.0) - ref).abs().max()) < 1e-8


@pytest.mark.parametrize("d,k,quadrature", [(5, 1, "grid"), (10, 2, "grid"), (8, 3, "grid"),
                                            (10, 2, "gauss-hermite"), (7, 3, "gauss-hermite")])
def test_exhaustive_mpt_equals_quadrature_lml(d, k, quadrature):
    npts = {1: 30, 2: 20, 3: 8}[k]
    model = BernoulliLVM.random(d, k, seed=d + k, scale=2.0, quadrature=quadrature,
                                num_points=npts)
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(8, d, generator=g) < 0.4).double()  # off-model binary data
    res = mptlml.estimate_lml(model, x, "exhaustive")
    exact = model.log_marginal(x).detach()
    torch.testing.assert_close(res.per_sample, exact, atol=1e-8, rtol=0)
    chain = mptlml.estimate_lml(model, x, "chain-rule", num_masks=3, seed=1)
    torch.testing.assert_close(chain.per_sample, exact, atol=1e-8, rtol=0)


def test_marginal_variant_is_the_papers_log_p_x_m():
    model = BernoulliLVM.random(6, 2, seed=1, mpt_term="marginal")
    true = BernoulliLVM(model.W.detach(), model.b.detach())
    x = model.sample(5, generator=2)
    mask = sample_masks(6, torch.tensor([2, 4, 6]), generator=3)
    lp = model.masked_log_prob(x, mask, None).detach()
    ll = _token_loglik(model, x, model.nodes)
    for b in range(3):
        ref = torch.logsumexp(model.log_weights[:, None] + (ll * mask[b]).sum(-1), 0)
        torch.testing.assert_close(lp[b], ref)
    # log_conditionals spreads log p(x_M) evenly over the masked positions
    lc = model.log_conditionals(x, mask).detach()
    torch.testing.assert_close(lc.sum(-1), lp)
    # full mask: log p(x_M) is the joint log p(x); the conditional term differs
    torch.testing.assert_close(lp[2], true.log_marginal(x).detach())
    assert (lp[0] - true.masked_log_prob(x, mask[:1], None)[0].detach()).abs().max() > 1e-3


def test_float32_close_to_float64():
    m64 = BernoulliLVM.random(64, 2, seed=0, scale=3.0)
    m32 = BernoulliLVM(m64.W.detach().float(), m64.b.detach().float())
    x = m64.sample(50, generator=1)
    mask = sample_masks(64, torch.tensor([1, 21, 40, 64]), num_data=50, generator=2)
    a = m64.log_conditionals(x, mask).detach()
    b = m32.log_conditionals(x.float(), mask).detach().double()
    assert torch.isfinite(b).all()
    assert (a - b).abs().max() < 1e-3
    assert (m64.log_marginal(x) - m32.log_marginal(x.float()).double()).abs().max() < 1e-3


def test_gradients_flow_and_match_finite_differences():
    model = BernoulliLVM.random(4, 2, seed=4, num_points=8)
    x = model.sample(3, generator=5)
    mask = sample_masks(4, torch.tensor([1, 2, 4]), num_data=3, generator=6)

    class Conditionals(torch.nn.Module):  # a model is not callable: functional_call needs one
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, x, mask):
            return self.model.log_conditionals(x, mask)

    def f(w, b):
        return torch.func.functional_call(Conditionals(), {"model.W": w, "model.b": b},
                                          (x, mask)).sum(-1)

    w = model.W.detach().clone().requires_grad_(True)
    b = model.b.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(f, (w, b))


def test_quadrature_rules():
    nodes, lw = latent_quadrature(2, "grid", 20, 5.0)
    assert nodes.shape == (400, 2) and lw.shape == (400,)
    assert float(torch.logsumexp(lw, 0)) == pytest.approx(0.0, abs=1e-14)
    assert nodes.min() == -5 and nodes.max() == 5
    # Gauss-Hermite integrates E[z1^2 z2^4] = 3 exactly
    nodes, lw = latent_quadrature(2, "gauss-hermite", 5)
    assert float((lw.exp() * nodes[:, 0] ** 2 * nodes[:, 1] ** 4).sum()) == pytest.approx(3.0)


def test_linear_vae_bounds_and_elbo():
    base = BernoulliLVM.random(10, 2, seed=7, scale=1.5)
    model = LinearVAE(base.W.detach(), base.b.detach(), quadrature="gauss-hermite",
                      num_points=40)
    with torch.no_grad():
        model.enc_mean_W.normal_(0, 0.3, generator=torch.Generator().manual_seed(0))
        model.enc_logvar_b.fill_(-1.0)
    x = model.sample(6, generator=8)
    lml = model.log_marginal(x).detach()
    # closed-form KL: the same draws give a Monte Carlo E_q[log p(x,z) - log q(z|x)]
    elbo = model.elbo(x, num_samples=5000, generator=torch.Generator().manual_seed(9)).detach()
    lw = model.log_importance_weights(x, num_samples=5000,
                                      generator=torch.Generator().manual_seed(9)).detach()
    se = lw.std(0) / math.sqrt(lw.shape[0])
    assert ((elbo - lw.mean(0)).abs() < 4 * se).all()
    g = torch.Generator().manual_seed(10)
    assert (elbo < lml).all()
    iw10 = model.iwae_log_marginal(x, num_samples=10, generator=g).detach()
    assert (iw10.mean() > elbo.mean())
    with torch.no_grad():  # proposal = prior: IS is then brute-force Monte Carlo
        model.enc_mean_W.zero_()
        model.enc_logvar_b.zero_()
    lw = model.log_importance_weights(x, num_samples=100_000, generator=g).detach()
    w = torch.exp(lw - lw.max(0).values)
    iw_big = torch.logsumexp(lw, 0) - math.log(lw.shape[0])
    se = w.std(0) / (w.mean(0) * math.sqrt(lw.shape[0]))
    assert ((iw_big - lml).abs() < 4 * se).all(), (iw_big - lml) / se
    iwae = IWAE(model, num_samples=5)
    assert torch.isfinite(iwae(x, generator=0))
    val = ELBO(model)(x, generator=0)
    (-val).backward()
    assert model.enc_mean_W.grad is not None and model.W.grad is not None


def test_bad_inputs():
    model = BernoulliLVM.random(4, 2, seed=0)
    with pytest.raises(ValueError, match="binary data"):
        model.log_marginal(torch.full((2, 4), 0.5, dtype=torch.float64))
    with pytest.raises(ValueError, match="binarize"):
        model.log_conditionals(torch.full((2, 4), 2.0, dtype=torch.float64),
                               torch.ones(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="gauss-hermite"):
        BernoulliLVM(np.ones((5, 4)), quadrature="grid")
    BernoulliLVM(np.ones((5, 4)), quadrature="gauss-hermite", num_points=5)  # accepted
    with pytest.raises(ValueError, match="exceed the limit"):
        BernoulliLVM(np.ones((5, 6)), quadrature="gauss-hermite", num_points=10)
    with pytest.raises(ValueError, match="quadrature must be one of"):
        BernoulliLVM(np.ones((5, 2)), quadrature="simpson")
    with pytest.raises(ValueError, match="mpt_term"):
        BernoulliLVM(np.ones((5, 2)), mpt_term="joint")
    with pytest.raises(ValueError, match="b must have shape"):
        BernoulliLVM(np.ones((5, 2)), np.zeros(4))
    vae = LinearVAE(np.ones((5, 2)))
    for bad in (0, -3):
        with pytest.raises(ValueError, match="num_samples"):
            ELBO(vae, num_samples=bad)
        with pytest.raises(ValueError, match="num_samples"):
            IWAE(vae, num_samples=bad)
        with pytest.raises(ValueError, match="num_samples"):
            vae.iwae_log_marginal(torch.zeros(2, 5, dtype=torch.float64), num_samples=bad)
    with pytest.raises(TypeError, match="encoder"):
        ELBO(BernoulliLVM(np.ones((5, 2))))
