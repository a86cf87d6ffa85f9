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
    g = W_M^T e_M = sigma2 z* - W_R^T e_R,

In float32, g is summed over the smaller of the masked and observed sets
(fewer rounded terms, no cancellation against z*) and W_R^T W_R over the
observed dimensions only (a sum of positive terms); float64 takes both from
one GEMM over the masked set, whose rounding is far below any tolerance.

The sum over the masked tokens that the estimators need
(:meth:`PPCA.masked_log_prob`) never forms a ``(T, N, D)`` array when the
masks are shared across the data: with c_j = m_j / v_j (m the masked
indicator, v_j the conditional variance, which then depends on the mask only),
P = A_R^{-1} / sigma2, C = sum_j c_j w_j w_j^T and f = sum_j c_j e_j w_j,

    sum_j m_j (e_j - w_j^T u)^2 / v_j = sum_j c_j e_j^2 + g^T P C P g + 2 g^T P f.

Cost per block of T shared masks: GEMMs of the T x D indicator matrices
against ``[w w^T | e w | e^2]`` (about 2 T D N (2K + 1) flops) plus T K x K
inverses. When D is small next to N, a grid of shared masks (draws x sizes,
:meth:`PPCA.grid_masked_log_prob`) is summed per draw as one D x D quadratic
form in e_n instead (2 T K D^2 + 2 A N D^2 flops for A draws). Nested masks
(the prefixes of one order, :meth:`PPCA.nested_masked_log_prob`) get
W_R^T W_R and g for every size from suffix and prefix sums along the order,
leaving one GEMM.

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

from .._validation import as_tensor, check_data, check_positive_int, make_generator
from ..masks import prefix_masks
from .base import MaskedModel

__all__ = ["PPCA"]

_LOG_2PI = math.log(2.0 * math.pi)


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


