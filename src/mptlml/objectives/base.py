"""Objective base class: a value to MAXIMISE, averaged per datum.

As GPyTorch's ``mlls``: an objective wraps a model, ``objective(x)`` returns a
scalar tensor (the mean over the N data points), and the caller negates it
for an optimizer. Objectives know the model only through the protocol of
:mod:`mptlml.models.base`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..models.base import MaskedModel

__all__ = ["Objective"]


class Objective(nn.Module):
    """Base class of training objectives.

    Subclasses implement :meth:`per_datum`, returning ``(N,)`` values.

    Parameters
    ----------
    model : MaskedModel
        The model whose parameters the objective depends on (registered as a
        submodule, so ``objective.parameters()`` are the model's).
    """

    #: set by objectives that need ``model.log_marginal``.
    requires_log_marginal: bool = False
    name: str = "objective"

    def __init__(self, model: MaskedModel) -> None:
        super().__init__()
        if not isinstance(model, MaskedModel):
            raise TypeError(
                f"model must be an mptlml.models.MaskedModel, got {type(model).__name__}."
            )
        if self.requires_log_marginal and not model.has_log_marginal:
            raise ValueError(
                f"{type(self).__name__} needs model.log_marginal, which "
                f"{type(model).__name__} does not have; use MPTLoss (masked conditionals) "
                "or ELBO instead."
            )
        self.model = model

    def per_datum(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Objective value for each datum, ``(N,)``; ``x`` is already validated."""
        raise NotImplementedError

    def batch_mean(self, x: torch.Tensor,
                   generator: torch.Generator | None = None) -> torch.Tensor:
        """Mean over the data of :meth:`per_datum` (``x`` validated): what a training step uses.

        Objectives that can compute the mean more cheaply than every datum's
        value override it (same value, same random draws).
        """
        return self.per_datum(x, generator).mean()

    def forward(self, x: Any, *, generator: torch.Generator | None = None) -> torch.Tensor:
        """Mean over the data of :meth:`per_datum`: the scalar to maximise."""
        xt = self.model.validate_data(x)
        return self.batch_mean(xt, generator)
