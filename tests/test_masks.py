"""Mask samplers: exact sizes, uniformity, partitions, ties, threads, and the owned thread pool."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mptlml.masks import fixed_rate_size, sample_masks


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


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_mask_thread_pool_in_a_forked_child():
    """The mask thread pool is per process: a forked child draws masks on threads of its own.

    (Calls the sampler's core directly: torch's own OpenMP reductions are not fork-safe
    once the parent has used them, which is torch's limitation, not the pool's.)
    """
    import multiprocessing as mp

    sizes = torch.arange(1, 101).repeat(30)  # sorted chunks: the threaded path
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        sample_masks(100, sizes, generator=1)  # start the pool in the parent
        assert _mask_threads()
        with mp.get_context("fork").Pool(1) as pool:
            total = pool.apply_async(_child_mask_total, (sizes.numpy(),)).get(timeout=60)
    finally:
        torch.set_num_threads(before)
    assert total == int(sizes.sum())


def _child_mask_total(sizes):
    from mptlml.masks import _masks_of_sizes

    return int(_masks_of_sizes(torch.Generator().manual_seed(2), sizes, 100).sum())


def _mask_threads():
    import threading

    return [t for t in threading.enumerate() if t.name.startswith("mptlml-masks")]


def test_mask_thread_pool_is_closable_and_restarts_lazily():
    """shutdown_mask_pool joins the workers; the next threaded draw starts a fresh pool with
    the same masks (the draw does not depend on the pool)."""
    from mptlml.masks import shutdown_mask_pool

    sizes = torch.arange(1, 101).repeat(30)  # sorted chunks: the threaded path
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        first = sample_masks(100, sizes, generator=1)
        assert _mask_threads(), "the threaded path should have started the pool"
        shutdown_mask_pool()
        assert not _mask_threads()
        shutdown_mask_pool()  # idempotent
        again = sample_masks(100, sizes, generator=1)
        assert torch.equal(first, again) and _mask_threads()
    finally:
        torch.set_num_threads(before)
        shutdown_mask_pool()
    assert not _mask_threads()


def test_fixed_rate_size_is_the_documented_floor_where_rounding_rules_differ():
    """M = max(1, floor(rate * D)), exactly (decimal rate as a fraction), on every path.

    Checked at every D in 1..300 for rates where floor, round-half-even,
    floor(x + 0.5) and ceil disagree (a planted round() or ceil() must fail), on the
    rule itself, the dense estimator and per-sequence sizes (the collator's).
    """
    from fractions import Fraction

    from mptlml.estimators import create

    lengths = list(range(1, 301))
    for rate in ("0.15", "0.2", "0.25", "0.3", "0.5", "0.85"):
        r = float(rate)
        want = [max(1, math.floor(Fraction(rate) * d)) for d in lengths]
        exact = [Fraction(rate) * d for d in lengths]
        halves = [x for x in exact if x.denominator == 2]
        assert any(round(x) != math.floor(x) for x in exact)  # round differs somewhere
        assert any(math.ceil(x) != math.floor(x) for x in exact)
        if halves:  # round-half-even and floor(x + 0.5) differ on half of them
            assert any(round(x) != math.floor(x + Fraction(1, 2)) for x in halves)
        assert [fixed_rate_size(r, d) for d in lengths] == want
        est = create("fixed-rate", rate=r)
        assert [int(est.sizes(d)[0]) for d in lengths] == want
        assert est.sizes(torch.tensor(lengths)).tolist() == want
