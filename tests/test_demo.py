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


def test_a_printed_table_formats_each_column_one_way(capsys):
    """The demo's table: a rounding-level 3.9e-16 beside 0.0424 reads 0.0000, not 3.887e-16;
    a column of small numbers keeps its digits (scientific)."""
    from mptlml.runs.output import print_table

    rows = [{"method": "exact", "mean_lml": -161.4034, "stderr": 0.0, "tiny": 2e-5},
            {"method": "cumulative", "mean_lml": -161.338, "stderr": 0.0424, "tiny": 3e-6},
            {"method": "chain-rule", "mean_lml": -161.4034, "stderr": 3.887e-16,
             "tiny": float("-inf")}]
    text = print_table(rows)
    assert "e-16" not in text
    lines = text.splitlines()[2:]
    assert [ln.split()[2] for ln in lines] == ["0.0000", "0.0424", "0.0000"]
    assert [ln.split()[3] for ln in lines] == ["2e-05", "3e-06", "-inf"]
