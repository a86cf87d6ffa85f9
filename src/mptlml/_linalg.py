"""Small dense linear algebra shared by the Gaussian models: SPD inverses and Woodbury.

The models' masked conditionals go through a K x K latent precision per mask
(K the latent dimension, a handful), never through a D x D covariance. These
helpers are the only place that inverts such matrices.

- :func:`spd_inverse`: batched inverse of small symmetric positive-definite
  matrices, closed forms for K = 1, 2 and a Cholesky inverse beyond.
- :func:`woodbury_posterior`: the latent posterior of a linear-Gaussian model
  x = W z + mu + eps given every coordinate, by the Woodbury identity.
- :func:`latent_dtype`: the dtype in which a model's K x K latent precisions
  ``I + W_R^T W_R / sigma2`` keep their digits, or a clear error where none does.

Nothing here imports the rest of the package (bottom layer).

References
----------
Golub & Van Loan (2013), *Matrix Computations*, 4th ed., Sec. 2.1.4 (Woodbury)
and 4.2 (Cholesky).
"""

from __future__ import annotations

import math

import torch

__all__ = ["latent_dtype", "spd_inverse", "woodbury_posterior"]

#: kappa * eps above which the K x K latent terms are computed in float64
LATENT_TOL = 1e-3
#: condition number of I + W^T W / sigma2 up to which masked conditionals keep their digits
#: (float32 with float64 latent terms: ~3e-3 nats per token at 1e11; float64: kappa eps 1e-3)
MAX_KAPPA = {torch.float32: 1e11, torch.float64: LATENT_TOL / torch.finfo(torch.float64).eps}


def spd_inverse(a: torch.Tensor) -> torch.Tensor:
    """Inverse of a batch of small symmetric positive-definite matrices.

    Parameters
    ----------
    a : torch.Tensor of shape (..., K, K)
        Symmetric positive definite.

    Returns
    -------
    torch.Tensor of shape (..., K, K)
        ``a^{-1}``: ``1 / a`` for K = 1; for K = 2 the adjugate over the
        determinant, ``[[s, -q], [-q, p]] / (p s - q^2)``; otherwise
        ``cholesky_inverse(cholesky(a))``. The closed forms avoid batched LAPACK
        calls on tiny matrices (about 40 times slower).

    Notes
    -----
    No check of positive-definiteness is made for K <= 2 (the callers pass
    ``I + G`` with G positive semi-definite, in a dtype that represents it).
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


def woodbury_posterior(w: torch.Tensor, sigma2: torch.Tensor, y: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Latent posterior mean of y = W z + eps, z ~ N(0, I_K), eps ~ N(0, sigma2 I_D).

    With the latent precision ``A = I_K + W^T W / sigma2`` (K x K), the
    posterior mean given all D coordinates is ``z* = A^{-1} W^T y / sigma2``
    and the residual ``e = y - W z*`` satisfies ``W^T e = sigma2 z*``. By the
    Woodbury identity ``(W W^T + sigma2 I)^{-1} y = e / sigma2``, so
    ``y^T C^{-1} y = |e|^2 / sigma2 + |z*|^2`` without a D x D solve.

    Parameters
    ----------
    w : (D, K) tensor
    sigma2 : scalar tensor
    y : (N, D) tensor, the data minus the mean

    Returns
    -------
    z_star : (N, K) tensor
    e : (N, D) tensor
    a : (K, K) tensor, the precision A
    """
    a = torch.eye(w.shape[1], dtype=w.dtype, device=w.device) + w.T @ w / sigma2
    zs = torch.linalg.solve(a, (y @ w).T / sigma2).T
    e = y - zs @ w.T
    return zs, e, a


def latent_dtype(w: torch.Tensor, sigma2: float, dtype: torch.dtype, model: str = "model"
                 ) -> torch.dtype:
    """dtype for the K x K latent precisions of a linear-Gaussian model, or a clear error.

    For every observed set R, ``A_R = I + W_R^T W_R / sigma2`` has condition
    number at most ``kappa = 1 + ||W||_2^2 / sigma2`` (a set that cannot pin
    the latent space reaches it). Where ``kappa * eps(dtype) > 1e-3`` the
    K x K solves need float64 (in float32 they return NaN, fail a Cholesky
    factorisation or lose digits there; the GEMMs over the data can stay in
    float32). ``||W||_F`` bounds ``||W||_2``, so the common case needs no
    eigenvalues.

    Parameters
    ----------
    w : (D, K) tensor, detached
    sigma2 : float
    dtype : torch.dtype
        The model's dtype.
    model : str
        Name used in the error message.

    Returns
    -------
    torch.dtype
        ``dtype``, or float64 where ``dtype`` would lose the latent terms.

    Raises
    ------
    ValueError
        Beyond ``kappa = 1e11`` (float32) or ``1e-3 / eps64`` (float64): no
        dtype keeps the conditionals' digits. The message names kappa and what
        to do (use float64, or a larger sigma2 / rescaled data).
    """
    eps = torch.finfo(dtype).eps
    limit = MAX_KAPPA.get(dtype, MAX_KAPPA[torch.float64])
    kappa = 1.0 + 1.01 * float(w.square().sum()) / sigma2  # Frobenius bound
    if not math.isfinite(kappa) or (kappa * eps <= LATENT_TOL and kappa <= limit):
        return dtype  # non-finite parameters: left to the callers' NaN checks (e.g. training)
    w64 = w.double()
    kappa = 1.0 + float(torch.linalg.eigvalsh(w64.T @ w64)[-1]) / sigma2
    if not kappa <= limit:
        what = ("use a float64 model (model.double(), or dtype=torch.float64) and float64 data"
                if dtype != torch.float64 else
                "sigma2 is too small for the scale of W: rescale the data, or fit or set a "
                "larger sigma2")
        raise ValueError(
            f"{model}: the latent precision I + W^T W / sigma2 has condition number "
            f"{kappa:.3g} (sigma2 = {sigma2:.3g}, ||W||_2^2 = {(kappa - 1) * sigma2:.3g}); "
            f"{str(dtype).replace('torch.', '')} masked conditionals are accurate up to "
            f"{limit:.3g} only; {what}.")
    return torch.float64 if kappa * eps > LATENT_TOL else dtype
