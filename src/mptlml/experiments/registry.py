"""The registry of reproductions: ``mptlml reproduce NAME`` -> the module that runs it.

Each module named here defines

- ``TITLE`` and ``PAPER``: its section of the report (the figure or table and
  the paper's statement, set beside our numbers);
- ``Config``: a dataclass whose defaults follow the paper, with a
  ``quick()`` classmethod giving a small setting for tests;
- ``run(cfg, run_dir) -> dict``: the experiment, writing CSVs and figures
  through :class:`~.common.RunDir` and returning the numbers for results.json;
- optionally ``summary(results)`` (rows of the printed table) and
  ``claims(results)`` (the checks the report shows, see :mod:`mptlml.report`).

The report reads this registry; nothing here imports the report.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["EXPERIMENTS", "get_experiment"]

#: reproduce name -> module, in the paper's reading order (the report's and the run order);
#: imported lazily so that the command line starts fast.
EXPERIMENTS: dict[str, str] = {
    "convergence": "mptlml.experiments.convergence",
    "training": "mptlml.experiments.training",
    "latent": "mptlml.experiments.latent",
    "area": "mptlml.experiments.area",
    "curve-evolution": "mptlml.experiments.curve_evolution",
    "bert": "mptlml.experiments.bert",
    "antibody": "mptlml.experiments.antibody",
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
