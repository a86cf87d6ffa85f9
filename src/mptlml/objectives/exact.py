"""The exact log-marginal likelihood as a training objective."""

from __future__ import annotations

import torch

from .base import Objective

__all__ = ["ExactLML"]


class ExactLML(Objective):
    """Exact log-marginal likelihood per datum, log p(x_n | theta).

    Maximising its mean is maximum-likelihood training (for PPCA it converges
    to the closed-form MLE of Tipping & Bishop, 1999). Needs a model with
    ``log_marginal`` (e.g. :class:`~mptlml.models.PPCA`); a model without one
    raises ``ValueError`` at construction.

    Parameters
    ----------
    model : MaskedModel
        A model with ``has_log_marginal``.

    Examples
    --------
    >>> from mptlml.models import PPCA
    >>> from mptlml.objectives import ExactLML
    >>> model = PPCA.random(5, 2, sigma2=0.2, seed=0)
    >>> float(ExactLML(model)(model.sample(10, generator=0))) < 0
    True
    """

    requires_log_marginal = True
    name = "exact-lml"

    def per_datum(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """log p(x_n) for each row, ``(N,)`` float64 (differentiable)."""
        return self.model._log_marginal(x).double()
