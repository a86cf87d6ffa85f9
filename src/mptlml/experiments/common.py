"""Run directories: safe creation, atomic result files, figures, environment block.

What every experiment and job shares: :class:`RunDir`, :func:`load_results`,
:func:`environment`, :func:`print_table` and :func:`pyplot`. Atomic writes and
JSON conversion live one floor down, in :mod:`mptlml._io`.

Every experiment writes into one run directory:

- ``results.json``: format version, experiment name, config, seed, package
  versions, hardware, wall time, and the experiment's own numbers;
- one CSV per plotted series;
- each figure as PNG and PDF.

A run is a transaction (:mod:`.rundir`): it writes into a hidden staging
directory under a lock and is swapped in only when it succeeds, so a failed or
interrupted run leaves the previous run directory as it was. Each file is
written atomically (:mod:`mptlml._io`). A non-empty directory is refused
unless ``overwrite=True``.
"""

from __future__ import annotations

import io
import json
import math
import os
import platform
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .._io import atomic_write_bytes, atomic_write_text, jsonable
from .._optional import require
from .rundir import Transaction

__all__ = [
    "RESULTS_FORMAT",
    "RunDir",
    "environment",
    "load_results",
    "print_table",
    "pyplot",
]

#: version of the results.json layout; ``mptlml report`` refuses newer ones.
RESULTS_FORMAT = 1


def environment() -> dict[str, Any]:
    """Package versions, hardware, the command line and the git commit, for results.json."""
    import importlib.metadata as md

    versions = {}
    for pkg in ("mptlml", "torch", "numpy", "scikit-learn", "transformers", "datasets",
                "accelerate", "matplotlib", "pandas"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = None
    cpu = platform.processor() or None
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f
                        if ln.lower().startswith("model name")), cpu)
    except OSError:
        pass
    commit, dirty = _git_state()
    env: dict[str, Any] = {
        "command": list(sys.argv),
        "git_commit": commit,
        "git_dirty": dirty,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "versions": versions,
    }
    try:
        import torch

        env["torch_threads"] = torch.get_num_threads()
        env["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:  # pragma: no cover
        pass
    return env


def _git_state() -> tuple[str | None, bool | None]:
    """HEAD of the git checkout the package runs from and whether it has local changes.

    ``(None, None)`` for an installed package (its files are not tracked by a
    repository around it), without git, or when git does not answer within 5 s.
    """
    import subprocess

    pkg = Path(__file__).resolve().parent.parent

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=pkg, capture_output=True, text=True,
                              timeout=5, check=False)

    try:
        if git("ls-files", "--error-unmatch", "__init__.py").returncode != 0:
            return None, None
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return None, None
        return head.stdout.strip(), git("diff", "--quiet", "HEAD", "--", ".").returncode != 0
    except (OSError, subprocess.SubprocessError):
        return None, None


def load_results(run_dir: str | os.PathLike) -> dict[str, Any]:
    """Read a run directory's ``results.json``, checking its format version.

    Raises
    ------
    FileNotFoundError
        If the directory or its results.json is missing.
    ValueError
        If the file is corrupt or written by a newer, unknown format.
    """
    d = Path(run_dir)
    path = d / "results.json"
    if d.exists() and not d.is_dir():
        raise ValueError(f"{run_dir} is a file, not a run directory; pass the --out directory "
                         "of `mptlml reproduce`, `curve`, `select` or `demo`.")
    if not d.is_dir():
        hint = ""
        if (d.parent / f".{d.name}.old").exists():
            hint = (" A process was killed while replacing it; the next run with this --out "
                    "repairs it.")
        raise FileNotFoundError(f"run directory {run_dir} does not exist.{hint}")
    if not path.is_file():
        raise FileNotFoundError(
            f"{run_dir} has no results.json: the run did not finish, or this is not a run "
            "directory. Re-run the experiment (it resumes where supported)."
        )
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); re-run the experiment.") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds a JSON {type(data).__name__}, not a results object; "
                         "it was not written by mptlml. Re-run the experiment.")
    fmt = data.get("format")
    if not isinstance(fmt, int) or fmt > RESULTS_FORMAT:
        raise ValueError(
            f"{path} has results format {fmt!r}, but this mptlml reads format <= {RESULTS_FORMAT}; "
            "upgrade mptlml or re-run the experiment with this version."
        )
    return data


