"""PPCA's fast reductions against the per-token reference paths: shared, per-datum,
nested (prefix sums) and grid (quadratic forms) sums, in float64 and ill-conditioned float32."""

from __future__ import annotations

import math

import pytest
import torch

from mptlml.masks import random_orders, sample_masks
from mptlml.models import PPCA
from mptlml.models.ppca import _grid_by_quadratic_forms, _grid_quadratic_forms


def _model(d, k, s2, scale=1.0, dtype=torch.float64):
    m = PPCA.random(d, k, sigma2=s2, seed=d + k)
    m.W.data *= scale
    m.mu.data = torch.linspace(-1, 1, d, dtype=torch.float64)
    if dtype == torch.float32:
        m = PPCA(m.W.detach().float(), m.mu.float(), s2)
    return m


def _forms(model, x, mask, weight, data_means):
    """PPCA's grid sums by quadratic forms, whatever the flop count would choose."""
    f64 = torch.float64
    e = model._recentre(x)[1]
    return _grid_quadratic_forms(model.W.detach().to(f64), model.sigma2.detach().to(f64), e,
                                 mask, weight, data_means)


@pytest.mark.parametrize("d,k", [(9, 1), (9, 3), (12, 2), (30, 6)])
@pytest.mark.parametrize("shared", [True, False])
def test_masked_log_prob_equals_sum_of_conditionals(d, k, shared):
    model = _model(d, k, 0.3)
    x = model.sample(7, generator=0) + 0.2
    sizes = torch.tensor([1, 2, d // 2, d - 1, d])
    mask = sample_masks(d, sizes, num_data=None if shared else 7, generator=1)
    with torch.no_grad():
        ref = model._log_conditionals(x, mask, None).sum(-1)
        out = model.masked_log_prob(x, mask, None)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=0)
    # with gradients enabled (the out-of-place path) the value and the gradient agree
    out_g = model.masked_log_prob(x, mask, None).sum()
    (gw,) = torch.autograd.grad(out_g, model.W)
    ref_g = model._log_conditionals(x, mask, None).sum()
    (gw_ref,) = torch.autograd.grad(ref_g, model.W)
    torch.testing.assert_close(gw, gw_ref, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("shared", [True, False])
def test_masked_log_prob_float32_ill_conditioned(shared):
    """float32 sums stay within 1e-4 per masked token of float64 at cond(S) ~ 5e5."""
    d = 512
    m64 = _model(d, 2, 1e-3, scale=10 / math.sqrt(d))
    m32 = _model(d, 2, 1e-3, scale=10 / math.sqrt(d), dtype=torch.float32)
    x = m64.sample(20, generator=1)
    sizes = torch.tensor([1, 76, 256, 500, 512])
    mask = sample_masks(d, sizes, num_data=None if shared else 20, generator=2)
    with torch.no_grad():
        ref = m64.masked_log_prob(x, mask, None)
        out = m32.masked_log_prob(x.float(), mask, None).double()
    assert torch.isfinite(out).all()
    assert ((out - ref).abs() / sizes[:, None]).max() < 1e-4


def test_nested_float32_ill_conditioned():
    """Prefix-sum (nested) sums in float32 within 1e-4 per masked token of float64."""
    d = 512
    m64 = _model(d, 2, 1e-3, scale=10 / math.sqrt(d))
    m32 = _model(d, 2, 1e-3, scale=10 / math.sqrt(d), dtype=torch.float32)
    x = m64.sample(20, generator=1)
    orders = random_orders(d, 2, generator=3)
    with torch.no_grad():
        ref = m64.nested_masked_log_prob(x, orders, None)
        out = m32.nested_masked_log_prob(x.float(), orders, None).double()
    assert torch.isfinite(out).all()
    assert ((out - ref).abs() / torch.arange(1, d + 1)[None, :, None]).max() < 1e-4


def _grid(d, a, n=None, seed=1):
    """A grid of masks: ``a`` draws x all sizes 1..D, with weights 1/M."""
    sizes = torch.arange(1, d + 1)
    mask = sample_masks(d, sizes.repeat(a), num_data=n, generator=seed)
    return mask.reshape(a, d, *mask.shape[1:]), (1.0 / sizes.double()).repeat(a, 1)


@pytest.mark.parametrize("d,k", [(9, 1), (12, 2), (10, 3), (14, 6)])
def test_grid_quadratic_forms_equal_direct_sums(d, k):
    """PPCA's D x D quadratic forms equal the generic grid sums of masked_log_prob."""
    model = _model(d, k, 0.3)
    x = model.sample(40, generator=0) + 0.2
    mask, weight = _grid(d, 5)
    with torch.no_grad():
        rows, cols = _forms(model, x, mask, weight, True)
        lp = model.masked_log_prob(x, mask.reshape(-1, d), None).reshape(5, d, 40)
    torch.testing.assert_close(rows, (weight[..., None] * lp).sum(1), atol=1e-10, rtol=0)
    torch.testing.assert_close(cols, (weight * lp.mean(-1)).sum(0), atol=1e-10, rtol=0)
    rows2, none = _forms(model, x, mask, weight, False)
    assert none is None and torch.equal(rows2, rows)


def test_grid_quadratic_forms_float32_ill_conditioned():
    """A float32 model's grid sums within 1e-4 per masked token of float64 at cond(S) ~ 5e5."""
    d = 128
    m64 = _model(d, 2, 1e-3, scale=10 / math.sqrt(d))
    m32 = _model(d, 2, 1e-3, scale=10 / math.sqrt(d), dtype=torch.float32)
    x = m64.sample(400, generator=1)
    mask, weight = _grid(d, 3)
    with torch.no_grad():
        ref = (weight[..., None] * m64.masked_log_prob(x, mask.reshape(-1, d), None)
               .reshape(3, d, 400)).sum(1)
        out, _ = _forms(m32, x.float(), mask, weight, False)
    assert torch.isfinite(out).all()
    assert (out - ref).abs().max() / d < 1e-4  # weights 1/M: one token's worth per size


def test_grid_dispatch_by_cost():
    """Quadratic forms where D is small next to N (shared masks only), direct sums otherwise."""
    model = _model(50, 2, 0.2)
    assert _grid_by_quadratic_forms(50, 2, 100, 50, 100, True)  # the D=50 benchmark
    assert _grid_by_quadratic_forms(64, 2, 100, 64, 1797, True)  # digits
    assert not _grid_by_quadratic_forms(512, 2, 10, 512, 100, True)
    assert not _grid_by_quadratic_forms(50, 2, 300, 1, 100, True)  # one mask per grid row
    x = model.sample(100, generator=0)
    mask, weight = _grid(50, 4)
    with torch.no_grad():  # dispatched (shared) and generic (per datum) paths agree in law
        rows, cols = model.grid_masked_log_prob(x, mask, weight, None)
        ref = _forms(model, x, mask, weight, True)
    assert torch.equal(rows, ref[0]) and torch.equal(cols, ref[1])
    # with gradients the dispatcher takes the differentiable generic path
    rows_g, _ = model.grid_masked_log_prob(x, mask, weight, None)
    assert rows_g.requires_grad
    torch.testing.assert_close(rows_g.detach(), rows, atol=1e-10, rtol=0)


def test_reuse_data_scope_caches_per_tensor_and_clears():
    """Inside reuse_data the terms of x are computed once; a new x or a closed scope recomputes."""
    model = _model(10, 2, 0.3)
    x = model.sample(5, generator=0)
    calls = []

    def compute():
        calls.append(1)
        return len(calls)

    assert model._cached(x, "t", compute) == 1 and model._cached(x, "t", compute) == 2
    with model.reuse_data():
        assert model._cached(x, "t", compute) == 3
        assert model._cached(x, "t", compute) == 3
        assert model._cached(x.clone(), "t", compute) == 4
        with model.reuse_data():  # nested scopes share the cache
            assert model._cached(x, "t", compute) == 3
    assert model._data_scope is None and model._cached(x, "t", compute) == 5
