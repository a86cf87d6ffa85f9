"""Fault injection: failed, interrupted, concurrent and corrupted runs never lose or mix results.

Each test is one class of fault from issue 14. Where the behaviour is the
command line's (exit codes, messages, no traceback), the real CLI runs in a
subprocess (``python -m mptlml``).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from mptlml.cli import main
from mptlml.report import build_report, collect_runs
from mptlml.reproduce import get_part, run_all
from mptlml.runs.rundir import RunDir, RunDirError, load_results, locked, staging_path
from mptlml.selection.data import load_matrix

from .mlm_helpers import SENTENCES, make_tiny_bert

SRC = str(Path(__file__).resolve().parents[1] / "src")
SELECT = ["select", "--data", "synthetic", "--true-k", "2", "--k-max", "3", "--num-masks", "2",
          "--max-num-masks", "4"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "HF_HUB_OFFLINE": "1"}


def _cli(*args: str, umask: int | None = None, cwd: Path | None = None,
         ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mptlml", *args], capture_output=True,
                          text=True, env=_env(), cwd=cwd, timeout=300,
                          preexec_fn=None if umask is None else (lambda: os.umask(umask)))


def _snapshot(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


def _no_debris(parent: Path, name: str) -> None:
    """Nothing but the lock file (and the run itself) beside a run directory."""
    extra = {p.name for p in parent.iterdir()} - {name, f".{name}.lock"}
    assert not extra, extra
    assert not list(parent.rglob("*.tmp"))


def _no_traceback(text: str) -> None:
    assert "Traceback" not in text and "allow_pickle" not in text, text


# ------------------------------------------------------------------ run directories
@pytest.fixture(scope="module")
def select_run(tmp_path_factory) -> Path:
    """A finished ``mptlml select`` run, written under umask 022."""
    out = tmp_path_factory.mktemp("sel") / "sel"
    r = _cli(*SELECT, "--out", str(out), umask=0o022)
    assert r.returncode == 0, r.stderr
    return out


@pytest.mark.slow  # select_run: mptlml select in its own process
def test_files_follow_the_umask(select_run):
    for p in select_run.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o644, p
    assert stat.S_IMODE(select_run.stat().st_mode) == 0o755


@pytest.mark.slow  # select_run: mptlml select in its own process
@pytest.mark.parametrize("fault", [ValueError("injected failure"), KeyboardInterrupt()])
def test_failed_overwrite_leaves_the_old_run_byte_identical(select_run, tmp_path, monkeypatch,
                                                            capsys, fault):
    out = tmp_path / "sel"
    shutil.copytree(select_run, out)
    before = _snapshot(out)

    def broken(res, desc, run, stem="scores"):  # fails after scores.csv was written
        assert (run.path / "scores.csv").is_file() and run.path != out
        raise fault

    monkeypatch.setattr("mptlml.jobs.select.plot_scores", broken)
    code = main([*SELECT, "--seed", "1", "--out", str(out), "--overwrite"])
    assert code == (2 if isinstance(fault, ValueError) else 130)
    _no_traceback(capsys.readouterr().err)
    assert _snapshot(out) == before  # the old run, byte for byte
    _no_debris(tmp_path, "sel")
    # with no previous run, a failed run leaves no directory at all
    assert main([*SELECT, "--out", str(tmp_path / "new")]) != 0
    assert not (tmp_path / "new").exists() and not staging_path(tmp_path / "new").exists()


@pytest.mark.slow  # select_run: mptlml select in its own process
def test_overwrite_replaces_and_the_lock_is_released(select_run, tmp_path):
    out = tmp_path / "sel"
    shutil.copytree(select_run, out)
    (out / "notes.txt").write_text("the user's own file")
    old = json.loads((out / "results.json").read_text())
    old["files"].append("old_series.csv")  # a file the old run wrote and the new one does not
    (out / "results.json").write_text(json.dumps(old))
    (out / "old_series.csv").write_text("from the older run")
    assert main([*SELECT, "--seed", "1", "--out", str(out), "--overwrite"]) == 0
    assert not (out / "old_series.csv").exists()  # nothing of the old run is left...
    assert (out / "notes.txt").read_text() == "the user's own file"  # ...the user's files are
    assert load_results(out)["seed"] == 1
    _no_debris(tmp_path, "sel")
    with locked(out):  # released after the run: can be taken again
        pass


@pytest.mark.slow  # two command-line processes
def test_two_runs_into_one_directory_exactly_one_succeeds(tmp_path, capsys):
    out = tmp_path / "sel"
    first = subprocess.Popen([sys.executable, "-m", "mptlml", *SELECT, "--max-num-masks", "8",
                              "--out", str(out)], env=_env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    while not staging_path(out).exists():  # the first run is under way and holds the lock
        assert first.poll() is None and time.monotonic() - t0 < 120
        time.sleep(0.01)
    t1 = time.monotonic()
    code = main([*SELECT, "--out", str(out), "--overwrite"])
    err = capsys.readouterr().err
    assert time.monotonic() - t1 < 5  # refused at once, not after waiting
    assert code == 2 and "being written by another mptlml process" in err
    assert f"pid {first.pid}" in err
    assert first.wait(timeout=300) == 0, first.stderr.read()
    assert load_results(out)["experiment"] == "select"
    _no_debris(tmp_path, "sel")


@pytest.mark.slow  # command-line processes
def test_lock_refuses_in_the_cli_with_exit_2(tmp_path):
    out = tmp_path / "x"
    with locked(out):
        r = _cli(*SELECT, "--out", str(out))
    assert r.returncode == 2 and "being written by another mptlml process" in r.stderr
    _no_traceback(r.stderr)
    assert not out.exists()


def test_killed_between_the_two_renames_is_repaired(tmp_path, capsys):
    def half_swapped(with_results: bool) -> Path:
        base = tmp_path / ("fwd" if with_results else "back")
        base.mkdir()
        out = base / "run"
        old = base / ".run.old"
        old.mkdir()
        (old / "results.json").write_text('{"format": 1, "experiment": "old"}')
        new = staging_path(out)
        new.mkdir()
        if with_results:
            (new / "results.json").write_text('{"format": 1, "experiment": "new"}')
        return out

    out = half_swapped(with_results=False)
    with pytest.raises(FileNotFoundError, match="killed while replacing"):
        load_results(out)
    with pytest.raises(RunDirError, match="not empty"):
        RunDir(out, "x")  # repairs first (puts the old run back), then refuses as usual
    assert "put the previous run back" in capsys.readouterr().err
    assert load_results(out)["experiment"] == "old"
    out = half_swapped(with_results=True)
    with RunDir(out, "x", overwrite=True) as run:
        run.abandon()
    assert "finished the swap" in capsys.readouterr().err
    assert load_results(out)["experiment"] == "new"
    assert not (out.parent / ".run.old").exists()


def test_run_all_failed_part_is_reported_failed_not_stale(tmp_path, monkeypatch, capsys):
    import dataclasses

    from mptlml.reproduce import fig4_area

    area = get_part("area")

    def with_run(run):  # the area part, with another run and no summary table
        monkeypatch.setattr(fig4_area, "PART", dataclasses.replace(area, run=run, summary=None))

    def fine(cfg, run_dir):
        run_dir.write_csv("x.csv", [{"a": 1}])
        return {"fake": True}

    def broken(cfg, run_dir):
        run_dir.write_csv("x.csv", [{"a": 2}])
        raise RuntimeError("injected failure")

    with_run(fine)
    assert run_all(tmp_path / "all", quick=True, only=["area"])["area"].startswith("ok")
    found, _ = collect_runs([tmp_path / "all"])
    assert "area" in found
    before = _snapshot(tmp_path / "all" / "area")
    with_run(broken)
    status = run_all(tmp_path / "all", quick=True, only=["area"], overwrite=True,
                     build_report=build_report)
    assert status["area"].startswith("failed")
    assert _snapshot(tmp_path / "all" / "area") == before  # the old part is untouched...
    rep = json.loads((tmp_path / "all" / "report.json").read_text())
    assert "area" in rep["missing"]  # ...but not reported as current
    assert any("area: its latest run failed" in p for p in rep["problems"])
    # --resume re-runs a part that failed, and its success clears the mark
    with_run(fine)
    status = run_all(tmp_path / "all", quick=True, only=["area"], resume=True)
    assert status["area"].startswith("ok")
    assert not (tmp_path / "all" / "area.error.txt").exists()
    assert "area" in collect_runs([tmp_path / "all"])[0]
    capsys.readouterr()


# ------------------------------------------------------------------ report on non-runs
def test_report_on_something_that_is_not_a_run(tmp_path, capsys):
    good = tmp_path / "good"
    with RunDir(good, "convergence") as run:
        run.write_results({}, {"value": 1.0})
    (tmp_path / "file.txt").write_text("hello")
    (tmp_path / "empty").mkdir()
    (tmp_path / "nested" / "sub").mkdir(parents=True)
    (tmp_path / "list").mkdir()
    (tmp_path / "list" / "results.json").write_text("[1, 2]")
    cases = {"file.txt": "is a file", "missing": "does not exist", "empty": "not a run directory",
             "nested": "not a run directory"}
    r = _cli("report", str(tmp_path / "file.txt"))
    assert r.returncode == 2 and "is a file" in r.stderr
    _no_traceback(r.stderr)
    for name, msg in cases.items():  # even beside a good run: a typo is not ignored
        assert main(["report", str(good), str(tmp_path / name)]) == 2, name
        err = capsys.readouterr().err
        assert msg in err and str(tmp_path / name) in err, err
    with pytest.raises(ValueError, match="holds a JSON list, not a results object"):
        load_results(tmp_path / "list")
    assert main(["report", str(tmp_path / "list")]) == 1
    out, err = capsys.readouterr()
    assert "not a results object" in out + err


# ------------------------------------------------------------------ user tables
def test_pandas_written_csvs_give_the_right_matrix(tmp_path):
    import pandas as pd

    x = np.random.default_rng(0).normal(size=(7, 4))
    pd.DataFrame(x).to_csv(tmp_path / "index.csv")  # integer header and an index column
    pd.DataFrame(x).to_csv(tmp_path / "header.csv", index=False)  # integer header "0,1,2,3"
    pd.DataFrame(x, columns=list("abcd")).to_csv(tmp_path / "named.csv", index=False)
    np.savetxt(tmp_path / "plain.csv", x, delimiter=",")
    np.save(tmp_path / "x.npy", x)
    for name in ("header.csv", "named.csv", "plain.csv", "x.npy"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            np.testing.assert_array_equal(load_matrix(str(tmp_path / name)), x)
    with pytest.warns(UserWarning, match="dropped the first column, an unnamed pandas index"):
        np.testing.assert_array_equal(load_matrix(str(tmp_path / "index.csv")), x)
    pd.DataFrame(x).to_csv(tmp_path / "noheader.csv", header=False)
    with pytest.raises(ValueError, match="looks like a pandas index"):
        load_matrix(str(tmp_path / "noheader.csv"))
    (tmp_path / "bad.csv").write_text("a,b,c\n1,2,3\n4,oops,6\n")
    with pytest.raises(ValueError, match=r"bad.csv: line 3, column 'b' \(column 2\) holds 'oops'"):
        load_matrix(str(tmp_path / "bad.csv"))


# ------------------------------------------------------------------ standard errors
def test_unknown_standard_errors_are_said_so(capsys):
    import mptlml
    from mptlml.models import PPCA
    from mptlml.selection import select_latent_dim

    x = PPCA.random(8, 2, seed=0).sample(60, generator=1).numpy()
    res = select_latent_dim(x, 3, num_masks=1, max_num_masks=1, verbose=True)
    text = capsys.readouterr().out + " ".join(res.notes)
    assert "unknown" in text and "0.0 paired SE" not in text
    assert not res.resolved
    model = PPCA.random(5, 2, seed=0)
    with pytest.warns(RuntimeWarning, match="standard error .* cannot be computed"):
        est = mptlml.estimate_lml(model, model.sample(4, generator=1), num_masks=1, seed=0)
    assert np.isnan(est.stderr) and np.isfinite(est.mean)


# ------------------------------------------------------------------ masked-LM checkpoints
@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("mlm")
    texts = base / "texts.txt"
    texts.write_text("\n".join(SENTENCES * 2) + "\n")
    return make_tiny_bert(base / "bert"), texts


def _curve_args(tiny: tuple[Path, Path], out: Path) -> list[str]:
    return ["curve", "--model", str(tiny[0]), "--data", str(tiny[1]), "--out", str(out),
            "--rates", "0.2,0.5,0.8", "--num-masks", "2", "--chunk-size", "2", "--no-progress"]


@pytest.mark.slow
def test_corrupt_or_foreign_checkpoints_are_refused_by_name(tiny, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(_curve_args(tiny, out)) == 0
    chunk = out / "checkpoint" / "pretrained" / "curve" / "chunk_000001.npz"
    good = chunk.read_bytes()

    def corrupt(kind: str) -> None:
        chunk.unlink()
        if kind == "truncated":
            chunk.write_bytes(good[: len(good) // 2])
        elif kind == "garbage":
            chunk.write_bytes(os.urandom(len(good)))
        elif kind == "wrong shape":
            with np.load(io.BytesIO(good)) as z:
                arrays = {k: z[k] for k in z.files}
            key = next(k for k in arrays if not k.startswith("__"))
            arrays[key] = np.concatenate([arrays[key], arrays[key]])
            np.savez(chunk, **arrays)
        elif kind == "pickled":
            np.savez(chunk, **{"2": np.array([object()], dtype=object)})

    for kind, msg in [("truncated", "corrupt or truncated"), ("garbage", "corrupt or truncated"),
                      ("wrong shape", "but this run expects float64"),
                      ("pickled", "corrupt or truncated")]:
        shutil.rmtree(staging_path(out), ignore_errors=True)  # resume from the finished run
        corrupt(kind)
        before = _snapshot(out)
        if kind == "truncated":  # once through a real subprocess: exit code, no traceback
            r = _cli(*_curve_args(tiny, out), "--resume")
            code, err = r.returncode, r.stderr
        else:
            code, err = main([*_curve_args(tiny, out), "--resume"]), capsys.readouterr().err
        assert code == 2, (kind, err)
        _no_traceback(err)
        assert msg in err and "chunk_000001.npz" in err and "--overwrite" in err, (kind, err)
        assert _snapshot(out) == before  # the finished run is untouched
        staging = staging_path(out)
        if staging.exists():  # a refused resume keeps only checkpoints for the next try
            assert {p.name for p in staging.iterdir()} <= {"checkpoint"}
    # a checkpoint of another run: the fingerprint differs
    meta = out / "checkpoint" / "pretrained" / "curve" / "meta.json"
    chunk.write_bytes(good)
    for text, msg in [("{not json", "unreadable"), ("[1]", "not a JSON object"),
                      (meta.read_text().replace('"seed": 0', '"seed": 9'), "different run")]:
        for p in (meta, staging_path(out) / "checkpoint" / "pretrained" / "curve" / "meta.json"):
            if p.exists():
                p.unlink()
                p.write_text(text)
        assert main([*_curve_args(tiny, out), "--resume"]) == 2
        err = capsys.readouterr().err
        assert msg in err and "meta.json" in err, err
    # --overwrite means what it says: a fresh run, no stale checkpoint in the way
    assert main([*_curve_args(tiny, out), "--overwrite", "--seed", "3"]) == 0
    assert load_results(out)["seed"] == 3
    _no_debris(tmp_path, "run")


_SLOW_CURVE = """
import signal, sys, time
# a parent started as a background job ignores SIGINT, and a child inherits that: take it back
signal.signal(signal.SIGINT, signal.default_int_handler)
import mptlml._scoring.ragged as runner
save = runner.save_chunk
def slow(path, *a, **k):
    save(path, *a, **k)
    # after the second chunk, wait for the test's SIGINT (however loaded the machine is)
    for _ in range(2400 if path.name == "chunk_000001.npz" else 4):
        time.sleep(0.05)
