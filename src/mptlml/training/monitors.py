"""Monitors: quantities tracked during training, evaluated without gradients on the full data.

A monitor is any callable ``fn(model, x) -> value`` (a float, a dict of floats,
or any JSON-ready value such as a curve); :class:`Monitor` adds how often it is
due and whether it needs the model's exact ``log_marginal``. Ready-made ones:
:func:`exact_lml`, :func:`estimate_monitor`, :func:`mpt_curve_monitor`; wrap any
callable with :func:`every`.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .._io import jsonable
from .._validation import check_positive_int
from ..estimators import estimate_lml, mpt_curve
from ..models.base import MaskedModel

__all__ = [
    "RESERVED",
    "Monitor",
    "as_monitors",
    "estimate_monitor",
    "every",
    "exact_lml",
    "flatten",
    "mpt_curve_monitor",
]


@dataclass
class Monitor:
    """A quantity tracked during training.

    Parameters
    ----------
    fn : callable ``fn(model, x) -> value``
        Called under ``torch.no_grad()`` with the full training data (already
        validated). A dict result is stored as ``name/key`` columns; a float as
        ``name``; anything else (e.g. a list) as ``name``, JSON-encoded in CSV.
    every : int
        Evaluate at epoch 0 and every ``every`` epochs (and at the last epoch).
    requires_log_marginal : bool
        Checked before training starts, so a monitor that needs the exact LML
        fails at once on a model without one.
    """

    fn: Callable[[MaskedModel, torch.Tensor], Any]
    every: int = 1
    requires_log_marginal: bool = False

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"a monitor must be callable fn(model, x), got {self.fn!r}.")
        self.every = check_positive_int(self.every, "every")

    def due(self, epoch: int, last: int) -> bool:
        """Whether to evaluate at ``epoch`` (0-based start, ``last`` the final epoch)."""
        return epoch == 0 or epoch == last or epoch % self.every == 0

    def __call__(self, model: MaskedModel, x: torch.Tensor) -> Any:
        return self.fn(model, x)


def every(k: int, fn: Callable[[MaskedModel, torch.Tensor], Any] | Monitor) -> Monitor:
    """Wrap ``fn`` so that it is evaluated only every ``k`` epochs."""
    if isinstance(fn, Monitor):
        return Monitor(fn.fn, every=k, requires_log_marginal=fn.requires_log_marginal)
    return Monitor(fn, every=k, requires_log_marginal=getattr(fn, "requires_log_marginal", False))


def exact_lml(every: int = 1) -> Monitor:
    """Monitor: mean exact log-marginal likelihood (1/N) sum_n log p(x_n) of the current model."""

    def fn(model: MaskedModel, x: torch.Tensor) -> float:
        return float(model._log_marginal(x).double().mean())

    return Monitor(fn, every=every, requires_log_marginal=True)


def estimate_monitor(estimator: str = "cumulative", *, every: int = 1, seed: int = 0,
                     **kwargs: Any) -> Monitor:
    """Monitor: :func:`mptlml.estimate_lml` of the current model (mean, plus bias if exact known).

    ``kwargs`` go to :func:`~mptlml.estimate_lml` (``num_masks``, ``rate``,
    ``mask_size``, ...). The same ``seed`` is used at every evaluation, so
    changes across epochs come from the parameters, not from the masks.
    """

    def fn(model: MaskedModel, x: torch.Tensor) -> dict[str, float | None]:
        est = estimate_lml(model, x, estimator, seed=seed, **kwargs)
        return {"mean": est.mean, "bias": est.bias}

    return Monitor(fn, every=every)


def mpt_curve_monitor(*, every: int = 100, num_masks: int = 1, seed: int = 0,
                      sizes: Sequence[int] | None = None) -> Monitor:
    """Monitor: the MPT curve S(x; M) (mean over data per size) and its area.

    Stored as ``{"area": float, "curve": [S(M) for M in sizes]}``; the area over
    all sizes is the cumulative estimate of the mean LML (Fig. 5, left).
    """

    def fn(model: MaskedModel, x: torch.Tensor) -> dict[str, Any]:
        c = mpt_curve(model, x, num_masks=num_masks, sizes=sizes, seed=seed)
        return {"area": c.area, "curve": c.mean.tolist()}

    return Monitor(fn, every=every)


#: record keys the loop writes itself; no monitor may take these names.
RESERVED = {"epoch", "objective", "time_s"}


def as_monitors(monitors: Mapping[str, Any] | None) -> dict[str, Monitor]:
    """Check ``{name: callable or Monitor}`` and wrap plain callables as :class:`Monitor`."""
    if monitors is None:
        return {}
    if not isinstance(monitors, Mapping):
        raise TypeError(
            "monitors must be a dict name -> callable fn(model, x) (or Monitor), e.g. "
            "{'exact_lml': mptlml.training.exact_lml()}."
        )
    out = {}
    for name, m in monitors.items():
        if not isinstance(name, str) or not name or name in RESERVED:
            raise ValueError(
                f"monitor name {name!r} is not allowed: use a non-empty string other than "
                f"{', '.join(sorted(RESERVED))}."
            )
        if isinstance(m, Monitor):
            out[name] = m
        elif callable(m):
            out[name] = Monitor(m, requires_log_marginal=getattr(m, "requires_log_marginal",
                                                                 False))
        else:
            raise TypeError(f"monitor {name!r} must be callable fn(model, x), got {m!r}.")
    return out


def flatten(name: str, value: Any) -> dict[str, Any]:
    """A monitor's value as record entries: dicts as ``name/key``, numbers as floats."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        value = value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(flatten(f"{name}/{k}", v))
        return out
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return {name: float(value)}
    return {name: jsonable(value)}
