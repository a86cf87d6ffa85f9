"""``reproduce training | area | curve-evolution --quick``: outputs, keys, columns, figures."""

from __future__ import annotations

import csv
import json

import pytest

from mptlml.cli import main
from mptlml.reproduce import run_part

pytestmark = pytest.mark.usefixtures("one_thread")


def _columns(path):
    with open(path) as fh:
        return next(csv.reader(fh))


def _check_common(out, name, csvs, figures):
    data = json.loads((out / "results.json").read_text())
    assert data["experiment"] == name and data["results"]["quick"] is True
    for key in ("format", "config", "environment", "files", "wall_time_s"):
        assert key in data
    for c, cols in csvs.items():
        assert set(cols) <= set(_columns(out / c)), c
        assert len((out / c).read_text().splitlines()) > 1
        assert c in data["files"]
    for stem in figures:
        for ext in ("png", "pdf"):
            f = out / f"{stem}.{ext}"
            assert f.is_file() and f.stat().st_size > 1000, f
    return data["results"]


@pytest.mark.slow
def test_training_quick(tmp_path, capsys):
    out = tmp_path / "training"
    assert main(["reproduce", "training", "--quick", "--out", str(out)]) == 0
    assert "training: summary" in capsys.readouterr().out
    res = _check_common(
        out, "training",
        {"training_curves.csv": ["objective", "init", "epoch", "neg_mpt_loss", "exact_lml",
                                 "fixed_rate_exact", "bias"],
         "fixed_rate_bias.csv": ["init", "epoch", "exact_lml", "fixed_rate_exact", "bias"]},
        ["fig2_training", "fig2_bias"])
    for key in ("gt_lml", "mle_lml", "mask_size", "gt_fixed_rate_bias", "objectives"):
        assert key in res
    assert res["mask_size"] == 2
    allz, fixed = res["objectives"]["all-sizes"], res["objectives"]["fixed-rate"]
    assert len(allz["inits"]) == 2 and len(fixed["inits"]) == 2
    # the LML rose from the random initialisation towards the MLE
    for f in allz["inits"] + fixed["inits"]:
        assert f["final_exact_lml"] > f["initial_exact_lml"] + 5
    assert allz["max_rel_gap_to_mle"] < 0.02
    assert fixed["bias_last_half_mean"] > 0 and fixed["bias_rel_spread_max"] < 0.05
    # the per-epoch bias equals D*S(x;M) - exact LML
    with open(out / "fixed_rate_bias.csv") as fh:
        rows = list(csv.DictReader(fh))
    r = rows[-1]
    assert float(r["bias"]) == pytest.approx(float(r["fixed_rate_exact"]) - float(r["exact_lml"]))


def test_area_quick(tmp_path):
    out = tmp_path / "area"
    run_part("area", out, quick=True)
    res = _check_common(out, "area",
                        {"curves.csv": ["panel", "latent_dim", "num_masks", "mask_size", "rate",
                                        "S_mean", "S_stderr"],
                         "areas.csv": ["panel", "area", "exact_lml", "area_minus_exact",
                                       "S_at_15pct", "S_at_85pct"]},
                        ["fig4_area"])
    assert [(p["latent_dim"], p["num_masks"]) for p in res["panels"]] == [(5, 1), (5, 20),
                                                                          (20, 1)]
    for p in res["panels"]:
        # the area estimates the exact LML (well within 5 data standard errors)
        assert abs(p["area_minus_exact"]) < 4 * p["area_mc_stderr"]
        assert p["S_at_15pct"] > p["S_at_85pct"]  # lower masking rates predict better


def test_curve_evolution_quick(tmp_path):
    out = tmp_path / "curve"
    run_part("curve-evolution", out, quick=True)
    res = _check_common(out, "curve-evolution",
                        {"curves.csv": ["epoch", "mask_size", "rate", "S_mean"],
                         "areas.csv": ["epoch", "area", "exact_lml", "area_minus_exact"],
                         "training.csv": ["epoch", "neg_mpt_loss", "exact_lml"]},
                        ["fig5_curve_evolution"])
    eps = [c["epoch"] for c in res["checkpoints"]]
    assert eps == list(range(0, 121, 20))
    first, last = res["checkpoints"][0], res["checkpoints"][-1]
    assert last["area"] > first["area"] + 10
    assert res["final_rel_gap_to_gt"] < 0.05
    from mptlml.training import History

    hist = History.load(out / "history.json")
    assert hist.records[-1]["epoch"] == 120


def test_refuses_non_empty_run_dir_and_bad_settings(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("user data")
    with pytest.raises(ValueError, match="exists and is not empty; pass --overwrite"):
        run_part("area", out, quick=True)
    assert main(["reproduce", "area", "--quick", "--out", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    # bad settings are refused before anything is written
    fresh = tmp_path / "fresh"
    assert main(["reproduce", "training", "--quick", "--out", str(fresh),
                 "--set", "lr=-1"]) == 2
    assert "lr must be a finite positive" in capsys.readouterr().err
    assert main(["reproduce", "area", "--quick", "--out", str(fresh),
                 "--set", "panels=5x1"]) == 2
    assert "'K:P'" in capsys.readouterr().err
    assert not fresh.exists()
    # --overwrite replaces results but keeps unrelated files
    assert main(["reproduce", "area", "--quick", "--out", str(out), "--overwrite",
                 "--set", "panels=3:2"]) == 0
    assert (out / "keep.txt").read_text() == "user data" and (out / "results.json").is_file()


def test_set_reaches_the_shared_settings():
    from mptlml.reproduce import get_part
    from mptlml.runs.config import parse_setting as _parse_override

    assert _parse_override(get_part("area").config, "sigma2=0.5") == ("sigma2", 0.5)
    assert _parse_override(get_part("training").config, "data_seed=3") == ("data_seed", 3)
    assert _parse_override(get_part("curve-evolution").config,
                           "dtype=float32") == ("dtype", "float32")
    assert _parse_override(get_part("convergence").config,
                           "share_masks=yes") == ("share_masks", True)
    # each experiment keeps the paper's own defaults over the shared ones
    fig2, fig5 = get_part("training").config(), get_part("curve-evolution").config()
    assert (fig2.num_data, fig2.num_tokens, fig2.lr, fig2.seed) == (2000, 10, 1e-2, 1)
    assert (fig5.num_data, fig5.num_tokens, fig5.lr, fig5.seed) == (1000, 50, 2e-2, 1)
    assert get_part("convergence").config().num_data == 100
    with pytest.raises(ValueError, match="sigma2 must be a finite positive"):
        get_part("convergence").config(sigma2=float("inf")).validate()
