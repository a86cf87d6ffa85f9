"""The conformance suite every :class:`~mptlml.models.MaskedModel` must pass.

Shipped inside the package (like GPyTorch's ``test/*_test_case.py``) so that a
model written outside mptlml is checked by the same identities as the
built-in ones. Subclass :class:`ModelConformance` in a pytest module::

    from mptlml.testing import ModelConformance

    class TestMyModel(ModelConformance):
        def make_model(self, dtype):
            return MyModel(..., dtype=dtype)

        def make_data(self, model, n):
            return model.sample(n, generator=1)

pytest then collects every ``test_*`` method below for ``TestMyModel``. The
module itself does not import pytest (it raises plain ``AssertionError``): it
imports without pytest installed.

What is checked: the protocol attributes; result shapes and zeros off the
mask for 1-, 2- and 3-D masks; the dtype kept; seed determinism; the public
reductions (``masked_log_prob``, ``masked_log_prob_mean``,
``grid_masked_log_prob``, ``nested_masked_log_prob``) equal the summed
``_log_conditionals``; the exhaustive MPT estimator reproduces log p(x)
(Proposition 1 of Moreno-Munoz, Recasens, Hauberg, NeurIPS 2023); bad masks
and bad data are refused with the documented errors.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from . import estimate_lml
from .masks import random_orders, sample_masks
from .models import MaskedModel

__all__ = ["ModelConformance"]


@contextmanager
def _raises(exc: type[BaseException], match: str) -> Iterator[None]:
    """``pytest.raises(exc, match=match)`` without importing pytest."""
    try:
        yield
    except exc as err:
        if not re.search(match, str(err)):
            raise AssertionError(f"{exc.__name__} raised, but {match!r} not in {err}") from err
    else:
        raise AssertionError(f"{exc.__name__} was not raised (expected {match!r})")


def _assert_close(actual: torch.Tensor, expected: torch.Tensor, atol: float,
                  rtol: float = 1e-12) -> None:
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol)


class ModelConformance:
    """Base class of a model's conformance tests.

    Subclass hooks
    --------------
    make_model(dtype) -> MaskedModel
        Required. A small model (D of about 5 to 10: the exhaustive test sums
        2^D - 1 masks) in ``dtype``.
    make_data(model, n) -> torch.Tensor
        Required. ``n`` observations ``(n, D)`` the model can score.
    reference_lml(model, x) -> torch.Tensor
        Optional. The log p(x) the exhaustive MPT sum must reproduce (default
        ``model.log_marginal``); override with an independent, many-sample
        estimate for a model whose conditionals are Monte Carlo estimates.

    Attributes
    ----------
    dtypes : tuple of torch.dtype
        Dtypes the model supports (the first is used by most tests).
    exhaustive_atol : float
        Tolerance of the exhaustive-sum identity (Proposition 1 holds only
        approximately for Monte Carlo conditionals).
    num_data : int
        Rows of data per test.
    """

    dtypes: tuple[torch.dtype, ...] = (torch.float64, torch.float32)
    exhaustive_atol: float = 1e-9
    num_data: int = 6

    # -- hooks ------------------------------------------------------------------------------
    def make_model(self, dtype: torch.dtype) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def make_data(self, model: Any, n: int) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def reference_lml(self, model: Any, x: torch.Tensor) -> torch.Tensor:
        """log p(x) that the exhaustive MPT sum must reproduce (default: log_marginal)."""
        if not model.has_log_marginal:  # pragma: no cover - guides a new subclass
            raise NotImplementedError(f"{type(model).__name__} has no log_marginal: override "
                                      "reference_lml with an independent estimate of log p(x).")
        with torch.no_grad():
            return model.log_marginal(x).double()

    # -- helpers ----------------------------------------------------------------------------
    def _setup(self, dtype: torch.dtype = torch.float64) -> tuple[Any, torch.Tensor]:
        torch.manual_seed(0)
        model = self.make_model(dtype)
        x = self.make_data(model, self.num_data)
        return model, x

    def _lc(self, model: Any, x: torch.Tensor, mask: torch.Tensor, seed: int = 0
            ) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            return model.log_conditionals(x, mask, generator=g)

    # -- tests ------------------------------------------------------------------------------
    def test_protocol_attributes(self) -> None:
        model, x = self._setup()
        assert isinstance(model, MaskedModel)
        assert isinstance(model.num_tokens, int) and model.num_tokens == x.shape[1]
        assert isinstance(model.has_log_marginal, bool)

    def test_shapes_and_masked_only(self) -> None:
        model, x = self._setup()
        n, d = x.shape
        g = torch.Generator().manual_seed(1)
        cases = [
            (sample_masks(d, torch.tensor([max(1, d // 2)]), generator=g)[0], (n, d)),
            (sample_masks(d, torch.tensor([1, d // 2 or 1, d]), generator=g), (3, n, d)),
            (sample_masks(d, torch.tensor([1, d]), num_data=n, generator=g), (2, n, d)),
        ]
        for mask, expect in cases:
            out = self._lc(model, x, mask)
            assert out.shape == expect, (mask.ndim, out.shape, expect)
            full = mask[:, None, :] if mask.ndim == 2 else mask
            full = full.expand(out.shape)
            assert torch.isfinite(out).all()
            assert (out[~full] == 0).all(), "conditionals must be 0 off the mask"
            assert (out[full] != 0).all()

    def test_dtype_kept(self) -> None:
        for dtype in self.dtypes:
            model, x = self._setup(dtype)
            assert model.dtype == dtype
            mask = torch.zeros(x.shape[1], dtype=torch.bool)
            mask[0] = True
            assert self._lc(model, x, mask).dtype == dtype
            if model.has_log_marginal:
                with torch.no_grad():
                    assert model.log_marginal(x).dtype == dtype

    def test_seed_determinism(self) -> None:
        model, x = self._setup()
        with warnings.catch_warnings():  # a check of reproducibility, not of precision
            warnings.simplefilter("ignore", RuntimeWarning)
            a = estimate_lml(model, x, "random-size", num_masks=3, seed=5)
            b = estimate_lml(model, x, "random-size", num_masks=3, seed=5)
        assert torch.equal(a.per_sample, b.per_sample)
        mask = sample_masks(x.shape[1], torch.tensor([1, 2]), generator=3)
        assert torch.equal(self._lc(model, x, mask, seed=7), self._lc(model, x, mask, seed=7))

    def test_reductions_equal_summed_conditionals(self) -> None:
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
                _assert_close(fast.double(), ref.sum(-1).double(), atol=1e-9)
            mean = model.masked_log_prob_mean(x, shared, torch.Generator().manual_seed(3))
            ref = model._log_conditionals(x, shared, torch.Generator().manual_seed(3))
            assert mean.shape == (3,)
            _assert_close(mean.double(), ref.sum(-1).double().mean(-1), atol=1e-9)

    def test_grid_sums_equal_summed_conditionals(self) -> None:
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
            _assert_close(rows, (weight[..., None] * lp).sum(1), atol=1e-9)
            _assert_close(cols, (weight * lp.mean(-1)).sum(0), atol=1e-9)

    def test_nested_prefix_sums_equal_summed_conditionals(self) -> None:
        """nested_masked_log_prob equals the conditionals summed over each order's prefixes."""
        model, x = self._setup(torch.float64)
        n, d = x.shape
        sizes = torch.arange(1, d + 1)
        for orders in (random_orders(d, 2, generator=4),
                       random_orders(d, 2, num_data=n, generator=5)):
            rank = orders.argsort(-1)
            if orders.ndim == 2:
                masks = (rank[:, None, :] < sizes[None, :, None]).reshape(-1, d)
            else:
                masks = (rank[:, None] < sizes[None, :, None, None]).reshape(-1, n, d)
            with torch.no_grad():
                fast = model.nested_masked_log_prob(x, orders, torch.Generator().manual_seed(3))
                ref = model._log_conditionals(x, masks, torch.Generator().manual_seed(3))
            assert fast.shape == (2, d, n)
            _assert_close(fast.double(), ref.sum(-1).double().reshape(2, d, n), atol=1e-9)

    def test_exhaustive_equals_log_marginal(self) -> None:
        model, x = self._setup(torch.float64)
        res = estimate_lml(model, x, "exhaustive", seed=0)
        _assert_close(res.per_sample, self.reference_lml(model, x).cpu(),
                      atol=self.exhaustive_atol, rtol=0)

    def test_rejects_bad_masks(self) -> None:
        model, x = self._setup()
        d = x.shape[1]
        with _raises(TypeError, "torch.bool"):
            model.log_conditionals(x, torch.ones(d, dtype=torch.int64))
        with _raises(ValueError, "mask must have shape"):
            model.log_conditionals(x, torch.ones(d + 1, dtype=torch.bool))

    def test_rejects_bad_data(self) -> None:
        model, x = self._setup()
        bad = x.clone()
        bad[0, 0] = float("nan")
        with _raises(ValueError, "NaN"):
            model.log_conditionals(bad, torch.ones(x.shape[1], dtype=torch.bool))
        with _raises(ValueError, "columns"):
            model.log_conditionals(x[:, :-1], torch.ones(x.shape[1] - 1, dtype=torch.bool))
