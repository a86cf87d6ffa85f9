"""Conditional standard errors at small num_masks, for every ragged estimator of the registry.

Continuations of 2 to 6 tokens given a context, scored by a tiny BERT at ``num_masks`` 2 and 4
over 50 seeds each (the seeds are the copies of a batched call: the masks of sequence i come
from (seed, i)). Each drawn estimate is compared with its expectation computed from direct
forwards (every mask of every size, :func:`tests.mlm_helpers.masked_size_scores`): the exact
conditional MPT sum for the unbiased estimators, ``D * S(x; M)`` for fixed-rate and the rate
grid's ``D * mean_k S(x; M_k)`` for riemann. Continuations scored on every mask (the
unbiased estimators' of up to 4 tokens; fixed-rate's sizes of at most 15 masks) must equal
their expectation exactly.

What is required, with z = (estimate - expectation) / stderr on each drawn continuation:

- no drawn estimate reports a standard error of 0 (a promise of exactness). With
  replacement, chain-rule's orders, random-size's masks and fixed-rate's masks repeated each
  other on short continuations (1 in 120, 1 in 16 and 1 in 2 sequences at num_masks=2; the
  old code failed here: random-size 6 zero SEs in 100, |z| beyond the t quantile in 11%;
  chain-rule 1; fixed-rate 59; riemann 12 in 250); they are now drawn without replacement;
- the spread over seeds matches the reported standard errors (RMS), within sampling error
  (riemann's err on the large side, ``CONSERVATIVE``);
- |z| exceeds Student's t quantile (97.5%) at the estimate's degrees of freedom in at most
  10% of seeds. A drawn continuation's dof is at least P - 1 (one cell of P draws; the
  pairs of stratified random-size: 1), which the quantile uses (a lower bound of the Welch
  dof of the estimators that pool cells, so their test is lenient). |z| > 2 itself happens
  in up to 39% of seeds at P = 2 (Student's t on one degree of freedom exceeds 2 in 30% of
  draws, and these draws are heavy-tailed): the normal quantile needs about 5 dof, and the
  estimate warns below that (``MIN_STDERR_DOF``). The rates are printed by
  ``python -m tests.test_conditional_calibration`` (with ``PYTHONPATH=src``);
- over every (seed, continuation) of the 2- to 6-token set, the measure of issue 39 (2- and
  3-token continuations at num_masks=2 had |z| > 2 in 38% of seeds when they were drawn
  with replacement; the 2- to 4-token ones are now exact, z = 0): |z| > 2 in at most 10%
  for the default estimator (cumulative) at num_masks 2 and 4, and for every estimator at
  num_masks=4. Measured: cumulative 6.4% and 5.2%; at 4 at most 8% (random-size and
  adaptive-size); at num_masks=2 random-size and adaptive-size reach 15.6%, chain-rule
  12.4%, learned-rate 11.2% (their drawn 5- and 6-token continuations rest on 1 dof).

llada is left out: it keeps LLaDA's draws with replacement to reproduce LLaDA's numbers,
and two equal batch means give it a standard error of 0 (37 of 250 continuations at
num_masks=2, batch=1), an open defect.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from scipy import stats

import mptlml
from mptlml.estimators import available
from mptlml.estimators.llada import llada_counts
from mptlml.estimators.rates import mask_sizes
from mptlml.masks import fixed_rate_size

from .mlm_helpers import masked_size_scores

pytestmark = pytest.mark.usefixtures("one_thread")

CONTEXT = "the cat sat on"
CONTINUATIONS = [" a mat", " the red house", " a big red tree", " the big red mat and",
                 " the big red tree and the"]  # 2 to 6 tokens
SEEDS = 50
RATES = [0.2, 0.5, 0.8]
#: the options each estimator needs beyond num_masks
OPTIONS = {"fixed-rate": {"rate": 0.5}, "riemann": {"rates": RATES}, "llada": {"batch": 1}}


def size_scores(lm, context: str, continuation: str) -> np.ndarray:
    """S(x_T; M | x_C), M = 1..|T|, by direct forwards of the module."""
    tok, model = lm.tokenizer, lm.model
    c = tok(context, add_special_tokens=False)["input_ids"]
    full = tok(context + continuation, add_special_tokens=False)["input_ids"]
    assert full[:len(c)] == c
    ids = torch.tensor([tok.cls_token_id, *full, tok.sep_token_id])
    return masked_size_scores(ids, list(range(1 + len(c), 1 + len(full))), tok.mask_token_id,
                              lambda x: torch.log_softmax(model(input_ids=x).logits.double(),
                                                          -1))


def expectation(name: str, s: np.ndarray, num_masks: int) -> float:
    """What the estimator's draws average to, from the exact S(x; M) of one continuation."""
    d = s.size
    if name == "fixed-rate":
        return d * s[fixed_rate_size(OPTIONS[name]["rate"], d) - 1]
    if name == "riemann":
        return d * float(s[mask_sizes(d, RATES) - 1].mean())
    if name == "llada":  # a start k ~ U{1..L}, then its batch of counts
        b = OPTIONS[name]["batch"]
        return float(np.mean([np.mean([d * s[c - 1] for c in llada_counts(k, d, b)])
                              for k in range(1, d + 1)]))
    return float(s.sum())  # the unbiased: the exhaustive conditional MPT sum