runner.save_chunk = slow
from mptlml.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_sigint_mid_run_then_resume_gives_identical_results(tiny, tmp_path):
    out = tmp_path / "run"
    args = _curve_args(tiny, out)
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_CURVE, *args], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    chunks = staging_path(out) / "checkpoint" / "pretrained" / "curve"
    t0 = time.monotonic()
    while not (chunks / "chunk_000001.npz").exists():
        assert proc.poll() is None and time.monotonic() - t0 < 120, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    _no_traceback(err)
    assert not out.exists()  # no run directory until a run succeeds
    left = {p.name for p in staging_path(out).iterdir()}
    assert left == {"checkpoint"}  # only finished chunks stay, for --resume
    assert not list(tmp_path.rglob("*.tmp"))
    assert 2 <= len(list(chunks.glob("chunk_*.npz"))) < 5
    r = _cli(*args, "--resume")
    assert r.returncode == 0, r.stderr
    _no_debris(tmp_path, "run")
    ref = tmp_path / "ref"
    assert main(_curve_args(tiny, ref)) == 0
    for name in ("curve.csv", "per_sequence.csv"):
        assert (out / name).read_bytes() == (ref / name).read_bytes(), name
    a, b = load_results(out)["results"], load_results(ref)["results"]
    # the forwards this process made: a resumed run makes fewer (the rest came from checkpoints)
    for r in (a, b):
        r["models"]["pretrained"].pop("num_model_calls")
    assert a == b


@pytest.mark.slow
def test_overwrite_is_not_refused_by_a_checkpoint_of_another_run(tmp_path):
    out = tmp_path / "ab"
    quick = ["reproduce", "antibody", "--quick", "--set", "num_sequences=2", "--out", str(out)]
    r = _cli(*quick)
    assert r.returncode == 0, r.stderr
    r = _cli(*quick, "--set", "seed=1", "--resume")  # resuming another run: refused by name
    assert r.returncode == 2 and "different run" in r.stderr and "meta.json" in r.stderr
    _no_traceback(r.stderr)
    r = _cli(*quick, "--set", "seed=1", "--overwrite")  # overwriting it: a fresh run
    assert r.returncode == 0, r.stderr
    assert load_results(out)["seed"] == 1
