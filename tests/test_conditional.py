"""Conditional scoring at every front door: log p(x_T | x_C), the context visible and never scored.

References: the exact Gaussian conditional of PPCA (scipy's multivariate normal on the
conditional mean and covariance), and for masked LMs masked forwards written with
transformers directly (the continuation's tokens masked, the context visible).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from scipy.stats import multivariate_normal
from sklearn.datasets import load_diabetes

import mptlml
from mptlml.models import PPCA, ConditionalView

from .test_compare import exhaustive_conditional


@pytest.fixture(scope="module")
def ppca_data():
    x = load_diabetes().data[:, :7] * 20  # real, off-model data
    model = PPCA.fit(x[:300], 2)
    return model, torch.as_tensor(x[300:340])


def test_ppca_exhaustive_conditional_sum_is_the_gaussian_conditional(ppca_data):
    model, x = ppca_data
    context = [0, 3, 5]
    exact = model.conditional_log_marginal(x, context).detach().numpy()
    s = model.covariance().detach().numpy()
    mu = model.mu.numpy()
    c, t = np.array(context), np.array([1, 2, 4, 6])
    k = s[np.ix_(t, c)] @ np.linalg.inv(s[np.ix_(c, c)])
    xs = x.numpy()
    ref = [multivariate_normal(mu[t] + k @ (row[c] - mu[c]), s[np.ix_(t, t)] - k @ s[np.ix_(c, t)])
           .logpdf(row[t]) for row in xs]
    np.testing.assert_allclose(exact, ref, atol=1e-8, rtol=0)
    est = mptlml.estimate_lml(model, x, "exhaustive", context=context)
    np.testing.assert_allclose(est.per_sample.numpy(), ref, atol=1e-8, rtol=0)
    assert est.exact == pytest.approx(float(np.mean(ref)), abs=1e-8)
    mask = torch.zeros(7, dtype=torch.bool)
    mask[context] = True  # a boolean context is the same
    same = mptlml.estimate_lml(model, x, "exhaustive", context=mask)
    torch.testing.assert_close(same.per_sample, est.per_sample)


def test_ppca_cumulative_conditional_is_unbiased_with_calibrated_se(ppca_data):
    model, x = ppca_data
    view = ConditionalView(model, [0, 3, 5])
    exact = view.log_marginal(x).detach().double()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        runs = [mptlml.estimate_lml(model, x, "cumulative", num_masks=2, seed=s,
                                    context=[0, 3, 5]) for s in range(300)]
    est = torch.stack([r.per_sample for r in runs])  # (seeds, N)
    se = torch.stack([r.per_sample_stderr for r in runs])
    bias = (est.mean(0) - exact).abs()
    assert bool((bias < 4 * est.std(0) / len(runs) ** 0.5 + 1e-12).all())
    ratio = float(est.std(0).pow(2).mean().sqrt() / se.pow(2).mean().sqrt())
    assert 0.8 < ratio < 1.25, ratio


def test_masked_lm_conditional_pll_equals_direct_forwards(tiny):
    ctx, conts = "the cat sat on", [" a mat", " the red house"]
    tok, model = tiny.tokenizer, tiny.model
    got = mptlml.pll(tiny, conts, context=ctx)
    for cont, g in zip(conts, got, strict=True):
        c = tok(ctx, add_special_tokens=False)["input_ids"]
        full = tok(ctx + cont, add_special_tokens=False)["input_ids"]
        ids = torch.tensor([tok.cls_token_id, *full, tok.sep_token_id])
        ref = 0.0
        for j in range(1 + len(c), 1 + len(full)):
            x = ids.clone()
            x[j] = tok.mask_token_id
            with torch.no_grad():
                ref += float(torch.log_softmax(model(input_ids=x[None]).logits[0, j].double(),
                                               -1)[ids[j]])
        assert float(g) == pytest.approx(ref, abs=1e-5)


@pytest.mark.parametrize("estimator", ["cumulative", "random-size", "adaptive-size",
                                       "chain-rule"])
def test_every_unbiased_estimator_is_centred_on_the_exhaustive_conditional_sum(tiny, estimator):
    ctx, conts = "the cat sat on", [" a mat", " the red house"]
    ref = np.array([exhaustive_conditional(tiny, ctx, c) for c in conts])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        est = torch.stack([mptlml.estimate_lml(tiny, conts, estimator, num_masks=4, seed=s,
                                               context=ctx).per_sample for s in range(60)])
    mean, spread = est.mean(0).numpy(), est.std(0).numpy() / np.sqrt(60)
    assert np.all(np.abs(mean - ref) < 4 * spread + 1e-9), (mean, ref, spread)


def test_conditional_curve_and_refusals(tiny):
    curve = mptlml.mpt_curve(tiny, [" a mat", " the red house"], context="the cat sat on",
                             rates=[0.3, 0.6, 0.9], num_masks=2, seed=0)
    assert curve.num_tokens.tolist() == [2, 3]  # D_i counts the continuation's tokens
    with pytest.raises(ValueError, match="per_token"):
        mptlml.pll(tiny, [" a mat"], context="the cat", per_token=True)
    with pytest.raises(ValueError, match="one context per continuation"):
        mptlml.estimate_lml(tiny, [" a mat", " a tree"], context=["x", "y", "z"])
    with pytest.raises(ValueError, match="every dimension"):
        mptlml.estimate_lml(PPCA(torch.randn(3, 1, dtype=torch.float64)),
                            torch.zeros(2, 3, dtype=torch.float64), context=[0, 1, 2])
