"""Reported standard errors are calibrated: they match the spread over seeds.

For every Monte Carlo estimator of ``estimate_lml`` (masks shared and per
datum, PPCA and the Bernoulli model), ``NUM_SEEDS`` calls with fixed seeds
give an empirical SD of ``mean`` (and of each ``per_sample``) over seeds; the
RMS of the reported ``stderr`` (``per_sample_stderr``) must match it within
[0.8, 1.25]. With 400 seeds the sampling SD of an SD estimate is ~1/sqrt(800)
= 3.5%, so the band is several sampling SDs wide, while an SE inflated by
1.5x or more, or one missing its 1/sqrt(P), falls far outside it.

``MPTLoss`` reports no SE; its spread per datum over seeds must equal the
per-datum SE that ``estimate_lml`` reports for the same estimator and P
(the same Monte Carlo average), which catches a training path that uses a
different number of masks than it says.
"""

from __future__ import annotations

import numpy as np
import pytest

from .mc_helpers import MODELS, NUM_MASKS, eval_runs, objective_runs, sd_ratio

LO, HI = 0.8, 1.25


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


CASES = [(n, e, s) for n in MODELS for e in ("cumulative", "nested", "random-size", "fixed-rate")
         for s in (False, True)]


@pytest.mark.parametrize("name,estimator,shared", CASES)
def test_stderr_of_mean_matches_spread_over_seeds(name, estimator, shared):
    runs = eval_runs(name, estimator, shared)
    assert np.isfinite(runs.stderr).all() and (runs.stderr >= 0).all()
    r = sd_ratio(runs.mean, runs.stderr)
    assert LO < r < HI, f"SD over seeds / reported stderr = {r:.3f} ({estimator}, P=" \
                        f"{NUM_MASKS[estimator]})"


@pytest.mark.parametrize("name,estimator,shared", CASES)
def test_per_sample_stderr_matches_spread_over_seeds(name, estimator, shared):
    runs = eval_runs(name, estimator, shared)
    r = sd_ratio(runs.per_sample, runs.per_sample_stderr)
    assert LO < r < HI, f"per-sample SD over seeds / reported = {r:.3f} ({estimator})"


@pytest.mark.parametrize("name,estimator,shared",
                         [(n, e, s) for n in MODELS for e in ("cumulative", "random-size",
                                                              "fixed-rate")
                          for s in (False, True)])
def test_mpt_loss_spread_equals_reported_evaluation_se(name, estimator, shared):
    """Var over seeds of MPTLoss.per_datum = E[per_sample_stderr^2] of estimate_lml, same P."""
    vals = objective_runs(name, estimator, shared, "per_datum")
    runs = eval_runs(name, estimator, shared)
    r = sd_ratio(vals, runs.per_sample_stderr)
    assert LO < r < HI, f"MPTLoss per-datum SD / estimate_lml per-sample SE = {r:.3f}"


@pytest.mark.parametrize("name,estimator", [(n, e) for n in MODELS
                                            for e in ("cumulative", "random-size")])
def test_shared_masks_do_not_change_each_datums_spread(name, estimator):
    """Per datum, a shared mask is as uniform as a private one: the same variance.

    (Sharing correlates the data, so only the data mean's variance may differ.)
    """
    a = objective_runs(name, estimator, False, "per_datum")
    b = objective_runs(name, estimator, True, "per_datum")
    r = float((a.var(0, ddof=1).mean() / b.var(0, ddof=1).mean()) ** 0.5)
    assert LO < r < HI, r
