"""Probabilistic PCA with closed-form masked conditionals and fast masked reductions.

Model (Tipping & Bishop, 1999)::

    z ~ N(0, I_K),   x | z ~ N(W z + mu, sigma2 I_D),   so  x ~ N(mu, W W^T + sigma2 I).

Notation (used throughout this file). A mask has a masked set M, indicator
m_j = [j in M], and an observed set R. Masked conditionals go through the
K-dimensional latent posterior given the observed tokens (Woodbury), never
through a D x D inverse::

    A_R = I_K + W_R^T W_R / sigma2,   P = A_R^{-1} / sigma2,
    z_R = A_R^{-1} W_R^T (x_R - mu_R) / sigma2            (E[z | x_R]),
    x_j | x_R ~ N(mu_j + w_j^T z_R, v_j),   v_j = sigma2 + w_j^T A_R^{-1} w_j.

For accuracy in float32 the data are re-centred on z* (the posterior mean
given all D tokens) with residuals e = x - mu - W z*. Since W^T e = sigma2 z*,

    x_j - E[x_j | x_R] = e_j - w_j^T u,   u = -A_R^{-1} g / sigma2,
    g = W_M^T e_M = sigma2 z* - W_R^T e_R.

With c_j = m_j / v_j, C = sum_j c_j w_j w_j^T and f = sum_j c_j e_j w_j,

    sum_j m_j (e_j - w_j^T u)^2 / v_j = sum_j c_j e_j^2 + g^T P C P g + 2 g^T P f,

so shared masks never form a ``(B, N, D)`` array: one GEMM of the ``(B, D)``
masks against the columns ``[w w^T | e w | e^2]`` (:func:`_gemm_columns`).

Layout, as scikit-learn's ``decomposition/_pca.py``: one model with its
solvers in one file. :class:`PPCA` holds the model, its constructors,
sampling, the exact LML and the reference conditionals
(:meth:`PPCA._log_conditionals`); its fast methods validate, cache the
terms of the data (z*, e and the GEMM columns, per :meth:`reuse_data` scope)
and call private pure functions of (W, sigma2, z*, e) and the masks:

- :meth:`PPCA.masked_log_prob`: :func:`_shared_masked_sum` (shared masks
  ``(B, D)``) or :func:`_per_datum_masked_sum` (one mask per datum
  ``(B, N, D)``);
- :meth:`PPCA.nested_masked_log_prob`: :func:`_nested_masked_sum`, every
  prefix of shared orders by prefix sums;
- :meth:`PPCA.grid_masked_log_prob`: :func:`_grid_quadratic_forms`, weighted
  grid sums as D x D quadratic forms, where :func:`_grid_by_quadratic_forms`
  counts fewer flops than the direct sums;
- :meth:`PPCA.masked_log_prob_mean`: :func:`_masked_mean_by_moments`, the data
  mean from the second moment of x.

The SPD inverse and the Woodbury re-centring live in :mod:`mptlml._linalg`.

Precision. float32 sums A_R over the observed set and g over the smaller of
the masked and observed sets (no cancellation); the grid forms and the data
mean are computed in float64. Where a float32 model's latent precisions are
too ill-conditioned for float32 (:func:`mptlml._linalg.latent_dtype`), the
reductions take a latent dtype ``ldt`` of float64: A_R^{-1} and v_j come
from W_R^T W_R summed in float64 (:func:`_latent_inverse`), and the
``(B, K, N)`` terms after the GEMM over the data are formed in float64; that
GEMM stays in float32.

References
----------
Tipping & Bishop (1999), "Probabilistic principal component analysis", JRSS-B.
Moreno-Munoz, Recasens, Hauberg (2023), "On Masked Pre-training and the
Marginal Likelihood", NeurIPS, Sec. 3.1 and App. B (``docs/notes.md``,
"Errata": the paper's conditional variance has a minus sign).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from .._linalg import latent_dtype, spd_inverse, woodbury_posterior
from .._validation import as_tensor, check_data, check_positive_int, make_generator
from ..masks import prefix_masks
from .base import MaskedModel

__all__ = ["PPCA"]

_LOG_2PI = math.log(2.0 * math.pi)


class PPCA(MaskedModel):
    """Probabilistic PCA: x ~ N(mu, W W^T + sigma2 I), with exact masked conditionals.

    Parameters
    ----------
    W : array-like of shape (D, K)
        Loading matrix. Its dtype (float32 or float64) is kept; other inputs
        become float64. Always a trainable ``nn.Parameter``.
    mu : array-like of shape (D,), optional
        Mean (zeros by default).
    sigma2 : float
        Isotropic noise variance, one number > 0 (stored as its log, so it stays
        positive under training).
    learn_mu, learn_sigma2 : bool
        Make ``mu`` / ``sigma2`` trainable parameters (buffers otherwise).

    Examples
    --------
    >>> import torch
    >>> from mptlml.models import PPCA
    >>> model = PPCA(torch.randn(10, 2, dtype=torch.float64), sigma2=0.2)
    >>> x = model.sample(5, generator=0)
    >>> model.log_conditionals(x, torch.tensor([True] * 3 + [False] * 7)).shape
    torch.Size([5, 10])
    """

    def __init__(self, W: Any, mu: Any = None, sigma2: Any = 1.0, *, learn_mu: bool = False,
                 learn_sigma2: bool = False, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        w = as_tensor(W, "W", dtype=dtype)
        if w.ndim != 2 or w.shape[0] < 1 or w.shape[1] < 1:
            raise ValueError(f"W must have shape (D, K) with D, K >= 1; got {tuple(w.shape)}.")
        if not torch.isfinite(w).all():
            raise ValueError("W contains NaN or infinite values.")
        d = w.shape[0]
        m = torch.zeros(d, dtype=w.dtype) if mu is None else as_tensor(mu, "mu", dtype=w.dtype)
        if m.shape != (d,):
            raise ValueError(f"mu must have shape (D,) = ({d},), got {tuple(m.shape)}.")
        if not torch.isfinite(m).all():
            raise ValueError("mu contains NaN or infinite values.")
        s2 = as_tensor(sigma2, "sigma2", dtype=w.dtype)
        if s2.numel() != 1:
            raise ValueError(
                f"sigma2 must be one number (PPCA's noise is isotropic, sigma2 I); got an array "
                f"of shape {tuple(s2.shape)}. A noise variance per dimension is factor "
                "analysis, not PPCA.")
        s2 = s2.reshape(())
        if not bool(torch.isfinite(s2)) or float(s2) <= 0:
            raise ValueError(f"sigma2 must be a finite positive variance, got {float(s2)}.")
        self.num_tokens = d
        self.latent_dim = w.shape[1]
        self.W = nn.Parameter(w)
        if learn_mu:
            self.mu = nn.Parameter(m)
        else:
            self.register_buffer("mu", m)
        if learn_sigma2:
            self.log_sigma2 = nn.Parameter(torch.log(s2))
        else:
            self.register_buffer("log_sigma2", torch.log(s2))

    # ------------------------------------------------------------------ constructors
    @property
    def sigma2(self) -> torch.Tensor:
        """Noise variance sigma2 = exp(log_sigma2)."""
        return self.log_sigma2.exp()

    @classmethod
    def from_sklearn(cls, pca: Any, **kwargs: Any) -> PPCA:
        """Build from a fitted ``sklearn.decomposition.PCA``.

        ``W = components_^T sqrt(explained_variance_ - noise_variance_)``,
        ``mu = mean_``, ``sigma2 = noise_variance_``, so that
        ``model.log_marginal(x)`` equals ``pca.score_samples(x)``. (sklearn's
        variances divide by N - 1, so these are the MLE scaled by N/(N-1).)
        """
        for attr in ("components_", "explained_variance_", "noise_variance_", "mean_"):
            if not hasattr(pca, attr):
                raise TypeError(
                    "from_sklearn needs a fitted sklearn.decomposition.PCA; call pca.fit(x) first."
                )
        noise = float(pca.noise_variance_)
        if noise <= 0:
            raise ValueError(
                "the PCA has noise_variance_ = 0 (n_components equals the data rank); refit with "
                "n_components < min(n_samples, n_features)."
            )
        scale = np.sqrt(np.maximum(pca.explained_variance_ - noise, 0.0))
        w = np.asarray(pca.components_, dtype=np.float64).T * scale
        return cls(w, np.asarray(pca.mean_, dtype=np.float64), noise, **kwargs)

    @classmethod
    def fit(cls, x: Any, k: int, **kwargs: Any) -> PPCA:
        """Closed-form maximum-likelihood PPCA (Tipping & Bishop 1999, eqs. 7-8).

        With the sample covariance S = (1/N) sum_n (x_n - mean)(x_n - mean)^T and
        its eigenpairs (lambda_i, u_i) sorted decreasingly:
        ``sigma2 = mean(lambda_{K+1..D})``, ``W = U_K (Lambda_K - sigma2 I)^{1/2}``.

        Raises
        ------
        ValueError
            If ``k >= D``, or if the centred data have rank <= k (in particular
            N <= k + 1): then sigma2 = 0 and the model is degenerate.
        """
        xt = check_data(x)
        n, d = xt.shape
        k = check_positive_int(k, "k")
        if k >= d:
            raise ValueError(f"k must be smaller than D={d} so that sigma2 is defined; got k={k}.")
        if n <= k + 1:
            raise ValueError(
                f"PPCA.fit needs more than k + 1 = {k + 1} rows: the {n} centred rows span at "
                f"most {n - 1} dimensions, so the maximum-likelihood sigma2 would be 0. Pass "
                f"more rows or a smaller k.")
        x64 = xt.double()
        mean = x64.mean(0)
        xc = x64 - mean
        cov = xc.T @ xc / n
        evals, evecs = torch.linalg.eigh(cov)
        evals, evecs = evals.flip(0), evecs.flip(1)
        # numerical rank of the centred data, as numpy.linalg.matrix_rank counts it
        rank = int((evals > float(evals[0]) * max(n, d) * torch.finfo(torch.float64).eps).sum())
        if rank <= k:
            raise ValueError(
                f"PPCA.fit: the centred data (N={n}, D={d}) have rank {rank} <= k={k}, so the "
                f"maximum-likelihood noise variance sigma2 (the mean of the D - k smallest "
                f"covariance eigenvalues) is 0 and the model is degenerate. Use k < {rank}, or "
                f"data that are not confined to a {rank}-dimensional subspace.")
        sigma2 = evals[k:].mean()
        w = evecs[:, :k] * torch.sqrt((evals[:k] - sigma2).clamp_min(0.0))
        return cls(w.to(xt.dtype), mean.to(xt.dtype), sigma2.to(xt.dtype), **kwargs)

    @classmethod
    def random(cls, num_tokens: int, latent_dim: int, sigma2: float = 1.0, *,
               seed: int | torch.Generator | None = None,
               dtype: torch.dtype = torch.float64, **kwargs: Any) -> PPCA:
        """A PPCA with W ~ N(0, 1) entries and zero mean (the paper's synthetic setting)."""
        g = make_generator(seed)
        d = check_positive_int(num_tokens, "num_tokens")
        k = check_positive_int(latent_dim, "latent_dim")
        w = torch.randn(d, k, generator=g, dtype=torch.float64).to(dtype)
        return cls(w, None, sigma2, **kwargs)

    # ------------------------------------------------------------------ sampling
    @torch.no_grad()
    def sample(self, n: int, *, generator: int | torch.Generator | None = None,
               noise: Literal["independent", "shared"] = "independent") -> torch.Tensor:
        """Draw ``n`` observations.

        ``noise="independent"`` (default) draws eps ~ N(0, sigma2 I_D), the model
        itself. ``noise="shared"`` reproduces the authors' generator: one noise
        value per observation, shared by all D dimensions, with standard
        deviation sigma2 (their ``(1/beta) * randn(N, 1)``); see ``docs/notes.md``,
        "Experiment settings".
        """
        n = check_positive_int(n, "n")
        g = make_generator(generator)
        d, k = self.W.shape
        z = torch.randn(n, k, generator=g, dtype=torch.float64)
        mean = z @ self.W.detach().double().cpu().T + self.mu.detach().double().cpu()
        s2 = float(self.sigma2)
        if noise == "independent":
            eps = math.sqrt(s2) * torch.randn(n, d, generator=g, dtype=torch.float64)
        elif noise == "shared":
            eps = s2 * torch.randn(n, 1, generator=g, dtype=torch.float64)
        else:
            raise ValueError(f"noise must be 'independent' or 'shared', got {noise!r}.")
        return (mean + eps).to(dtype=self.dtype, device=self.device)

    # ------------------------------------------------------------------ exact quantities
    def covariance(self) -> torch.Tensor:
        """Marginal covariance W W^T + sigma2 I, ``(D, D)`` (for references and tests)."""
        return self.W @ self.W.T + self.sigma2 * torch.eye(self.num_tokens, dtype=self.dtype,
                                                             device=self.device)

    def _recentre(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Posterior mean z* given all tokens, residuals e = x - mu - W z*, and A (float64)."""
        y = x.double() - self.mu.double()
        return woodbury_posterior(self.W.double(), self.sigma2.double(), y)

    def _split(self, x: torch.Tensor) -> tuple[torch.dtype, torch.Tensor, torch.Tensor,
                                               torch.Tensor, torch.Tensor, torch.dtype]:
        """dtype, W, sigma2, z* and e of :meth:`_recentre` in the model's dtype, and
        the dtype of the K x K latent terms (:meth:`_latent_dtype`)."""
        def split() -> tuple[torch.dtype, torch.Tensor, torch.Tensor, torch.Tensor,
                             torch.Tensor, torch.dtype]:
            ldt = self._latent_dtype()
            zs, e, _ = self._cached(x, "recentre", lambda: self._recentre(x))
            dtype = self.dtype
            return dtype, self.W, self.sigma2, zs.to(dtype), e.to(dtype), ldt

        return self._cached(x, "split", split)

    def _latent_dtype(self) -> torch.dtype:
        """dtype of the K x K latent terms (:func:`mptlml._linalg.latent_dtype`)."""
        return latent_dtype(self.W.detach(), float(self.sigma2.detach()), self.dtype, "PPCA")

    def marginal(self, dims: torch.Tensor) -> PPCA:
        """PPCA of ``x[:, dims]``: ``N(mu_C, W_C W_C^T + sigma2 I)`` (a Gaussian's marginal)."""
        idx = torch.as_tensor(dims, dtype=torch.long, device=self.W.device)
        return PPCA(self.W.detach()[idx], self.mu.detach()[idx], self.sigma2.detach())

    def _log_marginal(self, x: torch.Tensor) -> torch.Tensor:
        """log N(x; mu, W W^T + sigma2 I) via Woodbury and the matrix determinant lemma.

        ``(x-mu)^T C^{-1} (x-mu) = |x - mu - W z*|^2 / sigma2 + |z*|^2`` and
        ``log|C| = D log sigma2 + log|I + W^T W / sigma2|``.
        """
        zs, e, a = self._cached(x, "recentre", lambda: self._recentre(x))
        s2 = self.sigma2.double()
        quad = (e * e).sum(-1) / s2 + (zs * zs).sum(-1)
        logdet = self.num_tokens * torch.log(s2) + torch.logdet(a)
        return (-0.5 * (self.num_tokens * _LOG_2PI + logdet + quad)).to(self.dtype)

    def block_cost(self, num_data: int, shared: bool) -> int:
        """Elements of temporaries per mask in :meth:`masked_log_prob` (sizes the blocks)."""
        k = self.latent_dim
        if shared:
            return 4 * self.num_tokens + 4 * num_data * (k + 1)
        return num_data * self.num_tokens

    # ------------------------------------------------------------------ fast reductions
    def masked_log_prob(self, x: torch.Tensor, mask: torch.Tensor,
                        generator: torch.Generator | None) -> torch.Tensor:
        """Sum of log p(x_j | x_R) over the masked tokens of each mask: ``(B, N)``.

        Same quantity as ``_log_conditionals(...).sum(-1)``, computed without
        the per-token array when masks are shared (:func:`_shared_masked_sum`)
        and with fewer passes over it when they are not
        (:func:`_per_datum_masked_sum`).
        """
        _, w, s2, zs, e, ldt = self._split(x)
        if mask.ndim == 2:  # (B, D): shared masks, no (B, N, D) array
            columns = self._cached(x, "columns", lambda: _gemm_columns(w, e))
            return _shared_masked_sum(w, s2, zs, e, columns, mask, ldt)
        return _per_datum_masked_sum(w, s2, zs, e, mask, ldt)

    def nested_masked_log_prob(self, x: torch.Tensor, orders: torch.Tensor,
                               generator: torch.Generator | None) -> torch.Tensor:
        """Masked sums for every prefix of each order: ``(P, D, N)``.

        Shared orders ``(P, D)`` by prefix sums along the order
        (:func:`_nested_masked_sum`); per-datum orders ``(P, N, D)`` take the
        generic path.
        """
        if orders.ndim != 2:
            return super().nested_masked_log_prob(x, orders, generator)
        _, w, s2, zs, e, ldt = self._split(x)
        columns = self._cached(x, "columns", lambda: _gemm_columns(w, e))
        return _nested_masked_sum(w, s2, zs, e, columns, orders, ldt)

    def grid_masked_log_prob(self, x: torch.Tensor, mask: torch.Tensor, weight: torch.Tensor,
                             generator: torch.Generator | None, *, data_means: bool = True
                             ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Grid sums (see :meth:`MaskedModel.grid_masked_log_prob`) by quadratic forms.

        With shared masks, and when it costs fewer flops than scoring every
        (mask, datum) pair (:func:`_grid_by_quadratic_forms`), each grid row's
        weighted sum is one D x D quadratic form in the residuals e_n, in
        float64 (:func:`_grid_quadratic_forms`); otherwise the generic sum of
        :meth:`masked_log_prob`.
        """
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in self.parameters())
        if mask.ndim == 3 and not grad and _grid_by_quadratic_forms(
                self.num_tokens, self.latent_dim, mask.shape[0], mask.shape[1], x.shape[0],
                data_means):
            f64 = torch.float64
            self._latent_dtype()  # refuses a model no dtype can score
            _, e, _ = self._cached(x, "recentre", lambda: self._recentre(x))
            return _grid_quadratic_forms(self.W.to(f64), self.sigma2.to(f64), e, mask, weight,
                                         data_means)
        return super().grid_masked_log_prob(x, mask, weight, generator, data_means=data_means)

    def masked_log_prob_mean(self, x: torch.Tensor, mask: torch.Tensor,
                             generator: torch.Generator | None) -> torch.Tensor:
        """Mean over the data of :meth:`masked_log_prob` for shared masks: ``(B,)`` float64.

        From the data's second moment in O(D^2 K) per mask, independent of N
        (:func:`_masked_mean_by_moments`).
        """
        if mask.ndim != 2:
            return super().masked_log_prob_mean(x, mask, generator)
        f64 = torch.float64
        self._latent_dtype()  # refuses a model no dtype can score
        return _masked_mean_by_moments(self.W.to(f64), self.sigma2.to(f64), self.mu.to(f64),
                                       x, mask)

    # ------------------------------------------------------------------ reference path
    def _log_conditionals(self, x: torch.Tensor, mask: torch.Tensor,
                          generator: torch.Generator | None) -> torch.Tensor:
        """Reference conditionals, token by token (the closed form of the module docstring)."""
        dtype, w, s2, zs, e, ldt = self._split(x)
        d, k = w.shape
        r = (~mask).to(dtype)  # observed indicator
        a_inv = _latent_inverse(w, s2, r, ldt)[0]  # A_R^{-1}, W_R^T W_R over observed dims
        if mask.ndim == 2:  # (B, D): masks shared across the data
            b, n = mask.shape[0], x.shape[0]
            ew = (e.T[:, :, None] * w[:, None, :]).reshape(d, n * k)
            h = (r @ ew).reshape(b, n, k) / s2
            u = torch.einsum("bkl,bnl->bnk", a_inv, (h - zs).to(ldt)).to(dtype)
            var = s2 + torch.einsum("dk,bkl,dl->bd", w.to(ldt), a_inv, w.to(ldt))[:, None, :]
        else:  # (B, N, D): one mask per datum
            h = (r * e) @ w / s2
            u = (a_inv @ (h - zs).to(ldt)[..., None])[..., 0].to(dtype)
            var = s2 + torch.einsum("dk,bnkl,dl->bnd", w.to(ldt), a_inv, w.to(ldt))
        var = var.to(dtype)
        res = e - u @ w.T
        logp = -0.5 * (_LOG_2PI + torch.log(var) + res * res / var)
        m = mask[:, None, :] if mask.ndim == 2 else mask
        return torch.where(m, logp, torch.zeros((), dtype=dtype, device=logp.device))


# ---------------------------------------- fast reductions (pure functions, notation above)
def _outer_rows(w: torch.Tensor) -> torch.Tensor:
    """Row-wise outer products w_j w_j^T of ``W`` (D, K), flattened: ``(D, K^2)``."""
    d, k = w.shape
    return (w[:, :, None] * w[:, None, :]).reshape(d, k * k)


def _ew_columns(w: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """Columns e_nj w_jk of the masked sums, k-major: ``(D, K N)``, contiguous."""
    (d, k), n = w.shape, e.shape[0]
    return (w[:, :, None] * e.T[:, None, :]).reshape(d, k * n)


def _sum_after(t: torch.Tensor) -> torch.Tensor:
    """Sum over the positions strictly after each one along dim 1 (0 at the last)."""
    rest = t[:, 1:].flip(1).cumsum(1).flip(1)
    return torch.cat([rest, torch.zeros_like(t[:, :1])], dim=1)


def _times_wt(coef: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``coef @ W^T`` for ``coef`` (B, K): ``(B, D)``; K outer products when K is small.

    A GEMM with an inner dimension of 2 runs far below peak; K rank-one
    updates over the (B, D) output are cheaper up to K = 4.
    """
    k = coef.shape[1]
    if k > 4:
        return coef @ w.T
    out = torch.outer(coef[:, 0], w[:, 0])
    for i in range(1, k):
        out = torch.addr(out, coef[:, i], w[:, i])
    return out


def _gemm_columns(w: torch.Tensor, e: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GEMM columns ``[w w^T | e w | e^2]``, with views of their first two blocks.

    Returns w_j w_j^T ``(D, K^2)``, e_nj w_jk ``(D, K N)`` and the whole
    ``(D, K^2 + K N + N)`` matrix.
    """
    k, n = w.shape[1], e.shape[0]
    et = e.T.contiguous()  # cat of a transposed view copies element by element
    rhs = torch.cat([_outer_rows(w), _ew_columns(w, e), et * et], dim=1)
    return rhs[:, :k * k], rhs[:, k * k:-n], rhs


def _shared_sum(e: torch.Tensor, s2: torch.Tensor, ww: torch.Tensor, rhs: torch.Tensor,
                m: torch.Tensor, a_inv: torch.Tensor, g: torch.Tensor,
                var: torch.Tensor | None = None) -> torch.Tensor:
    """Masked sums of log p(x_j | x_R) for shared masks from A_R^-1 and g = W_M^T e_M.

    ``m`` is the ``(B, D)`` masked indicator, ``a_inv`` ``(B, K, K)``, ``g``
    ``(B, K N)`` (k-major) and ``rhs`` the columns ``[w w^T | e w | e^2]``.
    Returns ``(B, N)``: ``-0.5 (sum_j m_j (log 2 pi + log v_j) + quad)`` with
    the expanded quadratic form of the module docstring. ``a_inv`` and the
    variances ``var`` (computed here when not given) may be float64 for a
    float32 model (:func:`_latent_inverse`): the GEMM over the data stays in
    the dtype of ``rhs``, the ``(B, K, N)`` terms after it (where the
    expansion cancels) follow ``a_inv``.
    """
    b, d = m.shape
    n = e.shape[0]
    k = a_inv.shape[-1]
    dtype = rhs.dtype
    if var is None:
        # (B, D): v_j = s2 + w_j^T A^-1 w_j, s2 folded into the GEMM (no pass of its own)
        var = torch.cat([a_inv.reshape(b, k * k), s2.expand(b, 1)], dim=1) @ torch.cat(
            [ww.T, torch.ones_like(ww[:, :1]).T], dim=0)
    ldt = a_inv.dtype  # float64 for a float32 model with float64 latent terms
    c = m / var
    cb = (c.to(dtype) @ rhs).to(ldt)  # sum_j c_j [w_j w_j^T | e_j w_j | e_j^2]
    cww, f, quad = cb[:, :k * k].reshape(b, k, k), cb[:, k * k:-n], cb[:, -n:]
    pm = a_inv / s2
    g = g.reshape(b, k, n).to(ldt)
    t = torch.baddbmm(torch.bmm(pm @ cww @ pm, g), pm, f.reshape(b, k, n),
                      alpha=2.0)  # (B, K, N)
    for i in range(k):  # contiguous adds over K, no strided reduce
        quad = torch.addcmul(quad, g[:, i], t[:, i])
    logv = torch.linalg.vecdot(torch.log(var), m.to(ldt))  # (B,): sum_j m_j log v_j
    return (-0.5 * ((m.sum(-1) * _LOG_2PI + logv)[:, None] + quad)).to(dtype)


def _latent_inverse(w: torch.Tensor, s2: torch.Tensor, observed: torch.Tensor,
                    dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """A_R^{-1} ``(..., K, K)`` and v_j ``(..., D)`` in ``dtype``; ``observed`` is ``(..., D)``.

    W_R^T W_R is summed in ``dtype`` from the outer products w_j w_j^T
    (exact in float64 for a float32 ``w``), so a float32 model gets float64
    latent terms where ``I + W_R^T W_R / sigma2`` is too ill-conditioned to
    be represented in float32 (observed sets that cannot pin the latent space).
    """
    d, k = w.shape
    wl, s2l = w.to(dtype), s2.to(dtype)
    ww = _outer_rows(wl)
    obs = observed.to(dtype).reshape(-1, d) @ ww
    eye = torch.eye(k, dtype=dtype, device=w.device)
    a_inv = spd_inverse(eye + obs.reshape(-1, k, k) / s2l)
    var = s2l + a_inv.reshape(-1, k * k) @ ww.T
    return a_inv.reshape(*observed.shape[:-1], k, k), var.reshape(observed.shape)


def _shared_masked_sum(w: torch.Tensor, s2: torch.Tensor, zs: torch.Tensor, e: torch.Tensor,
                       columns: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                       mask: torch.Tensor, ldt: torch.dtype) -> torch.Tensor:
    """sum_{j in M} log p(x_nj | x_nR) for shared masks ``(B, D)``: ``(B, N)``.

    ``columns`` are :func:`_gemm_columns` of ``(w, e)``. float64 takes
    W_M^T W_M and g from one GEMM over the masked set (rounding far below any
    tolerance: fewest passes). float32 sums A_R over the observed set (a sum of
    positive terms: no cancellation) and g over the smaller of the masked and
    observed sets, ``g = (m - f) @ [e w] + f sigma2 z*`` with f = [M > D/2]
    (fewer rounded terms, no cancellation against z*).
    """
    dtype = w.dtype
    d, k = w.shape
    n = e.shape[0]
    ww, ew, rhs = columns
    m = mask.to(dtype)  # masked indicator
    eye = torch.eye(k, dtype=dtype, device=w.device)
    if dtype == torch.float64:
        mg = m @ rhs[:, :k * k + k * n]  # [W_M^T W_M | W_M^T e_M], one read of m
        obs, g = ww.sum(0) - mg[:, :k * k], mg[:, k * k:]
    else:
        precise = ldt != dtype  # A_R too ill-conditioned for float32
        if not precise:
            obs = (1.0 - m) @ ww
        flag = (m.sum(-1) > d / 2).to(dtype)
        g = torch.addr(m.sub(flag[:, None]) @ ew, flag, (s2 * zs).T.reshape(k * n))
        if precise:
            a_inv, var = _latent_inverse(w, s2, 1.0 - m, ldt)
            return _shared_sum(e, s2, ww, rhs, m, a_inv, g, var)
    a_inv = spd_inverse(eye + obs.reshape(-1, k, k) / s2)
    return _shared_sum(e, s2, ww, rhs, m, a_inv, g)


def _per_datum_masked_sum(w: torch.Tensor, s2: torch.Tensor, zs: torch.Tensor, e: torch.Tensor,
                          mask: torch.Tensor, ldt: torch.dtype) -> torch.Tensor:
    """sum_{j in M} log p(x_nj | x_nR) for one mask per datum ``(B, N, D)``: ``(B, N)``.

    Forms the ``(B, N, D)`` residuals once, in place when no gradient is
    needed. With a latent dtype ``ldt`` other than the model's, A_R^{-1}, v_j
    and u come from :func:`_latent_inverse` in it.
    """
    dtype = w.dtype
    d, k = w.shape
    m = mask.to(dtype)
    num_masked = m.sum(-1)
    r = 1.0 - m  # observed indicator
    if ldt == dtype:
        eye = torch.eye(k, dtype=dtype, device=w.device)
        ww = _outer_rows(w)
        g = (r.reshape(-1, d) @ ww).reshape(*mask.shape[:-1], k, k)  # W_R^T W_R, observed
        a_inv = spd_inverse(eye + g / s2)
        var = s2 + a_inv.reshape(-1, k * k) @ ww.T  # v_j = s2 + w_j^T A^-1 w_j
        var = var.reshape(mask.shape)
    else:
        a_inv, var = _latent_inverse(w, s2, r, ldt)
        var = var.to(dtype)
    h = (r * e) @ w / s2
    u = (a_inv @ (h - zs).to(ldt)[..., None])[..., 0].to(dtype)
    inplace = not (torch.is_grad_enabled() and (w.requires_grad or s2.requires_grad
                                                or e.requires_grad))
    res = e - u @ w.T
    if inplace:
        res.square_().div_(var).add_(var.log_()).mul_(m)
        terms = res
    else:
        terms = m * (res * res / var + torch.log(var))
    return -0.5 * (num_masked * _LOG_2PI + terms.sum(-1))


def _nested_masked_sum(w: torch.Tensor, s2: torch.Tensor, zs: torch.Tensor, e: torch.Tensor,
                       columns: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                       orders: torch.Tensor, ldt: torch.dtype) -> torch.Tensor:
    """Masked sums for every prefix of each shared order ``(P, D)``: ``(P, D, N)``.

    Along an order pi the observed set of the mask of size M is pi[M:], so
    W_R^T W_R for all M is one suffix sum of w_i w_i^T, and g = W_M^T e_M one
    prefix sum of e_i w_i (a suffix sum subtracted from sigma2 z* past
    M = D/2): no GEMM over the tokens for them. With a latent dtype ``ldt``
    other than the model's, the suffix sums, A_R^{-1} and v_j are computed in it.
    """
    dtype = w.dtype
    d, k = w.shape
    n, p = e.shape[0], orders.shape[0]
    ww, ew, rhs = columns
    o = orders.to(w.device)
    wwl, s2l = (ww, s2) if ldt == dtype else (_outer_rows(w.to(ldt)), s2.to(ldt))
    obs_ww = _sum_after(wwl[o])  # size M (row M-1): W_R^T W_R over R = pi[M:]
    eye = torch.eye(k, dtype=ldt, device=w.device)
    a_inv = spd_inverse(eye + obs_ww.reshape(p * d, k, k) / s2l)
    var = None if ldt == dtype else s2l + a_inv.reshape(p * d, k * k) @ wwl.T
    h = d // 2  # sizes 1..h: prefix sums; h+1..D: sigma2 z* minus suffix sums
    ewp = ew[o]  # (P, D, K N): rows in the order's sequence
    g = torch.cat([ewp[:, :h].cumsum(1),
                   (s2 * zs).T.reshape(1, 1, k * n) - _sum_after(ewp[:, h:])], dim=1)
    m = prefix_masks(o).to(dtype).reshape(p * d, d)
    out = _shared_sum(e, s2, ww, rhs, m, a_inv, g.reshape(p * d, k * n), var)
    return out.reshape(p, d, n)


def _grid_by_quadratic_forms(num_tokens: int, latent_dim: int, rows: int, cols: int,
                             num_data: int, data_means: bool) -> bool:
    """Whether :func:`_grid_quadratic_forms` costs fewer flops than the direct sums.

    Direct: GEMMs of the masks against ``[w w^T | e w | e^2]``, about
    2 B D N (2K + 1), plus O(B N K) after them. Quadratic forms: two (one
    without ``data_means``) batched GEMMs of 2 B K D^2, the forms 2 A N D^2,
    plus O(B D K). So the forms win when D is small next to N.
    """
    d, k = num_tokens, latent_dim
    b = rows * cols
    direct = b * num_data * (2 * d * (2 * k + 1) + 10 * k)
    forms = b * d * (2 * k * d * (1 + int(data_means)) + 10 * k) + 2 * rows * num_data * d * d
    return forms < direct


def _grid_quadratic_forms(w: torch.Tensor, s2: torch.Tensor, e: torch.Tensor, mask: torch.Tensor,
                          weight: torch.Tensor, data_means: bool
                          ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Grid sums for shared masks ``(A, C, D)`` through one D x D form per row.

    ``w``, ``s2`` and the residuals ``e`` are float64 (the expanded form
    cancels; the arrays are small). For one mask, u = -P g with
    g = W_M^T e = R^T e, R = (m o W), so the masked sum is
    ``const - 0.5 e^T (diag(c) + L^T R^T) e`` with L = H R^T + 2 P (c o W)^T,
    H = P C P. Summed over a grid row with weights omega::

        rows[a, n] = sum_c omega k_c - 0.5 (sum_c omega c_c . e_n^2
                     + e_n^T G_a e_n),   G_a = sum_c L_c^T (omega R_c)^T,

    and ``cols`` uses sum_a omega L^T R^T contracted with the data second
    moment (1/N) sum_n e_n e_n^T. Cost: batched GEMMs of 2 B K D^2 and
    2 A N D^2 flops and passes over (B, D) arrays, against 2 B D N (2K + 1)
    and passes over (B, N, K) arrays for the direct sums.
    """
    f64 = torch.float64
    d, k = w.shape
    n = e.shape[0]
    a, c = mask.shape[:2]
    b = a * c
    m = mask.reshape(b, d).to(f64)
    omega = weight.reshape(b).to(dtype=f64, device=w.device)
    ww = _outer_rows(w)
    eye = torch.eye(k, dtype=f64, device=w.device)
    a_inv = spd_inverse(eye + ((1.0 - m) @ ww).reshape(b, k, k) / s2)
    var = s2 + a_inv.reshape(b, k * k) @ ww.T  # (B, D): v_j = s2 + w_j^T A^-1 w_j
    cm = m / var
    const = -0.5 * (m.sum(-1) * _LOG_2PI + torch.log(var).mul_(m).sum(-1))  # (B,)
    pm = a_inv / s2
    h = pm @ (cm @ ww).reshape(b, k, k) @ pm
    mw = m * omega[:, None]
    g_rows = torch.zeros(a, d, d, dtype=f64, device=w.device)
    g_cols = torch.zeros(c, d, d, dtype=f64, device=w.device) if data_means else None
    for i in range(k):  # row i of L and of R, each (B, D)
        left = _times_wt(h[:, i], w).mul_(m).addcmul_(cm, _times_wt(2.0 * pm[:, i], w))
        left, right = left.view(a, c, d), (mw * w[:, i]).view(a, c, d)
        g_rows.baddbmm_(left.transpose(1, 2), right)
        if g_cols is not None:
            g_cols.baddbmm_(left.permute(1, 2, 0), right.transpose(0, 1))
    et = e.T.contiguous()  # (D, N)
    cw = (cm * omega[:, None]).view(a, c, d)
    quad = cw.sum(1) @ (et * et) + (g_rows.view(a * d, d) @ et).view(a, d, n).mul_(et).sum(1)
    weighted = (omega * const).view(a, c)
    rows = weighted.sum(1)[:, None] - 0.5 * quad
    if g_cols is None:
        return rows, None
    second = et @ e / n  # (1/N) sum_n e_n e_n^T
    cols = weighted.sum(0) - 0.5 * (cw.sum(0) @ torch.diagonal(second)
                                    + (g_cols * second).sum((1, 2)))
    return rows, cols


def _masked_mean_by_moments(w: torch.Tensor, s2: torch.Tensor, mu: torch.Tensor,
                            x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the data of the masked sums for shared masks ``(B, D)``: ``(B,)`` float64.

    For a mask with observed set R the residual of token j is linear in
    ``y = x - mu``::

        x_j - E[x_j | x_R] = y_j - sum_{i in R} (w_i^T v_j) y_i,
        v_j = A_R^{-1} w_j / sigma2

    (Woodbury: ``C_jR C_RR^{-1} = v_j^T W_R^T``), so its mean square over the
    data is ``c_j^T S c_j`` with ``S = (1/N) sum_n y_n y_n^T``, computed once
    for all masks as the data covariance plus ``(xbar - mu)(xbar - mu)^T``.
    The cost per mask is O(D^2 K), independent of N. ``w``, ``s2``, ``mu``
    are float64; gradients flow through them, not through ``x``.
    """
    f64 = torch.float64
    d, k = w.shape
    with torch.no_grad():
        xd = x.detach().to(f64)
        xbar = xd.mean(0)
        xc = xd - xbar
        cov = xc.T @ xc / xd.shape[0]
    dm = xbar - mu
    sy = cov + dm[:, None] * dm[None, :]  # (1/N) sum_n (x_n - mu)(x_n - mu)^T
    m = mask.to(f64)
    r = 1.0 - m
    ww = _outer_rows(w)
    eye = torch.eye(k, dtype=f64, device=w.device)
    a_inv = spd_inverse(eye + (r @ ww).reshape(-1, k, k) / s2)  # (B, K, K)
    v = a_inv @ w.T / s2  # (B, K, D): column j is v_j
    var = s2 * (1.0 + (w.T[None] * v).sum(1))  # (B, D): s2 + w_j^T A^-1 w_j
    coef = torch.eye(d, dtype=f64, device=w.device) - r[:, :, None] * (w @ v)  # (B, D, D)
    msq = (coef * (sy @ coef)).sum(1)  # (B, D): mean squared residual of each token
    terms = m * (torch.log(var) + msq / var)
    return -0.5 * (m.sum(-1) * _LOG_2PI + terms.sum(-1))
