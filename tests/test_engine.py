"""The fast paths of the engine against the per-token reference paths."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mptlml.masks import random_orders, sample_masks
from mptlml.models import PPCA


def _model(d, k, s2, scale=1.0, dtype=torch.float64):
    m = PPCA.random(d, k, sigma2=s2, seed=d + k)
    m.W.data *= scale
    m.mu.data = torch.linspace(-1, 1, d, dtype=torch.float64)
    if dtype == torch.float32:
        m = PPCA(m.W.detach().float(), m.mu.float(), s2)
    return m


@pytest.mark.parametrize("d,k", [(9, 1), (9, 3), (12, 2), (30, 6)])
@pytest.mark.parametrize("shared", [True, False])
def test_masked_log_prob_equals_sum_of_conditionals(d, k, shared):
    model = _model(d, k, 0.3)
    x = model.sample(7, generator=0) + 0.2
    sizes = torch.tensor([1, 2, d // 2, d - 1, d])
    mask = sample_masks(d, sizes, num_data=None if shared else 7, generator=1)
    with torch.no_grad():
        ref = model._log_conditionals(x, mask, None).sum(-1)
        out = model._masked_log_prob(x, mask, None)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=0)
    # with gradients enabled (the out-of-place path) the value and the gradient agree
    out_g = model._masked_log_prob(x, mask, None).sum()
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
        ref = m64._masked_log_prob(x, mask, None)
        out = m32._masked_log_prob(x.float(), mask, None).double()
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
        ref = m64._nested_masked_log_prob(x, orders, None)
        out = m32._nested_masked_log_prob(x.float(), orders, None).double()
    assert torch.isfinite(out).all()
    assert ((out - ref).abs() / torch.arange(1, d + 1)[None, :, None]).max() < 1e-4


def test_masks_exact_sizes_mixed_groups_and_reproducible():
    sizes = torch.randint(1, 65, (40, 30), generator=torch.Generator().manual_seed(0))
    m = sample_masks(64, sizes, num_data=30, generator=3)
    assert (m.sum(-1) == sizes).all()
    assert torch.equal(m, sample_masks(64, sizes, num_data=30, generator=3))
    assert not torch.equal(m, sample_masks(64, sizes, num_data=30, generator=4))


def test_masks_uniform_over_positions_and_pairs():
    """Each token is masked with probability M/D, each pair with M(M-1)/(D(D-1))."""
    d, m_size, b = 8, 3, 40000
    m = sample_masks(d, torch.full((b,), m_size), generator=5).double()
    p1 = m.mean(0).numpy()
    se1 = math.sqrt((m_size / d) * (1 - m_size / d) / b)
    assert np.abs(p1 - m_size / d).max() < 5 * se1
    pair = (m.T @ m / b).numpy()[np.triu_indices(d, 1)]
    q = m_size * (m_size - 1) / (d * (d - 1))
    assert np.abs(pair - q).max() < 5 * math.sqrt(q * (1 - q) / b)
