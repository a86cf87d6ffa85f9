"""Experiments: one thin module per figure or table of the paper.

Each module defines

- ``Config``: a dataclass whose defaults follow the paper, with a
  ``quick()`` classmethod giving a small setting for tests;
- ``run(cfg, run_dir) -> dict``: composes models, estimators, objectives and
  training, writes CSVs and figures through :class:`~.common.RunDir`, and
  returns the numbers for ``results.json``;
- ``summary(results) -> list[dict]``: rows of the short table printed at the end.

:func:`run_experiment` does the rest (run directory, results.json, timing).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from pathlib import Path
from types import ModuleType
from typing import Any

from .common import RunDir, print_table

__all__ = ["EXPERIMENTS", "run_all", "get_experiment", "run_experiment"]

#: reproduce name -> module (imported lazily so the CLI starts fast).
EXPERIMENTS: dict[str, str] = {
    "convergence": "mptlml.experiments.convergence",
    "training": "mptlml.experiments.training",
    "latent": "mptlml.experiments.latent",
    "area": "mptlml.experiments.area",
    "curve-evolution": "mptlml.experiments.curve_evolution",
    "antibody": "mptlml.experiments.antibody",
    "bert": "mptlml.experiments.bert",
    "select": "mptlml.experiments.select",
    "mlm-training": "mptlml.experiments.mlm_training",
}


def get_experiment(name: str) -> ModuleType:
    """Import the module of a reproduce command by name."""
    if name not in EXPERIMENTS:
        raise ValueError(
            f"unknown experiment {name!r}; choose one of {', '.join(sorted(EXPERIMENTS))}."
        )
    return importlib.import_module(EXPERIMENTS[name])


def run_experiment(name: str, out: str | Path, *, quick: bool = False, overwrite: bool = False,
                   overrides: dict[str, Any] | None = None, resume: bool = False) -> dict[str, Any]:
    """Run one experiment into ``out`` and return the content of its results.json."""
    mod = get_experiment(name)
    cfg = mod.Config.quick() if quick else mod.Config()
    if overrides:
        names = {f.name for f in dataclasses.fields(cfg)}
        unknown = set(overrides) - names
        if unknown:
            raise ValueError(
                f"unknown setting(s) {sorted(unknown)} for {name}; valid: {sorted(names)}."
            )
        cfg = dataclasses.replace(cfg, **overrides)
    if hasattr(cfg, "validate"):
        cfg.validate()  # before the run directory exists: a bad setting writes nothing
    run_dir = RunDir(out, name, overwrite=overwrite, resume=resume)
    results = mod.run(cfg, run_dir)
    results.setdefault("quick", quick)
    path = run_dir.write_results(cfg, results, seed=getattr(cfg, "seed", None))
    if hasattr(mod, "summary"):
        print_table(mod.summary(results), title=f"{name}: summary")
    print(f"results written to {path.parent}/")
    return json.loads(path.read_text())


def run_all(out: str | Path, *, quick: bool = False, overwrite: bool = False,
            resume: bool = False, only: list[str] | None = None,
            overrides: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Run every experiment into ``out/NAME`` and build the report in ``out``.

    A part that fails is recorded (its error is kept in ``out/failures.json``)
    and the others go on. With ``resume``, parts whose results.json already
    exists are kept.
    """
    import time
    import traceback

    from .common import atomic_write_text, load_results

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
                print(f"[{name}] finished earlier: kept")
                continue
            except (FileNotFoundError, ValueError):
                pass
        print(f"[{name}] running{' (quick)' if quick else ''} ...", flush=True)
        t0 = time.perf_counter()
        try:
            run_experiment(name, part, quick=quick, overwrite=True,
                           overrides=(overrides or {}).get(name), resume=resume)
            status[name] = f"ok in {time.perf_counter() - t0:.1f} s"
        except Exception as exc:  # keep going: the report lists the failed part as missing
            status[name] = f"failed: {exc}"
            atomic_write_text(part.with_suffix(".error.txt"), traceback.format_exc())
            print(f"[{name}] FAILED: {exc}")
    from ..report import build_report

    rep = build_report([out], out)
    atomic_write_text(out / "status.json", json.dumps(status, indent=2) + "\n")
    print(f"report: {out / 'report.html'} and {out / 'report.md'} "
          f"({rep.num_holding} of {rep.num_claims} checked claims hold)")
    return status
