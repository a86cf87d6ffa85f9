"""`mptlml reproduce all --quick`: every part runs and the report has every section."""

from __future__ import annotations

import json

import pytest

from mptlml.cli import main
from mptlml.report import ERRATA
from mptlml.reproduce import PARTS, get_part


@pytest.mark.slow
def test_reproduce_all_quick_report_has_every_section(tmp_path, capsys):
    out = tmp_path / "all"
    assert main(["reproduce", "all", "--quick", "--out", str(out)]) == 0
    for name in PARTS:
        assert (out / name / "results.json").is_file(), name
    rep = json.loads((out / "report.json").read_text())
    assert not rep["missing"] and not rep["problems"]
    # every part's wall time and the machine, for the full-size table
    assert [p["name"] for p in rep["parts"]] == list(PARTS)
    assert all(p["wall_time_s"] > 0 and p["quick"] for p in rep["parts"])
    assert rep["environment"]["cpu_count"] >= 1
    from mptlml.reproduce import full_size

    with pytest.raises(SystemExit):  # only a full run goes in the published table
        full_size.main([str(out)])
    md = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    for title in (get_part(n).title for n in PARTS):
        assert title in md
        assert title.replace("&", "&amp;") in html
    assert ERRATA[0][:40] in md
    # every claim hook ran on the real results (a crash is reported as "claim check failed")
    assert "claim check failed" not in md
    # nothing fails that only the quick sizes fail: such claims are "undecided" (issue 26)
    assert not rep["failing"], rep["failing"]
    assert "<img" in html and "data:image/png;base64," in html
    # a second run into the same directory must not clobber it silently
    capsys.readouterr()
    assert main(["reproduce", "all", "--quick", "--out", str(out)]) != 0
    assert "not empty" in capsys.readouterr().err
    # resume keeps every finished part
    assert main(["reproduce", "all", "--quick", "--out", str(out), "--resume"]) == 0
    assert capsys.readouterr().err.count("finished earlier with the same settings: kept") \
        == len(PARTS)


@pytest.mark.slow  # runs every part's quick configuration
def test_run_all_builds_the_report_only_when_given_a_builder(tmp_path, caplog):
    from mptlml.report import build_report
    from mptlml.reproduce import run_all

    status = run_all(tmp_path / "a", quick=True, only=["area"])
    assert list(status) == ["area"] and status["area"].startswith("ok")
    assert json.loads((tmp_path / "a" / "status.json").read_text()) == status
    assert not (tmp_path / "a" / "report.md").exists()  # the experiments know no report
    with caplog.at_level("INFO", logger="mptlml"):  # messages go through the mptlml logger
        status = run_all(tmp_path / "b", quick=True, only=["area"], build_report=build_report)
    rep = json.loads((tmp_path / "b" / "report.json").read_text())
    assert "area" not in rep["missing"] and "training" in rep["missing"]
    assert "claims, quick mode)" in caplog.text
