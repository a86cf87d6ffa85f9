"""Running reproductions: one into its run directory, or all of them one after another.

:func:`run_experiment` builds the config (paper defaults, ``quick()``, overrides),
checks it before anything is written, runs the module and writes results.json.
:func:`run_all` runs every registered experiment into ``out/NAME``, keeps going
past a failed part, and hands the finished directory to a report builder if one
is given (``mptlml reproduce all`` passes :func:`mptlml.report.build_report`;
this module does not import the report, which sits above the experiments).
"""

from __future__ import annotations

import json
import logging
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .._io import atomic_write_text
from .common import RunDir, load_results, print_table
from .config import apply_overrides, validate_config
from .registry import EXPERIMENTS, get_experiment
from .rundir import locked

__all__ = ["run_all", "run_experiment"]

_log = logging.getLogger(__name__)


def run_experiment(name: str, out: str | Path, *, quick: bool = False, overwrite: bool = False,
                   overrides: dict[str, Any] | None = None, resume: bool = False) -> dict[str, Any]:
    """Run one experiment into ``out`` and return the content of its results.json."""
    mod = get_experiment(name)
    cfg = apply_overrides(mod.Config.quick() if quick else mod.Config(), overrides, name=name)
    validate_config(cfg)  # before the run directory exists: a bad setting writes nothing
    with RunDir(out, name, overwrite=overwrite, resume=resume) as run_dir:
        results = mod.run(cfg, run_dir)
        results.setdefault("quick", quick)
        path = run_dir.write_results(cfg, results, seed=getattr(cfg, "seed", None))
    if hasattr(mod, "summary"):
        print_table(mod.summary(results), title=f"{name}: summary")
    _log.info(f"results written to {path.parent}/")
    return json.loads(path.read_text())


def run_all(out: str | Path, *, quick: bool = False, overwrite: bool = False,
            resume: bool = False, only: list[str] | None = None,
            overrides: dict[str, dict[str, Any]] | None = None,
            build_report: Callable[[Sequence[str | Path], str | Path], Any] | None = None,
            ) -> dict[str, Any]:
    """Run every experiment into ``out/NAME``; return ``{name: status}``.

    Each part is its own run directory (a transaction: see
    :class:`~.common.RunDir`), and the whole of ``out`` is locked while this
    runs. A part that fails keeps its previous directory untouched; its
    traceback goes to ``out/NAME.error.txt``, which marks that directory as
    stale for :func:`mptlml.report.collect_runs` (until a later run of the part
    succeeds and deletes it), and the other parts go on. ``out/status.json``
    holds every part's latest status, updated after each part. With
    ``resume``, parts that finished (and did not fail since) are kept.

    Parameters
    ----------
    build_report : callable ``(paths, out) -> Report``, optional
        Called as ``build_report([out], out)`` once every part ran, e.g.
        :func:`mptlml.report.build_report` (what ``mptlml reproduce all`` passes),
        to write ``report.html``/``report.md`` beside the parts.
    """
    out = Path(out)
    with locked(out):
        if out.is_dir() and any(out.iterdir()) and not (overwrite or resume):
            raise ValueError(
                f"output directory {out} exists and is not empty; pass --overwrite to replace "
                "it, --resume to keep finished parts, or choose another --out."
            )
        out.mkdir(parents=True, exist_ok=True)
        return _run_parts(out, only or list(EXPERIMENTS), quick=quick, resume=resume,
                          overrides=overrides or {}, build_report=build_report)


def _run_parts(out: Path, names: list[str], *, quick: bool, resume: bool,
               overrides: dict[str, dict[str, Any]],
               build_report: Callable[[Sequence[str | Path], str | Path], Any] | None,
               ) -> dict[str, Any]:
    status: dict[str, Any] = {}
    status_path = out / "status.json"
    try:
        recorded = json.loads(status_path.read_text())
        recorded = recorded if isinstance(recorded, dict) else {}
    except (OSError, ValueError):
        recorded = {}

    def record(name: str, value: str) -> None:
        status[name] = recorded[name] = value
        atomic_write_text(status_path, json.dumps(recorded, indent=2) + "\n")

    for name in names:
        part, error_file = out / name, out / f"{name}.error.txt"
        if resume and not error_file.exists():
            try:
                load_results(part)
                status[name] = "kept"
                _log.info(f"[{name}] finished earlier: kept")
                continue
            except (FileNotFoundError, ValueError):
                pass
        _log.info(f"[{name}] running{' (quick)' if quick else ''} ...")
        t0 = time.perf_counter()
        try:
            run_experiment(name, part, quick=quick, overwrite=True,
                           overrides=overrides.get(name), resume=resume)
        except Exception as exc:  # keep going: the report lists the failed part as failed
            atomic_write_text(error_file, traceback.format_exc())
            record(name, f"failed: {exc}")
            _log.error(f"[{name}] FAILED: {exc}")
            continue
        error_file.unlink(missing_ok=True)
        record(name, f"ok in {time.perf_counter() - t0:.1f} s")
    if build_report is not None:
        rep = build_report([out], out)
        _log.info(f"report: {out / 'report.html'} and {out / 'report.md'} "
                  f"({rep.summary_line()})")
    return status
