"""`mptlml reproduce convergence` (Fig. 1, Table 1): outputs and the mathematics they show."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch

from mptlml.cli import main
from mptlml.models import PPCA
from mptlml.reproduce.fig1_convergence import Config


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("conv") / "run"
    assert main(["reproduce", "convergence", "--quick", "--out", str(out)]) == 0
    return out, json.loads((out / "results.json").read_text())


def _csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_files_and_keys(quick_run):
    out, data = quick_run
    assert data["experiment"] == "convergence"
    res = data["results"]
    for key in ("noise", "noise_description", "share_masks", "panels", "table1"):
        assert key in res
    assert res["noise"] == "independent"
    cfg = Config.quick()
    assert len(res["panels"]) == len(cfg.dims) + 1
    for pan in res["panels"].values():
        for key in ("D", "estimator", "exact_lml", "P", "estimates", "sd_over_seeds",
                    "pooled_estimate", "pooled_stderr"):
            assert key in pan
        assert len(pan["estimates"]) == cfg.num_seeds
    table = _csv(out / "table1.csv")
    assert {"panel", "D", "P", "mean_estimate", "sd_over_seeds", "se_of_mean",
            "exact_lml"} <= set(table[0])
    # numbers, not text: a value and its spread in their own columns ("-5.96 ± 0.22" is no cell)
    assert "estimate" not in table[0]
    for r in table:
        assert float(r["se_of_mean"]) == pytest.approx(
            float(r["sd_over_seeds"]) / np.sqrt(int(r["num_seeds"])), rel=1e-12)
    assert sorted({int(r["P"]) for r in table}) == [1, 10, 100]
    series = _csv(out / "series.csv")
    assert {"panel", "seed", "P", "estimate", "exact_lml"} <= set(series[0])
    for ext in ("png", "pdf"):
        assert (out / f"fig1.{ext}").stat().st_size > 1000
    assert set(data["files"]) >= {"table1.csv", "series.csv", "fig1.png", "fig1.pdf"}


def test_exact_lml_matches_dense_gaussian(quick_run):
    """The reported exact LML equals log N(x; 0, W W^T + sigma2 I) of the same model and data."""
    _, data = quick_run
    cfg = Config.quick()
    for pan in data["results"]["panels"].values():
        d = pan["D"]
        model = PPCA.random(d, cfg.latent_dim, sigma2=cfg.sigma2, seed=cfg.data_seed * 1000 + d)
        x = model.sample(cfg.num_data, generator=cfg.data_seed * 1000 + d + 1)
        w = model.W.detach()
        cov = w @ w.T + cfg.sigma2 * torch.eye(d, dtype=torch.float64)
        ref = torch.distributions.MultivariateNormal(torch.zeros(d, dtype=torch.float64),
                                                     cov).log_prob(x).mean()
        assert pan["exact_lml"] == pytest.approx(float(ref), abs=1e-8)


def test_spread_shrinks_with_p(quick_run):
    _, data = quick_run
    for row_p1, row_p100 in _pairs(data["results"]["table1"]):
        # the Monte Carlo sd falls like 1/sqrt(P): a factor 10 from P=1 to P=100
        assert row_p100["sd_over_seeds"] < 0.5 * row_p1["sd_over_seeds"], row_p1["panel"]


def _pairs(table):
    by = {}
    for r in table:
        by.setdefault(r["panel"], {})[r["P"]] = r
    return [(v[1], v[100]) for v in by.values()]


def test_all_sizes_unbiased_fixed_rate_biased(quick_run):
    _, data = quick_run
    for pan in data["results"]["panels"].values():
        z = (pan["pooled_estimate"] - pan["exact_lml"]) / pan["pooled_stderr"]
        if pan["estimator"] == "cumulative":
            assert abs(z) < 4, (pan["D"], z)
            # every seed's path ends near the exact value
            for path in pan["estimates"]:
                assert abs(path[-1] - pan["exact_lml"]) < 0.05 * abs(pan["exact_lml"])
        else:
            # fixed 15% sees more context than average: optimistic, far beyond the noise
            assert z > 10, z
            assert pan["mask_size"] == int(0.15 * pan["D"])


def test_refuses_non_empty_dir_and_overwrite(quick_run, capsys):
    out, _ = quick_run
    before = (out / "results.json").read_bytes()
    assert main(["reproduce", "convergence", "--quick", "--out", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert (out / "results.json").read_bytes() == before


def test_shared_noise_option(tmp_path):
    out = tmp_path / "shared"
    argv = ["reproduce", "convergence", "--quick", "--out", str(out), "--set", "noise=shared",
            "--set", "dims=5", "--set", "fixed_dim=0", "--set", "max_num_masks=10",
            "--set", "table_masks=1,10"]
    assert main(argv) == 0
    res = json.loads((out / "results.json").read_text())["results"]
    assert res["noise"] == "shared" and "authors" in res["noise_description"]
    bad = tmp_path / "bad"
    assert main(argv[:4] + [str(bad)] + argv[5:] + ["--set", "noise=bogus"]) == 2
    assert not bad.exists()  # refused before anything is written
