"""`mptlml select`: choosing the latent dimension (PPCA, Bernoulli LVM) by held-out MPT."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch

from mptlml.cli import main
from mptlml.models import PPCA
from mptlml.selection import FAMILIES, load_dataset, select_latent_dim


@pytest.mark.parametrize("true_k", [1, 3, 5])
def test_synthetic_recovers_true_k(true_k):
    x, _ = load_dataset("synthetic", true_k=true_k, num_data=500, num_tokens=20, seed=true_k)
    assert x.shape == (500, 20)
    res = select_latent_dim(x, 8, seed=0)
    assert res.choices["Exact"] == true_k
    assert res.choices["MPT"] == res.choices["Exact"]
    assert res.resolved
    # MPT estimates the exact held-out LML: within a few Monte Carlo SE at every K
    for m, s, e in zip(res.mpt, res.mpt_stderr, res.exact_lml, strict=True):
        assert abs(m - e) < 5 * s + 1e-9, (m, e, s)


def test_exact_scores_are_held_out_log_likelihoods():
    """Exact column = log N(x_test; mean, W W^T + sigma2 I) of the MLE on the training split."""
    x, _ = load_dataset("synthetic", true_k=2, num_data=200, num_tokens=8, seed=0)
    xtr, xte = x[:150], x[150:]
    res = select_latent_dim(xtr, 4, x_test=xte, num_masks=4, max_num_masks=4)
    for k, e in zip(res.ks, res.exact_lml, strict=True):
        # MLE of Tipping & Bishop from the sample covariance (numpy, independently)
        mean = xtr.mean(0)
        cov = np.cov(xtr.T, bias=True)
        lam, u = np.linalg.eigh(cov)
        lam, u = lam[::-1], u[:, ::-1]
        s2 = lam[k:].mean()
        w = u[:, :k] * np.sqrt(lam[:k] - s2)
        c = torch.from_numpy(w @ w.T + s2 * np.eye(8))
        ref = torch.distributions.MultivariateNormal(torch.from_numpy(mean), c).log_prob(
            torch.from_numpy(xte)).mean()
        assert e == pytest.approx(float(ref), abs=1e-9)
        n = len(xtr)
        model = PPCA.fit(xtr, k)
        ll = float(model.log_marginal(xtr).detach().sum())
        p = 8 * k - k * (k - 1) // 2 + 8 + 1
        assert res.bic[k - 1] == pytest.approx(-2 * ll + p * np.log(n))


@pytest.mark.parametrize("name,k_max", [("wine", 12), ("breast_cancer", 20),
                                         pytest.param("digits", 20, marks=pytest.mark.slow)])
def test_real_data_mpt_agrees_with_exact(name, k_max):
    x, _ = load_dataset(name)
    res = select_latent_dim(x, k_max, standardise=True, seed=0)
    assert res.resolved, res.notes
    assert res.choices["MPT"] == res.choices["Exact"]
    assert any("standardised" in n for n in res.notes)


def test_cli_select_outputs(tmp_path, capsys):
    out = tmp_path / "sel"
    assert main(["select", "--data", "synthetic", "--true-k", "3", "--k-max", "6",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    for crit in ("MPT", "Exact", "BIC", "Minka"):
        assert f"\n{crit}: K = " in text
    assert "\nMPT: K = 3\n" in text
    data = json.loads((out / "results.json").read_text())
    assert data["experiment"] == "select"
    assert data["results"]["choices"]["MPT"] == 3
    with open(out / "scores.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["K"]) for r in rows] == list(range(1, 7))
    assert {"mpt_lml", "mpt_stderr", "exact_lml", "bic"} <= set(rows[0])
    for ext in ("png", "pdf"):
        assert (out / f"scores.{ext}").stat().st_size > 1000
    # non-empty run directory refused
    assert main(["select", "--data", "synthetic", "--true-k", "3", "--k-max", "6",
                 "--out", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err


def test_cli_select_file_input(tmp_path, capsys):
    x, _ = load_dataset("synthetic", true_k=2, num_data=200, num_tokens=6, seed=1)
    np.save(tmp_path / "x.npy", x)
    np.savetxt(tmp_path / "x.csv", x, delimiter=",", header="a,b,c,d,e,f", comments="")
    for f in ("x.npy", "x.csv"):
        assert main(["select", "--data", str(tmp_path / f), "--k-max", "3",
                     "--out", str(tmp_path / f"out_{f}")]) == 0
        assert "MPT: K = " in capsys.readouterr().out


@pytest.mark.parametrize("argv,match", [
    (["--data", "wine", "--k-max", "0"], "--k-max must be >= 1"),
    (["--data", "wine", "--k-max", "13"], "must be smaller than D=13"),
    (["--data", "synthetic", "--k-max", "3"], "needs --true-k"),
    (["--data", "nope", "--k-max", "3"], "no such file"),
    (["--data", "wine", "--k-max", "2", "--family", "bernoulli"], "needs binary data"),
    (["--data", "digits", "--k-max", "4", "--family", "bernoulli"], "allows K <= 3"),
    (["--data", "digits", "--k-max", "2", "--family", "bernoulli", "--standardise"],
     "needs 0/1 data"),
])
def test_cli_select_errors(tmp_path, capsys, argv, match):
    out = tmp_path / "o"
    assert main(["select", *argv, "--out", str(out)]) == 2
    assert match in capsys.readouterr().err
    assert not out.exists()


def test_library_errors():
    x = np.random.default_rng(0).normal(size=(50, 5))
    with pytest.raises(ValueError, match="k_max must be >= 1"):
        select_latent_dim(x, 0)
    with pytest.raises(TypeError, match="k_max must be an integer"):
        select_latent_dim(x, 2.5)
    with pytest.raises(ValueError, match="too large for D=5"):
        select_latent_dim(x, 5)
    with pytest.raises(ValueError, match="unknown model family"):
        select_latent_dim(x, 2, family="gmm")
    assert {"ppca", "bernoulli"} <= set(FAMILIES)
    with pytest.raises(ValueError, match="needs binary data"):
        select_latent_dim(x, 2, family="bernoulli")
    with pytest.raises(ValueError, match="needs 0/1 data"):
        select_latent_dim((x > 0).astype(float), 2, family="bernoulli", standardise=True)
    with pytest.raises(ValueError, match="too large"):
        select_latent_dim((x > 0).astype(float), 4, family="bernoulli")


# ---------------------------------------------------------------------- Bernoulli family
@pytest.mark.slow
def test_bernoulli_synthetic_mpt_agrees_with_exact(tmp_path, capsys):
    """Bernoulli latent linear model (K <= 3): MPT picks the true K, as the exact LML does."""
    assert main(["select", "--data", "synthetic", "--family", "bernoulli", "--true-k", "2",
                 "--k-max", "3", "--out", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "MPT: K = 2" in out and "Exact: K = 2" in out
    assert "Minka" not in out
    res = json.loads((tmp_path / "b" / "results.json").read_text())["results"]
    assert res["family"] == "bernoulli" and res["resolved"]
    for m, s, e in zip(res["mpt"], res["mpt_stderr"], res["exact_lml"], strict=True):
        assert abs(m - e) < 5 * s, (m, e, s)  # unbiased for the quadrature LML


@pytest.mark.slow
def test_bernoulli_exact_is_quadrature_lml_of_fitted_model():
    x, _ = load_dataset("synthetic", true_k=1, num_data=120, num_tokens=8, seed=0,
                        family="bernoulli")
    assert set(np.unique(x)) <= {0.0, 1.0}
    model = FAMILIES["bernoulli"].fit(torch.from_numpy(x), 1, seed=0)
    # maximum likelihood beats the independent-Bernoulli start (W = 0)
    p = x.mean(0).clip(1e-3, 1 - 1e-3)
    indep = (x * np.log(p) + (1 - x) * np.log1p(-p)).sum(1).mean()
    with torch.no_grad():
        assert float(model.log_marginal(torch.from_numpy(x)).mean()) > indep
