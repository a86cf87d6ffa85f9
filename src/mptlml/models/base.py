"""The model protocol: what an estimator may ask of a model, and how to implement it.

A model over D-token observations exposes its masked self-predictive
conditionals

    log p(x_j | x_R),   j in M,  R = {1..D} minus M,

through :meth:`MaskedModel.log_conditionals`, and optionally its exact
log-marginal likelihood log p(x) through :meth:`MaskedModel.log_marginal`.
The estimators (``mptlml.estimate_lml``, ``mptlml.mpt_curve``), the
objectives (``mptlml.objectives``), the training monitors and model selection
use nothing else, so they work for any model family.

Shapes
------
``x`` is ``(N, D)``. ``mask`` is bool, True = masked, of shape

- ``(D,)``: one mask for every datum, result ``(N, D)``;
- ``(B, D)``: B masks shared across the data, result ``(B, N, D)``;
- ``(B, N, D)``: B masks per datum, result ``(B, N, D)``.

The result holds log p(x_j | x_R) at masked positions and 0 elsewhere. A
fully masked row (R empty) gives the marginals log p(x_j).

Subclass API
------------
Public entry points (``log_conditionals``, ``log_marginal``) validate their
inputs (:meth:`MaskedModel.validate_data`, :meth:`MaskedModel.validate_mask`)
and call the protected hooks. Everything a subclass implements receives
*already validated* tensors: ``x`` finite, ``(N, D)``, in the model's dtype
and on its device; masks bool on the model's device, never 1-D (a 1-D mask is
lifted to ``(1, D)``); ``generator`` a ``torch.Generator`` or None.

Must override

- :meth:`MaskedModel._log_conditionals` -- the conditionals, ``(B, N, D)``.
  Also set ``num_tokens`` (D, an int) in ``__init__``.

May override (defaults are correct, derived from the hooks above)

- :meth:`MaskedModel._log_marginal` -- exact (or consistent) log p(x), ``(N,)``;
  turns on :attr:`MaskedModel.has_log_marginal`.
- :meth:`MaskedModel.masked_log_prob` -- the per-mask sums the estimators
  score, ``(B, N)``; override when the sum is cheaper than the ``(B, N, D)``
  array (PPCA: one GEMM against ``[w w^T | e w | e^2]``).
- :meth:`MaskedModel.masked_log_prob_mean` -- its data mean, ``(B,)`` (what a
  training step with shared masks needs; PPCA: from the data's second moment).
- :meth:`MaskedModel.grid_masked_log_prob` -- weighted sums over a grid of
  masks (the cumulative estimator; PPCA: D x D quadratic forms).
- :meth:`MaskedModel.nested_masked_log_prob` -- the sums for every prefix of
  random orders (nested masks; PPCA: prefix sums along the order).
- :meth:`MaskedModel.block_cost` -- elements of temporaries per mask, which
  sizes the engine's blocks of masks.
- :meth:`MaskedModel.reuse_data` -- a scope in which the parameters are fixed
  and terms of ``x`` may be cached (:meth:`MaskedModel._cached`).

An override must return the same numbers as the default up to rounding; the
conformance suite (:mod:`mptlml.testing`) checks every reduction against the
summed ``_log_conditionals``. Set :attr:`MaskedModel.stochastic` when the
conditionals are Monte Carlo estimates (then they must be reproducible from
``generator``).

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
    """Base class of every model in :mod:`mptlml.models` (see the module docstring).

    Subclasses implement :meth:`_log_conditionals` (inputs already validated)
    and, when they can, :meth:`_log_marginal`. They may override the public
    reductions :meth:`masked_log_prob`, :meth:`masked_log_prob_mean`,
    :meth:`grid_masked_log_prob`, :meth:`nested_masked_log_prob` with faster
    algorithms, and :meth:`block_cost` to size the engine's blocks.

    Attributes
    ----------
    num_tokens : int
        D, the number of tokens of one observation (set by the subclass).
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

    @property
    def has_marginal(self) -> bool:
        """Whether :meth:`marginal` gives the model of a subset of the dimensions."""
        return type(self).marginal is not MaskedModel.marginal

    def marginal(self, dims: torch.Tensor) -> MaskedModel:
        """The model of ``x[:, dims]`` alone, with the other dimensions integrated out. Optional.

        Implemented by models whose marginals stay in the family (PPCA:
        ``N(mu_C, W_C W_C^T + sigma2 I)``); it gives the exact conditional
        :meth:`conditional_log_marginal`.
        """
        raise NotImplementedError(f"{type(self).__name__} has no marginal over a subset of "
                                  "its dimensions.")

    def conditional_log_marginal(self, x: Any, context: Any) -> torch.Tensor:
        """Exact log p(x_T | x_C) = log p(x) - log p(x_C) of each row, shape ``(N,)``.

        Parameters
        ----------
        x : array-like of shape (N, D)
        context : bool mask ``(D,)`` or indices
            C, the always-visible dimensions; T is the rest.

        Notes
        -----
        Needs :meth:`log_marginal` and, for a non-empty context, :meth:`marginal`.
        This is what the conditional MPT sum over masks drawn inside T estimates
        (Proposition 1 applied to p(x_T | x_C)).
        """
        from .._validation import check_context

        c = check_context(context, self.num_tokens)
        if not self.has_log_marginal or (bool(c.any()) and not self.has_marginal):
            raise NotImplementedError(
                f"{type(self).__name__} has no exact conditional log p(x_T | x_C) (it needs "
                "log_marginal and marginal); estimate it with mptlml.estimate_lml(model, x, "
                "context=...).")
        xt = self.validate_data(x)
        full = self.log_marginal(xt)
        if not bool(c.any()):
            return full
        dims = c.nonzero().flatten().to(xt.device)
        return full - self.marginal(dims).log_marginal(xt[:, dims])

    # ------------------------------------------------------------------ reuse across blocks
    @contextmanager
    def reuse_data(self) -> Iterator[None]:
        """Scope in which the parameters do not change, so terms of ``x`` may be reused.

        The engine scores masks in blocks and opens one scope per estimate
        (under ``torch.no_grad``); a model caches what depends only on ``x``
        and its parameters through :meth:`_cached` (PPCA: the re-centred
        residuals and its GEMM columns), and the cache is dropped on exit.
        Scopes nest and share one cache. Override only to add set-up or
        tear-down around the scope (call ``super().reuse_data()``).
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
        """The masked conditionals log p(x_j | x_R). Subclasses must override it.

        Called by :meth:`log_conditionals` after validation, and by the
        default reductions below.

        Parameters
        ----------
        x : torch.Tensor of shape (N, D)
            Validated data, in the model's dtype and on its device.
        mask : bool torch.Tensor of shape (B, D) or (B, N, D)
            True marks the masked set M of each row; shared across the data
            when 2-D.
        generator : torch.Generator or None
            Randomness for Monte Carlo conditionals (ignored by exact models).

        Returns
        -------
        torch.Tensor of shape (B, N, D)
            log p(x_nj | x_nR) at masked positions, exactly 0 elsewhere, in the
            model's dtype. Differentiable in the parameters.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement _log_conditionals.")

    def _log_marginal(self, x: torch.Tensor) -> torch.Tensor:
        """log p(x_n) of each validated row ``(N, D)``: ``(N,)``. Optional.

        Called by :meth:`log_marginal`, :class:`~mptlml.objectives.ExactLML`,
        the training monitors and the estimators (to report the exact value
        beside an estimate). Overriding it turns on :attr:`has_log_marginal`.
        """
        raise NotImplementedError

    def masked_log_prob(self, x: torch.Tensor, mask: torch.Tensor,
                        generator: torch.Generator | None) -> torch.Tensor:
        """Sum of log p(x_j | x_R) over the masked positions of each mask.

        The reduction every estimator and :class:`~mptlml.objectives.MPTLoss`
        score; may be overridden by a cheaper algorithm with the same value.

        Parameters
        ----------
        x : torch.Tensor of shape (N, D)
            Validated data.
        mask : bool torch.Tensor of shape (B, D) or (B, N, D)
        generator : torch.Generator or None

        Returns
        -------
        torch.Tensor of shape (B, N)
            ``_log_conditionals(x, mask, generator).sum(-1)``, in the model's
            dtype, differentiable in the parameters.
        """
        return self._log_conditionals(x, mask, generator).sum(dim=-1)

    def masked_log_prob_mean(self, x: torch.Tensor, mask: torch.Tensor,
                             generator: torch.Generator | None) -> torch.Tensor:
        """Mean over the data of :meth:`masked_log_prob` for shared masks.

        What a training step needs when every datum shares the masks (the
        paper's code; called by :class:`~mptlml.objectives.MPTLoss`). A model
        whose conditionals are linear-Gaussian can compute it from sufficient
        statistics of the data (PPCA does, in O(D^2 K) per mask).

        Parameters
        ----------
        x : torch.Tensor of shape (N, D)
            Validated data.
        mask : bool torch.Tensor of shape (B, D)
            Shared masks (an override may defer other shapes to this default).
        generator : torch.Generator or None

        Returns
        -------
        torch.Tensor of shape (B,)
            float64, ``masked_log_prob(x, mask, generator).mean(-1)``,
            differentiable in the parameters.
        """
        return self.masked_log_prob(x, mask, generator).double().mean(dim=-1)

    def grid_masked_log_prob(self, x: torch.Tensor, mask: torch.Tensor, weight: torch.Tensor,
                             generator: torch.Generator | None, *, data_means: bool = True
                             ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Weighted sums of :meth:`masked_log_prob` over a grid of masks.

        Called by the engine for the cumulative estimator and the MPT curve:
        the grid is (draws x sizes) with weight 1/M, so ``rows`` are per-draw
        estimates of log p(x_n) and ``cols`` per-size scores. A model can do
        better than scoring every (mask, datum) pair when the masks are shared
        (PPCA does, with one D x D quadratic form per grid row).

        Parameters
        ----------
        x : torch.Tensor of shape (N, D)
            Validated data.
        mask : bool torch.Tensor of shape (A, C, D) or (A, C, N, D)
            Shared across the data, or one per datum.
        weight : torch.Tensor of shape (A, C)
        generator : torch.Generator or None
        data_means : bool
            Whether ``cols`` is wanted.

        Returns
        -------
        rows : torch.Tensor of shape (A, N)
            float64, ``sum_c weight[a, c] * lp[a, c, n]`` with
            ``lp[a, c, n] = sum_{j in mask[a, c]} log p(x_nj | x_nR)``.
        cols : torch.Tensor of shape (C,) or None
            float64, ``sum_a weight[a, c] * mean_n lp[a, c, n]``; None unless
            ``data_means``.
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
        """:meth:`masked_log_prob` of nested masks, every prefix of each order.

        Called by the engine for the nested cumulative estimator and curve.
        Default: build the D masks of each order (:func:`~mptlml.masks.prefix_masks`)
        and call :meth:`masked_log_prob`; a model can do better with prefix
        sums over the order (PPCA does).

        Parameters
        ----------
        x : torch.Tensor of shape (N, D)
            Validated data.
        orders : long torch.Tensor of shape (P, D) or (P, N, D)
            Permutations pi of the tokens, shared or one per datum.
        generator : torch.Generator or None

        Returns
        -------
        torch.Tensor of shape (P, D, N)
            Entry ``[p, M-1, n]`` is ``sum_{j in pi[:M]} log p(x_nj | x_n,pi[M:])``:
            the mask of size M is the first M positions of the order, M = 1..D.
        """
        d = self.num_tokens
        masks = prefix_masks(orders)  # (P, D sizes, [N,] D tokens)
        out = self.masked_log_prob(x, masks.reshape(-1, *masks.shape[2:]), generator)
        return out.reshape(orders.shape[0], d, x.shape[0])

    def block_cost(self, num_data: int, shared: bool) -> int:
        """Elements of temporaries one mask costs in :meth:`masked_log_prob`.

        The engine and model selection score ``block_elements // block_cost``
        masks per call. Default: one ``(N, D)`` array per mask. A model whose
        reduction needs less (PPCA with shared masks: O(D + N K)) overrides it.

        Parameters
        ----------
        num_data : int
            N, the rows scored per call.
        shared : bool
            Whether the masks are shared across the data (``(B, D)``) or one
            per datum (``(B, N, D)``).

        Returns
        -------
        int
            Positive number of array elements per mask.
        """
        return num_data * self.num_tokens
