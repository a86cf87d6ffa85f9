"""Models that expose masked conditionals (see :mod:`mptlml.models.base`)."""

from .base import MaskedModel
from .bernoulli import BernoulliLVM, LinearVAE
from .masked_lm import MaskedLM
from .ppca import PPCA
from .quadrature import latent_quadrature
from .vae import GaussianVAE

__all__ = ["PPCA", "BernoulliLVM", "GaussianVAE", "LinearVAE", "MaskedLM", "MaskedModel",
           "latent_quadrature"]
