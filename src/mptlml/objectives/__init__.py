"""Training objectives (values to maximise, per datum), in the style of GPyTorch's ``mlls``.

``ExactLML``   log p(x_n), for models with ``log_marginal``;
``MPTLoss``    the masked pre-training estimate of log p(x_n) (cumulative,
               random-size or fixed-rate);
``ELBO``       evidence lower bound of a VAE (reparameterised, closed-form KL);
``IWAE``       importance-weighted bound with ``num_samples`` draws.
"""

from .base import Objective
from .exact import ExactLML
from .mpt import MPTLoss
from .variational import ELBO, IWAE

__all__ = ["ELBO", "IWAE", "ExactLML", "MPTLoss", "Objective"]
