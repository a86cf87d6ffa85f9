"""Output control: --quiet and TQDM_DISABLE=1 leave stderr free of progress bars; logging.

The CLI runs through subprocess on a tiny training job (a few epochs), first with the
defaults to show that the job does draw bars (so the quiet runs prove something).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mptlml import estimate_lml, settings
from mptlml._progress import progress_bar, progress_enabled, set_quiet
from mptlml.models import PPCA

JOB = ["reproduce", "curve-evolution", "--quick", "--set", "epochs=4", "--set", "curve_every=2",
       "--set", "num_data=20", "--set", "num_tokens=4", "--set", "latent_dim=1"]


def _run(tmp_path, name, *extra, env=None):
    out = tmp_path / name
    full_env = {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}
    full_env.update(env or {})
    done = subprocess.run([sys.executable, "-m", "mptlml", *JOB, "--out", str(out),
                           *extra], capture_output=True, text=True, env=full_env, timeout=300)
    assert done.returncode == 0, done.stderr
    return done, out


def _has_bar(stderr: str) -> bool:
    return "\r" in stderr or "%|" in stderr or "it/s" in stderr


@pytest.mark.slow  # three runs of a job on the command line, each its own process
def test_bars_by_default_none_with_tqdm_disable_or_quiet(tmp_path):
    loud, out = _run(tmp_path, "loud")
    assert _has_bar(loud.stderr), "the job draws no bar: this test would prove nothing"
    assert "results written to" in loud.stderr  # INFO messages go to stderr by default
    assert "curve-evolution: summary" in loud.stdout  # the final table stays on stdout

    env, _ = _run(tmp_path, "env", env={"TQDM_DISABLE": "1"})
    assert not _has_bar(env.stderr), env.stderr
    assert "results written to" in env.stderr  # only the bars are off

    quiet, _ = _run(tmp_path, "quiet", "--quiet")
    assert quiet.stderr == "", quiet.stderr  # warnings only, and there are none
    assert "curve-evolution: summary" in quiet.stdout

    env_block = json.loads((out / "results.json").read_text())["environment"]
    assert env_block["command"][1:3] == ["reproduce", "curve-evolution"]
    assert env_block["git_commit"] is None or len(env_block["git_commit"]) == 40
    assert isinstance(env_block["cpu"], str) and env_block["cpu"]
    assert "gpu" in env_block  # the GPU model, None without one


@pytest.mark.parametrize(("argv", "quiet"), [
    (["-q", "report", "DIR"], True), (["report", "DIR", "--quiet"], True),
    (["report", "DIR"], False)])
def test_quiet_goes_before_or_after_the_command(argv, quiet, tmp_path, capsys):
    import logging

    from mptlml.cli import main

    argv = [str(tmp_path / "missing") if a == "DIR" else a for a in argv]
    assert main(argv) == 2  # no such run directory: the output was set up before the error
    level = logging.getLogger("mptlml").level
    assert level == (logging.WARNING if quiet else logging.INFO)
    capsys.readouterr()


def test_library_bars_honour_tqdm_disable_even_when_asked_for(monkeypatch, capsys):
    model = PPCA.random(6, 2, 0.5, seed=0)
    x = model.sample(30, generator=1)
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    with settings.block_elements(200):  # many small blocks: the estimator draws a bar
        estimate_lml(model, x, "cumulative", num_masks=4, seed=0, progress=True)
        assert "%|" in capsys.readouterr().err
        monkeypatch.setenv("TQDM_DISABLE", "1")
        estimate_lml(model, x, "cumulative", num_masks=4, seed=0, progress=True)
    list(progress_bar(range(3), enabled=True, desc="x"))
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("value,off", [("0", False), ("false", False), ("", False), ("1", True),
                                       ("True", True)])
def test_tqdm_disable_values(monkeypatch, value, off):
    monkeypatch.setenv("TQDM_DISABLE", value)
    assert progress_enabled(True) is not off


def test_set_quiet_turns_bars_off_and_back(monkeypatch):
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    try:
        set_quiet(True)
        assert not progress_enabled(True)
        assert os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS") == "1"
    finally:
        set_quiet(False)
    assert progress_enabled(True) and not progress_enabled(False)
    assert "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ


def test_messages_go_through_the_mptlml_logger(caplog, tmp_path):
    from mptlml.reproduce import run_part

    with caplog.at_level("INFO", logger="mptlml"):
        run_part("area", tmp_path / "a", quick=True,
                 overrides={"num_data": 20, "num_tokens": 6, "panels": ("2:1",)})
    names = {r.name for r in caplog.records}
    assert "mptlml.runs.job" in names and "mptlml.reproduce.fig4_area" in names
    assert any("results written to" in r.getMessage() for r in caplog.records)


def test_no_print_in_library_code():
    """Messages go through logging; print only for the final tables and the CLI's errors."""
    import re
    from pathlib import Path

    import mptlml

    # cli/: the spacer between --show-config tables, the error line, a missing extra's line
    # (refused up front), the interrupted line
    # reproduce/full_size.py: the table itself, when no file is named
    # lm_eval/command.py: the model's part of --help, printed before lm-eval's own; the one
    # error line of `python -m mptlml.lm_eval` (as `mptlml eval` prints it)
    allowed = {"runs/output.py": 1, "cli/__init__.py": 3, "cli/reproduce.py": 1,
               "jobs/select.py": 1, "reproduce/full_size.py": 1, "lm_eval/command.py": 2}
    for path in Path(mptlml.__file__).parent.rglob("*.py"):
        rel = path.relative_to(Path(mptlml.__file__).parent).as_posix()
        n = len(re.findall(r"(?<![\w.])print\(", path.read_text()))
        assert n <= allowed.get(rel, 0), f"{rel}: {n} print( calls; use logging"


def test_every_bar_goes_through_the_helper():
    import re
    from pathlib import Path

    import mptlml

    for path in Path(mptlml.__file__).parent.rglob("*.py"):
        if path.name == "_progress.py":
            continue
        assert not re.search(r"\btqdm\(", path.read_text()), path

