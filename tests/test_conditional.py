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
    assert est.exact_lml == pytest.approx(float(np.mean(ref)), abs=1e-8)
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


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["cumulative", "random-size", "adaptive-size",
                                       "chain-rule"])
def test_every_unbiased_estimator_is_centred_on_the_exhaustive_conditional_sum(tiny, estimator):
    """Continuations of 5 and 6 tokens (drawn: shorter ones are enumerated, tested below)."""
    ctx, conts = "the cat sat on", [" the big red mat and", " the big red tree and the"]
    ref = np.array([exhaustive_conditional(tiny, ctx, c) for c in conts])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        est = torch.stack([mptlml.estimate_lml(tiny, conts, estimator, num_masks=4, seed=s,
                                               context=ctx).per_sample for s in range(60)])
    mean, spread = est.mean(0).numpy(), est.std(0).numpy() / np.sqrt(60)
    assert np.all(np.abs(mean - ref) < 4 * spread + 1e-6), (mean, ref, spread)


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


# ---------------------------------------------------------------- finite populations
SHORT = [" a mat", " the red house", " a big red tree"]  # 2, 3 and 4 tokens
LONGER = [" the big red mat and", " the big red tree and the"]  # 5 and 6 tokens


@pytest.mark.parametrize("estimator", ["exhaustive", "cumulative", "random-size", "chain-rule"])
def test_short_continuations_are_enumerated_exactly_by_every_unbiased_estimator(tiny, estimator):
    """Up to 4 tokens (2^T - 1 <= 15 masks) a continuation is scored on every mask: the
    exhaustive conditional sum itself, standard error 0, 2^T - 1 masked inputs each."""
    ref = np.array([exhaustive_conditional(tiny, "the cat sat on", c) for c in SHORT])
    kw = {} if estimator == "exhaustive" else {"num_masks": 2, "seed": 0}
    est = mptlml.estimate_lml(tiny, SHORT, estimator, context="the cat sat on", **kw)
    np.testing.assert_allclose(est.per_sample.numpy(), ref, atol=1e-5)
    assert np.all(est.per_sample_stderr.numpy() == 0) and est.stderr == 0
    assert est.num_masked_rows == 3 + 7 + 15


def test_exhaustive_refuses_a_continuation_past_max_masks(tiny):
    with mptlml.settings.max_masks(31):
        with pytest.raises(ValueError, match="needs 2\\^D - 1 = 63 masks for D=6"):
            mptlml.estimate_lml(tiny, LONGER, "exhaustive", context="the cat sat on")


def test_a_size_whose_masks_are_no_more_than_its_draws_is_an_exact_cell(tiny_dir, tiny):
    """Cumulative at P = 5 on a 5-token text: sizes 1, 4 and 5 (5, 5 and 1 masks) are scored
    on every mask, their terms equal the exhaustive S(x; M), their variance 0; sizes 2 and 3
    (10 masks each) are drawn."""
    from mptlml.estimators import Cumulative
    from mptlml.estimators.stats import ExactCell, cell_error

    from .mlm_helpers import exact_size_scores

    text = "the big red mat and"
    ref = exact_size_scores(tiny_dir, [text])[0]
    toks = tiny.encode([text])
    assert len(toks[0]) == 5
    est = Cumulative(5)
    cells, _ = est.ragged_cells(tiny, toks, [np.full(5, 5)], 0, tag="t")
    exact = [isinstance(c, ExactCell) for c in cells[0]]
    assert exact == [True, False, False, True, True]
    for m in (1, 4, 5):
        assert cell_error(cells[0][m - 1])[1] == 0
        np.testing.assert_allclose(cells[0][m - 1].mean(), ref[m - 1], atol=1e-5)
    assert est.scored_rows(5, np.full(5, 5)) == 5 + 5 + 5 + 5 + 1


@pytest.mark.slow
def test_conditional_standard_errors_are_calibrated_at_small_num_masks(tiny):
    """2- to 6-token continuations, cumulative at num_masks=4, over 150 seeds: z = (mean -
    exhaustive) / stderr exceeds 2 in at most 10% of seeds (4% measured; the short ones are
    exact, the others drawn; at num_masks=2, 15%: one degree of freedom per size)."""
    estimator = "cumulative"
    conts = SHORT + LONGER
    ref = np.array([exhaustive_conditional(tiny, "the cat sat on", c) for c in conts]).mean()
    z = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # few dof per estimate, expected
        for s in range(150):
            est = mptlml.estimate_lml(tiny, conts, estimator, context="the cat sat on",
                                      num_masks=4, seed=s)
            z.append((est.mean - ref) / est.stderr)
    z = np.array(z)
    assert np.mean(np.abs(z) > 2) <= 0.10, np.mean(np.abs(z) > 2)
    assert 0.75 < z.std() < 1.33, z.std()


def test_every_exact_path_is_under_the_one_cap(tiny):
    """compare(estimator="exhaustive") and the DPO bounds' exact_length refuse, before any
    masked input is scored, what estimate_lml's exhaustive estimator refuses: more than
    mptlml.settings.max_masks masked inputs for one sequence."""
    from mptlml.hf.preference import preference_bounds

    long = [" " + " ".join(["the big red mat"] * 5), " a cat"]  # 20 tokens: 2^20 - 1 masks
    calls = []
    hook = tiny.model.register_forward_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(ValueError, match="candidate 0 of question 0 has 20 tokens; the "
                                             "exhaustive estimator needs 2\\^D - 1 = 1048575"):
            mptlml.compare(tiny, ["the cat sat on"], [long], estimator="exhaustive")
        with mptlml.settings.max_masks(31), pytest.raises(
                ValueError, match="candidate 2 of question 1 has 6 tokens.*max_masks=31"):
            mptlml.compare(tiny, ["the cat", "the cat sat on"], [SHORT[:2], [" a", *LONGER]],
                           estimator="exhaustive")
        for n, cap in ((17, None), (6, 31)):
            with mptlml.settings.max_masks(cap or mptlml.settings.max_masks.value()), \
                    pytest.raises(ValueError, match=f"exact_length={n} .*max_masks="):
                preference_bounds(tiny, tiny, ["the cat"], [" sat"], [" ran"], exact_length=n)
    finally:
        hook.remove()
    assert not calls
    with mptlml.settings.max_masks(63):  # within the cap: enumerated as before, exact
        res = mptlml.compare(tiny, ["the cat sat on"], [[LONGER[0], SHORT[0]]],
                             estimator="exhaustive")
        assert bool(res.exact[0].all())
