"""Reports are rebuilt from run directories alone and survive incomplete ones."""

from __future__ import annotations

import json

import pytest

from mptlml.cli import main
from mptlml.experiments.common import RESULTS_FORMAT, RunDir, load_results
from mptlml.report import ERRATA, build_report


def _fake_run(path, name, results=None):
    run = RunDir(path, name)
    run.write_csv("series.csv", [{"a": 1, "b": 2.5}])
    run.write_results({"k": 1}, results or {"value": 1.0}, seed=0)
    return path


def test_report_from_run_dirs_lists_missing(tmp_path):
    _fake_run(tmp_path / "runs" / "convergence", "convergence")
    (tmp_path / "runs" / "training").mkdir()  # interrupted: no results.json
    rep = build_report([tmp_path / "runs"], tmp_path / "out")
    names = [s["name"] for s in rep.sections]
    assert names == ["convergence"]
    assert "training" in rep.missing and "bert" in rep.missing
    assert any("no results.json" in p for p in rep.problems)
    md = (tmp_path / "out" / "report.md").read_text()
    html = (tmp_path / "out" / "report.html").read_text()
    for text in (md, html):
        assert "Errata in the paper" in text and "Environment" in text
        assert "Missing parts" in text
    assert ERRATA[0][:40] in md
    assert json.loads((tmp_path / "out" / "report.json").read_text())["missing"]


def test_newer_format_and_missing_results_are_clear(tmp_path):
    d = _fake_run(tmp_path / "r", "convergence")
    data = json.loads((d / "results.json").read_text())
    data["format"] = RESULTS_FORMAT + 1
    (d / "results.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="upgrade mptlml"):
        load_results(d)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="has no results.json"):
        load_results(tmp_path / "empty")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "results.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_results(tmp_path / "bad")
    rep = build_report([d, tmp_path / "bad"], tmp_path / "out")
    assert len(rep.problems) == 2 and not rep.sections


def test_report_cli(tmp_path, capsys):
    _fake_run(tmp_path / "c", "convergence")
    assert main(["report", str(tmp_path / "c"), "--out", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err  # messages go to stderr through the mptlml logger
    assert "mptlml: warning: missing: training" in err
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "none of the run directories exist" in capsys.readouterr().err
    assert not (tmp_path / "nope").exists()


def test_run_dir_refuses_non_empty(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep.txt").write_text("precious")
    with pytest.raises(ValueError, match="not empty.*--overwrite"):
        RunDir(tmp_path / "x", "demo")
    assert (tmp_path / "x" / "keep.txt").read_text() == "precious"
