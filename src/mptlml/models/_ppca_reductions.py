"""PPCA's fast masked reductions, as pure functions of (W, sigma2, z*, e) and the masks.

:class:`mptlml.models.PPCA` validates, caches the terms of the data
(:meth:`PPCA._split`, :meth:`PPCA._columns`) and dispatches here. Notation
(see the module docstring of :mod:`mptlml.models.ppca`): for a mask with
masked set M and observed set R,

    A_R = I_K + W_R^T W_R / sigma2,   P = A_R^{-1} / sigma2,
    v_j = sigma2 + w_j^T A_R^{-1} w_j              (conditional variance),
    g   = W_M^T e_M = sigma2 z* - W_R^T e_R,        u = -A_R^{-1} g / sigma2,
    x_j - E[x_j | x_R] = e_j - w_j^T u,

where z* is the posterior mean given all D tokens and e = x - mu - W z*.
With c_j = m_j / v_j, C = sum_j c_j w_j w_j^T and f = sum_j c_j e_j w_j,

    sum_j m_j (e_j - w_j^T u)^2 / v_j = sum_j c_j e_j^2 + g^T P C P g + 2 g^T P f,

so shared masks never form a ``(B, N, D)`` array: one GEMM of the ``(B, D)``
masks against the columns ``[w w^T | e w | e^2]`` (:func:`gemm_columns`).

- :func:`shared_masked_sum`: shared masks ``(B, D)``;
- :func:`per_datum_masked_sum`: one mask per datum ``(B, N, D)``;
- :func:`nested_masked_sum`: every prefix of shared orders, by prefix sums;
- :func:`grid_quadratic_forms`: weighted grid sums as D x D quadratic forms
  (chosen by :func:`grid_by_quadratic_forms` from a flop count);
- :func:`masked_mean_by_moments`: the data mean from the second moment of x.

Precision. float32 sums A_R over the observed set and g over the smaller of
the masked and observed sets (no cancellation); the grid forms and the data
mean are computed in float64. Where a float32 model's latent precisions are
too ill-conditioned for float32 (:func:`mptlml._linalg.latent_dtype`), the
reductions take a ``latent_dtype`` of float64: A_R^{-1} and v_j come from
W_R^T W_R summed in float64 (:func:`latent_inverse`), and the ``(B, K, N)``
terms after the GEMM over the data are formed in float64; that GEMM stays
in float32.

References
----------
Tipping & Bishop (1999), JRSS-B; Moreno-Munoz, Recasens, Hauberg (2023),
NeurIPS, Sec. 3.1 and App. B.
"""

from __future__ import annotations

import math

import torch

from .._linalg import spd_inverse
from ..masks import prefix_masks

__all__ = [
    "LOG_2PI",
    "gemm_columns",
    "grid_by_quadratic_forms",
    "grid_quadratic_forms",
    "masked_mean_by_moments",
    "nested_masked_sum",
    "outer_rows",
    "per_datum_masked_sum",
    "shared_masked_sum",
]

LOG_2PI = math.log(2.0 * math.pi)


def outer_rows(w: torch.Tensor) -> torch.Tensor:
    """Row-wise outer products w_j w_j^T of ``W`` (D, K), flattened: ``(D, K^2)``."""
    d, k = w.shape
    return (w[:, :, None] * w[:, None, :]).reshape(d, k * k)


