"""Faults of run directories, resumed runs, reports and `select` inputs (issue: trust, round two).

Each test failed before its fix: a resumed part kept although its settings changed, a symlinked
--out replaced by a directory, a *.png symlink embedded into report.html, raw Markdown from a
run directory, a demo run reported as "0 parts", complex data silently made real, --true-k
ignored for a file, a numbered header read as data, a decode error without the file's name, a K
at the edge of the searched range (or Minka's outside it) printed without a word.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from mptlml.cli import main
from mptlml.reproduce import Part, driver
from mptlml.runs.config import RunConfig, setting
from mptlml.runs.rundir import RunDir, Transaction

# --------------------------------------------------------------- one declaration, one job style


def test_mlm_settings_are_declared_once():
    """curve, antibody and bert share MLMRunConfig: same keys, help and bounds; curve's flags
    are exactly CurveConfig's settings."""
    from mptlml.jobs.curve import CurveConfig, MLMRunConfig
    from mptlml.reproduce import antibody
    from mptlml.reproduce import table2_bert as bert

    shared = {f.name: f.metadata for f in dataclasses.fields(MLMRunConfig)}
    for cls in (CurveConfig, antibody.Config, bert.Config):
        assert issubclass(cls, MLMRunConfig)
        mine = {f.name: f.metadata for f in dataclasses.fields(cls)}
        for key, meta in shared.items():
            assert dict(mine[key]) == dict(meta), (cls, key)
    assert dict(next(f for f in dataclasses.fields(bert.Config) if f.name == "model").metadata) \
        == dict(next(f for f in dataclasses.fields(CurveConfig) if f.name == "model").metadata)
    from tests.cli_helpers import parse

    flags = parse(["curve", "--model", "m", "--data", "d"])[1].params
    assert set(flags) - {"quiet", "out", "overwrite", "resume"} == \
        {f.name for f in dataclasses.fields(CurveConfig)}


# --------------------------------------------------------------- resume never goes stale


@dataclass
class _FakeConfig(RunConfig):
    num_data: int = setting(10, "N", min=1)
    seed: int = setting(0, "seed", min=0)
    num_threads: int | None = setting(None, "torch threads", min=1, execution=True)


def _fake_part(calls: list) -> Part:
    def run(cfg, run_dir):
        calls.append(cfg.num_data)
        run_dir.write_csv("x.csv", [{"n": cfg.num_data}])
        return {"n": cfg.num_data}

    return Part(config=_FakeConfig, run=run, title="fake", paper="", claims=lambda res: [])


def test_resume_reruns_a_part_whose_settings_changed(tmp_path, monkeypatch, caplog):
    calls: list = []
    fake = _fake_part(calls)
    monkeypatch.setattr(driver, "get_part", lambda name: fake)
    out = tmp_path / "all"
    driver.run_all(out, only=["fake"])
    assert calls == [10]
    with caplog.at_level(logging.INFO, logger="mptlml"):
        status = driver.run_all(out, resume=True, only=["fake"])
    assert calls == [10] and status["fake"] == "kept"  # same settings: kept
    status = driver.run_all(out, resume=True, only=["fake"], overrides={"fake": {"num_threads": 2}})
    assert calls == [10] and status["fake"] == "kept"  # an execution-only setting changes no number
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="mptlml"):
        status = driver.run_all(out, resume=True, only=["fake"],
                                overrides={"fake": {"num_data": 50}})
    assert calls == [10, 50] and status["fake"].startswith("ok")
    assert "other settings (num_data: 10 -> 50)" in caplog.text
    res = json.loads((out / "fake" / "results.json").read_text())
    assert res["config"]["num_data"] == 50 and res["results"]["n"] == 50
    driver.run_all(out, resume=True, only=["fake"], quick=True,
                   overrides={"fake": {"num_data": 50}})
    assert calls == [10, 50, 50]  # the mode changed: run again


# --------------------------------------------------------------- output and files


def _finished_run(path: Path, name: str = "area", results: dict | None = None) -> Path:
    with RunDir(path, name, overwrite=True) as run:
        run.write_csv("x.csv", [{"a": 1}])
        run.write_results({"num_data": 1}, results or {"quick": True})
    return path