def design_dof(name: str, num_masks: int, options: dict) -> int:
    """The fewest degrees of freedom a drawn continuation's standard error rests on."""
    if options.get("stratified"):
        return 1  # P/2 pairs of one degree of freedom each
    if name == "learned-rate":
        return num_masks // 2  # H = P/2 strata of two draws: H degrees of freedom
    if name == "llada":
        return num_masks // options["batch"] - 1
    return num_masks - 1


def calibration(lm, refs: list[np.ndarray], name: str, num_masks: int,
                options: dict | None = None) -> dict:
    """z of every drawn continuation over SEEDS seeded copies, and what the test needs."""
    options = {**OPTIONS.get(name, {}), **(options or {})}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # few dof, said by a warning
        est = mptlml.estimate_lml(lm, CONTINUATIONS * SEEDS, name, context=CONTEXT,
                                  num_masks=num_masks, seed=0, **options)
    lml = est.per_sample.numpy().reshape(SEEDS, -1)
    se = est.per_sample_stderr.numpy().reshape(SEEDS, -1)
    want = np.array([expectation(name, s, num_masks) for s in refs])
    drawn = ~np.all(se == 0, axis=0) if name != "exhaustive" else np.zeros(len(refs), bool)
    exact = ~drawn
    np.testing.assert_allclose(lml[:, exact], np.broadcast_to(want[exact], lml[:, exact].shape),
                               atol=1e-5)
    z = (lml[:, drawn] - want[drawn]) / se[:, drawn]
    q = stats.t.ppf(0.975, design_dof(name, num_masks, options))
    spread = lml[:, drawn].std(0, ddof=1) / np.sqrt((se[:, drawn] ** 2).mean(0))
    return {"z": z, "zero_se": int((se[:, drawn] == 0).sum()), "quantile": q,
            "over_t": float(np.mean(np.abs(z) > q)) if z.size else 0.0,
            "over_2": float(np.mean(np.abs(z) > 2)) if z.size else 0.0,
            # the measure: over every (seed, continuation) of 2 to 6 tokens, an exact
            # one counting with its error 0
            "over_2_all": float(np.sum(np.abs(z) > 2)) / lml.size,
            "spread_ratio": spread, "drawn": int(drawn.sum())}


#: estimate_lml's default estimator
DEFAULT = "cumulative"


