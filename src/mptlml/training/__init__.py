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

- :mod:`.loop`: :func:`train`, optimizers by name, callbacks, :class:`StopTraining`;
- :mod:`.monitors`: :class:`Monitor`, :func:`every` and the ready-made monitors;
- :mod:`.history`: :class:`History`, the records with their CSV / JSON files.

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

from .history import HISTORY_FORMAT, History
from .loop import OPTIMIZERS, StopTraining, train
from .monitors import Monitor, estimate_monitor, every, exact_lml, mpt_curve_monitor

__all__ = [
    "HISTORY_FORMAT",
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
