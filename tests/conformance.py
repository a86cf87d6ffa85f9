"""Shared conformance suite: every model's tests subclass :class:`ModelConformance`.

A subclass provides ``make_model(dtype)`` and ``make_data(model, n)``; it may
set ``exhaustive_atol`` and ``dtypes``, and override ``reference_lml(model, x)``
(by default ``model.log_marginal``), e.g. with a many-sample estimate for a
model whose conditionals and log_marginal are Monte Carlo estimates, where
Proposition 1 holds only approximately and ``exhaustive_atol`` says how well.
"""

from __future__ import annotations

import pytest
import torch

import mptlml
from mptlml.masks import random_orders, sample_masks


class ModelConformance:
    dtypes: tuple[torch.dtype, ...] = (torch.float64, torch.float32)
    exhaustive_atol: float = 1e-9
    num_data: int = 6

    # -- hooks ------------------------------------------------------------------------------
    def make_model(self, dtype: torch.dtype):  # pragma: no cover - abstract
        raise NotImplementedError

    def make_data(self, model, n: int) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def reference_lml(self, model, x: torch.Tensor) -> torch.Tensor:
        """log p(x) that the exhaustive MPT sum must reproduce (default: log_marginal)."""
        if not model.has_log_marginal:  # pragma: no cover - guides a new subclass
            raise NotImplementedError(f"{type(model).__name__} has no log_marginal: override "
                                      "reference_lml with an independent estimate of log p(x).")
        with torch.no_grad():
            return model.log_marginal(x).double()

    # -- helpers ----------------------------------------------------------------------------
    def _setup(self, dtype=torch.float64):
        torch.manual_seed(0)
        model = self.make_model(dtype)
        x = self.make_data(model, self.num_data)
        return model, x

    def _lc(self, model, x, mask, seed=0):
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            return model.log_conditionals(x, mask, generator=g)

    # -- tests ------------------------------------------------------------------------------
    def test_protocol_attributes(self):
        model, x = self._setup()
        assert isinstance(model, mptlml.models.MaskedModel)
        assert isinstance(model.num_tokens, int) and model.num_tokens == x.shape[1]
        assert isinstance(model.has_log_marginal, bool)

    @pytest.mark.parametrize("mask_ndim", [1, 2, 3])
    def test_shapes_and_masked_only(self, mask_ndim):
        model, x = self._setup()
        n, d = x.shape
        g = torch.Generator().manual_seed(1)
        if mask_ndim == 1:
            mask = sample_masks(d, torch.tensor([max(1, d // 2)]), generator=g)[0]
            expect = (n, d)
        elif mask_ndim == 2:
            mask = sample_masks(d, torch.tensor([1, d // 2 or 1, d]), generator=g)
            expect = (3, n, d)
        else:
            mask = sample_masks(d, torch.tensor([1, d]), num_data=n, generator=g)
            expect = (2, n, d)
        out = self._lc(model, x, mask)
        assert out.shape == expect
        full = mask.expand(out.shape) if mask_ndim != 2 else mask[:, None, :].expand(out.shape)
        assert torch.isfinite(out).all()
        assert (out[~full] == 0).all(), "conditionals must be 0 off the mask"
        assert (out[full] != 0).all()

    @pytest.mark.parametrize("dtype_index", [0, 1])
    def test_dtype_kept(self, dtype_index):
        if dtype_index >= len(self.dtypes):
            pytest.skip("model supports a single dtype")
        dtype = self.dtypes[dtype_index]
        model, x = self._setup(dtype)
        assert model.dtype == dtype
        mask = torch.zeros(x.shape[1], dtype=torch.bool)
        mask[0] = True
        assert self._lc(model, x, mask).dtype == dtype
        if model.has_log_marginal:
            with torch.no_grad():
                assert model.log_marginal(x).dtype == dtype

    def test_seed_determinism(self):
        model, x = self._setup()
        a = mptlml.estimate_lml(model, x, "random-size", num_masks=3, seed=5)
        b = mptlml.estimate_lml(model, x, "random-size", num_masks=3, seed=5)
        assert torch.equal(a.per_sample, b.per_sample)
        mask = sample_masks(x.shape[1], torch.tensor([1, 2]), generator=3)
        assert torch.equal(self._lc(model, x, mask, seed=7), self._lc(model, x, mask, seed=7))

    def test_reductions_equal_summed_conditionals(self):
        """Fast reductions (masked_log_prob, masked_log_prob_mean) equal the naive sums."""
        model, x = self._setup(torch.float64)
        n, d = x.shape
        g = torch.Generator().manual_seed(2)
        shared = sample_masks(d, torch.tensor([1, d // 2 or 1, d]), generator=g)
        per = sample_masks(d, torch.tensor([1, d]), num_data=n, generator=g)
        with torch.no_grad():
            for mask in (shared, per):
                ref = model._log_conditionals(x, mask, torch.Generator().manual_seed(3))
                fast = model.masked_log_prob(x, mask, torch.Generator().manual_seed(3))
                torch.testing.assert_close(fast.double(), ref.sum(-1).double(), atol=1e-9,
                                           rtol=1e-12)
            mean = model.masked_log_prob_mean(x, shared, torch.Generator().manual_seed(3))
            ref = model._log_conditionals(x, shared, torch.Generator().manual_seed(3))
            assert mean.shape == (3,)
            torch.testing.assert_close(mean.double(), ref.sum(-1).double().mean(-1), atol=1e-9,
                                       rtol=1e-12)

    def test_grid_sums_equal_summed_conditionals(self):
        """grid_masked_log_prob: weighted row sums and column data-means of the naive sums."""
        model, x = self._setup(torch.float64)
        n, d = x.shape
        g = torch.Generator().manual_seed(6)
        sizes = torch.tensor([[1, d // 2 or 1, d], [d, 1, d // 2 or 1]])  # (A=2, C=3)
        weight = torch.rand(2, 3, generator=g, dtype=torch.float64) + 0.5
        for num_data in (None, n):
            mask = sample_masks(d, sizes.reshape(-1), num_data=num_data, generator=g)
            mask = mask.reshape(2, 3, *mask.shape[1:])
            with torch.no_grad():
                rows, cols = model.grid_masked_log_prob(x, mask, weight,
                                                         torch.Generator().manual_seed(3))
                flat = mask.reshape(6, *mask.shape[2:])
                lp = model._log_conditionals(x, flat, torch.Generator().manual_seed(3))
            lp = lp.sum(-1).double().reshape(2, 3, n)
            assert rows.shape == (2, n) and cols.shape == (3,)
            torch.testing.assert_close(rows, (weight[..., None] * lp).sum(1), atol=1e-9,
                                       rtol=1e-12)
            torch.testing.assert_close(cols, (weight * lp.mean(-1)).sum(0), atol=1e-9,
                                       rtol=1e-12)

    def test_nested_prefix_sums_equal_summed_conditionals(self):
        """nested_masked_log_prob equals the conditionals summed over each order's prefixes."""
        model, x = self._setup(torch.float64)
        n, d = x.shape
        sizes = torch.arange(1, d + 1)
        for orders in (random_orders(d, 2, generator=4), random_orders(d, 2, num_data=n,
                                                                       generator=5)):
            rank = orders.argsort(-1)
            if orders.ndim == 2:
                masks = (rank[:, None, :] < sizes[None, :, None]).reshape(-1, d)
            else:
                masks = (rank[:, None] < sizes[None, :, None, None]).reshape(-1, n, d)
            with torch.no_grad():
                fast = model.nested_masked_log_prob(x, orders, torch.Generator().manual_seed(3))
                ref = model._log_conditionals(x, masks, torch.Generator().manual_seed(3))
            assert fast.shape == (2, d, n)
            torch.testing.assert_close(fast.double(), ref.sum(-1).double().reshape(2, d, n),
                                       atol=1e-9, rtol=1e-12)

    def test_exhaustive_equals_log_marginal(self):
        model, x = self._setup(torch.float64)
        res = mptlml.estimate_lml(model, x, "exhaustive", seed=0)
        torch.testing.assert_close(res.per_sample, self.reference_lml(model, x).cpu(),
                                   atol=self.exhaustive_atol, rtol=0)

    def test_rejects_bad_masks(self):
        model, x = self._setup()
        d = x.shape[1]
        with pytest.raises(TypeError, match="torch.bool"):
            model.log_conditionals(x, torch.ones(d, dtype=torch.int64))
        with pytest.raises(ValueError, match="mask must have shape"):
            model.log_conditionals(x, torch.ones(d + 1, dtype=torch.bool))

    def test_rejects_bad_data(self):
        model, x = self._setup()
        bad = x.clone()
        bad[0, 0] = float("nan")
        with pytest.raises(ValueError, match="NaN"):
            model.log_conditionals(bad, torch.ones(x.shape[1], dtype=torch.bool))
        with pytest.raises(ValueError, match="columns"):
            model.log_conditionals(x[:, :-1], torch.ones(x.shape[1] - 1, dtype=torch.bool))