class RunDir:
    """A run directory for one experiment, written as a transaction.

    Files are written into a hidden staging directory beside ``path`` (see
    :mod:`mptlml.experiments.rundir`); :meth:`write_results` writes
    ``results.json`` last and then swaps the staging directory in, so ``path``
    only ever holds a finished run. While it runs, the run holds a lock that
    refuses a second process targeting the same ``path``. Use it as a context
    manager so that a failure releases the lock and drops the staging
    directory at once (otherwise that happens when the object is collected,
    or at exit)::

        with RunDir(out, "name", overwrite=True) as run:
            run.write_csv(...)
            run.write_results(config, results)

    Parameters
    ----------
    path : path-like
        The run directory. If it exists and is not empty it is refused,
        unless ``overwrite`` (it is replaced when the new run succeeds) or
        ``resume`` (finished checkpoint chunks are reused).
    name : str
        Experiment name stored in results.json.
    worker : bool
        A non-main process of a data-parallel run (see
        :class:`~mptlml.experiments.rundir.Transaction`).

    Attributes
    ----------
    path : pathlib.Path
        Where files go: the staging directory while the run is going, the
        final directory once it is committed.
    final : pathlib.Path
        The run directory asked for.
    """

    def __init__(self, path: str | os.PathLike, name: str, *, overwrite: bool = False,
                 resume: bool = False, worker: bool = False) -> None:
        self.final = Path(path)
        self.name = name
        self._tx = Transaction(path, overwrite=overwrite, resume=resume, worker=worker)
        self.path = self._tx.staging
        self._t0 = time.perf_counter()
        self.files: list[str] = []

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._tx.active:  # failed, interrupted, or left without write_results
            self._tx.abandon()

    def abandon(self) -> None:
        """Give up the run: the previous run directory stays as it was."""
        self._tx.abandon()

    def file(self, name: str) -> Path:
        """Path of a file inside the run directory."""
        return self.path / name

    def write_json(self, name: str, data: Any) -> Path:
        """Atomically write JSON (tensors, arrays and NaN handled)."""
        p = self.file(name)
        atomic_write_text(p, json.dumps(jsonable(data), indent=2, sort_keys=False) + "\n")
        self._track(name)
        return p

    def write_csv(self, name: str, rows: Iterable[Mapping[str, Any]],
                  columns: Sequence[str] | None = None) -> Path:
        """Atomically write a CSV from a list of dict rows (missing and None cells empty)."""
        require("pandas", "a run's CSV files")
        import pandas as pd

        rows = [jsonable(r) for r in rows]
        cols = list(columns) if columns is not None else (list(rows[0].keys()) if rows else [])
        p = self.file(name)
        atomic_write_text(p, pd.DataFrame(rows, columns=cols, dtype=object).to_csv(
            index=False, lineterminator="\n"))
        self._track(name)
        return p

    def save_figure(self, fig: Any, stem: str,
                    formats: Sequence[str] = ("png", "pdf")) -> list[Path]:
        """Save a matplotlib figure as PNG and PDF (atomically) and close it."""
        require("matplotlib", "a run's figures")
        import matplotlib.pyplot as plt

        out = []
        for fmt in formats:
            buf = io.BytesIO()
            fig.savefig(buf, format=fmt, dpi=130, bbox_inches="tight")
            p = self.file(f"{stem}.{fmt}")
            atomic_write_bytes(p, buf.getvalue())
            self._track(p.name)
            out.append(p)
        plt.close(fig)
        return out

    def write_results(self, config: Any, results: Mapping[str, Any], *,
                      seed: int | None = None) -> Path:
        """Write ``results.json`` last and swap the run in; return its final path."""
        data = {
            "format": RESULTS_FORMAT,
            "experiment": self.name,
            "config": jsonable(config),
            "seed": seed,
            "wall_time_s": round(time.perf_counter() - self._t0, 3),
            "environment": environment(),
            "files": sorted(set(self.files)),
            "results": jsonable(results),
        }
        self.write_json("results.json", data)
        self._tx.commit()
        self.path = self.final
        return self.path / "results.json"

    def _track(self, name: str) -> None:
        if name != "results.json":
            self.files.append(name)


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend (figures go to files only)."""
    require("matplotlib", "a run's figures")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def print_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None,
                title: str | None = None) -> str:
    """Format rows as a plain-text table, print it and return it."""
    if not rows:
        return ""
    cols = list(columns) if columns is not None else list(rows[0].keys())

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return "nan" if not math.isfinite(v) else f"{v:.4g}" if abs(v) < 1e-3 else f"{v:.4f}"
        return str(v)

    cells = [[fmt(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = []
    if title:
        lines.append(title)
    lines.append("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells)
    text = "\n".join(lines)
    print(text)
    return text
