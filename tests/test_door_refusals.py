"""Doors that ended in bare internal errors refuse their input by name, before any work.

A ``checkpoint_dir`` that cannot be a folder, an ``ax`` that is not a matplotlib Axes and
a ``target_se`` no run can reach (it overflowed the engine's plan) are each refused at
every door that takes them, naming the input; a hook on the model's forward shows that no
masked input was scored first.
"""

from __future__ import annotations

import pytest

import mptlml
from mptlml.cli import main

from .mlm_helpers import SENTENCES

TEXTS = SENTENCES[:2]


@pytest.fixture
def no_forward(tiny):
    """Fails the test if the model's forward runs inside it."""
    calls = []
    hook = tiny.model.register_forward_hook(lambda *a: calls.append(1))
    yield
    hook.remove()
    assert not calls, "the model was run before the input was refused"


def test_a_checkpoint_dir_that_cannot_be_a_folder_is_refused_at_every_door(tiny, tmp_path,
                                                                           no_forward):
    afile = tmp_path / "afile"
    afile.write_text("x")
    doors = {"estimate_lml": lambda d: mptlml.estimate_lml(tiny, TEXTS, "cumulative",
                                                           num_masks=2, checkpoint_dir=d),
             "mpt_curve": lambda d: mptlml.mpt_curve(tiny, TEXTS, num_masks=2,
                                                     checkpoint_dir=d),
             "pll": lambda d: mptlml.pll(tiny, TEXTS, checkpoint_dir=d)}
    for where, door in doors.items():
        for bad, what in ((afile, "is a file"), (str(afile / "sub" / "dir"),
                                                  f"lies below the file {afile}")):
            with pytest.raises(ValueError, match=f"{where}: checkpoint_dir=.* {what}"):
                door(bad)
        with pytest.raises(TypeError, match=f"{where}: checkpoint_dir must be a folder path"):
            door(3)


def test_a_target_se_no_run_can_reach_is_refused_at_every_door(tiny, tmp_path, capsys,
                                                               no_forward):
    """1e-300 overflowed the engine's plan (a raw OverflowError): a target whose square (the
    target variance) is no normal float64 is refused by name at each door, the command line
    before loading; one above it but beyond reach no longer overflows the plan."""
    from mptlml._validation import MIN_TARGET_SE
    from mptlml.estimators.sequential import draws_needed

    for tiny_target in (1e-300, 1e-160):
        for where, door in (
                ("mpt_curve", lambda t: mptlml.mpt_curve(tiny, TEXTS, target_se=t)),
                ("estimate_lml", lambda t: mptlml.estimate_lml(tiny, TEXTS, "cumulative",
                                                               target_se=t)),
                ("compare", lambda t: mptlml.compare(tiny, ["the cat"], [TEXTS],
                                                     target_se=t))):
            with pytest.raises(ValueError, match=f"{where}: target_se must be a positive number "
                                                 f">= {MIN_TARGET_SE:g} .*normal float64.* or "
                                                 f"None, got {tiny_target}"):
                door(tiny_target)
    data = tmp_path / "texts.txt"
    data.write_text("\n".join(TEXTS) + "\n")
    for i, value in enumerate(("1e-300", "1e-160")):
        capsys.readouterr()
        assert main(["curve", "--model", "unused", "--data", str(data), "--out",
                     str(tmp_path / f"o{i}"), "--target-se", value, "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert "target-se" in err and str(MIN_TARGET_SE)[:6] in err and "Overflow" not in err, err
        assert not (tmp_path / f"o{i}").exists()
    for se in (0.5, 1e3):  # the plan of a target at the floor: infinite draws, no overflow
        assert draws_needed(8, se, 7.0, MIN_TARGET_SE) >= 8 * (se / 1e-150) ** 2


def test_an_ax_that_is_not_a_matplotlib_axes_is_refused(tiny):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = mptlml.mpt_curve(tiny, TEXTS, num_masks=2, rates=[0.2, 0.6])
    res = mptlml.compare(tiny, ["the cat"], [[" sat", " ran"]])
    fig, axes = plt.subplots(1, 2)
    try:
        for bad, hint in (("ax", "got str"), (3, "got int"), (fig, "a Figure: pass"),
                          (axes, "an array of Axes")):
            with pytest.raises(TypeError, match=f"ax must be a matplotlib Axes.*{hint}"):
                curve.plot(ax=bad)
            with pytest.raises(TypeError, match=f"ax must be a matplotlib Axes.*{hint}"):
                res.plot(ax=bad)
        assert curve.plot(ax=axes[0]) is not None  # an Axes: drawn
    finally:
        plt.close(fig)
