"""The published full-size table: rendered from a full run's report.json, copied in the docs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mptlml.reproduce import full_size
from mptlml.reproduce.claims import (
    full_size_markdown,
    full_size_table,
    full_size_table_from_report,
)

DOCS = Path(__file__).resolve().parents[1] / "docs" / "results" / "full-reproduction.md"


def _report(mode: str = "full") -> dict:
    return {
        "mode": mode,
        "claims": [
            {"section": "area", "claim": "a | b", "status": "holds", "ours": "1.0"},
            {"section": "area", "claim": "long text", "key": "k", "status": "undecided",
             "ours": "z = +0.4", "note": "about 121 seeds would decide it"},
            {"section": "bert", "claim": "c", "status": "recomputed", "ours": "2"},
        ],
        "parts": [{"name": "area", "wall_time_s": 140.2, "git_commit": "abc"},
                  {"name": "bert", "wall_time_s": 3.0, "git_commit": "abc"},
                  {"name": "select", "wall_time_s": 3725.0, "git_commit": "abc"}],
        "environment": {"cpu": "AMD EPYC", "cpu_count": 2, "python": "3.11.7",
                        "versions": {"torch": "2.13.0+cpu"}},
        "missing": [],
    }


def test_markdown_has_every_part_time_and_every_claim():
    table = full_size_table_from_report(_report(), date="2026-11-26", machine="m")
    md = full_size_markdown(table)
    assert "Run on 2026-11-26, m:" in md
    assert "| area | 2 min 20 s | 1 |  | 1 |  |  |" in md
    assert "| bert | 3 s |  |  |  | 1 |  |" in md
    assert "| select | 1 h 02 min |" in md  # a part without claims still has its time
    assert "**1 h 04 min**" in md  # 140 + 3 + 3725 s
    assert "| a \\| b | holds | 1.0 |" in md  # a table cell cannot break the table
    assert "| k | undecided | z = +0.4 *about 121 seeds would decide it* |" in md


def test_a_quick_report_is_refused():
    with pytest.raises(ValueError, match="full run only"):
        full_size_table_from_report(_report("quick"), date="d", machine="m")


def test_the_docs_page_holds_the_packaged_table():
    """docs/results/full-reproduction.md shows exactly the table quick mode cites."""
    page = DOCS.read_text(encoding="utf-8")
    region = page.split(full_size.BEGIN)[1].split(full_size.END)[0]
    assert region == "\n" + full_size_markdown(full_size_table())


def test_main_writes_the_table_and_the_docs_region(tmp_path):
    run = tmp_path / "all"
    run.mkdir()
    (run / "report.json").write_text(json.dumps(_report()))
    page = tmp_path / "page.md"
    page.write_text(f"# Title\n\nabove\n\n{full_size.BEGIN}\nSTALE\n{full_size.END}\n\nbelow\n")
    out = tmp_path / "table.json"
    full_size.main([str(run), "--json", str(out), "--docs", str(page), "--date", "2026-11-26",
                    "--note", "select=beside | area"])
    table = json.loads(out.read_text())
    assert table["machine"] == "2 CPU cores (AMD EPYC), torch 2.13.0+cpu, Python 3.11.7"
    assert table["parts"]["area"]["wall_time_s"] == 140.2
    assert table["parts"]["select"]["note"] == "beside | area"
    assert "| select | 1 h 02 min |  |  |  |  |  | beside \\| area |" in full_size_markdown(table)
    with pytest.raises(SystemExit):  # a note for a part the run does not have
        full_size.main([str(run), "--note", "latent=x"])
    text = page.read_text()
    assert text.startswith("# Title\n\nabove\n\n") and text.endswith("\n\nbelow\n")
    assert "STALE" not in text and full_size_markdown(table) in text
    with pytest.raises(SystemExit):  # no report.json: says to build it
        full_size.main([str(tmp_path)])
    with pytest.raises(ValueError, match="one line"):
        full_size.replace_region("no markers", "x")


def test_a_report_with_missing_parts_is_refused():
    """A report of one part (eight missing) is no table of `reproduce all`."""
    rep = {**_report(), "missing": ["latent", "training", "vae"]}
    with pytest.raises(ValueError, match=r"lacks 3 parts \(latent, training, vae\).*--resume"):
        full_size_table_from_report(rep, date="d", machine="m")


@pytest.mark.parametrize("content, msg", [
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "holds a JSON list"),
    (json.dumps({k: v for k, v in _report().items() if k != "claims"}), "has no claims"),
    (json.dumps({**_report(), "claims": []}), "claims are empty"),
    (json.dumps({**_report(), "missing": ["vae"]}), "lacks 1 part (vae)"),
])
def test_main_refuses_a_broken_report_with_a_message(content, msg, tmp_path, capsys):
    run = tmp_path / "all"
    run.mkdir()
    (run / "report.json").write_text(content)
    out = tmp_path / "table.json"
    with pytest.raises(SystemExit) as exc:
        full_size.main([str(run), "--json", str(out), "--date", "2026-11-26"])
    assert exc.value.code == 2
    assert msg in capsys.readouterr().err
    assert not out.exists()


def test_main_refuses_a_bad_date_and_a_missing_docs_page_before_writing(tmp_path, capsys):
    run = tmp_path / "all"
    run.mkdir()
    (run / "report.json").write_text(json.dumps(_report()))
    out = tmp_path / "table.json"
    for extra, msg in [(["--date", "not-a-date"], "is not a date"),
                       (["--docs", str(tmp_path / "nope.md")], "does not exist")]:
        with pytest.raises(SystemExit) as exc:
            full_size.main([str(run), "--json", str(out), *extra])
        assert exc.value.code == 2 and msg in capsys.readouterr().err
        assert not out.exists()
