"""The training loop: maximise an objective over a model's parameters, epoch by epoch.

One loop for every objective (exact LML, MPT loss, ELBO, ...) and every model:
each step minimises ``-objective(x_batch)`` with a torch optimizer, full batch or
minibatches; after each epoch the monitors are evaluated on the full data, a
record is added to the :class:`~.history.History`, and the callbacks may stop
training. The loop knows nothing of the model family.
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from .._progress import progress_bar
from .._validation import check_positive_int, make_generator
from ..models.base import MaskedModel
from ..objectives.base import Objective
from .history import History
from .monitors import Monitor, as_monitors, flatten

__all__ = ["OPTIMIZERS", "Callback", "StopTraining", "train"]

#: optimizer names accepted by :func:`train`.
OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "sgd": torch.optim.SGD,
    "rmsprop": torch.optim.RMSprop,
}

#: ``cb(history, record)``, called after each epoch's record; True (or StopTraining) stops.
Callback = Callable[[History, dict[str, Any]], Any]


class StopTraining(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raise from a callback (or return True from it) to end training after this epoch."""


def train(model: MaskedModel, objective: Objective, x: Any, *, epochs: int, lr: float,
          optimizer: str | type[torch.optim.Optimizer] = "adam",
          optimizer_options: Mapping[str, Any] | None = None, batch_size: int | None = None,
          seed: int | torch.Generator | None = None,
          monitors: Mapping[str, Callable[[MaskedModel, torch.Tensor], Any] | Monitor]
          | None = None,
          callbacks: Iterable[Callback] = (),
          progress: bool = True, record_initial: bool = True) -> History:
    """Maximise ``objective`` over the trainable parameters of ``model``.

    Each step minimises ``-objective(x_batch)`` (the objective is a mean per
    datum, so the learning rate does not depend on N or the batch size). Every
    record holds ``epoch``, ``objective`` (mean over the epoch's batches of the
    value being maximised, weighted by batch size, evaluated before each step),
    ``time_s`` and the monitors due; epoch 0 holds them at the initial parameters.

    Parameters
    ----------
    model : MaskedModel
        The model being trained; must be ``objective.model``.
    objective : Objective
        Value to maximise per datum (``ExactLML``, ``MPTLoss``, ``ELBO``, ...).
    x : array-like, (N, D)
        Training data.
    epochs : int
        Number of passes over the data (> 0).
    lr : float
        Learning rate (> 0).
    optimizer : str or torch.optim.Optimizer subclass
        ``"adam"`` (default, the paper's choice), ``"adamw"``, ``"sgd"``,
        ``"rmsprop"``, or a class called as ``cls(params, lr=lr, **optimizer_options)``.
    optimizer_options : dict, optional
        Extra keyword arguments of the optimizer (momentum, betas, ...).
    batch_size : int, optional
        Minibatch size; ``None`` (default) is full batch. Batches are reshuffled
        every epoch from ``seed``.
    seed : int or torch.Generator, optional
        Seeds the masks (or other randomness) of the objective and the shuffling.
    monitors : dict name -> callable ``fn(model, x)`` or :class:`Monitor`
        Evaluated without gradients on the full data; see :func:`exact_lml`,
        :func:`mpt_curve_monitor`, :func:`estimate_monitor` and :func:`every`.
    callbacks : iterable of callables ``cb(history, record)``
        Called after each epoch's record; returning True or raising
        :class:`StopTraining` ends training early.
    progress : bool
        Show a tqdm bar with the epoch and the current objective and monitors.
    record_initial : bool
        Record epoch 0 (objective and monitors at the initial parameters).

    Returns
    -------
    History

    Raises
    ------
    ValueError
        Non-positive ``epochs`` / ``lr`` / ``batch_size``, an objective not
        built on ``model``, a model without trainable parameters, a monitor
        that needs ``log_marginal`` on a model without it, or an objective that
        becomes NaN or infinite.
    """
    _check_pair(model, objective)
    epochs = check_positive_int(epochs, "epochs")
    lr = _check_lr(lr)
    mons = _checked_monitors(model, monitors)
    xt = model.validate_data(x)
    n = xt.shape[0]
    bs = n if batch_size is None else min(check_positive_int(batch_size, "batch_size"), n)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError(f"{type(model).__name__} has no trainable parameters (requires_grad).")
    opt = _make_optimizer(optimizer, params, lr, optimizer_options)
    g = make_generator(seed)
    cbs = _checked_callbacks(callbacks)
    hist = History(meta={
        "objective": type(objective).__name__, "objective_repr": repr(objective),
        "model": type(model).__name__,
        "optimizer": optimizer if isinstance(optimizer, str) else optimizer.__name__,
        "lr": lr, "epochs": epochs, "batch_size": batch_size, "num_data": n,
        "seed": int(seed) if isinstance(seed, numbers.Integral) else None,
        "monitors": {k: m.every for k, m in mons.items()},
    })
    bar = progress_bar(range(1, epochs + 1), enabled=progress, desc="training")

    def record(epoch: int, value: float, time_s: float) -> bool:
        """Add the epoch's record (with the monitors due); True when a callback stops."""
        rec = {"epoch": epoch, "objective": value, "time_s": time_s}
        with torch.no_grad():
            for name, m in mons.items():
                if m.due(epoch, epochs):
                    rec.update(flatten(name, m(model, xt)))
        if progress:
            bar.set_postfix(_postfix(rec), refresh=False)
        hist.records.append(rec)
        return _callbacks_stop(cbs, hist, rec)

    was_training = model.training
    model.train()
    t0 = time.perf_counter()
    try:
        if record_initial:
            with torch.no_grad():
                v0 = float(objective.batch_mean(xt, g))
            if record(0, v0, 0.0):
                return hist
        for epoch in bar:
            total = 0.0
            order = torch.randperm(n, generator=g) if bs < n else None
            for s in range(0, n, bs):
                xb = xt if order is None else xt[order[s:s + bs].to(xt.device)]
                opt.zero_grad(set_to_none=True)
                value = objective.batch_mean(xb, g)
                if not torch.isfinite(value):
                    raise ValueError(
                        f"the objective became {float(value.detach())} at epoch {epoch}; lower the "
                        f"learning rate (lr={lr}) or check the initialisation."
                    )
                (-value).backward()
                opt.step()
                total += float(value.detach()) * xb.shape[0]
            if record(epoch, total / n, round(time.perf_counter() - t0, 6)):
                break
    finally:
        bar.close()
        model.train(was_training)
    hist.meta["wall_time_s"] = round(time.perf_counter() - t0, 3)
    return hist


