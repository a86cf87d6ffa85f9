"""One objective-agnostic training loop, with per-epoch monitors and a saved history.

:func:`train` maximises ``objective(x)`` (an :class:`~mptlml.objectives.Objective`:
exact LML, MPT loss, ELBO, ...) over the model's trainable parameters with a
torch optimizer, full batch or minibatches, and records for every epoch

- ``epoch``, ``objective`` (mean over the epoch's batches of the value being
  maximised, weighted by batch size, evaluated before each step),
- ``time_s`` (wall time since the start),
- the value of each *monitor*: any callable ``fn(model, x) -> value`` (a float,
  a dict of floats, or any JSON-ready value such as a curve), evaluated on the
  full training data after the epoch's updates, every ``k`` epochs.

Epoch 0 holds the monitors (and the objective) at the initial parameters.
The loop knows nothing of the model family.

Example
-------
>>> from mptlml.models import PPCA
>>> from mptlml.objectives import MPTLoss
>>> from mptlml.training import train, exact_lml
>>> model = PPCA.random(6, 2, sigma2=0.2, seed=0)
>>> x = model.sample(200, generator=1)
>>> init = PPCA.random(6, 2, sigma2=0.2, seed=5)
>>> hist = train(init, MPTLoss(init, "cumulative"), x, epochs=5, lr=0.05, seed=0,
...              monitors={"exact_lml": exact_lml()}, progress=False)
>>> len(hist.records)  # epoch 0 + 5 epochs
6
"""

from __future__ import annotations

import csv
import io
import json
import math
import numbers
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from ._io import atomic_write_text, jsonable
from ._validation import check_positive_int, make_generator
from .estimators import estimate_lml, mpt_curve
from .models.base import MaskedModel
from .objectives.base import Objective

__all__ = [
    "OPTIMIZERS",
    "History",
    "Monitor",
    "StopTraining",
    "estimate_monitor",
    "every",
    "exact_lml",
    "mpt_curve_monitor",
    "train",
]

#: optimizer names accepted by :func:`train`.
OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "sgd": torch.optim.SGD,
    "rmsprop": torch.optim.RMSprop,
}

HISTORY_FORMAT = 1


class StopTraining(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raise from a callback (or return True from it) to end training after this epoch."""


# ---------------------------------------------------------------------- monitors
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


def _as_monitors(monitors: Mapping[str, Any] | None) -> dict[str, Monitor]:
    if monitors is None:
        return {}
    if not isinstance(monitors, Mapping):
        raise TypeError(
            "monitors must be a dict name -> callable fn(model, x) (or Monitor), e.g. "
            "{'exact_lml': mptlml.training.exact_lml()}."
        )
    out = {}
    for name, m in monitors.items():
        if not isinstance(name, str) or not name or name in _RESERVED:
            raise ValueError(
                f"monitor name {name!r} is not allowed: use a non-empty string other than "
                f"{', '.join(sorted(_RESERVED))}."
            )
        if isinstance(m, Monitor):
            out[name] = m
        elif callable(m):
            out[name] = Monitor(m, requires_log_marginal=getattr(m, "requires_log_marginal",
                                                                 False))
        else:
            raise TypeError(f"monitor {name!r} must be callable fn(model, x), got {m!r}.")
    return out


_RESERVED = {"epoch", "objective", "time_s"}


def _flatten(name: str, value: Any) -> dict[str, Any]:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        value = value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(f"{name}/{k}", v))
        return out
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return {name: float(value)}
    return {name: jsonable(value)}


# ---------------------------------------------------------------------- history
@dataclass
class History:
    """Per-epoch records of a training run.

    Attributes
    ----------
    records : list of dict
        One dict per recorded epoch (epoch 0 = initial parameters), with keys
        ``epoch``, ``objective``, ``time_s`` and one per monitor (``name`` or
        ``name/key``); a monitor not due at an epoch is absent from its record.
    meta : dict
        Settings of the run (objective, optimizer, lr, epochs, seed, ...).
    """

    records: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def columns(self) -> list[str]:
        """Every key that appears in some record, in first-seen order."""
        cols: dict[str, None] = {}
        for r in self.records:
            for k in r:
                cols.setdefault(k, None)
        return list(cols)

    def column(self, name: str) -> list[Any]:
        """Values of ``name`` over the records (``None`` where it was not recorded)."""
        if name not in self.columns:
            raise KeyError(f"no column {name!r} in the history; columns: {self.columns}.")
        return [r.get(name) for r in self.records]

    def series(self, name: str) -> tuple[list[int], list[Any]]:
        """``(epochs, values)`` of the records where ``name`` was recorded."""
        vals = self.column(name)
        pairs = [(r["epoch"], v) for r, v in zip(self.records, vals, strict=True) if v is not None]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    @property
    def last(self) -> dict[str, Any]:
        """The final record."""
        if not self.records:
            raise ValueError("the history is empty.")
        return self.records[-1]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dictionary."""
        return {"format": HISTORY_FORMAT, "meta": jsonable(self.meta),
                "records": jsonable(self.records)}

    def to_json(self, path: str | os.PathLike) -> Path:
        """Write the history (records and meta) to a JSON file, atomically."""
        p = Path(path)
        atomic_write_text(p, json.dumps(self.to_dict(), indent=1) + "\n")
        return p

    def csv_text(self, columns: Sequence[str] | None = None) -> str:
        """The records as CSV text (non-scalar values JSON-encoded, missing ones empty)."""
        cols = list(columns) if columns is not None else self.columns
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(cols)
        for r in self.records:
            row = []
            for c in cols:
                v = jsonable(r.get(c))
                row.append("" if v is None else (json.dumps(v) if isinstance(v, list | dict)
                                                 else v))
            w.writerow(row)
        return buf.getvalue()

    def to_csv(self, path: str | os.PathLike, columns: Sequence[str] | None = None) -> Path:
        """Write the records as CSV, atomically (meta is not stored; use :meth:`to_json`)."""
        p = Path(path)
        atomic_write_text(p, self.csv_text(columns))
        return p

    @classmethod
    def load(cls, path: str | os.PathLike) -> History:
        """Read a history written by :meth:`to_json` (``.json``) or :meth:`to_csv` (``.csv``)."""
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"no history file at {p}.")
        if p.suffix.lower() == ".csv":
            return cls(records=[_parse_csv_row(r) for r in csv.DictReader(io.StringIO(
                p.read_text()))])
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{p} is not valid JSON ({exc}).") from exc
        if not isinstance(data, dict) or "records" not in data:
            raise ValueError(f"{p} is not a training history (no 'records'); write it with "
                             "History.to_json.")
        if int(data.get("format", 0)) > HISTORY_FORMAT:
            raise ValueError(f"{p} has history format {data.get('format')}, newer than this "
                             f"mptlml reads ({HISTORY_FORMAT}); upgrade mptlml.")
        return cls(records=list(data["records"]), meta=dict(data.get("meta", {})))


