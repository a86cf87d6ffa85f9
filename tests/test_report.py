"""Reports are rebuilt from run directories alone and survive incomplete ones."""

from __future__ import annotations

import dataclasses
import html
import json

import pytest

from mptlml.cli import main
from mptlml.report import ERRATA, STATUSES, build_report
from mptlml.runs.rundir import RESULTS_FORMAT, RunDir, load_results


def _fake_run(path, name, results=None):
    run = RunDir(path, name)
    run.write_csv("series.csv", [{"a": 1, "b": 2.5}])
    run.write_results({"k": 1}, results or {"value": 1.0, "quick": True}, seed=0)
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


def test_report_of_one_quick_run_goes_beside_it_and_says_how_to_run_the_rest(tmp_path, capsys):
    """A single part's run directory is replaced by its next run: the report goes beside it;
    the missing parts are suggested in the run's (quick) mode; "1 part", not "1 parts"."""
    run = _fake_run(tmp_path / "c", "convergence")
    before = sorted(p.name for p in run.iterdir())
    assert main(["report", str(run)]) == 0
    err = capsys.readouterr().err
    assert sorted(p.name for p in run.iterdir()) == before  # nothing written into the run
    assert (tmp_path / "c-report" / "report.md").is_file()
    assert "c-report/report.html" in err and ": 1 part;" in err
    assert "missing: training (run `mptlml reproduce training --quick`)" in err


