"""Results that show themselves: ``MPTCurve.plot()`` and ``Comparison.plot()``.

What each draws is read back from the Axes and set against the result's own fields
(the curve's points, its +-1 SE band; each candidate's score, its +-2 SE bar and its
paired SE to the chosen one), and the one plotter (:mod:`mptlml.estimators.plots`) is
the one the jobs' figures use. Without matplotlib the error names the ``report``
extra (``tests/test_packaging.py``).
"""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from sklearn.decomposition import PCA  # noqa: E402

import mptlml  # noqa: E402
from mptlml.estimators.results import Comparison  # noqa: E402
from mptlml.models import PPCA  # noqa: E402


@pytest.fixture(scope="module")
def curves():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 6)) @ rng.normal(size=(6, 6))
    return [mptlml.mpt_curve(PPCA.from_sklearn(PCA(n_components=k).fit(x)), x, num_masks=2,
                             seed=0) for k in (1, 3)]


def _band(collection) -> tuple[np.ndarray, np.ndarray]:
    """The lower and upper edges of a fill_between band at its x points."""
    v = collection.get_paths()[0].vertices
    xs = np.unique(v[:, 0])
    return (np.array([v[v[:, 0] == x, 1].min() for x in xs]),
            np.array([v[v[:, 0] == x, 1].max() for x in xs]))


def test_a_curve_plots_its_points_and_a_one_se_band(curves):
    curve = curves[0]
    ax = curve.plot(label="PPCA K=1")
    line, = ax.lines
    np.testing.assert_allclose(line.get_xdata(), curve.rates)
    np.testing.assert_allclose(line.get_ydata(), curve.mean.numpy())
    low, high = _band(ax.collections[0])
    np.testing.assert_allclose(low, curve.mean.numpy() - curve.stderr.numpy(), atol=1e-12)
    np.testing.assert_allclose(high, curve.mean.numpy() + curve.stderr.numpy(), atol=1e-12)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == [f"PPCA K=1 (area {curve.area:.1f})", "±1 SE"]
    plt.close(ax.figure)


def test_a_second_curve_on_the_same_axes_gets_its_own_colour_and_keeps_the_legend(curves):
    fig, ax = plt.subplots()
    assert curves[0].plot(ax=ax, label="K=1") is ax
    curves[1].plot(ax=ax, label="K=3")
    curves[1].plot(ax=ax, label="K=3 (random init)")  # the pair of K=3: its colour, dashed
    a, b, c = ax.lines
    assert a.get_color() != b.get_color() == c.get_color()
    assert (a.get_linestyle(), b.get_linestyle(), c.get_linestyle()) == ("-", "-", "--")
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == [f"K=1 (area {curves[0].area:.1f})", f"K=3 (area {curves[1].area:.1f})",
                      f"K=3 (random init) (area {curves[1].area:.1f})", "±1 SE"]
    plt.close(fig)


def _comparison(num_questions: int = 1) -> Comparison:
    """A Comparison as compare() returns it (three candidates; the second chosen)."""
    q = range(num_questions)
    return Comparison(
        contexts=["the cat sat on"] * num_questions,
        candidates=[[" a mat", " the mat", " a tree"] for _ in q],
        scores=[np.array([-4.0, -2.5, -9.0]) for _ in q],
        stderr=[np.array([0.5, 0.25, 1.0]) for _ in q],
        choice=[1 for _ in q], paired_stderr=[np.array([0.4, 0.0, 0.9]) for _ in q],
        margin_z=[3.75 for _ in q], decided=[True for _ in q], tied=[np.zeros(3, bool) for _ in q],
        z_threshold=[2.0 for _ in q],
        exact=[np.zeros(3, bool) for _ in q], stderr_dof=[30.0 for _ in q],
        num_masked_rows=[12 for _ in q], candidate_masked_rows=[np.full(3, 4) for _ in q],
        rounds=[1 for _ in q], stop_reason=["decided" for _ in q])


def test_a_comparison_plots_each_candidate_with_two_se_and_the_paired_se():
    res = _comparison()
    ax = res.plot()
    points = [line.get_xydata()[0] for line in ax.lines if len(line.get_xdata()) == 1
              and line.get_marker() == "o"]
    y = [int(t.get_position()[1]) for t in ax.get_yticklabels()]
    assert [p[0] for p in points] == [-4.0, -2.5, -9.0]  # the scores, first candidate on top
    assert [p[1] for p in points] == [2, 1, 0] and sorted(y) == [0, 1, 2]
    bars = [seg for coll in ax.collections for seg in coll.get_segments()]
    widths = sorted(round(float(s[1][0] - s[0][0]), 9) for s in bars)
    assert widths == [0.5 * 2, 1.0 * 2, 2.0 * 2]  # +-2 SE of 0.25, 0.5, 1.0
    notes = [t.get_text() for t in ax.texts]
    assert notes == ["Δ -1.50 ± 0.40", "chosen (decided)", "Δ -6.50 ± 0.90"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["' a mat'", "' the mat'",
                                                           "' a tree'"]
    plt.close(ax.figure)


def test_a_comparison_of_several_questions_asks_which():
    res = _comparison(3)
    with pytest.raises(ValueError, match=r"3 questions; pass question= \(0\.\.2\)"):
        res.plot()
    for bad in (3, -1, True, "1"):
        with pytest.raises(ValueError, match="question must be an int in 0..2"):
            res.plot(bad)
    ax = res.plot(2)
    assert ax.get_title().startswith("question 2:")
    plt.close(ax.figure)


def test_the_jobs_draw_with_the_same_plotter():
    """One plotter per figure: the jobs' curve figures go through plots.plot_curves."""
    from pathlib import Path

    src = Path(mptlml.__file__).parent
    for module in ("jobs/curve.py", "jobs/demo.py", "reproduce/table2_bert.py"):
        text = (src / module).read_text(encoding="utf-8")
        assert "plot_curves(" in text or ".plot(ax=ax" in text, module
        assert "fill_between" not in text, module