def _parse_csv_row(row: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in row.items():
        if v == "":
            continue
        try:
            val: Any = json.loads(v)
        except json.JSONDecodeError:
            val = v
        out[k] = int(val) if k == "epoch" else val
    return out


# ---------------------------------------------------------------------- loop
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


def train(model: MaskedModel, objective: Objective, x: Any, *, epochs: int, lr: float,
          optimizer: str | type[torch.optim.Optimizer] = "adam",
          optimizer_options: Mapping[str, Any] | None = None, batch_size: int | None = None,
          seed: int | torch.Generator | None = None,
          monitors: Mapping[str, Callable[[MaskedModel, torch.Tensor], Any] | Monitor]
          | None = None,
          callbacks: Iterable[Callable[[History, dict[str, Any]], Any]] = (),
          progress: bool = True, record_initial: bool = True) -> History:
    """Maximise ``objective`` over the trainable parameters of ``model``.

    Each step minimises ``-objective(x_batch)`` (the objective is a mean per
    datum, so the learning rate does not depend on N or the batch size).

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
    epochs = check_positive_int(epochs, "epochs")
    lr = _check_lr(lr)
    mons = _as_monitors(monitors)
    for name, m in mons.items():
        if m.requires_log_marginal and not model.has_log_marginal:
            raise ValueError(
                f"monitor {name!r} needs model.log_marginal, which {type(model).__name__} does "
                "not have; monitor an estimate instead (mptlml.training.estimate_monitor)."
            )
    xt = model.validate_data(x)
    n = xt.shape[0]
    bs = n if batch_size is None else check_positive_int(batch_size, "batch_size")
    bs = min(bs, n)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError(f"{type(model).__name__} has no trainable parameters (requires_grad).")
    opt = _make_optimizer(optimizer, params, lr, optimizer_options)
    g = make_generator(seed)
    cbs = list(callbacks)
    for cb in cbs:
        if not callable(cb):
            raise TypeError(f"callbacks must be callables cb(history, record), got {cb!r}.")

    hist = History(meta={
        "objective": type(objective).__name__,
        "objective_repr": repr(objective),
        "model": type(model).__name__,
        "optimizer": optimizer if isinstance(optimizer, str) else optimizer.__name__,
        "lr": lr, "epochs": epochs, "batch_size": batch_size, "num_data": n,
        "seed": int(seed) if isinstance(seed, numbers.Integral) else None,
        "monitors": {k: m.every for k, m in mons.items()},
    })
    t0 = time.perf_counter()

    def monitor_values(epoch: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        with torch.no_grad():
            for name, m in mons.items():
                if m.due(epoch, epochs):
                    out.update(_flatten(name, m(model, xt)))
        return out

    def finish(rec: dict[str, Any]) -> bool:
        hist.records.append(rec)
        stop = False
        for cb in cbs:
            try:
                stop = bool(cb(hist, rec)) or stop
            except StopTraining:
                stop = True
        return stop

    was_training = model.training
    model.train()
    bar = tqdm(range(1, epochs + 1), desc="training", disable=not progress, leave=False)
    try:
        if record_initial:
            with torch.no_grad():
                v0 = float(objective.batch_mean(xt, g))
            rec0 = {"epoch": 0, "objective": v0, "time_s": 0.0, **monitor_values(0)}
            if progress:
                bar.set_postfix(_postfix(rec0), refresh=False)
            if finish(rec0):
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
            rec = {"epoch": epoch, "objective": total / n,
                   "time_s": round(time.perf_counter() - t0, 6), **monitor_values(epoch)}
            if progress:
                bar.set_postfix(_postfix(rec), refresh=False)
            if finish(rec):
                break
    finally:
        bar.close()
        model.train(was_training)
    hist.meta["wall_time_s"] = round(time.perf_counter() - t0, 3)
    return hist