def _spd_inverse(a: torch.Tensor) -> torch.Tensor:
    """Inverse of a batch of small symmetric positive-definite matrices ``(..., K, K)``.

    Closed forms for K = 1 and 2 (batched LAPACK on tiny matrices is ~40x
    slower), a Cholesky inverse otherwise.
    """
    k = a.shape[-1]
    if k == 1:
        return 1.0 / a
    if k == 2:
        p, q, s = a[..., 0, 0], a[..., 0, 1], a[..., 1, 1]
        det = p * s - q * q
        row0 = torch.stack([s, -q], dim=-1)
        row1 = torch.stack([-q, p], dim=-1)
        return torch.stack([row0, row1], dim=-2) / det[..., None, None]
    return torch.cholesky_inverse(torch.linalg.cholesky(a))


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
        Isotropic noise variance, > 0 (stored as its log, so it stays positive
        under training).
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
        s2 = as_tensor(sigma2, "sigma2", dtype=w.dtype).reshape(())
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
        """
        xt = check_data(x)
        n, d = xt.shape
        k = check_positive_int(k, "k")
        if k >= d:
            raise ValueError(f"k must be smaller than D={d} so that sigma2 is defined; got k={k}.")
        x64 = xt.double()
        mean = x64.mean(0)
        xc = x64 - mean
        cov = xc.T @ xc / n
        evals, evecs = torch.linalg.eigh(cov)
        evals, evecs = evals.flip(0), evecs.flip(1)
        sigma2 = evals[k:].mean().clamp_min(1e-12)
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
        w = self.W.double()
        s2 = self.sigma2.double()
        y = x.double() - self.mu.double()
        a = torch.eye(self.latent_dim, dtype=torch.float64, device=x.device) + w.T @ w / s2
        zs = torch.linalg.solve(a, (y @ w).T / s2).T
        e = y - zs @ w.T
        return zs, e, a

    def _split(self, x: torch.Tensor) -> tuple[torch.dtype, torch.Tensor, torch.Tensor,
                                               torch.Tensor, torch.Tensor]:
        """dtype, W, sigma2, z* and e of :meth:`_recentre` in the model's dtype."""
        def split() -> tuple[torch.dtype, torch.Tensor, torch.Tensor, torch.Tensor,
                             torch.Tensor]:
            zs, e, _ = self._cached(x, "recentre", lambda: self._recentre(x))
            return self.dtype, self.W, self.sigma2, zs.to(self.dtype), e.to(self.dtype)

        return self._cached(x, "split", split)

    def _columns(self, x: torch.Tensor, w: torch.Tensor, e: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """GEMM columns ``[w w^T | e w | e^2]`` of ``x``, with views of their first blocks.

        Returns w_j w_j^T ``(D, K^2)``, e_nj w_jk ``(D, K N)`` and the whole
        ``(D, K^2 + K N + N)`` matrix, computed once per :meth:`reuse_data` scope.
        """
        def columns() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            k, n = w.shape[1], e.shape[0]
            et = e.T.contiguous()  # cat of a transposed view copies element by element
            rhs = torch.cat([_outer_rows(w), _ew_columns(w, e), et * et], dim=1)
            return rhs[:, :k * k], rhs[:, k * k:-n], rhs

        return self._cached(x, "columns", columns)

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

    @staticmethod
    def _shared_sum(e: torch.Tensor, s2: torch.Tensor, ww: torch.Tensor, rhs: torch.Tensor,
                    m: torch.Tensor, a_inv: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """Masked sums of log p(x_j | x_R) for shared masks from A_R^-1 and g = W_M^T e_M.

        ``m`` is the ``(B, D)`` masked indicator, ``a_inv`` ``(B, K, K)``, ``g``
        ``(B, K N)`` (k-major) and ``rhs`` the columns ``[w w^T | e w | e^2]``.
        With u = -A_R^-1 g / sigma2 and c_j = m_j / v_j,
        ``sum_j c_j (e_j - w_j^T u)^2 = sum_j c_j e_j^2 + g^T P C P g + 2 g^T P f``,
        P = A_R^-1 / sigma2, C = sum_j c_j w_j w_j^T, f = sum_j c_j e_j w_j.
        """
        b, d = m.shape
        n = e.shape[0]
        k = a_inv.shape[-1]
        # (B, D): v_j = s2 + w_j^T A^-1 w_j, s2 folded into the GEMM (no pass of its own)
        var = torch.cat([a_inv.reshape(b, k * k), s2.expand(b, 1)], dim=1) @ torch.cat(
            [ww.T, torch.ones_like(ww[:, :1]).T], dim=0)
        c = m / var
        cb = c @ rhs  # sum_j c_j [w_j w_j^T | e_j w_j | e_j^2]
        cww, f, quad = cb[:, :k * k].reshape(b, k, k), cb[:, k * k:-n], cb[:, -n:]
        pm = a_inv / s2
        g = g.reshape(b, k, n)
        t = torch.baddbmm(torch.bmm(pm @ cww @ pm, g), pm, f.reshape(b, k, n),
                          alpha=2.0)  # (B, K, N)
        for i in range(k):  # contiguous adds over K, no strided reduce
            quad = torch.addcmul(quad, g[:, i], t[:, i])
        logv = torch.linalg.vecdot(torch.log(var), m)  # (B,): sum_j m_j log v_j
        return -0.5 * ((m.sum(-1) * _LOG_2PI + logv)[:, None] + quad)

    def nested_masked_log_prob(self, x: torch.Tensor, orders: torch.Tensor,
                                generator: torch.Generator | None) -> torch.Tensor:
        """Masked sums for every prefix of each shared order, by prefix sums: ``(P, D, N)``.

        Along an order pi the observed set of the mask of size M is pi[M:], so
        W_R^T W_R for all M is one suffix sum of w_i w_i^T, and g = W_M^T e_M
        one prefix sum of e_i w_i (a suffix sum subtracted from sigma2 z* past
        M = D/2): no GEMM over the tokens for them. Per-datum orders
        ``(P, N, D)`` take the generic path.
        """
        if orders.ndim != 2:
            return super().nested_masked_log_prob(x, orders, generator)
        dtype, w, s2, zs, e = self._split(x)
        d, k = w.shape
        n, p = e.shape[0], orders.shape[0]
        ww, ew, rhs = self._columns(x, w, e)
        o = orders.to(w.device)
        obs_ww = _sum_after(ww[o])  # size M (row M-1): W_R^T W_R over R = pi[M:]
        eye = torch.eye(k, dtype=dtype, device=w.device)
        a_inv = _spd_inverse(eye + obs_ww.reshape(p * d, k, k) / s2)
        h = d // 2  # sizes 1..h: prefix sums; h+1..D: sigma2 z* minus suffix sums
        ewp = ew[o]  # (P, D, K N): rows in the order's sequence
        g = torch.cat([ewp[:, :h].cumsum(1),
                       (s2 * zs).T.reshape(1, 1, k * n) - _sum_after(ewp[:, h:])], dim=1)
        m = prefix_masks(o).to(dtype).reshape(p * d, d)
        out = self._shared_sum(e, s2, ww, rhs, m, a_inv, g.reshape(p * d, k * n))
        return out.reshape(p, d, n)

    def masked_log_prob(self, x: torch.Tensor, mask: torch.Tensor,
                         generator: torch.Generator | None) -> torch.Tensor:
        """Sum of log p(x_j | x_R) over the masked tokens of each mask: ``(B, N)``.

        Same quantity as ``_log_conditionals(...).sum(-1)``, computed without
        the per-token array when masks are shared (see the module docstring)
        and with fewer passes over it when they are not.
        """
        dtype, w, s2, zs, e = self._split(x)
        d, k = w.shape
        n = e.shape[0]
        m = mask.to(dtype)  # masked indicator
        eye = torch.eye(k, dtype=dtype, device=w.device)
        if mask.ndim == 2:  # (B, D): shared masks, no (B, N, D) array
            ww, ew, rhs = self._columns(x, w, e)
            if dtype == torch.float64:  # rounding far below any tolerance: fewest passes
                mg = m @ rhs[:, :k * k + k * n]  # [W_M^T W_M | W_M^T e_M], one read of m
                obs, g = ww.sum(0) - mg[:, :k * k], mg[:, k * k:]
            else:
                # A_R from the observed set (a sum of positive terms: no cancellation);
                # g = W_M^T e_M (= sigma2 z* - W_R^T e_R, since W^T e = sigma2 z*) summed
                # over the masked set when M <= D/2, over the observed one otherwise
                # (fewer rounded terms, no cancellation): g = (m - f) @ [e w] + f sigma2 z*.
                obs = (1.0 - m) @ ww
                flag = (m.sum(-1) > d / 2).to(dtype)
                g = torch.addr(m.sub(flag[:, None]) @ ew, flag, (s2 * zs).T.reshape(k * n))
            a_inv = _spd_inverse(eye + obs.reshape(-1, k, k) / s2)
            return self._shared_sum(e, s2, ww, rhs, m, a_inv, g)
        ww = _outer_rows(w)
        num_masked = m.sum(-1)
        r = 1.0 - m  # observed indicator
        g = (r.reshape(-1, d) @ ww).reshape(*mask.shape[:-1], k, k)  # W_R^T W_R, observed
        a_inv = _spd_inverse(eye + g / s2)
        var = s2 + a_inv.reshape(-1, k * k) @ ww.T  # v_j = s2 + w_j^T A^-1 w_j
        # (B, N, D): one mask per datum
        var = var.reshape(mask.shape)
        h = (r * e) @ w / s2
        u = (a_inv @ (h - zs)[..., None])[..., 0]
        inplace = not (torch.is_grad_enabled() and (w.requires_grad or s2.requires_grad
                                                    or e.requires_grad))
        res = e - u @ w.T
        if inplace:
            res.square_().div_(var).add_(var.log_()).mul_(m)
            terms = res
        else:
            terms = m * (res * res / var + torch.log(var))
        return -0.5 * (num_masked * _LOG_2PI + terms.sum(-1))

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
        """Whether :meth:`_grid_quadratic_forms` costs fewer flops than the direct sums.

        Direct: GEMMs of the masks against ``[w w^T | e w | e^2]``, about
        2 B D N (2K + 1), plus O(B N K) after them. Quadratic forms: two
        (one without ``data_means``) batched GEMMs of 2 B K D^2, the forms
        2 A N D^2, plus O(B D K). So the forms win when D is small next to N.
        """
        d, k = self.num_tokens, self.latent_dim
        b = rows * cols
        direct = b * num_data * (2 * d * (2 * k + 1) + 10 * k)
        forms = b * d * (2 * k * d * (1 + int(data_means)) + 10 * k) + 2 * rows * num_data * d * d
        return forms < direct

    def _grid_quadratic_forms(self, x: torch.Tensor, mask: torch.Tensor, weight: torch.Tensor,
                              data_means: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Grid sums for shared masks ``(A, C, D)`` through one D x D form per row, float64.

        For one mask (module docstring), u = -P g with g = W_M^T e = R^T e,
        R = (m o W) and P = A_R^{-1} / sigma2, so the masked sum is
        ``const - 0.5 e^T (diag(c) + L^T R^T) e`` with L = H R^T + 2 P (c o W)^T,
        H = P C P. Summed over a grid row with weights omega::

            rows[a, n] = sum_c omega k_c - 0.5 (sum_c omega c_c . e_n^2
                         + e_n^T G_a e_n),   G_a = sum_c L_c^T (omega R_c)^T,

        and ``cols`` uses sum_a omega L^T R^T contracted with the data second
        moment (1/N) sum_n e_n e_n^T. Cost: batched GEMMs of 2 B K D^2 and
        2 A N D^2 flops and passes over (B, D) arrays, against
        2 B D N (2K + 1) and passes over (B, N, K) arrays for the direct sums.
        Computed in float64 (the expanded form cancels; the arrays are small).
        """
        f64 = torch.float64
        zs, e, _ = self._cached(x, "recentre", lambda: self._recentre(x))
        w, s2 = self.W.to(f64), self.sigma2.to(f64)
        d, k = w.shape
        n = e.shape[0]
        a, c = mask.shape[:2]
        b = a * c
        m = mask.reshape(b, d).to(f64)
        omega = weight.reshape(b).to(dtype=f64, device=w.device)
        ww = _outer_rows(w)
        eye = torch.eye(k, dtype=f64, device=w.device)
        a_inv = _spd_inverse(eye + ((1.0 - m) @ ww).reshape(b, k, k) / s2)
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

    def masked_log_prob_mean(self, x: torch.Tensor, mask: torch.Tensor,
                              generator: torch.Generator | None) -> torch.Tensor:
        """Mean over the data of the masked-token log-likelihood, shared masks: ``(B,)``.

        For a mask with observed set R, the residual of token j is linear in
        ``y = x - mu``::

            x_j - E[x_j | x_R] = y_j - sum_{i in R} (w_i^T v_j) y_i,
            v_j = A_R^{-1} w_j / sigma2,   A_R = I + W_R^T W_R / sigma2

        (Woodbury: ``C_jR C_RR^{-1} = v_j^T W_R^T``), so its mean square over the
        data is ``c_j^T S c_j`` with ``S = (1/N) sum_n y_n y_n^T``, computed once
        for all masks as the data covariance plus ``(xbar - mu)(xbar - mu)^T``.
        The cost per mask is O(D^2 K), independent of N, and the value equals
        ``masked_log_prob(x, mask).mean(-1)`` (tested). Computed in float64
        (the arrays are D x D), returned as float64.
        """
        if mask.ndim != 2:
            return super().masked_log_prob_mean(x, mask, generator)
        f64 = torch.float64
        w, s2, mu = self.W.to(f64), self.sigma2.to(f64), self.mu.to(f64)
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
        a_inv = _spd_inverse(eye + (r @ ww).reshape(-1, k, k) / s2)  # (B, K, K)
        v = a_inv @ w.T / s2  # (B, K, D): column j is v_j
        var = s2 * (1.0 + (w.T[None] * v).sum(1))  # (B, D): s2 + w_j^T A^-1 w_j
        coef = torch.eye(d, dtype=f64, device=w.device) - r[:, :, None] * (w @ v)  # (B, D, D)
        msq = (coef * (sy @ coef)).sum(1)  # (B, D): mean squared residual of each token
        terms = m * (torch.log(var) + msq / var)
        return -0.5 * (m.sum(-1) * _LOG_2PI + terms.sum(-1))

    def _log_conditionals(self, x: torch.Tensor, mask: torch.Tensor,
                          generator: torch.Generator | None) -> torch.Tensor:
        dtype, w, s2, zs, e = self._split(x)
        d, k = w.shape
        r = (~mask).to(dtype)  # observed indicator
        ww = _outer_rows(w)
        g = (r @ ww).reshape(*r.shape[:-1], k, k)  # W_R^T W_R, summed over observed dims
        a_inv = _spd_inverse(torch.eye(k, dtype=dtype, device=w.device) + g / s2)
        if mask.ndim == 2:  # (B, D): masks shared across the data
            b, n = mask.shape[0], x.shape[0]
            ew = (e.T[:, :, None] * w[:, None, :]).reshape(d, n * k)
            h = (r @ ew).reshape(b, n, k) / s2
            u = torch.einsum("bkl,bnl->bnk", a_inv, h - zs)
            var = s2 + torch.einsum("dk,bkl,dl->bd", w, a_inv, w)[:, None, :]
        else:  # (B, N, D): one mask per datum
            h = (r * e) @ w / s2
            u = (a_inv @ (h - zs)[..., None])[..., 0]
            var = s2 + torch.einsum("dk,bnkl,dl->bnd", w, a_inv, w)
        res = e - u @ w.T
        logp = -0.5 * (_LOG_2PI + torch.log(var) + res * res / var)
        m = mask[:, None, :] if mask.ndim == 2 else mask
        return torch.where(m, logp, torch.zeros((), dtype=dtype, device=logp.device))
