"""Quadrature rules over a K-dimensional standard-normal latent space.

Both rules return nodes z_g and log-weights log pi_g with sum_g pi_g = 1, so
that for any likelihood

    p(x) = int N(z; 0, I) p(x | z) dz  ~=  sum_g pi_g p(x | z_g).

``"grid"`` (the paper's): a tensor grid of ``n`` equispaced points per axis on
[-bound, bound]; pi_g is proportional to the cell volume times N(z_g; 0, I),
renormalised (the truncated prior mass beyond +-5 is ~6e-7 per axis).
``"gauss-hermite"``: the tensor product of n-point Gauss-Hermite rules for
the weight exp(-z^2 / 2) (probabilists' Hermite), whose weights divided by
sqrt(2 pi) already sum to one; exact for polynomial integrands of degree
< 2n in each coordinate.

Renormalising makes the quadrature model an exact finite mixture, so the
chain rule of its conditionals telescopes exactly to its log-marginal.

References
----------
Golub & Welsch (1969), "Calculation of Gauss quadrature rules", Math. Comp.
Moreno-Munoz, Recasens, Hauberg (2023), NeurIPS, Sec. 4 (20 x 20 grid on [-5, 5]^2).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .._validation import check_positive_int

__all__ = ["MAX_GRID_DIM", "MAX_QUADRATURE_POINTS", "QUADRATURES", "latent_quadrature"]

QUADRATURES = ("grid", "gauss-hermite")
#: the dense grid is refused above this latent dimension (n^K points).
MAX_GRID_DIM = 3
#: upper bound on the total number of nodes of either rule.
MAX_QUADRATURE_POINTS = 200_000


def latent_quadrature(latent_dim: int, kind: str = "grid", num_points: int = 20,
                      bound: float = 5.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Nodes ``(G, K)`` and normalised log-weights ``(G,)`` (float64) for N(0, I_K).

    Parameters
    ----------
    latent_dim : int
        K.
    kind : {"grid", "gauss-hermite"}
    num_points : int
        Points per axis n; G = n^K.
    bound : float
        Half-width of the dense grid (ignored by Gauss-Hermite).

    Raises
    ------
    ValueError
        For K > 3 with the dense grid, or more than ``MAX_QUADRATURE_POINTS`` nodes.
    """
    k = check_positive_int(latent_dim, "latent_dim")
    n = check_positive_int(num_points, "num_points")
    if kind not in QUADRATURES:
        raise ValueError(f"quadrature must be one of {QUADRATURES}, got {kind!r}.")
    if kind == "grid" and k > MAX_GRID_DIM:
        raise ValueError(
            f"a dense grid over K={k} latent dimensions needs {n}^{k} = {n ** k:,} points; it is "
            f"refused for K > {MAX_GRID_DIM}. Use quadrature='gauss-hermite' with fewer points "
            "per axis (e.g. num_points=5), or a VAE whose LML is estimated by importance "
            "sampling (mptlml.models.GaussianVAE / IWAE)."
        )
    total = n ** k
    if total > MAX_QUADRATURE_POINTS:
        raise ValueError(
            f"{n}^{k} = {total:,} quadrature points exceed the limit of {MAX_QUADRATURE_POINTS:,}; "
            "lower num_points, or estimate the LML by importance sampling (IWAE) instead."
        )
    if kind == "grid":
        if not (isinstance(bound, int | float) and math.isfinite(bound) and bound > 0):
            raise ValueError(f"bound must be a positive number, got {bound!r}.")
        if n < 2:
            raise ValueError("a dense grid needs num_points >= 2 per axis.")
        axis = np.linspace(-bound, bound, n)
        log_w1 = -0.5 * axis**2  # cell volume and 1/sqrt(2 pi) cancel on renormalising
    else:
        axis, w = np.polynomial.hermite_e.hermegauss(n)
        log_w1 = np.log(w)
    nodes = np.stack([g.ravel() for g in np.meshgrid(*[axis] * k, indexing="ij")], axis=1)
    log_w = sum(g.ravel() for g in np.meshgrid(*[log_w1] * k, indexing="ij"))
    log_w = torch.from_numpy(np.asarray(log_w, dtype=np.float64))
    return torch.from_numpy(nodes), log_w - torch.logsumexp(log_w, 0)
