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

__all__ = ["run_all", "run_experiment"]

_log = logging.getLogger(__name__)


def run_experiment(name: str, out: str | Path, *, quick: bool = False, overwrite: bool = False,
                   overrides: dict[str, Any] | None = None, resume: bool = False) -> dict[str, Any]:
    """Run one experiment into ``out`` and return the content of its results.json."""
    mod = get_experiment(name)
    cfg = apply_overrides(mod.Config.quick() if quick else mod.Config(), overrides, name=name)
    validate_config(cfg)  # before the run directory exists: a bad setting writes nothing
    run_dir = RunDir(out, name, overwrite=overwrite, resume=resume)
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

    A part that fails is recorded (its traceback is kept in ``out/NAME.error.txt``)
    and the others go on; ``out/status.json`` holds every part's status. With
    ``resume``, parts whose results.json already exists are kept.

    Parameters
    ----------
    build_report : callable ``(paths, out) -> Report``, optional
        Called as ``build_report([out], out)`` once every part ran, e.g.
        :func:`mptlml.report.build_report` (what ``mptlml reproduce all`` passes),
        to write ``report.html``/``report.md`` beside the parts.
    """
    out = Path(out)
    if out.is_dir() and any(out.iterdir()) and not (overwrite or resume):
        raise ValueError(
            f"output directory {out} exists and is not empty; pass --overwrite to replace it, "
            "--resume to keep finished parts, or choose another --out."
        )
    out.mkdir(parents=True, exist_ok=True)
    status: dict[str, Any] = {}
    for name in only or list(EXPERIMENTS):
        part = out / name
        if resume:
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
                           overrides=(overrides or {}).get(name), resume=resume)
            status[name] = f"ok in {time.perf_counter() - t0:.1f} s"
        except Exception as exc:  # keep going: the report lists the failed part as missing
            status[name] = f"failed: {exc}"
            atomic_write_text(part.with_suffix(".error.txt"), traceback.format_exc())
            _log.error(f"[{name}] FAILED: {exc}")
    if build_report is not None:
        rep = build_report([out], out)
        _log.info(f"report: {out / 'report.html'} and {out / 'report.md'} "
                  f"({rep.num_holding} of {rep.num_claims} checked claims hold)")
    atomic_write_text(out / "status.json", json.dumps(status, indent=2) + "\n")
    return status
