"""Deprecated: masked-LM scoring on ragged sequences moved to :mod:`mptlml.estimation`.

``mlm_curve``, ``pll`` and the LML estimators live in
:mod:`mptlml.estimation.ragged`, the rate grids and areas in
:mod:`mptlml.estimation.rates`, the runner (buckets, checkpoints,
torch.distributed) in :mod:`mptlml.estimation.runner`. This module re-exports
the old names so that existing imports keep working. ``MLMCurveResult`` and
``MLMLMLResult`` are now :class:`~mptlml.estimation.results.MPTCurve` and
:class:`~mptlml.estimation.results.LMLEstimate` (their old attribute names,
``lml_se``, ``area_se``, ``scores``, ..., remain as deprecated properties).
"""

from __future__ import annotations

import warnings
from typing import Any

from .estimation.ragged import mlm_curve, pll
from .estimation.rates import check_rates as _check_rates  # noqa: F401 - old private name
from .estimation.rates import default_rates, mask_sizes, mpt_area, rate_widths
from .estimation.runner import distributed_context, shutdown_distributed
from .estimation.runner import seq_seed as _seq_seed  # noqa: F401 - old private name

__all__ = [
    "default_rates",
    "distributed_context",
    "mask_sizes",
    "mlm_curve",
    "mlm_estimate_lml",
    "mpt_area",
    "pll",
    "rate_widths",
    "shutdown_distributed",
]

def mlm_estimate_lml(model: Any, sequences: Any, *, estimator: str = "cumulative",
                     rates: Any = None, num_masks: int = 1, seed: int = 0,
                     **kwargs: Any) -> Any:
    """Deprecated: use ``mptlml.estimate_lml(model, sequences, estimator, ...)``."""
    from .estimation.ragged import estimate_ragged

    warnings.warn("mptlml.sequences.mlm_estimate_lml is deprecated; use mptlml.estimate_lml.",
                  DeprecationWarning, stacklevel=2)
    options = {**kwargs, **({} if rates is None else {"rates": rates})}
    progress = bool(options.pop("progress", False))
    return estimate_ragged(model, sequences, estimator, num_masks=num_masks, seed=int(seed),
                           progress=progress, options=options)


def __getattr__(name: str) -> Any:
    from .estimation import results

    old = {"MLMCurveResult": results.MPTCurve, "MLMLMLResult": results.LMLEstimate}
    if name in old:
        warnings.warn(f"mptlml.sequences.{name} is deprecated; it is "
                      f"mptlml.{old[name].__name__} now.", DeprecationWarning, stacklevel=2)
        return old[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