def at_most(rate: float, n: int) -> float:
    """A rate of at most ``rate`` seen on n (seed, continuation) draws: the claim plus the
    one-sided 95% sampling margin of a binomial proportion, ``rate + 1.64 sqrt(rate (1 -
    rate) / n)``. At 50 seeds the proportions rest on 100 to 250 draws (a 10% rate reads
    6-14% across seed sets): measured on 400 seeds, learned-rate's |z| beyond its t quantile
    is 7.4% (P = 2) and 7.6% (P = 4), random-size-stratified's |z| > 2 over every
    continuation 10.1% at P = 4, each of which a 50-seed set may read above 10%."""
    return rate + 1.64 * float(np.sqrt(rate * (1 - rate) / n))

#: estimators whose standard error errs on the large side by design: riemann's cells draw
#: without replacement but report the i.i.d. SE s / sqrt(P) (its s^2 is the spread a
#: target's rounds allocate by), 1 / sqrt(1 - P / C(D, M)) too large, up to an exact cell
#: reported with an SE (a 2-token continuation at P = 2: both masks of size 1 drawn)
CONSERVATIVE = {"riemann"}


@pytest.fixture(scope="module")
def refs(tiny):
    return [size_scores(tiny, CONTEXT, c) for c in CONTINUATIONS]


#: every ragged estimator of the registry but llada, which keeps LLaDA's draws with
#: replacement to reproduce LLaDA's numbers: two equal batch means then give a standard
#: error of 0 (37 of 250 continuations at num_masks=2, batch=1), an open defect
CASES = [(name, {}) for name in available(ragged=True) if name != "llada"] + [
    ("random-size", {"stratified": True})]


@pytest.mark.slow  # 2 to 4.5 s a case on a busy machine
@pytest.mark.parametrize(("name", "options"), CASES,
                         ids=[n + ("-stratified" if o else "") for n, o in CASES])
def test_conditional_standard_errors_are_calibrated_at_small_num_masks(tiny, refs, name,
                                                                        options):
    """Over 2 x 50 seeds (num_masks 2 and 4) per drawn continuation: no SE of 0, the spread
    over seeds matches the RMS reported SE, and |z| > t_{0.975}(dof) in at most 10% (within
    the sampling margin of the draws, :func:`at_most`)."""
    kinds = [num_masks for num_masks in (2, 4)] if name != "exhaustive" else [1]
    for num_masks in kinds:
        res = calibration(tiny, refs, name, num_masks, options)
        if name == "exhaustive":
            assert res["drawn"] == 0
            continue
        assert res["drawn"] >= 1, res  # the 6-token continuation at least
        assert res["zero_se"] == 0, res["zero_se"]
        assert np.all(np.isfinite(res["z"]))
        low = 0.0 if name in CONSERVATIVE else 0.6
        assert np.all((res["spread_ratio"] > low) & (res["spread_ratio"] < 1.6)), res
        n_drawn = res["z"].size
        assert res["over_t"] <= at_most(0.10, n_drawn), (num_masks, res["over_t"], n_drawn)
        if num_masks >= 4 or name == DEFAULT:  # |z| > 2 over the 2- to 6-token continuations
            assert res["over_2_all"] <= at_most(0.10, SEEDS * len(CONTINUATIONS)), (
                num_masks, res["over_2_all"])


