"""Why fixed-rate training is slow, measured: curvature along W's scale and the exact maximiser."""

from __future__ import annotations

import pytest
import torch

from mptlml.models import PPCA
from mptlml.reproduce._fixed_rate import (
    maximise_fixed_rate,
    scale_curvature,
    settle_epoch,
    w_only_optimum,
)
from mptlml.reproduce._synthetic_ppca import exact_fixed_rate, fixed_rate_masks, mean_lml
from mptlml.reproduce.fig2_training import Config
from mptlml.runs.threads import torch_threads


def test_scale_curvature_of_a_quadratic():
    w = torch.tensor([[1.0, 2.0]], dtype=torch.float64)
    # f(cW) = -3 c^2 |W|^2 has second derivative -6 |W|^2 = -30 at c = 1
    assert scale_curvature(lambda v: float(-3 * (v**2).sum()), w) == pytest.approx(-30, rel=1e-6)


def test_settle_epoch():
    rows = [{"epoch": e, "exact_lml": v} for e, v in
            ((0, -20.0), (10, -10.05), (20, -10.5), (30, -10.02), (40, -10.01))]
    assert settle_epoch(rows, -10.0) == 30  # the last excursion beyond 1% was at epoch 20
    assert settle_epoch(rows[:3], -10.0) is None  # still outside at the end
    assert settle_epoch(rows[3:], -10.0) == 30


def test_fixed_rate_is_flat_along_scale_and_shares_the_optimum():
    """At the quick setting: an order of magnitude flatter, same optimum (issue 16)."""
    cfg = Config.quick()
    with torch_threads(1):  # as the experiment runs it: a tiny model
        _check_flat_and_shared(cfg)


def _check_flat_and_shared(cfg: Config) -> None:
    true, x = cfg.data()
    w = w_only_optimum(x, cfg.latent_dim, cfg.sigma2)
    masks = fixed_rate_masks(cfg.num_tokens, 2)
    lml = scale_curvature(lambda v: mean_lml(PPCA(v, None, cfg.sigma2), x), w)
    fr = scale_curvature(lambda v: exact_fixed_rate(PPCA(v, None, cfg.sigma2), x, 2, masks), w)
    assert lml < fr < 0 and lml / fr > 5
    # the W-only optimum: no other scale of it has a higher exact LML
    opt = mean_lml(PPCA(w, None, cfg.sigma2), x)
    assert opt >= max(mean_lml(PPCA(c * w, None, cfg.sigma2), x) for c in (0.98, 1.02))
    model, evals = maximise_fixed_rate(cfg.init(cfg.seed), x, 2, masks)
    assert evals > 1
    assert abs(mean_lml(model, x) - opt) < 0.002 * abs(opt)
    assert abs(mean_lml(model, x) - mean_lml(true, x)) < 0.01 * abs(mean_lml(true, x))
