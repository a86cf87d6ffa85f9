"""Objectives and the training loop: gradients, convergence to the MLE, the fixed-rate bias."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import mptlml
import mptlml.masks
from mptlml.masks import all_masks, fixed_rate_size
from mptlml.models import PPCA, MaskedModel
from mptlml.objectives import ExactLML, MPTLoss, Objective
from mptlml.training import History, Monitor, StopTraining, exact_lml, mpt_curve_monitor, train

pytestmark = pytest.mark.usefixtures("one_thread")


def _data(d=10, k=2, sigma2=0.2, n=500, seed=0):
    true = PPCA.random(d, k, sigma2, seed=seed)
    return true, true.sample(n, generator=seed + 1)


def _mle_lml(x, k):
    with torch.no_grad():
        return float(PPCA.fit(x, k).log_marginal(x).mean())


class _NoMarginal(MaskedModel):
    """Independent Gaussians N(a_j, 1) without a log_marginal (conditionals = marginals)."""

    def __init__(self, d):
        super().__init__()
        self.num_tokens = d
        self.a = torch.nn.Parameter(torch.zeros(d, dtype=torch.float64))

    def _log_conditionals(self, x, mask, generator):
        lp = -0.5 * (math.log(2 * math.pi) + (x - self.a) ** 2)
        m = mask[:, None, :] if mask.ndim == 2 else mask
        return torch.where(m, lp, torch.zeros((), dtype=x.dtype))


# ---------------------------------------------------------------------- gradients
@pytest.mark.parametrize("estimator,kw", [("cumulative", {"num_masks": 2}),
                                          ("random-size", {"num_masks": 3}),
                                          ("fixed-rate", {"rate": 0.3, "num_masks": 2}),
                                          ("cumulative", {"share_masks": True})])
def test_mpt_gradient_matches_finite_differences(estimator, kw):
    model = PPCA.random(6, 2, sigma2=0.3, seed=3, learn_mu=True, learn_sigma2=True)
    x = PPCA.random(6, 2, sigma2=0.5, seed=4).sample(7, generator=5)
    obj = MPTLoss(model, estimator, **kw)

    def value():
        return obj(x, generator=torch.Generator().manual_seed(11))  # same masks every call

    value().backward()
    eps = 1e-6
    for p in (model.W, model.mu, model.log_sigma2):
        grad = p.grad.clone()
        fd = torch.zeros_like(p)
        flat = p.data.view(-1)
        for i in range(flat.numel()):
            old = float(flat[i])
            with torch.no_grad():
                flat[i] = old + eps
                up = float(value())
                flat[i] = old - eps
                down = float(value())
                flat[i] = old
            fd.view(-1)[i] = (up - down) / (2 * eps)
        torch.testing.assert_close(grad, fd, rtol=1e-6, atol=1e-7)


def test_gradients_flow_in_float32():
    m64 = PPCA.random(8, 2, sigma2=0.2, seed=0)
    m32 = PPCA(m64.W.detach().float(), sigma2=0.2)
    x = m64.sample(50, generator=1)
    g = []
    for m in (m64, m32):
        MPTLoss(m, "cumulative", num_masks=2)(x, generator=torch.Generator().manual_seed(0)) \
            .backward()
        g.append(m.W.grad.double())
    assert m32.W.grad.dtype == torch.float32 and torch.isfinite(g[1]).all()
    torch.testing.assert_close(g[1], g[0], rtol=1e-3, atol=1e-4)


def test_exact_lml_objective_and_its_gradient():
    model = PPCA.random(5, 2, sigma2=0.3, seed=2)
    x = model.sample(20, generator=3)
    val = ExactLML(model)(x)
    ref = torch.distributions.MultivariateNormal(
        torch.zeros(5, dtype=torch.float64), model.covariance()).log_prob(x).mean()
    torch.testing.assert_close(val, ref, rtol=0, atol=1e-10)
    val.backward()
    w = model.W.detach().clone().requires_grad_(True)
    c = w @ w.T + 0.3 * torch.eye(5, dtype=torch.float64)
    torch.distributions.MultivariateNormal(torch.zeros(5, dtype=torch.float64), c) \
        .log_prob(x).mean().backward()
    torch.testing.assert_close(model.W.grad, w.grad, rtol=1e-8, atol=1e-10)


# ---------------------------------------------------------------------- identities
def test_curve_area_equals_cumulative_estimate_and_objective():
    true, x = _data(d=12, n=40)
    model = PPCA.random(12, 2, sigma2=0.2, seed=9)
    for p in (1, 3):
        curve = mptlml.mpt_curve(model, x, num_masks=p, seed=5)
        est = mptlml.estimate_lml(model, x, "cumulative", num_masks=p, seed=5)
        with torch.no_grad():
            obj = MPTLoss(model, "cumulative", num_masks=p)(x, generator=5)
        assert curve.area_is_exact_sum
        assert curve.area == pytest.approx(est.mean, abs=1e-10)
        assert float(obj) == pytest.approx(est.mean, abs=1e-10)
        # area = sum over sizes of the curve
        assert float(curve.mean.sum()) == pytest.approx(curve.area, abs=1e-10)


def test_fixed_rate_objective_expectation_is_d_times_s():
    model, x = _data(d=8, n=30)
    obj = MPTLoss(model, "fixed-rate", rate=0.25, num_masks=4000)
    m = fixed_rate_size(0.25, 8)
    assert obj.mask_size == m == 2
    with torch.no_grad():
        exact = float(8 * model.masked_log_prob(x, all_masks(8, m), None).mean() / m)
        mc = float(obj(x, generator=0))
    assert mc == pytest.approx(exact, abs=0.05)


# ---------------------------------------------------------------------- training
@pytest.mark.slow
def test_cumulative_mpt_training_reaches_mle():
    _, x = _data(n=500)
    mle = _mle_lml(x, 2)
    model = PPCA.random(10, 2, sigma2=1.0, seed=7, learn_sigma2=True, learn_mu=True)
    hist = train(model, MPTLoss(model, "cumulative"), x, epochs=600, lr=0.05, seed=0,
                 monitors={"lml": exact_lml(every=50)}, progress=False)
    final = hist.last["lml"]
    assert hist.records[0]["lml"] < mle - 5  # started far away
    assert abs(final - mle) / abs(mle) < 0.005, (final, mle)
    # the LML rises: each later checkpoint beats the initial one
    epochs, lml = hist.series("lml")
    assert epochs[0] == 0 and epochs[-1] == 600 and lml[-1] > lml[0]


@pytest.mark.slow
def test_fixed_rate_training_converges_with_constant_bias():
    _, x = _data(sigma2=1.0, n=500)
    mle = _mle_lml(x, 2)
    model = PPCA.random(10, 2, sigma2=1.0, seed=7)
    m = fixed_rate_size(0.2, 10)
    masks = all_masks(10, m)

    def bias(mod, xx):
        d_s = float(10 * mod.masked_log_prob(xx, masks, None).mean() / m)
        return d_s - float(mod._log_marginal(xx).mean())

    hist = train(model, MPTLoss(model, "fixed-rate", rate=0.2), x, epochs=2000, lr=0.02,
                 seed=0, monitors={"lml": exact_lml(every=50), "bias": Monitor(bias, every=50)},
                 progress=False)
    assert abs(hist.last["lml"] - mle) / abs(mle) < 0.01, (hist.last["lml"], mle)
    epochs, b = hist.series("bias")
    tail = np.array([v for e, v in zip(epochs, b, strict=True) if e >= 1000])
    assert len(tail) >= 10
    assert (tail.max() - tail.min()) < 0.02 * abs(tail.mean()), tail
    assert abs(tail.mean()) > 0.1  # a real bias, not zero


@pytest.mark.slow  # a training run to convergence: over 3 s on an idle core
def test_exact_lml_training_agrees_with_closed_form_mle():
    _, x = _data(n=400, sigma2=0.5)
    mle = PPCA.fit(x, 2)
    model = PPCA.random(10, 2, sigma2=1.0, seed=3, learn_mu=True, learn_sigma2=True)
    train(model, ExactLML(model), x, epochs=3000, lr=0.05, seed=0, progress=False)
    with torch.no_grad():
        a, b = float(model.log_marginal(x).mean()), float(mle.log_marginal(x).mean())
        assert a == pytest.approx(b, abs=1e-4)  # Adam settles within ~2e-5 nats per datum
        assert a <= b + 1e-9  # the closed form is the maximum
        torch.testing.assert_close(model.covariance(), mle.covariance(), rtol=0, atol=1e-4)
        torch.testing.assert_close(model.mu, mle.mu, rtol=0, atol=5e-3)


def test_minibatch_training_and_callbacks():
    _, x = _data(n=200)
    model = PPCA.random(10, 2, sigma2=0.2, seed=1)
    seen = []

    def cb(hist, rec):
        seen.append(rec["epoch"])
        if rec["epoch"] == 3:
            raise StopTraining

    hist = train(model, MPTLoss(model, "random-size", num_masks=2), x, epochs=10, lr=0.01,
                 batch_size=64, seed=0, callbacks=[cb], progress=False,
                 monitors={"curve": mpt_curve_monitor(every=2, sizes=[1, 5, 10])})
    assert seen == [0, 1, 2, 3] and [r["epoch"] for r in hist.records] == seen
    assert "curve/area" in hist.records[0] and "curve/area" not in hist.records[1]
    assert len(hist.records[2]["curve/curve"]) == 3


def test_training_is_reproducible_from_seed():
    _, x = _data(n=100)
    out = []
    for _ in range(2):
        model = PPCA.random(10, 2, sigma2=0.2, seed=1)
        train(model, MPTLoss(model), x, epochs=5, lr=0.01, seed=4, progress=False)
        out.append(model.W.detach().clone())
    torch.testing.assert_close(out[0], out[1], rtol=0, atol=0)


def test_history_round_trip(tmp_path):
    _, x = _data(n=60)
    model = PPCA.random(10, 2, sigma2=0.2, seed=1)
    hist = train(model, MPTLoss(model), x, epochs=4, lr=0.01, seed=0, progress=False,
                 monitors={"lml": exact_lml(every=2), "curve": mpt_curve_monitor(every=2)})
    hist.to_json(tmp_path / "h.json")
    hist.to_csv(tmp_path / "h.csv")
    back = History.load(tmp_path / "h.json")
    assert back.records == hist.records and back.meta["lr"] == 0.01
    csv_back = History.load(tmp_path / "h.csv")
    assert [r["epoch"] for r in csv_back.records] == [0, 1, 2, 3, 4]
    for r0, r1 in zip(hist.records, csv_back.records, strict=True):
        assert r1["objective"] == pytest.approx(r0["objective"], rel=1e-12)
        assert set(r0) == set(r1)
    header = (tmp_path / "h.csv").read_text().splitlines()[0].split(",")
    assert header[:3] == ["epoch", "objective", "time_s"] and "lml" in header


# ---------------------------------------------------------------------- bad input
def test_bad_inputs_give_clear_errors(tmp_path):
    model, x = _data(n=20)
    nomarg = _NoMarginal(10)
    with pytest.raises(ValueError, match="needs model.log_marginal"):
        ExactLML(nomarg)
    with pytest.raises(ValueError, match="unknown estimator 'bert'"):
        MPTLoss(model, "bert")
    with pytest.raises(ValueError, match="evaluation-only"):
        MPTLoss(model, "exhaustive")
    with pytest.raises(ValueError, match="needs rate="):
        MPTLoss(model, "fixed-rate")
    with pytest.raises(ValueError, match="only apply to estimator='fixed-rate'"):
        MPTLoss(model, "cumulative", rate=0.2)
    obj = MPTLoss(model)
    for bad in (0, -3):
        with pytest.raises(ValueError, match="epochs must be a positive integer"):
            train(model, obj, x, epochs=bad, lr=0.1, progress=False)
    for bad in (0.0, -1e-3, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="lr .learning rate. must be a finite positive"):
            train(model, obj, x, epochs=1, lr=bad, progress=False)
    with pytest.raises(ValueError, match="monitor 'lml' needs model.log_marginal"):
        train(nomarg, MPTLoss(nomarg), x, epochs=1, lr=0.1, monitors={"lml": exact_lml()},
              progress=False)
    with pytest.raises(ValueError, match="different model"):
        train(PPCA.random(10, 2, seed=9), obj, x, epochs=1, lr=0.1, progress=False)
    with pytest.raises(ValueError, match="unknown optimizer 'adamax2'"):
        train(model, obj, x, epochs=1, lr=0.1, optimizer="adamax2", progress=False)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        train(model, obj, x, epochs=1, lr=0.1, batch_size=0, progress=False)
    with pytest.raises(TypeError, match="Objective"):
        train(model, lambda z: z, x, epochs=1, lr=0.1, progress=False)
    with pytest.raises(ValueError, match="model has D=10"):
        train(model, obj, x[:, :4], epochs=1, lr=0.1, progress=False)
    # a model without log_marginal still trains with MPT
    hist = train(nomarg, MPTLoss(nomarg), x, epochs=3, lr=0.1, seed=0, progress=False)
    assert len(hist.records) == 4
    assert isinstance(obj, Objective)


def test_divergence_is_reported():
    model, x = _data(n=20)
    obj = MPTLoss(model)
    with torch.no_grad():
        model.W.fill_(float("nan"))
    with pytest.raises(ValueError, match="objective became nan at epoch 1"):
        train(model, obj, x, epochs=2, lr=0.1, progress=False, record_initial=False)


@pytest.mark.parametrize("d,k,b", [(10, 2, 10), (12, 3, 4), (6, 1, 7)])
def test_ppca_shared_mask_fast_path_matches_conditionals(d, k, b):
    """The quadratic-form reduction for shared masks equals the summed conditionals (and grads)."""
    model = PPCA.random(d, k, sigma2=0.3, seed=d + k)
    model.mu.data = torch.linspace(-1, 2, d, dtype=torch.float64)
    x = PPCA.random(d, k, sigma2=0.7, seed=1).sample(25, generator=2) + 0.3
    sizes = torch.randint(1, d + 1, (b,), generator=torch.Generator().manual_seed(4))
    masks = mptlml.masks.sample_masks(d, sizes, generator=3)
    fast = model.masked_log_prob(x, masks, None)
    ref = model._log_conditionals(x, masks, None).sum(-1)
    torch.testing.assert_close(fast, ref, rtol=0, atol=1e-10)
    gw = torch.autograd.grad(fast.sum(), model.W)[0]
    gr = torch.autograd.grad(ref.sum(), model.W)[0]
    torch.testing.assert_close(gw, gr, rtol=1e-9, atol=1e-9)
    m32 = PPCA(model.W.detach().float(), model.mu.float(), 0.3)
    f32 = m32.masked_log_prob(x.float(), masks, None)
    assert f32.dtype == torch.float32
    torch.testing.assert_close(f32.double(), ref.detach(), rtol=0, atol=1e-4)


@pytest.mark.parametrize("d,k,b", [(10, 2, 10), (12, 3, 4), (6, 1, 7)])
def test_ppca_sufficient_statistic_mean_matches_per_datum(d, k, b):
    """The data-mean from sufficient statistics equals the per-datum sums' mean (and grads)."""
    model = PPCA.random(d, k, sigma2=0.3, seed=d + k, learn_mu=True, learn_sigma2=True)
    with torch.no_grad():
        model.mu.copy_(torch.linspace(-1, 2, d, dtype=torch.float64))
    x = PPCA.random(d, k, sigma2=0.7, seed=1).sample(40, generator=2) + 0.3
    sizes = torch.randint(1, d + 1, (b,), generator=torch.Generator().manual_seed(4))
    masks = mptlml.masks.sample_masks(d, sizes, generator=3)
    fast = model.masked_log_prob_mean(x, masks, None)
    ref = model._log_conditionals(x, masks, None).sum(-1).mean(-1)
    assert fast.shape == (b,)
    torch.testing.assert_close(fast, ref, rtol=0, atol=1e-10)
    params = [model.W, model.mu, model.log_sigma2]
    for gf, gr in zip(torch.autograd.grad(fast.sum(), params),
                      torch.autograd.grad(ref.sum(), params), strict=True):
        torch.testing.assert_close(gf, gr, rtol=1e-9, atol=1e-9)
    m32 = PPCA(model.W.detach().float(), model.mu.detach().float(), 0.3)
    f32 = m32.masked_log_prob_mean(x.float(), masks, None)
    torch.testing.assert_close(f32, ref.detach(), rtol=0, atol=1e-4)


@pytest.mark.parametrize("estimator,kw", [("cumulative", {"num_masks": 2}),
                                          ("random-size", {"num_masks": 3}),
                                          ("fixed-rate", {"rate": 0.3, "num_masks": 2})])
def test_shared_mask_batch_mean_equals_per_datum_mean(estimator, kw):
    """MPTLoss.batch_mean (training's fast path) draws the same masks and gives the same value."""
    model = PPCA.random(8, 2, sigma2=0.3, seed=0)
    x = model.sample(30, generator=1)
    obj = MPTLoss(model, estimator, share_masks=True, **kw)
    fast = obj.batch_mean(x, torch.Generator().manual_seed(5))
    ref = obj.per_datum(x, torch.Generator().manual_seed(5)).mean()
    torch.testing.assert_close(fast, ref, rtol=0, atol=1e-10)
    torch.testing.assert_close(obj(x, generator=5), ref, rtol=0, atol=1e-10)