def test_chain_rule_reports_no_zero_standard_error_on_a_drawn_continuation(tiny):
    """Seed 0 drew one order twice for this 5-token continuation (SE 0, infinite dof); orders
    are now distinct, and the SE matches the spread of the estimate over 200 seeds."""
    cont = [" the big red mat and"]
    est = mptlml.estimate_lml(tiny, cont, "chain-rule", context=CONTEXT, num_masks=2, seed=0)
    assert est.num_masked_rows == 2 * 5  # drawn, not enumerated
    assert est.stderr > 0 and est.stderr_dof == pytest.approx(1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        many = mptlml.estimate_lml(tiny, cont * 200, "chain-rule", context=CONTEXT,
                                   num_masks=2, seed=0)
    se = many.per_sample_stderr.numpy()
    assert np.all(se > 0)
    ratio = many.per_sample.numpy().std(ddof=1) / np.sqrt((se ** 2).mean())
    assert 0.8 < ratio < 1.25, ratio


def test_distinct_draws_are_distinct_and_des_raj_is_unbiased():
    """Random-size's masks of one sequence never repeat (where the masks outnumber the draws),
    nor do ``distinct_masks``' of one size, and des Raj's terms average to the population
    total over every ordered pair of draws."""
    from itertools import permutations

    from mptlml.estimators import RandomSize
    from mptlml.estimators.stats import des_raj

    est = RandomSize(6)
    for seed in range(50):
        masks, _, _, probs, distinct = est._distinct_draws(
            3, 6, torch.Generator().manual_seed(seed), pairs=False)
        assert bool(distinct.all())
        assert len({m.numpy().tobytes() for m in masks}) == 6
        assert float(probs.sum()) < 1.0
    for pairs in (False, True):  # a long sequence: C(D, M) past a float, no overflow
        _, _, _, probs, distinct = RandomSize(8, stratified=pairs)._distinct_draws(
            1500, 8, torch.Generator().manual_seed(0), pairs)
        assert bool(distinct.all()) and bool(torch.isfinite(probs).all())
    from mptlml.estimators.chain_rule import distinct_orders
    from mptlml.estimators.stats import cell_error, sampled_cell

    assert distinct_orders(300, 2, torch.Generator().manual_seed(0)).shape == (2, 300)
    assert cell_error(sampled_cell([1.0, 2.0], 10 ** 400)) == (1.5, 0.25, 1.0)  # 300!: no fpc
    from mptlml.masks import distinct_masks

    for seed in range(20):  # a whole population of 10 masks in 10 draws: each once
        m = distinct_masks(5, 2, 10, torch.Generator().manual_seed(seed))
        assert len({r.numpy().tobytes() for r in m}) == 10 and bool((m.sum(1) == 2).all())
    # exact expectation of the mean of des Raj's terms over ordered draws without replacement
    rng = np.random.default_rng(0)
    y, p = rng.normal(size=4), rng.dirichlet(np.ones(4))
    total = 0.0
    for a, b in permutations(range(4), 2):
        prob = p[a] * p[b] / (1 - p[a])
        total += prob * des_raj(y[[a, b]] / p[[a, b]], p[[a, b]]).mean()
    assert total == pytest.approx(y.sum(), rel=1e-12)


if __name__ == "__main__":  # the rates, estimator by estimator
    from mptlml.models import MaskedLM

    from .mlm_helpers import make_tiny_bert

    torch.set_num_threads(1)
    import tempfile
    from pathlib import Path

    lm = MaskedLM.from_pretrained(make_tiny_bert(Path(tempfile.mkdtemp()) / "tiny"))
    rs = [size_scores(lm, CONTEXT, c) for c in CONTINUATIONS]
    for n, o in [*CASES, ("llada", {})]:
        for pm in ((2, 4) if n != "exhaustive" else (1,)):
            r = calibration(lm, rs, n, pm, o)
            print(f"{n + (' stratified' if o else ''):24s} P={pm}: drawn {r['drawn']}, "
                  f"zero SE {r['zero_se']}, |z|>2 {r['over_2']:.3f} "
                  f"(all 2-6 tokens {r['over_2_all']:.3f}), "
                  f"|z|>t(dof={design_dof(n, pm, {**OPTIONS.get(n, {}), **o})}) "
                  f"{r['over_t']:.3f}, spread/SE {np.round(r['spread_ratio'], 2).tolist()}")


def test_a_run_too_large_says_what_it_would_score(tiny):
    """Chain-rule on 4-token continuations scores every mask (2^4 - 1 = 15 each, exact), not
    num_masks x 4 draws: the refusal says so and does not offer a lower num_masks, which
    would not help; with a drawn 6-token continuation beside it, it does."""
    four, six = " a big red tree", " the big red tree and the"
    with mptlml.settings.max_masked_inputs(10):
        with pytest.raises(ValueError) as err:
            mptlml.estimate_lml(tiny, [four, four], "chain-rule", context=CONTEXT,
                                num_masks=2, seed=0)
    msg = str(err.value)
    assert "2 sequence(s) scored on every mask, 2^D - 1 = 15 masked inputs each" in msg
    assert "would score 30 masked inputs" in msg and "lower num_masks" not in msg
    with mptlml.settings.max_masked_inputs(20):
        with pytest.raises(ValueError) as err:
            mptlml.estimate_lml(tiny, [four, six], "chain-rule", context=CONTEXT,
                                num_masks=2, seed=0)
    msg = str(err.value)
    assert "1 sequence(s) scored on every mask" in msg
    assert "1 drawn, 12 masked inputs" in msg  # 2 orders x 6 tokens
    assert "would score 27 masked inputs" in msg and "lower num_masks" in msg


#: continuations of 5 to 7 tokens: at num_masks=2 every size but the whole one is drawn
LONGER = [" the big red mat and", " the big red tree and the", " a small blue house or a cat",
          " the dog ran on a mat", " big red trees and the cat sat"]


@pytest.mark.slow  # about 10 s
def test_cumulative_standard_errors_are_honest_at_two_masks_on_longer_continuations(tiny):
    """Issue 48's measure: at num_masks=2, 5- to 7-token continuations (too long to enumerate)
    over 100 seeds, |z| > 2 against the exhaustive sum in at most 10% of (seed, continuation)
    pairs (15% with the sizes' own variances alone, 1 dof each; the pooled SE of
    ``Cumulative.sequence_error`` makes it 9%), and the SE never understates the spread."""
    refs = [size_scores(tiny, CONTEXT, c) for c in LONGER]
    assert [len(r) for r in refs] == [5, 6, 7, 6, 7]
    seeds = 100
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # few dof, said by a warning
        est = mptlml.estimate_lml(tiny, LONGER * seeds, "cumulative", context=CONTEXT,
                                  num_masks=2, seed=0)
    lml = est.per_sample.numpy().reshape(seeds, -1)
    se = est.per_sample_stderr.numpy().reshape(seeds, -1)
    z = (lml - np.array([r.sum() for r in refs])) / se
    assert np.mean(np.abs(z) > 2) <= 0.10, np.mean(np.abs(z) > 2, 0)
    ratio = lml.std(0, ddof=1) / np.sqrt((se ** 2).mean(0))
    assert np.all((ratio > 0.5) & (ratio < 1.1)), ratio


def test_the_pooled_size_variance_is_the_finite_population_model():
    """pooled_size_error against the formula written out: sigma^2 pooled over the drawn sizes
    (dof-weighted s_M^2 / f_M, f_M = (T - M) / (M (T - 1))), the sum's variance sum_M sigma^2
    f_M / P_M; None below two drawn sizes or with a size of one draw; exact sizes left out."""
    from mptlml.estimators.stats import exact_cell, pooled_size_error

    rng = np.random.default_rng(0)
    t = 6
    cells = [rng.normal(size=p) for p in (2, 3, 2, 4, 2)] + [exact_cell([0.7])]
    f = [(t - m) / (m * (t - 1)) for m in range(1, t)]
    nu = sum(len(c) - 1 for c in cells[:-1])
    sigma2 = sum((len(c) - 1) * np.var(c, ddof=1) / fm
                 for c, fm in zip(cells[:-1], f, strict=True)) / nu
    var, dof = pooled_size_error(cells)
    assert dof == nu
    want = sum(sigma2 * fm / len(c) for c, fm in zip(cells[:-1], f, strict=True))
    assert var == pytest.approx(want, rel=1e-12)
    assert pooled_size_error([rng.normal(size=2), exact_cell([1.0])]) is None
    assert pooled_size_error([rng.normal(size=2), rng.normal(size=1), exact_cell([1.0])]) is None