# ---------------------------------------------------------------------- checks and helpers
def _check_pair(model: Any, objective: Any) -> None:
    if not isinstance(model, MaskedModel):
        raise TypeError(f"model must be an mptlml.models.MaskedModel, got {type(model).__name__}.")
    if not isinstance(objective, Objective):
        raise TypeError(
            f"objective must be an mptlml.objectives.Objective (ExactLML, MPTLoss, ...), got "
            f"{type(objective).__name__}."
        )
    if objective.model is not model:
        raise ValueError("objective was built on a different model; pass the model the "
                         "objective wraps, e.g. train(obj.model, obj, x, ...).")


def _checked_monitors(model: MaskedModel, monitors: Any) -> dict[str, Monitor]:
    mons = as_monitors(monitors)
    for name, m in mons.items():
        if m.requires_log_marginal and not model.has_log_marginal:
            raise ValueError(
                f"monitor {name!r} needs model.log_marginal, which {type(model).__name__} does "
                "not have; monitor an estimate instead (mptlml.training.estimate_monitor)."
            )
    return mons


def _checked_callbacks(callbacks: Iterable[Callback]) -> list[Callback]:
    cbs = list(callbacks)
    for cb in cbs:
        if not callable(cb):
            raise TypeError(f"callbacks must be callables cb(history, record), got {cb!r}.")
    return cbs


def _callbacks_stop(cbs: list[Callback], hist: History, rec: dict[str, Any]) -> bool:
    """Run every callback on the new record; True if one asked to stop."""
    stop = False
    for cb in cbs:
        try:
            stop = bool(cb(hist, rec)) or stop
        except StopTraining:
            stop = True
    return stop


def _make_optimizer(optimizer: Any, params: list[torch.nn.Parameter], lr: float,
                    options: Mapping[str, Any] | None) -> torch.optim.Optimizer:
    opts = dict(options or {})
    if isinstance(optimizer, str):
        key = optimizer.lower()
        if key not in OPTIMIZERS:
            raise ValueError(
                f"unknown optimizer {optimizer!r}; choose one of {', '.join(OPTIMIZERS)} or pass "
                "a torch.optim.Optimizer class."
            )
        return OPTIMIZERS[key](params, lr=lr, **opts)
    if isinstance(optimizer, type) and issubclass(optimizer, torch.optim.Optimizer):
        return optimizer(params, lr=lr, **opts)
    raise TypeError(
        f"optimizer must be a name ({', '.join(OPTIMIZERS)}) or a torch.optim.Optimizer class, "
        f"got {optimizer!r}."
    )


def _check_lr(lr: Any) -> float:
    if isinstance(lr, bool) or not isinstance(lr, numbers.Real):
        raise TypeError(f"lr must be a positive float, got {lr!r}.")
    if not math.isfinite(float(lr)) or float(lr) <= 0:
        raise ValueError(f"lr (learning rate) must be a finite positive number, got {lr}; "
                         "e.g. lr=1e-2 (the paper's Adam setting).")
    return float(lr)


def _postfix(rec: Mapping[str, Any]) -> dict[str, str]:
    out = {}
    for k, v in rec.items():
        if k in ("epoch", "time_s") or not isinstance(v, float):
            continue
        out[k] = f"{v:.4g}"
    return out
