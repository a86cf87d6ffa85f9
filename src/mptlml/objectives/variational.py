"""Variational objectives of latent-variable models: the ELBO and the IWAE bound.

For a model with a Gaussian encoder q(z | x) (see
:class:`mptlml.models.amortized.AmortizedGaussianMixin`)::

    ELBO(x)   = E_{q(z|x)}[log p(x | z)] - KL(q(z | x) || N(0, I))   (reparameterised,
                closed-form KL; Kingma & Welling, 2014)
    IWAE_S(x) = E[log (1/S) sum_s p(x, z_s) / q(z_s | x)],  z_s ~ q(z | x)
                (Burda, Grosse & Salakhutdinov, 2016); IWAE_1 = ELBO <= IWAE_S <= log p(x).

Both are values to maximise, per datum, like every :class:`Objective`.
"""

from __future__ import annotations

import torch

from .._validation import check_positive_int
from ..models.amortized import iwae_bound
from ..models.base import MaskedModel
from .base import Objective

__all__ = ["ELBO", "IWAE"]


def _check_amortized(model: MaskedModel, name: str) -> None:
    for attr in ("elbo", "log_importance_weights"):
        if not callable(getattr(model, attr, None)):
            raise TypeError(
                f"{name} needs a latent-variable model with an encoder (e.g. "
                f"mptlml.models.LinearVAE or GaussianVAE); {type(model).__name__} has no "
                f"{attr}(). Use MPTLoss or ExactLML for it instead."
            )


class ELBO(Objective):
    """Evidence lower bound, reparameterised with closed-form KL, per datum.

    Parameters
    ----------
    model : MaskedModel with an encoder (LinearVAE, GaussianVAE)
    num_samples : int
        Reparameterised samples per datum for E_q[log p(x | z)].
    """

    name = "elbo"

    def __init__(self, model: MaskedModel, num_samples: int = 1) -> None:
        super().__init__(model)
        _check_amortized(model, "ELBO")
        self.num_samples = check_positive_int(num_samples, "num_samples")

    def per_datum(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return self.model.elbo(x, num_samples=self.num_samples, generator=generator)


class IWAE(Objective):
    """Importance-weighted bound log (1/S) sum_s w_s with the encoder as proposal, per datum.

    Parameters
    ----------
    model : MaskedModel with an encoder (LinearVAE, GaussianVAE)
    num_samples : int
        S >= 1 importance samples (S = 1 is a single-sample ELBO without the
        closed-form KL).
    """

    name = "iwae"

    def __init__(self, model: MaskedModel, num_samples: int = 10) -> None:
        super().__init__(model)
        _check_amortized(model, "IWAE")
        self.num_samples = check_positive_int(num_samples, "num_samples")

    def per_datum(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        lw = self.model.log_importance_weights(x, num_samples=self.num_samples,
                                               generator=generator)
        return iwae_bound(lw, self.num_samples)
