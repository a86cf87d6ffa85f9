"""Mask sizes, allocations and standard errors: each promise pinned by a test that bites.

Every test here was checked against a deliberate slip in the code (``tests/README.md``'s
closing table): it fails with the slip and passes without it. The references do not share
the code path: exact rational arithmetic (:class:`fractions.Fraction`) for the size rules,
a brute-force search over integer allocations for Neyman's, a recording model wrapper that
keeps every masked input it is asked to score, the spread over seeded runs for standard
errors, and the cross-entropy summed by hand for the training loss.
"""

from __future__ import annotations

import itertools
import math
import warnings
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import mptlml
from mptlml.models import MaskedLM

from .diffusion_helpers import MASK_WORD, Output, make_word_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


class Recording:
    """A ragged masked model that records the masks of every sequence it is asked to score.

    ``sizes[tuple(ids)]``: the masked-token count of every row scored for that sequence,
    in the order asked (one draw after the other).
    """

    def __init__(self, model: Any) -> None:
        self._model = model
        self.sizes: dict[tuple[int, ...], list[int]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def ragged_masked_log_prob(self, ids, masks, generators, **kw):
        for t, m in zip(ids, masks, strict=True):
            self.sizes.setdefault(tuple(int(v) for v in t), []).extend(m.sum(1).tolist())
        return self._model.ragged_masked_log_prob(ids, masks, generators, **kw)


# ------------------------------------------------------------------ size rules
def test_the_fixed_rate_size_is_the_floor_of_the_exact_product():
    """M = max(1, floor(rate D)) with rate D taken exactly: 0.7 x 90 = 63, not 62.

    For every rate k/100 and D up to 300, against the floor of the rational k D / 100
    (float products such as 0.7 * 90 = 62.99999999999999 need the tolerance).
    """
    from mptlml.masks import fixed_rate_size

    assert fixed_rate_size(0.7, 90) == 63
    for k, d in itertools.product(range(1, 100), range(1, 301)):
        want = max(1, min(d, math.floor(Fraction(k, 100) * d)))
        assert fixed_rate_size(k / 100, d) == want, (k, d)


def test_the_curve_rounds_each_mask_size_half_up(tiny):
    """M_k = max(1, round(r_k D)) rounding halves up: r D = 1.5, 2.5, 3.5, 4.5 give 2, 3, 4, 5.

    Read off the masked inputs the model scored (:class:`Recording`) for a text of D = 10
    tokens. Flooring gives 1, 2, 3, 4; Python's round (to even) 2, 2, 4, 4.
    """
    text = "the dog was under the big tree and the cat"
    rates = [0.05, 0.15, 0.25, 0.35, 0.45]
    rec = Recording(tiny)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # one datum: no spread over data
        curve = mptlml.mpt_curve(rec, [text], rates=rates, num_masks=2, seed=0)
    (ids,) = tiny.encode([text])
    assert len(ids) == 10
    want = [max(1, math.floor(Fraction(str(r)) * 10 + Fraction(1, 2))) for r in rates]
    assert want == [1, 2, 3, 4, 5]
    assert rec.sizes[tuple(ids.tolist())] == [m for m in want for _ in range(2)]
    assert curve.sizes[0].tolist() == want


# ------------------------------------------------------------------ Neyman's allocation
def test_neyman_counts_give_the_least_variance_of_their_draws_by_brute_force():
    """A round's counts (the sequential engine's, dense strata and ragged rows alike) are
    Neyman's: of every integer allocation of the same draws (at least 2 per stratum) none
    has a variance ``sum_h sd_h^2 / c_h`` below theirs by more than rounding. Counts in
    proportion to the variances (not the SDs) give 1.3 times the variance here.
    """
    from mptlml.estimators.sequential import neyman_counts, neyman_sd

    sd = np.array([1.0, 4.0, 10.0])
    for p in (7, 20, 33):
        counts = neyman_counts(sd, p)
        total = int(counts.sum())
        assert abs(total - 3 * p) <= 2 and counts.min() >= 2
        grid = np.stack(np.meshgrid(*[np.arange(2, total + 1)] * 3, indexing="ij"), -1)
        grid = grid.reshape(-1, 3)[grid.reshape(-1, 3).sum(1) == total]
        best = float((sd ** 2 / grid).sum(1).min())
        var = float((sd ** 2 / counts).sum())
        assert var <= best * 1.02, (p, counts, var, best)
    by_var = np.round(60 * sd ** 2 / (sd ** 2).sum())
    assert float((sd ** 2 / by_var).sum()) > 1.3 * float((sd ** 2 / neyman_counts(sd, 20)).sum())
    # the spreads, pooled (the mean of the variances measured), a stratum never measured
    # given the largest; not floored: a stratum of no spread keeps only its 2 draws a round
    pooled = neyman_sd(np.array([0.0, 2 * 16.0, 3 * 100.0, 0.0]), np.array([1.0, 2.0, 3.0, 0]))
    assert np.allclose(pooled, [0.0, 4.0, 10.0, 10.0])
    assert neyman_sd(np.zeros(3), np.zeros(3)) is None


def test_neyman_counts_follow_spreads_that_differ_beyond_the_density_floor():
    """Pins the counts' spreads unfloored (the rate density alone keeps DENSITY_FLOOR):
    spreads 1 : 4 : 40 (the smallest below DENSITY_FLOOR of the largest, by more than
    three times) give counts ``c_h = P H sd_h / sum_k sd_k`` exactly where that is a whole
    number of at least 2, so the quiet stratum does not take the loud one's draws; a
    group's own variances are shrunk toward the call's as if by PRIOR_PAIRS measures,
    ``(s_h + PRIOR_PAIRS v_h) / (n_h + PRIOR_PAIRS)``, and a stratum the call never
    measured (NaN) is given the largest."""
    from mptlml.estimators.sequential import (
        DENSITY_FLOOR,
        PRIOR_PAIRS,
        density_of,
        neyman_counts,
        neyman_sd,
    )

    sd = neyman_sd(np.array([1.0, 16.0, 1600.0]) * 3, np.full(3, 3.0))
    assert np.allclose(sd, [1.0, 4.0, 40.0]) and sd[0] < DENSITY_FLOOR * sd[-1] / 3
    counts = neyman_counts(sd, 45)  # P H = 135 draws: 135 * (1, 4, 40) / 45
    assert counts.tolist() == [3, 12, 120]
    assert np.allclose(counts / counts.sum(), sd / sd.sum())
    # the rate density of the same spreads is floored (its importance weights stay bounded)
    mass = density_of(np.array([1.0, 16.0, 1600.0])).mass
    assert np.isclose(mass[0] / mass[-1], DENSITY_FLOOR)
    own_s, own_n = np.array([2.0, 0.0, 9.0]), np.array([2.0, 0.0, 1.0])
    prior = np.array([4.0, 25.0, np.nan])
    shrunk = neyman_sd(own_s, own_n, prior)
    want = np.sqrt([(2.0 + PRIOR_PAIRS * 4.0) / (2 + PRIOR_PAIRS), 25.0, 9.0])
    assert np.allclose(shrunk, want)


# ------------------------------------------------------------------ systematic sizes
class VisibleCountLM(nn.Module):
    """p(x_j | x_R) = softmax(b (1 + 3 |R| / L))[x_j]: sharper the more tokens are visible.

    On a text of one repeated word every mask of size M gives the same S(x; M), falling
    steeply with M: the spread of a size's draws is nil and the spread between sizes is
    all there is, which systematic sizes remove (and an i.i.d. standard error does not
    see removed). Token-id input, ``attention_mask`` honoured, ``.logits`` returned.
    """

    def __init__(self, vocab_size: int, mask_id: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.bias = nn.Parameter(2 * torch.randn(vocab_size, generator=g, dtype=torch.float64))
        self.mask_id = mask_id

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                ) -> Output:
        real = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else (
            attention_mask.bool())
        seen = ((input_ids != self.mask_id) & real).sum(1, keepdim=True).double()
        scale = 1 + 3 * seen / real.sum(1, keepdim=True)
        return Output((self.bias * scale[..., None]).expand(*input_ids.shape, -1))


@pytest.fixture(scope="module")
def visible_count():
    tok = make_word_tokenizer()
    mask_id = tok.convert_tokens_to_ids(MASK_WORD)
    return MaskedLM(VisibleCountLM(len(tok), mask_id), tok, mask_token_id=mask_id)


def test_systematic_sizes_put_two_draws_in_each_stratum_and_their_se_comes_from_the_pairs(
        visible_count):
    """random-size, ``stratified=True``, P = 8 on D = 12: two sizes in each quarter of 1..12.

    Every seed's eight draws (read off the masked inputs, :class:`Recording`) fall two in
    each of {1..3}, {4..6}, {7..9}, {10..12}. The standard error from the pairs is
    calibrated over 150 seeds (spread / RMS SE in [0.7, 1.43]); the i.i.d. SE of the same
    draws is many times larger here (the spread between sizes is all the noise).
    """
    text = " ".join(["cat"] * 12)
    rec = Recording(visible_count)
    n = 150
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # few dof per run: expected
        runs = [mptlml.estimate_lml(rec, [text], "random-size", num_masks=8, stratified=True,
                                    seed=s) for s in range(n)]
    (sizes,) = rec.sizes.values()
    draws = np.array(sizes).reshape(n, 8)
    for row in draws:
        assert np.bincount((row - 1) // 3, minlength=4).tolist() == [2, 2, 2, 2], row
    est = np.array([float(r.per_sample[0]) for r in runs])
    se = np.array([float(r.per_sample_stderr[0]) for r in runs])
    ratio = est.std(ddof=1) / math.sqrt((se ** 2).mean())
    assert 0.7 < ratio < 1.43, ratio  # i.i.d. SE: 0.22; pairs across strata: 0.44


# ------------------------------------------------------------------ a sequence's LML SE
def test_the_curves_lml_standard_error_adds_its_cells_variances(tiny):
    """D_i / K * sqrt(sum_k SE(S_ik)^2): calibrated over 200 independent draws, 10 rates,
    2 masks each (spread / RMS SE in [0.7, 1.43]; measured 1.05).

    The draws are 200 copies of one text in one call: sequence i's masks come from its own
    generator, seeded by (seed, i), and its LML and SE from its own cells only, so the copies
    are 200 seeded runs of that text, scored in one batched pass. Adding the cells' standard
    errors instead of their variances overstates it over twofold with ten rates (ratio
    0.46, measured).
    """
    text = "the dog was under the big tree and the cat"
    rates = np.linspace(0.05, 0.95, 10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # few dof per cell: expected
        res = mptlml.mpt_curve(tiny, [text] * 200, rates=rates, num_masks=2, seed=0)
    lml, se = res.lml.numpy(), res.lml_stderr.numpy()
    assert len(set(lml.tolist())) == 200  # independent draws, not one repeated
    ratio = lml.std(ddof=1) / math.sqrt((se ** 2).mean())
    assert 0.7 < ratio < 1.43, ratio


# ------------------------------------------------------------------ the training loss
def test_mpt_loss_is_the_mean_over_sequences_of_the_weighted_sums():
    """mean_i w_i sum_{j masked in i} -log q(x_ij | x_R), by hand (per sequence, not per token).

    Sequences with 1, 3 and 2 masked tokens: a mean over masked tokens differs.
    """
    from mptlml.hf import mpt_loss

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 7, generator=g, dtype=torch.float64)
    labels = torch.full((3, 5), -100)
    labels[0, 2] = 4
    labels[1, [0, 1, 4]] = torch.tensor([1, 6, 2])
    labels[2, [3, 4]] = torch.tensor([0, 5])
    w = torch.tensor([5.0, 5 / 3, 2.5], dtype=torch.float64)
    terms = []
    for i in range(3):
        lp = torch.log_softmax(logits[i], -1)
        terms.append(float(w[i]) * -sum(float(lp[j, labels[i, j]]) for j in range(5)
                                        if labels[i, j] != -100))
    assert float(mpt_loss(logits, labels, w)) == pytest.approx(np.mean(terms), rel=1e-12)
    assert float(mpt_loss(logits, labels, w, reduction="sum")) == pytest.approx(
        np.sum(terms), rel=1e-12)
    np.testing.assert_allclose(mpt_loss(logits, labels, w, reduction="none").numpy(), terms,
                               rtol=1e-12)
