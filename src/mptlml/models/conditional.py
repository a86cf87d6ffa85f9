"""A dense model seen through a context: the masked conditionals of x_T given x_C.

Proposition 1 holds conditionally. For the scored dimensions T and the
always-visible context C (T and C partition the D dimensions),

    log p(x_T | x_C) = sum_{M=1..|T|} S_T(x; M),
    S_T(x; M) = E_{mask in T, |mask| = M} [ (1/M) sum_{j in mask} log p(x_j | x_{T - mask}, x_C) ],

the chain rule of p(x_T | x_C) in a uniformly random order of T. So every
estimator of log p(x) estimates log p(x_T | x_C) when its masks are drawn
inside T and C is never masked. :class:`ConditionalView` is that model: its
``num_tokens`` is |T|, its data are the full ``(N, D)`` rows (the context's
values ride along), and a mask ``(..., |T|)`` is placed into the T columns
of a full mask before the wrapped model scores it, so the wrapped model's
fast reductions (PPCA's GEMMs and quadratic forms) serve unchanged. Its
``log_marginal`` is the exact conditional when the wrapped model has one
(:meth:`~mptlml.models.base.MaskedModel.conditional_log_marginal`).

Reference: Moreno-Munoz, Recasens, Hauberg, "On Masked Pre-training and the
Marginal Likelihood", NeurIPS 2023, Proposition 1.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from .._validation import check_context, check_mask
from .base import MaskedModel

__all__ = ["ConditionalView"]


class ConditionalView(MaskedModel):
    """The conditionals of ``model`` on the dimensions outside ``context``, the context visible.

    Parameters
    ----------
    model : MaskedModel
        A dense model over D dimensions.
    context : bool mask ``(D,)`` or indices
        C, the dimensions that are always visible and never scored.

    Attributes
    ----------
    scored : LongTensor ``(|T|,)``
        The dimensions T that masks are drawn from, in order.
    """

    def __init__(self, model: MaskedModel, context: Any) -> None:
        super().__init__()
        if not isinstance(model, MaskedModel):
            raise TypeError(f"ConditionalView wraps a dense MaskedModel, got "
                            f"{type(model).__name__}.")
        self.inner = model
        self.context = check_context(context, model.num_tokens)
        self.scored = (~self.context).nonzero().flatten()
        self.num_tokens = int(self.scored.numel())
        self.stochastic = model.stochastic
        self.name = f"{getattr(model, 'name', type(model).__name__)} | context"

    # ------------------------------------------------------------------ data and masks
    def validate_data(self, x: Any) -> torch.Tensor:
        """Full rows ``(N, D)`` of the wrapped model: the context's values come with the data."""
        return self.inner.validate_data(x)

    def validate_mask(self, mask: Any, num_data: int) -> torch.Tensor:
        """A mask over the scored dimensions, ``(..., |T|)``."""
        return check_mask(mask, self.num_tokens, num_data, device=self.inner.device)

    def expand(self, mask: torch.Tensor) -> torch.Tensor:
        """Place a mask ``(..., |T|)`` into the T columns of a full ``(..., D)`` mask."""
        full = torch.zeros(*mask.shape[:-1], self.inner.num_tokens, dtype=torch.bool,
                           device=mask.device)
        full[..., self.scored.to(mask.device)] = mask
        return full

    @property
    def dtype(self) -> torch.dtype:
        return self.inner.dtype

    @property
    def device(self) -> torch.device:
        return self.inner.device

    # ------------------------------------------------------------------ protocol
    @property
    def has_log_marginal(self) -> bool:
        """Whether the exact conditional log p(x_T | x_C) is known."""
        return self.inner.has_log_marginal and (self.inner.has_marginal
                                                or not bool(self.context.any()))

    def _log_marginal(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner.conditional_log_marginal(x, self.context)

    def _log_conditionals(self, x: torch.Tensor, mask: torch.Tensor,
                          generator: torch.Generator | None) -> torch.Tensor:
        out = self.inner._log_conditionals(x, self.expand(mask), generator)
        return out[..., self.scored.to(out.device)]

    def masked_log_prob(self, x: torch.Tensor, mask: torch.Tensor,
                        generator: torch.Generator | None) -> torch.Tensor:
        return self.inner.masked_log_prob(x, self.expand(mask), generator)

    def masked_log_prob_mean(self, x: torch.Tensor, mask: torch.Tensor,
                             generator: torch.Generator | None) -> torch.Tensor:
        return self.inner.masked_log_prob_mean(x, self.expand(mask), generator)

    def grid_masked_log_prob(self, x: torch.Tensor, mask: torch.Tensor, weight: torch.Tensor,
                             generator: torch.Generator | None, *, data_means: bool = True
                             ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.inner.grid_masked_log_prob(x, self.expand(mask), weight, generator,
                                               data_means=data_means)

    def block_cost(self, num_data: int, shared: bool) -> int:
        return self.inner.block_cost(num_data, shared)

    @contextmanager
    def reuse_data(self) -> Iterator[None]:
        with self.inner.reuse_data():
            yield
