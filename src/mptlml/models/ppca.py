"""Probabilistic PCA with closed-form masked conditionals.

Model (Tipping & Bishop, 1999)::

    z ~ N(0, I_K),   x | z ~ N(W z + mu, sigma2 I_D),   so  x ~ N(mu, W W^T + sigma2 I).

Masked conditionals go through the K-dimensional latent posterior given the
observed tokens R (Woodbury), never through a D x D inverse::

    A_R   = I_K + W_R^T W_R / sigma2
    m_R   = A_R^{-1} W_R^T (x_R - mu_R) / sigma2
    x_j | x_R ~ N(mu_j + w_j^T m_R,  sigma2 + w_j^T A_R^{-1} w_j).

For accuracy in float32 the data are re-centred on z* (the posterior mean
given all D tokens) with residuals e = x - mu - W z*. Since W^T e = sigma2 z*,

    x_j - E[x_j | x_R] = e_j - w_j^T u,   u = -A_R^{-1} g / sigma2,
    g = W_M^T e_M = sigma2 z* - W_R^T e_R.

This module holds the model, its constructors, sampling, the exact LML and
the reference conditionals (:meth:`PPCA._log_conditionals`). The fast
reductions the estimators call (:meth:`PPCA.masked_log_prob`,
:meth:`PPCA.grid_masked_log_prob`, :meth:`PPCA.nested_masked_log_prob`,
:meth:`PPCA.masked_log_prob_mean`) are pure functions in
:mod:`mptlml.models._ppca_reductions`, whose docstring gives their algebra
and cost; the SPD inverse and the Woodbury re-centring live in
:mod:`mptlml._linalg`.

References
----------
Tipping & Bishop (1999), "Probabilistic principal component analysis", JRSS-B.
Moreno-Munoz, Recasens, Hauberg (2023), "On Masked Pre-training and the
Marginal Likelihood", NeurIPS, Sec. 3.1 and App. B (see the errata in
``shared/paper/NOTES.md``: the conditional variance has a minus sign).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from .._linalg import latent_dtype, woodbury_posterior
from .._validation import as_tensor, check_data, check_positive_int, make_generator
from . import _ppca_reductions as red
from .base import MaskedModel

__all__ = ["PPCA"]

_LOG_2PI = red.LOG_2PI


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
        deviation sigma2 (their ``(1/beta) * randn(N, 1)``); see NOTES.md.
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

    def _columns(self, x: torch.Tensor, w: torch.Tensor, e: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:func:`~mptlml.models._ppca_reductions.gemm_columns`, once per reuse scope."""
        return self._cached(x, "columns", lambda: red.gemm_columns(w, e))

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
        the per-token array when masks are shared
        (:func:`~mptlml.models._ppca_reductions.shared_masked_sum`) and with
        fewer passes over it when they are not
        (:func:`~mptlml.models._ppca_reductions.per_datum_masked_sum`).
        """
        _, w, s2, zs, e, ldt = self._split(x)
        if mask.ndim == 2:  # (B, D): shared masks, no (B, N, D) array
            return red.shared_masked_sum(w, s2, zs, e, self._columns(x, w, e), mask, ldt)
        return red.per_datum_masked_sum(w, s2, zs, e, mask, ldt)

    def nested_masked_log_prob(self, x: torch.Tensor, orders: torch.Tensor,
                               generator: torch.Generator | None) -> torch.Tensor:
        """Masked sums for every prefix of each order: ``(P, D, N)``.

        Shared orders ``(P, D)`` by prefix sums along the order
        (:func:`~mptlml.models._ppca_reductions.nested_masked_sum`); per-datum
        orders ``(P, N, D)`` take the generic path.
        """
        if orders.ndim != 2:
            return super().nested_masked_log_prob(x, orders, generator)
        _, w, s2, zs, e, ldt = self._split(x)
        return red.nested_masked_sum(w, s2, zs, e, self._columns(x, w, e), orders, ldt)

    def grid_masked_log_prob(self, x: torch.Tensor, mask: torch.Tensor, weight: torch.Tensor,
                             generator: torch.Generator | None, *, data_means: bool = True
                             ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Grid sums (see :meth:`MaskedModel.grid_masked_log_prob`) by quadratic forms.

        With shared masks, and when it is cheaper than scoring every (mask,
        datum) pair (:meth:`_grid_by_quadratic_forms`), each grid row's
        weighted sum is one D x D quadratic form in the residuals e_n; otherwise
        the generic sum of :meth:`masked_log_prob`.
        """
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in self.parameters())
        if mask.ndim == 3 and not grad and self._grid_by_quadratic_forms(
                mask.shape[0], mask.shape[1], x.shape[0], data_means):
            return self._grid_quadratic_forms(x, mask, weight, data_means)
        return super().grid_masked_log_prob(x, mask, weight, generator, data_means=data_means)

    def _grid_by_quadratic_forms(self, rows: int, cols: int, num_data: int,
                                 data_means: bool) -> bool:
        """:func:`~mptlml.models._ppca_reductions.grid_by_quadratic_forms` for this model."""
        return red.grid_by_quadratic_forms(self.num_tokens, self.latent_dim, rows, cols,
                                           num_data, data_means)

    def _grid_quadratic_forms(self, x: torch.Tensor, mask: torch.Tensor, weight: torch.Tensor,
                              data_means: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:func:`~mptlml.models._ppca_reductions.grid_quadratic_forms`, in float64."""
        f64 = torch.float64
        self._latent_dtype()  # refuses a model no dtype can score
        _, e, _ = self._cached(x, "recentre", lambda: self._recentre(x))
        return red.grid_quadratic_forms(self.W.to(f64), self.sigma2.to(f64), e, mask, weight,
                                        data_means)

    def masked_log_prob_mean(self, x: torch.Tensor, mask: torch.Tensor,
                             generator: torch.Generator | None) -> torch.Tensor:
        """Mean over the data of :meth:`masked_log_prob` for shared masks: ``(B,)`` float64.

        From the data's second moment in O(D^2 K) per mask, independent of N
        (:func:`~mptlml.models._ppca_reductions.masked_mean_by_moments`).
        """
        if mask.ndim != 2:
            return super().masked_log_prob_mean(x, mask, generator)
        f64 = torch.float64
        self._latent_dtype()  # refuses a model no dtype can score
        return red.masked_mean_by_moments(self.W.to(f64), self.sigma2.to(f64), self.mu.to(f64),
                                          x, mask)

    # ------------------------------------------------------------------ reference path
    def _log_conditionals(self, x: torch.Tensor, mask: torch.Tensor,
                          generator: torch.Generator | None) -> torch.Tensor:
        """Reference conditionals, token by token (the closed form of the module docstring)."""
        dtype, w, s2, zs, e, ldt = self._split(x)
        d, k = w.shape
        r = (~mask).to(dtype)  # observed indicator
        a_inv = red.latent_inverse(w, s2, r, ldt)[0]  # A_R^{-1}, W_R^T W_R over observed dims
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
