"""The model protocol: what an estimator may ask of a model.

A model over D-token observations exposes its masked self-predictive
conditionals

    log p(x_j | x_R),   j in M,  R = {1..D} minus M,

through :meth:`MaskedModel.log_conditionals`, and optionally its exact
log-marginal likelihood log p(x) through :meth:`MaskedModel.log_marginal`.
Estimators (``mptlml.estimation``) and objectives (``mptlml.objectives``)
use nothing else, so they work for any model family.

Shapes
------
``x`` is ``(N, D)``. ``mask`` is bool, True = masked, of shape

- ``(D,)``: one mask for every datum, result ``(N, D)``;
- ``(B, D)``: B masks shared across the data, result ``(B, N, D)``;
- ``(B, N, D)``: B masks per datum, result ``(B, N, D)``.

The result holds log p(x_j | x_R) at masked positions and 0 elsewhere. A
fully masked row (R empty) gives the marginals log p(x_j).

Reference: Moreno-Munoz, Recasens, Hauberg, "On Masked Pre-training and the
Marginal Likelihood", NeurIPS 2023, Proposition 1.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import torch
from torch import nn

from .._validation import check_data, check_mask
from ..masks import prefix_masks

__all__ = ["MaskedModel"]

_T = TypeVar("_T")


class MaskedModel(nn.Module):
    """Base class of every model in :mod:`mptlml.models`.

    Subclasses implement :meth:`_log_conditionals` (inputs already validated)
    and, when they can, :meth:`_log_marginal`. They may override
    :meth:`masked_log_prob` (and :meth:`masked_log_prob_mean`,
    :meth:`grid_masked_log_prob`, :meth:`nested_masked_log_prob`) with a
    faster reduction.

    Attributes
    ----------
    num_tokens : int
        D, the number of tokens of one observation.
    stochastic : bool
        True when the conditionals are Monte Carlo estimates (then they are
        reproducible from the ``generator`` argument).
    """

    num_tokens: int
    stochastic: bool = False
    #: terms of the data reused across blocks of masks inside :meth:`reuse_data`
    _data_scope: dict[Any, tuple[torch.Tensor, Any]] | None = None

    # ------------------------------------------------------------------ dtype/device
    def _first_tensor(self) -> torch.Tensor | None:
        for t in self.parameters():
            return t
        for t in self.buffers():
            return t
        return None

    @property
    def dtype(self) -> torch.dtype:
        """Floating dtype of the model's parameters (float64 when it has none)."""
        t = self._first_tensor()
        return t.dtype if t is not None else torch.float64

    @property
    def device(self) -> torch.device:
        """Device of the model's parameters."""
        t = self._first_tensor()
        return t.device if t is not None else torch.device("cpu")

    # ------------------------------------------------------------------ protocol
    @property
    def has_log_marginal(self) -> bool:
        """Whether :meth:`log_marginal` is available (exact or a consistent estimate)."""
        return type(self)._log_marginal is not MaskedModel._log_marginal

    def validate_data(self, x: Any) -> torch.Tensor:
        """Check ``x`` is a finite ``(N, D)`` array and move it to the model's dtype/device."""
        return check_data(x, self.num_tokens, dtype=self.dtype, device=self.device)

    def validate_mask(self, mask: Any, num_data: int) -> torch.Tensor:
        """Check a mask's dtype and shape against this model and ``num_data``."""
        return check_mask(mask, self.num_tokens, num_data, device=self.device)

    def log_conditionals(self, x: Any, mask: Any, *,
                         generator: torch.Generator | None = None) -> torch.Tensor:
        """Masked self-predictive conditionals log p(x_j | x_R).

        Parameters
        ----------
        x : array-like of shape (N, D)
        mask : bool tensor of shape (D,), (B, D) or (B, N, D)
            True marks the masked set M; R is its complement.
        generator : torch.Generator, optional
            Randomness for stochastic (Monte Carlo) conditionals.

        Returns
        -------
        torch.Tensor
            ``(N, D)`` for a 1-D mask, else ``(B, N, D)``; log p(x_j | x_R) at
            masked positions, 0 elsewhere.
        """
        xt = self.validate_data(x)
        m = self.validate_mask(mask, xt.shape[0])
        squeeze = m.ndim == 1
        if squeeze:
            m = m[None]
        out = self._log_conditionals(xt, m, generator)
        return out[0] if squeeze else out

    def log_marginal(self, x: Any) -> torch.Tensor:
        """Log-marginal likelihood log p(x_n) of each row, shape ``(N,)``."""
        if not self.has_log_marginal:
            raise NotImplementedError(
                f"{type(self).__name__} has no log_marginal; estimate the LML with "
                "mptlml.estimate_lml(model, x, estimator='cumulative') instead."
            )
        return self._log_marginal(self.validate_data(x))

    # ------------------------------------------------------------------ reuse across blocks
    @contextmanager
    def reuse_data(self) -> Iterator[None]:
        """Scope in which the parameters do not change, so terms of ``x`` may be reused.

        The estimators score masks in blocks and open one scope per call (under
        ``torch.no_grad``); a model caches what depends only on ``x`` and its
        parameters through :meth:`_cached`, and the cache is dropped on exit.
        """
        outer = self._data_scope
        self._data_scope = {} if outer is None else outer
        try:
            yield
        finally:
            self._data_scope = outer

    def _cached(self, x: torch.Tensor, name: str, compute: Callable[[], _T]) -> _T:
        """``compute()``, reused for the same tensor ``x`` inside :meth:`reuse_data`."""
        scope = self._data_scope
        if scope is None:
            return compute()
        hit = scope.get((name, id(x)))
        if hit is not None and hit[0] is x:
            return hit[1]
        value = compute()
        scope[(name, id(x))] = (x, value)  # holding x keeps its id from being reused
        return value

    # ------------------------------------------------------------------ to implement
    def _log_conditionals(self, x: torch.Tensor, mask: torch.Tensor,
                          generator: torch.Generator | None) -> torch.Tensor:
        """Unvalidated conditionals; mask ``(B, D)`` or ``(B, N, D)``, result ``(B, N, D)``."""
        raise NotImplementedError

    def _log_marginal(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def masked_log_prob(self, x: torch.Tensor, mask: torch.Tensor,
                         generator: torch.Generator | None) -> torch.Tensor:
        """Sum of log p(x_j | x_R) over the masked positions of each mask: ``(B, N)``."""
        return self._log_conditionals(x, mask, generator).sum(dim=-1)

    def masked_log_prob_mean(self, x: torch.Tensor, mask: torch.Tensor,
                              generator: torch.Generator | None) -> torch.Tensor:
        """Mean over the data of :meth:`masked_log_prob` for shared masks ``(B, D)``: ``(B,)``.

        What a training step needs when every datum shares the masks (the
        paper's code). A model whose conditionals are linear-Gaussian can
        compute it from sufficient statistics of the data (PPCA does).
        """
        return self.masked_log_prob(x, mask, generator).double().mean(dim=-1)

    def grid_masked_log_prob(self, x: torch.Tensor, mask: torch.Tensor, weight: torch.Tensor,
                              generator: torch.Generator | None, *, data_means: bool = True
                              ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Weighted sums of :meth:`masked_log_prob` over a grid of masks.

        ``mask`` is ``(A, C, D)`` (shared across the data) or ``(A, C, N, D)``
        (one per datum), ``weight`` is ``(A, C)``. With
        lp[a, c, n] = sum_{j in mask[a, c]} log p(x_nj | x_nR) it returns

        - ``rows``, ``(A, N)`` float64: sum_c weight[a, c] * lp[a, c, n];
        - ``cols``, ``(C,)`` float64: sum_a weight[a, c] * mean_n lp[a, c, n]
          (None unless ``data_means``).

        The cumulative estimator is the grid (draws x sizes) with weight 1/M:
        ``rows`` are its per-draw estimates of log p(x_n) and ``cols`` its
        per-size scores. A model can do better than scoring every (mask,
        datum) pair when the masks are shared (PPCA does, with one D x D
        quadratic form per grid row).
        """
        a, c = mask.shape[:2]
        lp = self.masked_log_prob(x, mask.reshape(a * c, *mask.shape[2:]), generator)
        lp = lp.double().reshape(a, c, -1)
        w = weight.to(dtype=torch.float64, device=lp.device)
        rows = (lp * w[..., None]).sum(1)
        cols = (lp.mean(-1) * w).sum(0) if data_means else None
        return rows, cols

    def nested_masked_log_prob(self, x: torch.Tensor, orders: torch.Tensor,
                                generator: torch.Generator | None) -> torch.Tensor:
        """:meth:`masked_log_prob` of nested masks, every prefix of each order: ``(P, D, N)``.

        ``orders`` is ``(P, D)`` (shared across the data) or ``(P, N, D)`` (one
        per datum), each row a permutation pi of the tokens. Entry ``[p, M-1, n]``
        is sum_{j in pi[:M]} log p(x_j | x_{pi[M:]}): the mask of size M is the
        first M positions of the order, for M = 1..D. Default: build the D masks
        of each order and call :meth:`masked_log_prob`; a model can do better
        with prefix sums over the order (PPCA does).
        """
        d = self.num_tokens
        masks = prefix_masks(orders)  # (P, D sizes, [N,] D tokens)
        out = self.masked_log_prob(x, masks.reshape(-1, *masks.shape[2:]), generator)
        return out.reshape(orders.shape[0], d, x.shape[0])

    def block_cost(self, num_data: int, shared: bool) -> int:
        """Elements of temporaries per mask (sizes the blocks of masks in the estimators).

        Default: one ``(N, D)`` array per mask. A model whose reduction over the
        masked tokens needs less (e.g. PPCA with shared masks) overrides it.
        """
        return num_data * self.num_tokens

    def forward(self, x: Any, mask: Any) -> torch.Tensor:  # pragma: no cover - alias
        return self.log_conditionals(x, mask)