def test_symlinked_out_replaces_the_target_and_keeps_the_link(tmp_path):
    target = _finished_run(tmp_path / "target")
    link = tmp_path / "link"
    link.symlink_to(target, target_is_directory=True)
    tx = Transaction(link, overwrite=True)
    (tx.staging / "new.txt").write_text("new run")
    (tx.staging / "results.json").write_text("{}")
    tx.commit()
    assert link.is_symlink() and os.path.realpath(link) == str(target.resolve())
    assert (target / "new.txt").read_text() == "new run"
    assert not (target / "x.csv").exists()  # the old run's files are gone from the target
    assert not any(p.name.startswith(".link") for p in tmp_path.iterdir())  # lock by the target


def test_report_refuses_a_png_symlink_out_of_the_run_dir(tmp_path):
    from mptlml.report import build_report

    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-KEY")
    run = _finished_run(tmp_path / "run")
    (run / "evil.png").symlink_to(secret)
    (run / "fake.png").write_text("not a png")
    rep = build_report([run], tmp_path / "rep")
    html = (tmp_path / "rep" / "report.html").read_text()
    assert base64.b64encode(b"TOP-SECRET-KEY").decode() not in html
    assert any("evil.png" in p and "outside the run directory" in p for p in rep.problems)
    assert any("fake.png" in p and "not a PNG" in p for p in rep.problems)


def test_report_md_escapes_run_directory_strings(tmp_path):
    from mptlml.report import build_report

    evil = "![pwn](http://evil.example/x.png) <script>alert(1)</script> | **x**"
    run = _finished_run(tmp_path / "run", results={"quick": True, "notes": evil})
    build_report([run], tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "](http://evil" not in md.replace("\\]", "") or "\\[pwn\\]" in md
    assert "<script>" not in md and "**x**" not in md and "\\[pwn\\]" in md


def test_report_of_a_demo_run_says_what_it_is(tmp_path, capsys):
    run = _finished_run(tmp_path / "demo", name="demo")
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert "is a `mptlml demo` run" in err and "mptlml reproduce" in err
    assert len(err.splitlines()) == 1


def test_select_refuses_complex_data(tmp_path):
    from mptlml.selection import load_matrix

    p = tmp_path / "c.npy"
    np.save(p, np.ones((5, 3)) + 1j)
    with pytest.raises(ValueError, match=r"c\.npy: the matrix is complex"):
        load_matrix(str(p))


def test_select_refuses_true_k_for_a_file(tmp_path, capsys):
    p = tmp_path / "x.npy"
    np.save(p, np.random.default_rng(0).normal(size=(40, 5)))
    assert main(["select", "--data", str(p), "--k-max", "2", "--true-k", "2",
                 "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "--true-k applies to --data synthetic only" in err and str(p) in err
    assert not (tmp_path / "o").exists()


def test_select_skips_a_numbered_header_with_a_warning(tmp_path):
    from mptlml.selection import load_matrix

    p = tmp_path / "h.csv"
    p.write_text("1,2,3\n0.5,1.5,2.5\n1.0,2.0,3.5\n")
    with pytest.warns(UserWarning, match=r"h\.csv: line 1 is 1, 2, 3: read as a header"):
        x = load_matrix(str(p))
    np.testing.assert_array_equal(x, [[0.5, 1.5, 2.5], [1.0, 2.0, 3.5]])


def test_select_decode_error_names_the_file(tmp_path):
    from mptlml.selection import load_matrix

    p = tmp_path / "latin.csv"
    p.write_bytes("a,b\n1,2\n\xe9,3\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin\.csv: not UTF-8 text \(byte 0xe9"):
        load_matrix(str(p))


def test_select_warns_at_the_edge_and_for_minka_outside():
    from mptlml.jobs.select import choice_warnings

    res = types.SimpleNamespace(choices={"MPT": 4, "Exact": 4, "BIC": 2, "Minka": 9})
    warned = choice_warnings(res, 4)
    assert any("MPT picks K = 4, the largest K searched" in w and "widen" in w for w in warned)
    assert any("Minka's K = 9 lies outside the searched range 1..4" in w for w in warned)
    assert not any(w.startswith("BIC") for w in warned)


def test_select_cli_says_the_choice_is_at_the_edge(tmp_path, capsys):
    assert main(["select", "--data", "synthetic", "--true-k", "3", "--k-max", "2",
                 "--max-num-masks", "20", "--out", str(tmp_path / "o")]) == 0
    cap = capsys.readouterr()
    assert "MPT: K = 2  (the largest K searched)" in cap.out
    assert "the optimum is at the edge of the search range" in cap.err
    res = json.loads((tmp_path / "o" / "results.json").read_text())
    assert any("largest K searched" in w for w in res["results"]["warnings"])
