"""Shared pieces of the PPCA training experiments: synthetic data and exact fixed-rate scores."""

from __future__ import annotations

import math

import torch

from ..masks import all_masks
from ..models import PPCA

__all__ = ["exact_fixed_rate", "synthetic_ppca"]

_DTYPES = {"float64": torch.float64, "float32": torch.float32}

#: above this many masks of one size, the fixed-rate score is a seeded Monte Carlo average.
MAX_EXACT_MASKS = 2000


def dtype_of(name: str) -> torch.dtype:
    """``"float64"`` / ``"float32"`` to a torch dtype, with a clear error otherwise."""
    if name not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, got {name!r}.")
    return _DTYPES[name]


def synthetic_ppca(num_tokens: int, latent_dim: int, sigma2: float, num_data: int, *,
                   seed: int, noise: str = "independent",
                   dtype: torch.dtype = torch.float64) -> tuple[PPCA, torch.Tensor]:
    """The generating PPCA (W with N(0, 1) entries, mu = 0) and N draws from it."""
    true = PPCA.random(num_tokens, latent_dim, sigma2, seed=seed, dtype=dtype)
    x = true.sample(num_data, generator=seed + 1, noise=noise)
    return true, x


def exact_fixed_rate(model: PPCA, x: torch.Tensor, mask_size: int,
                     masks: torch.Tensor | None = None) -> float:
    """Mean over data of D * S(x; M), the expectation of the fixed-rate MPT objective.

    Uses every one of the C(D, M) masks of size M when there are at most
    ``MAX_EXACT_MASKS`` of them (then it is exact), else ``MAX_EXACT_MASKS``
    uniform masks drawn with a fixed seed (the same at every call, so that
    changes over training come from the parameters only).
    """
    d = model.num_tokens
    if masks is None:
        masks = fixed_rate_masks(d, mask_size)
    with torch.no_grad():
        lp = model.masked_log_prob(x, masks.to(x.device), None).double()  # (B, N)
    return float(d * lp.mean() / mask_size)


def fixed_rate_masks(num_tokens: int, mask_size: int) -> torch.Tensor:
    """All masks of size M, or ``MAX_EXACT_MASKS`` seeded uniform ones when there are more."""
    from ..masks import sample_masks

    if math.comb(num_tokens, mask_size) <= MAX_EXACT_MASKS:
        return all_masks(num_tokens, mask_size)
    return sample_masks(num_tokens, mask_size, num_masks=MAX_EXACT_MASKS, generator=12345)