def ew_columns(w: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """Columns e_nj w_jk of the masked sums, k-major: ``(D, K N)``, contiguous."""
    (d, k), n = w.shape, e.shape[0]
    return (w[:, :, None] * e.T[:, None, :]).reshape(d, k * n)


def sum_after(t: torch.Tensor) -> torch.Tensor:
    """Sum over the positions strictly after each one along dim 1 (0 at the last)."""
    rest = t[:, 1:].flip(1).cumsum(1).flip(1)
    return torch.cat([rest, torch.zeros_like(t[:, :1])], dim=1)


def times_wt(coef: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
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


def gemm_columns(w: torch.Tensor, e: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GEMM columns ``[w w^T | e w | e^2]``, with views of their first two blocks.

    Returns w_j w_j^T ``(D, K^2)``, e_nj w_jk ``(D, K N)`` and the whole
    ``(D, K^2 + K N + N)`` matrix.
    """
    k, n = w.shape[1], e.shape[0]
    et = e.T.contiguous()  # cat of a transposed view copies element by element
    rhs = torch.cat([outer_rows(w), ew_columns(w, e), et * et], dim=1)
    return rhs[:, :k * k], rhs[:, k * k:-n], rhs


def shared_sum(e: torch.Tensor, s2: torch.Tensor, ww: torch.Tensor, rhs: torch.Tensor,
               m: torch.Tensor, a_inv: torch.Tensor, g: torch.Tensor,
               var: torch.Tensor | None = None) -> torch.Tensor:
    """Masked sums of log p(x_j | x_R) for shared masks from A_R^-1 and g = W_M^T e_M.

    ``m`` is the ``(B, D)`` masked indicator, ``a_inv`` ``(B, K, K)``, ``g``
    ``(B, K N)`` (k-major) and ``rhs`` the columns ``[w w^T | e w | e^2]``.
    Returns ``(B, N)``: ``-0.5 (sum_j m_j (log 2 pi + log v_j) + quad)`` with
    the expanded quadratic form of the module docstring. ``a_inv`` and the
    variances ``var`` (computed here when not given) may be float64 for a
    float32 model (:func:`latent_inverse`): the GEMM over the data stays in
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
    return (-0.5 * ((m.sum(-1) * LOG_2PI + logv)[:, None] + quad)).to(dtype)


def latent_inverse(w: torch.Tensor, s2: torch.Tensor, observed: torch.Tensor,
                   dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """A_R^{-1} ``(..., K, K)`` and v_j ``(..., D)`` in ``dtype``; ``observed`` is ``(..., D)``.

    W_R^T W_R is summed in ``dtype`` from the outer products w_j w_j^T
    (exact in float64 for a float32 ``w``), so a float32 model gets float64
    latent terms where ``I + W_R^T W_R / sigma2`` is too ill-conditioned to
    be represented in float32 (observed sets that cannot pin the latent space).
    """
    d, k = w.shape
    wl, s2l = w.to(dtype), s2.to(dtype)
    ww = outer_rows(wl)
    obs = observed.to(dtype).reshape(-1, d) @ ww
    eye = torch.eye(k, dtype=dtype, device=w.device)
    a_inv = spd_inverse(eye + obs.reshape(-1, k, k) / s2l)
    var = s2l + a_inv.reshape(-1, k * k) @ ww.T
    return a_inv.reshape(*observed.shape[:-1], k, k), var.reshape(observed.shape)


def shared_masked_sum(w: torch.Tensor, s2: torch.Tensor, zs: torch.Tensor, e: torch.Tensor,
                      columns: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                      mask: torch.Tensor, latent_dtype: torch.dtype | None = None
                      ) -> torch.Tensor:
    """sum_{j in M} log p(x_nj | x_nR) for shared masks ``(B, D)``: ``(B, N)``.

    ``columns`` are :func:`gemm_columns` of ``(w, e)``. float64 takes
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
        precise = latent_dtype not in (None, dtype)  # A_R too ill-conditioned for float32
        if not precise:
            obs = (1.0 - m) @ ww
        flag = (m.sum(-1) > d / 2).to(dtype)
        g = torch.addr(m.sub(flag[:, None]) @ ew, flag, (s2 * zs).T.reshape(k * n))
        if precise:
            a_inv, var = latent_inverse(w, s2, 1.0 - m, latent_dtype)
            return shared_sum(e, s2, ww, rhs, m, a_inv, g, var)
    a_inv = spd_inverse(eye + obs.reshape(-1, k, k) / s2)
    return shared_sum(e, s2, ww, rhs, m, a_inv, g)


def per_datum_masked_sum(w: torch.Tensor, s2: torch.Tensor, zs: torch.Tensor, e: torch.Tensor,
                         mask: torch.Tensor, latent_dtype: torch.dtype | None = None
                         ) -> torch.Tensor:
    """sum_{j in M} log p(x_nj | x_nR) for one mask per datum ``(B, N, D)``: ``(B, N)``.

    Forms the ``(B, N, D)`` residuals once, in place when no gradient is
    needed. With a ``latent_dtype`` other than the model's, A_R^{-1}, v_j and
    u come from :func:`latent_inverse` in it.
    """
    dtype = w.dtype
    d, k = w.shape
    m = mask.to(dtype)
    num_masked = m.sum(-1)
    r = 1.0 - m  # observed indicator
    ldt = dtype if latent_dtype is None else latent_dtype
    if ldt == dtype:
        eye = torch.eye(k, dtype=dtype, device=w.device)
        ww = outer_rows(w)
        g = (r.reshape(-1, d) @ ww).reshape(*mask.shape[:-1], k, k)  # W_R^T W_R, observed
        a_inv = spd_inverse(eye + g / s2)
        var = s2 + a_inv.reshape(-1, k * k) @ ww.T  # v_j = s2 + w_j^T A^-1 w_j
        var = var.reshape(mask.shape)
    else:
        a_inv, var = latent_inverse(w, s2, r, ldt)
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
    return -0.5 * (num_masked * LOG_2PI + terms.sum(-1))


def nested_masked_sum(w: torch.Tensor, s2: torch.Tensor, zs: torch.Tensor, e: torch.Tensor,
                      columns: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                      orders: torch.Tensor, latent_dtype: torch.dtype | None = None
                      ) -> torch.Tensor:
    """Masked sums for every prefix of each shared order ``(P, D)``: ``(P, D, N)``.

    Along an order pi the observed set of the mask of size M is pi[M:], so
    W_R^T W_R for all M is one suffix sum of w_i w_i^T, and g = W_M^T e_M one
    prefix sum of e_i w_i (a suffix sum subtracted from sigma2 z* past
    M = D/2): no GEMM over the tokens for them. With a ``latent_dtype`` other
    than the model's, the suffix sums, A_R^{-1} and v_j are computed in it.
    """
    dtype = w.dtype
    d, k = w.shape
    n, p = e.shape[0], orders.shape[0]
    ww, ew, rhs = columns
    o = orders.to(w.device)
    ldt = dtype if latent_dtype is None else latent_dtype
    wwl, s2l = (ww, s2) if ldt == dtype else (outer_rows(w.to(ldt)), s2.to(ldt))
    obs_ww = sum_after(wwl[o])  # size M (row M-1): W_R^T W_R over R = pi[M:]
    eye = torch.eye(k, dtype=ldt, device=w.device)
    a_inv = spd_inverse(eye + obs_ww.reshape(p * d, k, k) / s2l)
    var = None if ldt == dtype else s2l + a_inv.reshape(p * d, k * k) @ wwl.T
    h = d // 2  # sizes 1..h: prefix sums; h+1..D: sigma2 z* minus suffix sums
    ewp = ew[o]  # (P, D, K N): rows in the order's sequence
    g = torch.cat([ewp[:, :h].cumsum(1),
                   (s2 * zs).T.reshape(1, 1, k * n) - sum_after(ewp[:, h:])], dim=1)
    m = prefix_masks(o).to(dtype).reshape(p * d, d)
    out = shared_sum(e, s2, ww, rhs, m, a_inv, g.reshape(p * d, k * n), var)
    return out.reshape(p, d, n)


def grid_by_quadratic_forms(num_tokens: int, latent_dim: int, rows: int, cols: int,
                            num_data: int, data_means: bool) -> bool:
    """Whether :func:`grid_quadratic_forms` costs fewer flops than the direct sums.

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


def grid_quadratic_forms(w: torch.Tensor, s2: torch.Tensor, e: torch.Tensor, mask: torch.Tensor,
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
    ww = outer_rows(w)
    eye = torch.eye(k, dtype=f64, device=w.device)
    a_inv = spd_inverse(eye + ((1.0 - m) @ ww).reshape(b, k, k) / s2)
    var = s2 + a_inv.reshape(b, k * k) @ ww.T  # (B, D): v_j = s2 + w_j^T A^-1 w_j
    cm = m / var
    const = -0.5 * (m.sum(-1) * LOG_2PI + torch.log(var).mul_(m).sum(-1))  # (B,)
    pm = a_inv / s2
    h = pm @ (cm @ ww).reshape(b, k, k) @ pm
    mw = m * omega[:, None]
    g_rows = torch.zeros(a, d, d, dtype=f64, device=w.device)
    g_cols = torch.zeros(c, d, d, dtype=f64, device=w.device) if data_means else None
    for i in range(k):  # row i of L and of R, each (B, D)
        left = times_wt(h[:, i], w).mul_(m).addcmul_(cm, times_wt(2.0 * pm[:, i], w))
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


def masked_mean_by_moments(w: torch.Tensor, s2: torch.Tensor, mu: torch.Tensor,
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
    ww = outer_rows(w)
    eye = torch.eye(k, dtype=f64, device=w.device)
    a_inv = spd_inverse(eye + (r @ ww).reshape(-1, k, k) / s2)  # (B, K, K)
    v = a_inv @ w.T / s2  # (B, K, D): column j is v_j
    var = s2 * (1.0 + (w.T[None] * v).sum(1))  # (B, D): s2 + w_j^T A^-1 w_j
    coef = torch.eye(d, dtype=f64, device=w.device) - r[:, :, None] * (w @ v)  # (B, D, D)
    msq = (coef * (sy @ coef)).sum(1)  # (B, D): mean squared residual of each token
    terms = m * (torch.log(var) + msq / var)
    return -0.5 * (m.sum(-1) * LOG_2PI + terms.sum(-1))
