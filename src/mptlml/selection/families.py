"""Model families for choosing a latent dimension: what selection needs of a model.

A family is a :class:`ModelFamily` (``fit``, ``num_params`` for BIC, ``max_k``);
:data:`FAMILIES` names the two built in:

- ``"ppca"``: PPCA fitted in closed form (Tipping & Bishop 1999); continuous data;
  ``D K - K (K - 1) / 2 + D + 1`` free parameters (W up to rotation, mu, sigma2).
- ``"bernoulli"``: the Bernoulli latent linear model p(x|z) = Bernoulli(sigmoid(W z + b)),
  K <= 3, fitted by Adam on its quadrature LML (tensor Gauss-Hermite rule); binary
  data; ``D K - K (K - 1) / 2 + D`` free parameters.
"""

from __future__ import annotations

from typing import Protocol

import torch

from ..models import PPCA
from ..models.base import MaskedModel

__all__ = ["FAMILIES", "BernoulliFamily", "ModelFamily", "PPCAFamily"]


class ModelFamily(Protocol):
    """What model selection needs of a family of latent-variable models."""

    name: str

    def fit(self, x: torch.Tensor, k: int, *, seed: int = 0) -> MaskedModel:
        """Fit the model with latent dimension ``k`` to training data ``(N, D)``."""

    def num_params(self, d: int, k: int) -> int:
        """Free parameters (for BIC)."""

    def max_k(self, d: int) -> int:
        """Largest latent dimension the family supports for D tokens."""


class PPCAFamily:
    """PPCA fitted in closed form (Tipping & Bishop 1999)."""

    name = "ppca"

    def fit(self, x: torch.Tensor, k: int, *, seed: int = 0) -> MaskedModel:
        return PPCA.fit(x, k)

    def num_params(self, d: int, k: int) -> int:
        return d * k - k * (k - 1) // 2 + d + 1

    def max_k(self, d: int) -> int:
        return d - 1


class BernoulliFamily:
    """Bernoulli latent linear model, maximum likelihood by Adam on the quadrature LML.

    The quadrature is a tensor Gauss-Hermite rule with ``points[K]`` nodes per
    axis (40, 20, 10 for K = 1, 2, 3: at most 1000 nodes). Initialisation:
    small random W (seeded by the selection's ``seed`` + K) and b at the logits of the column
    means, so every K starts from the same independent-Bernoulli fit.
    """

    name = "bernoulli"
    points = {1: 40, 2: 20, 3: 10}

    def __init__(self, epochs: int = 300, lr: float = 0.05) -> None:
        self.epochs, self.lr = epochs, lr

    def fit(self, x: torch.Tensor, k: int, *, seed: int = 0) -> MaskedModel:
        from ..models import BernoulliLVM
        from ..objectives import ExactLML
        from ..training import train

        d = x.shape[1]
        g = torch.Generator().manual_seed(seed + k)
        w = 0.1 * torch.randn(d, k, generator=g, dtype=torch.float64)
        mean = x.double().mean(0).clamp(0.5 / x.shape[0], 1.0 - 0.5 / x.shape[0])
        model = BernoulliLVM(w, torch.logit(mean), quadrature="gauss-hermite",
                             num_points=self.points[k])
        model.validate_data(x)
        train(model, ExactLML(model), x, epochs=self.epochs, lr=self.lr, seed=seed,
              progress=False, record_initial=False)
        return model

    def num_params(self, d: int, k: int) -> int:
        return d * k - k * (k - 1) // 2 + d

    def max_k(self, d: int) -> int:
        return min(3, d - 1)


#: family name -> implementation.
FAMILIES: dict[str, ModelFamily] = {"ppca": PPCAFamily(), "bernoulli": BernoulliFamily()}