@pytest.mark.parametrize("results, why", [
    ({}, "holds no results"),
    ({"value": 1.0}, "records no mode"),
])
def test_a_hollow_results_json_is_an_error_not_a_bug_in_the_check(results, why, tmp_path,
                                                                   capsys):
    d = tmp_path / "area"
    d.mkdir()
    (d / "results.json").write_text(json.dumps(
        {"format": RESULTS_FORMAT, "experiment": "area", "config": {}, "results": results}))
    assert main(["report", str(d), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert why in err and "run `mptlml reproduce area` again" in err
    md = (tmp_path / "o" / "report.md").read_text()
    assert "bug in the check" not in md + err and "Full mode" not in md


def test_run_dir_refuses_non_empty(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep.txt").write_text("precious")
    with pytest.raises(ValueError, match="not empty.*--overwrite"):
        RunDir(tmp_path / "x", "demo")
    assert (tmp_path / "x" / "keep.txt").read_text() == "precious"


def _claims_run(path, name, config, results):
    run = RunDir(path, name)
    run.write_results(config, {**results, "quick": True}, seed=0)


def test_report_top_lists_mode_counts_and_every_failing_claim(tmp_path):
    """Before the first section: the mode, the count per status, every failing claim linked."""
    import re

    from mptlml.reproduce import fig2_training as training
    from mptlml.reproduce import table2_bert as bert
    from tests.test_claims import _bert_good, _training_good

    bad_training = _training_good()
    # where fixed-rate training ends up: undecided at quick sizes, whatever the numbers
    bad_training["objectives"]["fixed-rate"]["max_rel_gap_to_gt"] = 0.05
    bad_training["objectives"]["fixed-rate"]["bias_last_half_mean"] = 1.3
    # decidable at quick sizes: these fail
    bad_training["objectives"]["fixed-rate"]["bias_rel_spread_max"] = 0.05
    bad_training["flat_direction"]["fixed_rate_maximiser"]["exact_lml"] = -10.5
    _claims_run(tmp_path / "runs" / "training", "training", training.Config.quick(), bad_training)
    _claims_run(tmp_path / "runs" / "bert", "bert", bert.Config.quick(), _bert_good())
    rep = build_report([tmp_path / "runs"], tmp_path / "out")

    failing = [c["claim"] for c in rep.claims if c["status"] == "fails"]
    assert len(failing) == 2 and rep.mode == "quick"
    assert rep.counts == {"holds": 2, "fails": 2, "undecided": 2, "recomputed": 3, "not run": 1}

    html_text = (tmp_path / "out" / "report.html").read_text()
    top = html_text[:html_text.index("<section")]
    assert "Mode: quick" in top
    assert "num_data 300 (2000)" in top and "epochs_fixed 600 (10000)" in top
    for s, n in rep.counts.items():
        assert re.search(rf"{s}</span> {n}\b", top), s
    for c in rep.claims:
        if c["status"] == "fails":
            assert c["claim"] in html.unescape(top)
            assert f'href="#{c["anchor"]}"' in top and f'id="{c["anchor"]}"' in html_text
    # every claim row carries its status badge; the failing note is shown beside it
    body = html_text[len(top):]
    assert body.count('<span class="badge s-recomputed">recomputed</span>') == 3
    assert body.count('<span class="badge s-fails">fails</span>') == 2
    assert body.count('<span class="badge s-undecided">undecided</span>') == 2
    assert "11x flatter" in html_text
    assert "Not decided at quick sizes" in html_text and "at full size (" in html_text
    assert 'class="badge s-undecided">undecided</span> the run is too small' in top  # legend

    md = (tmp_path / "out" / "report.md").read_text()
    md_top = md[:md.index('<a id="training">')]
    assert "**Mode: quick.**" in md_top and "❌ fails 2" in md_top and "🟡 undecided 2" in md_top
    assert "🟡 undecided: the run is too small" in md_top
    from mptlml._markdown import md_cell  # run-directory strings are escaped in report.md

    assert all(md_cell(f) in md_top for f in failing)

    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert data["mode"] == "quick" and data["counts"] == rep.counts
    assert {c["status"] for c in data["claims"]} <= set(STATUSES)
    assert [c["claim"] for c in data["failing"]] == failing


def test_report_figures_have_captions_not_file_names(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mptlml.reproduce import fig4_area as area

    run = RunDir(tmp_path / "runs" / "area", "area")
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    run.save_figure(fig, "fig4_area")
    res = {"num_tokens": 40, "num_data": 200, "panels": [
        {"panel": 0, "latent_dim": 5, "num_masks": 1, "area": -37.9, "area_mc_stderr": 0.1,
         "exact_lml": -37.8, "roughness": 0.05}]}
    run.write_results(area.Config.quick(), {**res, "quick": True}, seed=0)
    build_report([tmp_path / "runs"], tmp_path / "out")
    text = (tmp_path / "out" / "report.html").read_text()
    cap = text[text.index("<figcaption>"):text.index("</figcaption>")]
    assert "Paper Figure 4" in cap and "N=200, D=40" in cap and "fig4_area.png" not in cap


def test_a_claim_check_that_raises_fails(tmp_path, monkeypatch):
    """A broken claim check is a failure of the package, reported as ``fails`` (not hidden as
    "not run"), and the rest of the report is still built."""
    from mptlml.reproduce import fig2_training as training
    from mptlml.reproduce import table2_bert as bert
    from tests.test_claims import _bert_good, _training_good

    def broken(results):
        raise KeyError("objectives")

    monkeypatch.setattr(training, "PART", dataclasses.replace(training.PART, claims=broken))
    _claims_run(tmp_path / "runs" / "training", "training", training.Config.quick(),
                _training_good())
    _claims_run(tmp_path / "runs" / "bert", "bert", bert.Config.quick(), _bert_good())
    rep = build_report([tmp_path / "runs"], tmp_path / "out")
    assert [c["claim"] for c in rep.failing] == ["claim check failed"]
    assert rep.counts["recomputed"] == 3


def test_the_errata_have_one_text():
    """The report and the notes page print the same errata: the packaged ``data/errata.md``."""
    from importlib.resources import files
    from pathlib import Path

    text = files("mptlml.data").joinpath("errata.md").read_text(encoding="utf-8")
    notes = (Path(__file__).resolve().parents[1] / "docs" / "notes.md").read_text(encoding="utf-8")
    begin = "<!-- errata: the text of src/mptlml/data/errata.md, which the report prints too -->"
    end = "<!-- end of the errata -->"
    region = notes.split(begin, 1)[1].split(end, 1)[0]
    assert region.strip() == text.strip(), "copy src/mptlml/data/errata.md into docs/notes.md"
    numbered = [line for line in text.splitlines() if line[:1].isdigit()]
    assert len(ERRATA) == len(numbered) >= 5
    assert ERRATA[0].startswith("**The sign of the Gaussian conditional variance.**")
    assert "\n" not in "".join(ERRATA)  # one line each, as the report lists them


def test_errata_render_as_html(tmp_path):
    from mptlml.report import _md_inline_html

    assert _md_inline_html("**a** *b* `x * y` <c>") == \
        "<strong>a</strong> <em>b</em> <code>x * y</code> &lt;c&gt;"
