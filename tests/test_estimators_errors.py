"""Bad input raises an actionable error and writes nothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mptlml
from mptlml.masks import all_masks, sample_masks
from mptlml.models import PPCA


@pytest.fixture
def setup():
    model = PPCA.random(6, 2, sigma2=0.3, seed=0)
    return model, model.sample(8, generator=0)


def test_nan_and_inf(setup):
    model, x = setup
    for bad in (float("nan"), float("inf")):
        y = x.clone()
        y[1, 2] = bad
        with pytest.raises(ValueError, match="NaN or infinite"):
            mptlml.estimate_lml(model, y)


def test_wrong_ndim_and_d(setup):
    model, x = setup
    with pytest.raises(ValueError, match=r"2-D with shape \(N, D\)"):
        mptlml.estimate_lml(model, x[0])
    with pytest.raises(ValueError, match="2-D"):
        mptlml.estimate_lml(model, x[None])
    with pytest.raises(ValueError, match="model has D=6"):
        mptlml.estimate_lml(model, x[:, :4])
    with pytest.raises(ValueError, match="N=0"):
        mptlml.estimate_lml(model, x[:0])


def test_sizes_and_counts(setup):
    model, x = setup
    with pytest.raises(ValueError, match="1 <= M <= D"):
        mptlml.mpt_curve(model, x, sizes=[0])
    with pytest.raises(ValueError, match="1 <= M <= D"):
        mptlml.mpt_curve(model, x, sizes=[7])
    with pytest.raises(ValueError, match="mask_size"):
        mptlml.estimate_lml(model, x, "fixed-rate", mask_size=0)
    for p in (0, -3):
        with pytest.raises(ValueError, match="num_masks must be a positive integer"):
            mptlml.estimate_lml(model, x, num_masks=p)
    with pytest.raises(TypeError, match="num_masks"):
        mptlml.estimate_lml(model, x, num_masks=2.5)


@pytest.mark.parametrize("rate", [0.0, 1.0, -0.1, 1.5, None])
def test_rate_outside_unit_interval(setup, rate):
    model, x = setup
    with pytest.raises(ValueError, match="rate"):
        mptlml.estimate_lml(model, x, "fixed-rate", rate=rate)


@pytest.mark.parametrize("estimator", ["random-size", "fixed-rate", "chain-rule", "exhaustive"])
def test_nested_needs_cumulative(setup, estimator):
    model, x = setup
    with pytest.raises(ValueError, match="nested=True needs estimator='cumulative'"):
        mptlml.estimate_lml(model, x, estimator, rate=0.5, nested=True)


def test_mask_shape_and_dtype(setup):
    model, x = setup
    with pytest.raises(TypeError, match="torch.bool"):
        model.log_conditionals(x, torch.ones(6))
    with pytest.raises(ValueError, match="mask must have shape"):
        model.log_conditionals(x, torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\(B, N, D\) with N=8"):
        model.log_conditionals(x, torch.ones(2, 3, 6, dtype=torch.bool))
    with pytest.raises(TypeError, match="bool torch.Tensor"):
        model.log_conditionals(x, [True] * 6)


def test_unknown_estimator_and_budget(setup):
    model, x = setup
    with pytest.raises(ValueError, match="unknown estimator 'exact'.*cumulative"):
        mptlml.estimate_lml(model, x, "exact")
    with pytest.raises(ValueError, match="max_masks"):
        mptlml.estimate_lml(model, x, "exhaustive", max_masks=10)
    with pytest.raises(TypeError, match="MaskedModel"):
        mptlml.estimate_lml(object(), x)


def test_sigma2_nonpositive():
    with pytest.raises(ValueError, match="sigma2"):
        PPCA(np.ones((3, 1)), sigma2=0)


def test_masks_are_uniform_subsets():
    m = sample_masks(5, torch.tensor([2] * 20000), generator=0)
    assert (m.sum(1) == 2).all()
    # each of the C(5,2)=10 subsets appears ~2000 times
    keys = (m.long() * (2 ** torch.arange(5))).sum(1)
    counts = torch.bincount(keys)[torch.bincount(keys) > 0]
    assert len(counts) == 10
    assert counts.min() > 1800 and counts.max() < 2200
    assert all_masks(5, 2).shape == (10, 5)
    per = sample_masks(7, torch.randint(1, 8, (4, 3)), num_data=3, generator=1)
    assert per.shape == (4, 3, 7)


def test_an_instance_keeps_its_num_masks_when_the_caller_passes_none(setup):
    """Before: estimate_lml(m, x, create(..., num_masks=4)) was refused for a "num_masks"
    the caller never passed (the default 1 differed from the instance's 4)."""
    from mptlml.estimators import create
    from mptlml.objectives import MPTLoss

    model, x = setup
    est = mptlml.estimate_lml(model, x, create("random-size", num_masks=4), seed=0)
    assert est.num_masks == 4 and est.num_masked_rows == 4 * x.shape[0]
    assert MPTLoss(model, create("random-size", num_masks=3)).num_masks == 3
    with pytest.raises(TypeError, match="carries its options"):
        mptlml.estimate_lml(model, x, create("random-size", num_masks=4), num_masks=2)
