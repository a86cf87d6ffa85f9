"""Models that expose masked conditionals (see :mod:`mptlml.models.base`).

Dense data ``(N, D)``: :class:`MaskedModel` subclasses. Ragged sequences:
the sibling protocol :class:`~mptlml.models.protocols.RaggedMaskedModel`,
implemented by :class:`MaskedLM`.
"""

from .base import MaskedModel
from .bernoulli import BernoulliLVM, LinearVAE
from .conditional import ConditionalView
from .masked_lm import MaskedLM
from .ppca import PPCA
from .protocols import RaggedMaskedModel
from .quadrature import latent_quadrature
from .vae import DecoderProposal, GaussianVAE

__all__ = ["PPCA", "BernoulliLVM", "ConditionalView", "DecoderProposal", "GaussianVAE",
           "LinearVAE", "MaskedLM", "MaskedModel", "RaggedMaskedModel", "latent_quadrature"]
