"""One mask-size draw and one validation of its arguments, for evaluation and training."""

from __future__ import annotations

import pytest
import torch

import mptlml
from mptlml.masks import check_mask_size_args, draw_mask_sizes, fixed_rate_size
from mptlml.models import PPCA
from mptlml.objectives import MPTLoss


@pytest.fixture
def setup():
    model = PPCA.random(6, 2, sigma2=0.3, seed=0)
    return model, model.sample(8, generator=0)


def test_draws():
    assert torch.equal(draw_mask_sizes("cumulative", 3, 2), torch.tensor([1, 1, 2, 2, 3, 3]))
    assert torch.equal(draw_mask_sizes("fixed-rate", 10, 3, rate=0.2), torch.full((3,), 2))
    assert torch.equal(draw_mask_sizes("fixed-rate", 10, 2, mask_size=7), torch.full((2,), 7))
    per = draw_mask_sizes("random-size", 5, 400, num_data=3, generator=0)
    assert per.shape == (400, 3) and int(per.min()) == 1 and int(per.max()) == 5
    u = torch.rand(400, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert torch.equal(per, (u * 5).floor().long() + 1)  # the documented floor(U * D) + 1
    counts = torch.bincount(draw_mask_sizes("random-size", 5, 20000, generator=1), minlength=6)
    chi2 = float(((counts[1:] - 4000.0) ** 2 / 4000.0).sum())
    assert counts[0] == 0 and chi2 < 4 + 5 * 8 ** 0.5  # U{1..5}: chi-square, 4 dof
    assert fixed_rate_size(0.15, 512) == 76 and fixed_rate_size(0.2, 10) == 2
    assert fixed_rate_size(0.01, 10) == 1
    with pytest.raises(ValueError, match="mask sizes are drawn for the estimators"):
        draw_mask_sizes("chain-rule", 5, 1)


@pytest.mark.parametrize("estimator", ["cumulative", "random-size", "exhaustive", "chain-rule"])
@pytest.mark.parametrize("arg", [{"rate": 0.3}, {"mask_size": 2}])
def test_rate_and_mask_size_refused_unless_fixed_rate(setup, estimator, arg):
    """Evaluation and training refuse them with the one message of check_mask_size_args."""
    model, x = setup
    with pytest.raises(ValueError, match="only apply to estimator='fixed-rate'") as ev:
        mptlml.estimate_lml(model, x, estimator, **arg)
    with pytest.raises(ValueError) as direct:
        check_mask_size_args(estimator, 6, **arg)
    assert str(ev.value) == str(direct.value)
    if estimator in ("cumulative", "random-size"):
        with pytest.raises(ValueError) as tr:
            MPTLoss(model, estimator, **arg)
        assert str(tr.value) == str(direct.value)


def test_float_sizes_refused_not_truncated(setup):
    model, x = setup
    with pytest.raises(TypeError, match="integer mask size, got 2.7"):
        mptlml.mpt_curve(model, x, sizes=[2.7])
    with pytest.raises(TypeError, match="integer mask size"):
        mptlml.mpt_curve(model, x, sizes=[2.0])
    with pytest.raises(TypeError, match="mask_size must be an integer mask size"):
        mptlml.estimate_lml(model, x, "fixed-rate", mask_size=2.7)
    with pytest.raises(TypeError, match="mask_size must be an integer"):
        MPTLoss(model, "fixed-rate", mask_size=2.7)
    with pytest.raises(ValueError, match="either rate or mask_size"):
        mptlml.estimate_lml(model, x, "fixed-rate", rate=0.3, mask_size=2)
    import numpy as np

    curve = mptlml.mpt_curve(model, x, sizes=np.array([2, 4]), seed=0)  # numpy ints are ints
    assert curve.sizes == [2, 4]


@pytest.mark.parametrize("estimator, kw", [("random-size", {}), ("fixed-rate", {"rate": 0.4}),
                                           ("fixed-rate", {"mask_size": 5})])
@pytest.mark.parametrize("shared", [False, True])
def test_training_and_evaluation_draw_the_same_masks(setup, estimator, kw, shared):
    """MPTLoss.per_datum and estimate_lml: same seed, same sizes and masks, same numbers."""
    model, x = setup
    est = mptlml.estimate_lml(model, x, estimator, num_masks=4, seed=3, share_masks=shared, **kw)
    loss = MPTLoss(model, estimator, num_masks=4, share_masks=shared, **kw)
    with torch.no_grad():
        train = loss.per_datum(x, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(train, est.per_sample, atol=1e-12, rtol=0)
    assert est.rate == loss.rate and est.sizes == ([loss.mask_size] if loss.mask_size else
                                                   list(range(1, 7)))


@pytest.mark.parametrize("estimator", ["random-size", "fixed-rate", "chain-rule"])
def test_other_inapplicable_arguments(setup, estimator):
    model, x = setup
    kw = {"rate": 0.5} if estimator == "fixed-rate" else {}
    with pytest.raises(TypeError, match=r"\['max_masks'\] do not apply"):
        mptlml.estimate_lml(model, x, estimator, max_masks=100, **kw)
    with pytest.raises(TypeError, match="only for ragged sequences"):
        mptlml.estimate_lml(model, x, estimator, rates=[0.5], **kw)


def test_exhaustive_refuses_num_masks(setup):
    model, x = setup
    with pytest.raises(ValueError, match="num_masks does not apply to estimator='exhaustive'"):
        mptlml.estimate_lml(model, x, "exhaustive", num_masks=5)
    res = mptlml.estimate_lml(model, x, "exhaustive", share_masks=True)
    assert res.shared_masks and res.stderr == 0.0
