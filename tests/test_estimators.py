"""The estimator objects: one registry, one size rule per estimator, one file per new estimator.

Every test that runs over estimators takes them from the registry
(``mptlml.estimators.available``), never from a list of names.
"""

from __future__ import annotations

import math

import pytest
import torch

import mptlml
from mptlml.estimators import (
    Estimator,
    RandomSize,
    accepted_options,
    available,
    create,
    get,
    register,
    unregister,
)
from mptlml.masks import fixed_rate_size
from mptlml.models import PPCA
from mptlml.objectives import MPTLoss

_OPTIONS = {"fixed-rate": {"rate": 0.4}}  # the one option an estimator cannot do without


@pytest.fixture
def setup():
    model = PPCA.random(6, 2, sigma2=0.3, seed=0)
    return model, model.sample(8, generator=0)


def test_documented_size_rules():
    """cumulative: every size P times, size-major; fixed-rate: floor; random-size: floor(UD)+1."""
    assert torch.equal(create("cumulative", num_masks=2).sizes(3),
                       torch.tensor([1, 1, 2, 2, 3, 3]))
    assert torch.equal(create("fixed-rate", num_masks=3, rate=0.2).sizes(10), torch.full((3,), 2))
    assert torch.equal(create("fixed-rate", num_masks=2, mask_size=7).sizes(10),
                       torch.full((2,), 7))
    per = create("random-size", num_masks=400).sizes(5, num_data=3,
                                                     generator=torch.Generator().manual_seed(0))
    u = torch.rand(400, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert torch.equal(per, (u * 5).floor().long() + 1)  # the documented floor(U * D) + 1
    counts = torch.bincount(create("random-size", num_masks=20000).sizes(
        5, generator=torch.Generator().manual_seed(1)), minlength=6)
    chi2 = float(((counts[1:] - 4000.0) ** 2 / 4000.0).sum())
    assert counts[0] == 0 and chi2 < 4 + 5 * 8 ** 0.5  # U{1..5}: chi-square, 4 dof
    assert fixed_rate_size(0.15, 512) == 76 and fixed_rate_size(0.2, 10) == 2
    assert fixed_rate_size(0.01, 10) == 1
    with pytest.raises(NotImplementedError, match="no mask-size rule"):
        create("chain-rule").sizes(5)


def test_dense_and_ragged_sizes_are_one_draw():
    """An int D and a tensor of D_i give the same sizes from the same generator."""
    rs = create("random-size", num_masks=50)
    dense = rs.sizes(9, generator=torch.Generator().manual_seed(3))
    ragged = rs.sizes(torch.full((50,), 9), generator=torch.Generator().manual_seed(3))
    assert torch.equal(dense, ragged)
    assert torch.equal(create("fixed-rate", rate=0.15).sizes(torch.tensor([0, 10, 100])),
                       torch.tensor([0, 1, 15]))
    with pytest.raises(ValueError, match="need rate"):
        create("fixed-rate", mask_size=3).sizes(torch.tensor([4, 5]))
    with pytest.raises(ValueError, match="every size of each sequence"):
        create("cumulative").sizes(torch.tensor([4, 5]))


def test_stratified_sizes_cover_every_stratum():
    g = torch.Generator().manual_seed(0)
    rs = create("random-size", stratified=True)
    for d in (1, 7, 40):
        assert sorted(rs.sizes(torch.full((d,), d), generator=g).tolist()) == list(range(1, d + 1))


def test_registry_is_the_one_list():
    names = available()
    assert {"cumulative", "random-size", "fixed-rate", "exhaustive", "chain-rule",
            "riemann"} <= set(names)
    assert set(available(trainable=True)) >= {"cumulative", "random-size", "fixed-rate"}
    assert set(available(per_sequence_sizes=True)) >= {"random-size", "fixed-rate"}
    assert "cumulative" not in available(per_sequence_sizes=True)
    for name in names:
        cls = get(name)
        assert cls.name == name and cls.summary and cls.__doc__
        assert "num_masks" in accepted_options(cls)
    with pytest.raises(ValueError, match="unknown estimator 'nope'; choose one of"):
        mptlml.estimate_lml(PPCA.random(4, 1, seed=0), torch.zeros(2, 4), "nope")


@pytest.mark.parametrize("name", available(dense=True))
def test_every_dense_estimator_against_the_exact_lml(name):
    """Unbiased estimators agree with the exact LML of PPCA (z-test); exact ones to 1e-8."""
    model = PPCA.random(5, 2, sigma2=0.3, seed=1)
    x = model.sample(30, generator=2)
    cls = get(name)
    nm = 1 if name == "exhaustive" else 40
    est = mptlml.estimate_lml(model, x, name, num_masks=nm, seed=0, **_OPTIONS.get(name, {}))
    assert est.estimator == name and est.exact_lml is not None
    if name in ("exhaustive", "chain-rule"):
        assert abs(est.mean - est.exact_lml) < 1e-8
    elif cls.unbiased:
        assert abs(est.mean - est.exact_lml) < 5 * est.stderr
    assert est.num_model_calls > 0 and est.num_masked_rows > 0


@pytest.mark.parametrize("name", available(trainable=True, dense=True))
@pytest.mark.parametrize("shared", [False, True])
def test_training_draws_the_masks_of_evaluation(setup, name, shared):
    """MPTLoss.per_datum and estimate_lml: same seed, same sizes and masks, same numbers."""
    model, x = setup
    kw = _OPTIONS.get(name, {})
    est = mptlml.estimate_lml(model, x, name, num_masks=4, seed=3, share_masks=shared, **kw)
    loss = MPTLoss(model, name, num_masks=4, share_masks=shared, **kw)
    with torch.no_grad():
        train = loss.per_datum(x, generator=torch.Generator().manual_seed(3))
    if name == "cumulative":  # evaluation reduces the grid of sizes in the model: same law
        assert train.shape == est.per_sample.shape
        return
    torch.testing.assert_close(train, est.per_sample, atol=1e-12, rtol=0)
    assert est.rate == loss.rate


@pytest.mark.parametrize("name", [n for n in available(dense=True) if n != "fixed-rate"])
@pytest.mark.parametrize("arg", [{"rate": 0.3}, {"mask_size": 2}])
def test_rate_and_mask_size_refused_unless_fixed_rate(setup, name, arg):
    model, x = setup
    with pytest.raises((ValueError, TypeError), match="rate|mask_size"):
        mptlml.estimate_lml(model, x, name, **arg)
    if get(name).trainable:
        with pytest.raises((ValueError, TypeError), match="rate|mask_size"):
            MPTLoss(model, name, **arg)


def test_float_sizes_refused_not_truncated(setup):
    model, x = setup
    with pytest.raises(TypeError, match="integer mask size, got 2.7"):
        mptlml.mpt_curve(model, x, sizes=[2.7])
    with pytest.raises(TypeError, match="mask_size must be a positive integer"):
        mptlml.estimate_lml(model, x, "fixed-rate", mask_size=2.7)
    with pytest.raises(TypeError, match="mask_size must be a positive integer"):
        MPTLoss(model, "fixed-rate", mask_size=2.7)
    with pytest.raises(ValueError, match="either rate or mask_size"):
        mptlml.estimate_lml(model, x, "fixed-rate", rate=0.3, mask_size=2)
    with pytest.raises(ValueError, match="mask_size"):
        mptlml.estimate_lml(model, x, "fixed-rate", mask_size=7)  # M > D


def test_evaluation_only_estimators_refuse_to_train(setup):
    model, _ = setup
    for name in available(trainable=False, dense=True):
        with pytest.raises(ValueError, match="cannot train"):
            MPTLoss(model, name)


def test_exhaustive_refuses_num_masks(setup):
    model, x = setup
    with pytest.raises(ValueError, match="num_masks does not apply to estimator='exhaustive'"):
        mptlml.estimate_lml(model, x, "exhaustive", num_masks=5)


# ------------------------------------------------------------ an estimator from outside
class SmallSizes(RandomSize):
    """S_hat(x; M) / q(M) with q(M) proportional to 1/M: importance-sampled sizes, unbiased."""

    name = "test-small-sizes"
    summary = "S_hat(x; M) / q(M), q(M) ~ 1/M; unbiased"

    def size_probs(self, num_tokens: int) -> torch.Tensor:
        q = 1.0 / torch.arange(1, num_tokens + 1, dtype=torch.float64)
        return q / q.sum()


@pytest.fixture
def small_sizes():
    register(SmallSizes)
    yield SmallSizes
    unregister(SmallSizes.name)


def test_a_new_estimator_is_one_class_from_outside(small_sizes, tiny_dir):
    """Subclass, register, and it works in estimate_lml, MPTLoss and DataCollatorForMPT."""
    name = small_sizes.name
    assert name in available(trainable=True, per_sequence_sizes=True)
    # estimate_lml: unbiased for the exact LML (z-test over many draws)
    model = PPCA.random(6, 2, sigma2=0.3, seed=1)
    x = model.sample(20, generator=2)
    est = mptlml.estimate_lml(model, x, name, num_masks=400, seed=0)
    assert est.estimator == name and abs(est.mean - est.exact_lml) < 5 * est.stderr
    # its sizes follow q: small sizes far more often than large ones
    m = small_sizes(num_masks=20000).sizes(6, generator=torch.Generator().manual_seed(0))
    freq = torch.bincount(m, minlength=7)[1:].double() / m.numel()
    q = small_sizes().size_probs(6)
    assert torch.allclose(freq, q, atol=0.015)
    # MPTLoss: the objective's expectation is the same unbiased estimate
    loss = MPTLoss(model, name, num_masks=400)
    with torch.no_grad():
        val = float(loss(x, generator=1))
    assert abs(val - est.exact_lml) < 5 * est.stderr * math.sqrt(2) + 0.05
    # DataCollatorForMPT: weight 1 / (q(M_i) M_i) per masked token
    from transformers import AutoTokenizer

    from mptlml.hf import DataCollatorForMPT
    from mptlml.hf.loss import LABELS

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    coll = DataCollatorForMPT(tok, estimator=name, seed=0)
    batch = coll([tok("the cat sat on a mat")["input_ids"]] * 64)
    mi = (batch[LABELS] != -100).sum(1)
    qd = small_sizes().size_probs(6)
    want = 1.0 / (qd[mi - 1] * mi.double())
    torch.testing.assert_close(batch["mpt_weights"].double(), want, rtol=1e-6, atol=0)


def test_registering_twice_needs_replace(small_sizes):
    class Other(RandomSize):
        name = small_sizes.name

    with pytest.raises(ValueError, match="registered already"):
        register(Other)
    with pytest.raises(ValueError, match="needs a class attribute name"):
        register(type("Nameless", (Estimator,), {}))
