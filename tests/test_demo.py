"""The main job on built-in data (sklearn digits) runs and writes readable results."""

from __future__ import annotations

import json

import pytest

from mptlml.cli import main


@pytest.mark.slow
def test_demo_writes_results(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--num-masks", "2"]) == 0
    text = capsys.readouterr().out
    assert "sklearn PCA.score_samples" in text and "MPT chain-rule" in text
    res = json.loads((out / "results.json").read_text())["results"]
    assert res["max_abs_diff_vs_sklearn"] < 1e-8
    # the chain rule is exact for PPCA whatever the order
    assert abs(res["estimates"]["chain-rule"]["mean"] - res["exact_mean_lml"]) < 1e-8
    assert (out / "mpt_curve.png").stat().st_size > 1000
    # refuses to clobber
    assert main(["demo", "--out", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
