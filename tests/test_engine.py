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
        rows, cols = model._grid_quadratic_forms(x, mask, weight, True)
        lp = model.masked_log_prob(x, mask.reshape(-1, d), None).reshape(5, d, 40)
    torch.testing.assert_close(rows, (weight[..., None] * lp).sum(1), atol=1e-10, rtol=0)
    torch.testing.assert_close(cols, (weight * lp.mean(-1)).sum(0), atol=1e-10, rtol=0)
    rows2, none = model._grid_quadratic_forms(x, mask, weight, False)
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
        out, _ = m32._grid_quadratic_forms(x.float(), mask, weight, False)
    assert torch.isfinite(out).all()
    assert (out - ref).abs().max() / d < 1e-4  # weights 1/M: one token's worth per size


def test_grid_dispatch_by_cost():
    """Quadratic forms where D is small next to N (shared masks only), direct sums otherwise."""
    model = _model(50, 2, 0.2)
    assert model._grid_by_quadratic_forms(100, 50, 100, True)  # the D=50 benchmark
    assert model._grid_by_quadratic_forms(100, 64, 1797, True)  # digits
    assert not _model(512, 2, 0.2)._grid_by_quadratic_forms(10, 512, 100, True)
    assert not model._grid_by_quadratic_forms(300, 1, 100, True)  # one mask per grid row
    x = model.sample(100, generator=0)
    mask, weight = _grid(50, 4)
    with torch.no_grad():  # dispatched (shared) and generic (per datum) paths agree in law
        rows, cols = model.grid_masked_log_prob(x, mask, weight, None)
        ref = model._grid_quadratic_forms(x, mask, weight, True)
    assert torch.equal(rows, ref[0]) and torch.equal(cols, ref[1])
    # with gradients the dispatcher takes the differentiable generic path
    rows_g, _ = model.grid_masked_log_prob(x, mask, weight, None)
    assert rows_g.requires_grad
    torch.testing.assert_close(rows_g.detach(), rows, atol=1e-10, rtol=0)


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


def test_masks_wide_rows_by_partition():
    """D > 128 selects by partition, per distinct size: exact sizes, uniform positions."""
    d, b = 200, 3000
    sizes = torch.tensor([1, 30, 199, 200]).repeat(b // 4)
    m = sample_masks(d, sizes, generator=8)
    assert (m.sum(-1) == sizes).all()
    rows = m[sizes == 30].double()
    se = math.sqrt(0.15 * 0.85 / rows.shape[0])
    assert (rows.mean(0) - 0.15).abs().max() < 5 * se
    wide = sample_masks(5000, torch.tensor([1, 2500, 4999]), generator=8)  # 64-bit keys
    assert wide.sum(-1).tolist() == [1, 2500, 4999]


def test_masks_redraw_rows_with_a_tie_at_the_threshold(monkeypatch):
    """Keys with one random bit tie all the time; index tie-breaks would favour low
    columns, so rows tied at the M-th key are drawn again and stay uniform."""
    import mptlml.masks as masks_mod

    full = masks_mod._random_keys

    def one_bit(rng, rows, d):
        keys, shift = full(rng, rows, d)
        top = keys.dtype.type(keys.dtype.itemsize * 8 - 1)
        return ((keys >> top) << keys.dtype.type(shift)) | (keys & keys.dtype.type(
            (1 << shift) - 1)), shift

    monkeypatch.setattr(masks_mod, "_random_keys", one_bit)
    d, m_size, b = 8, 3, 20000
    m = sample_masks(d, torch.full((b,), m_size), generator=5).double()
    assert (m.sum(-1) == m_size).all()
    se1 = math.sqrt((m_size / d) * (1 - m_size / d) / b)
    assert np.abs(m.mean(0).numpy() - m_size / d).max() < 5 * se1


def test_masks_same_whatever_the_number_of_threads():
    """Chunks are seeded in turn and fixed in size, so threads do not change the draw."""
    sizes = torch.arange(1, 301).repeat(4)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = sample_masks(300, sizes, generator=11)
        torch.set_num_threads(2)
        two = sample_masks(300, sizes, generator=11)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two) and (one.sum(-1) == sizes).all()


def test_keep_heap_opt_out_and_idempotent(monkeypatch):
    from mptlml import _heap

    monkeypatch.setenv("MPTLML_KEEP_HEAP", "0")
    assert _heap._set_thresholds() is False
    monkeypatch.delenv("MPTLML_KEEP_HEAP")
    first = _heap.keep_heap()
    assert isinstance(first, bool) and _heap.keep_heap() is first
    assert _heap.heap_kept() is first


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


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_mask_thread_pool_in_a_forked_child():
    """The mask thread pool is per process: a forked child draws masks on threads of its own.

    (Calls the sampler's core directly: torch's own OpenMP reductions are not fork-safe
    once the parent has used them, which is torch's limitation, not the pool's.)
    """
    import multiprocessing as mp

    sizes = torch.arange(1, 101).repeat(30)  # sorted chunks: the threaded path
    sample_masks(100, sizes, generator=1)  # start the pool in the parent
    with mp.get_context("fork").Pool(1) as pool:
        total = pool.apply_async(_child_mask_total, (sizes.numpy(),)).get(timeout=60)
    assert total == int(sizes.sum())


def _child_mask_total(sizes):
    from mptlml.masks import _masks_of_sizes

    return int(_masks_of_sizes(torch.Generator().manual_seed(2), sizes, 100).sum())
