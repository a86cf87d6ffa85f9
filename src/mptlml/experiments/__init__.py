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
from pathlib import Path
from types import ModuleType
from typing import Any

from .common import RunDir, print_table

__all__ = ["EXPERIMENTS", "get_experiment", "run_experiment"]

#: reproduce name -> module (imported lazily so the CLI starts fast).
EXPERIMENTS: dict[str, str] = {
    "convergence": "mptlml.experiments.convergence",
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
    import json

    return json.loads(path.read_text())
