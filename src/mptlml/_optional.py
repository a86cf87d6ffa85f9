"""Optional dependencies: a missing one is reported with the extra that installs it.

The core (``pip install mptlml``) estimates, trains and selects dense models with numpy,
scipy, torch, scikit-learn and tqdm, and runs the ``mptlml`` command (click, filelock).
Hugging Face masked LMs need the ``hf`` extra (AntiBERTy the ``antibody`` extra too),
data frames, reports and figures the ``report`` extra, the lm-evaluation-harness backend
(:mod:`mptlml.lm_eval`, ``mptlml eval``) the ``lm-eval`` extra. A job of the command
line declares what it needs (:attr:`mptlml.runs.job.Job.needs`) and is refused up front
without it. Each import of an optional package follows a
:func:`require` of it (``tests/test_packaging.py`` checks this), so a user without the
extra reads what to install instead of a bare ``No module named ...``.
"""

from __future__ import annotations

import importlib.util

__all__ = ["EXTRAS", "require"]

#: optional top-level import name -> the extra of ``pyproject.toml`` that installs it
EXTRAS: dict[str, str] = {
    "transformers": "hf",
    "datasets": "hf",
    "accelerate": "hf",
    "huggingface_hub": "hf",
    "pandas": "report",
    "jinja2": "report",
    "matplotlib": "report",
    "lm_eval": "lm-eval",
    "antiberty": "antibody",
}


def require(module: str, purpose: str) -> None:
    """Raise ``ModuleNotFoundError`` naming the extra if ``module`` is not installed.

    Parameters
    ----------
    module : str
        The import name (``"pandas"``, ``"transformers"``); a key of :data:`EXTRAS`.
    purpose : str
        What needs it, for the message (``"LMLEstimate.to_pandas()"``).
    """
    extra = EXTRAS[module]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ModuleNotFoundError(
            f"{purpose} needs {module}, which is not installed: pip install \"mptlml[{extra}]\" "
            "(or \"mptlml[all]\" for every optional feature).", name=module)
