"""The HTML report renders in a real headless browser (Debian's chromium).

CI installs chromium (see .ci/run); elsewhere the test is skipped when no
chromium binary is on PATH.
"""

from __future__ import annotations

import shutil
import subprocess

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from mptlml.report import build_report  # noqa: E402
from mptlml.runs.rundir import RunDir  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_report_renders_in_headless_chromium(tmp_path):
    run = RunDir(tmp_path / "runs" / "convergence", "convergence")
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    run.save_figure(fig, "figure1")
    run.write_results({}, {"value": 1.0, "quick": True})
    from mptlml.reproduce import fig2_training as training
    from tests.test_claims import _training_good

    bad = _training_good()
    bad["objectives"]["fixed-rate"]["max_rel_gap_to_gt"] = 0.05
    tr = RunDir(tmp_path / "runs" / "training", "training")
    tr.write_results(training.Config.quick(), {**bad, "quick": True})
    rep = build_report([tmp_path / "runs"], tmp_path / "out")
    (failing,) = rep.failing
    page = (tmp_path / "out" / "report.html").resolve().as_uri()
    profile = tmp_path / "profile"
    dom = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", page],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    for section in ("id=\"convergence\"", "id=\"errata\"", "id=\"environment\"", "id=\"missing\""):
        assert section in dom.stdout
    assert "data:image/png;base64," in dom.stdout
    top = dom.stdout[:dom.stdout.index("<section")]  # what a reader sees first
    assert "Mode: quick" in top and f'href="#{failing["anchor"]}"' in top
    shot = tmp_path / "shot.png"
    res = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}",
                          f"--screenshot={shot}", "--window-size=1200,1600", page],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert shot.stat().st_size > 10_000  # a rendered page, not a blank one
