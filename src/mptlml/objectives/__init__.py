"""Training objectives (values to maximise, per datum), in the style of GPyTorch's ``mlls``.

``ExactLML``   log p(x_n), for models with ``log_marginal``;
``MPTLoss``    the masked pre-training estimate of log p(x_n) (cumulative,
               random-size or fixed-rate).
"""

from .base import Objective
from .exact import ExactLML
from .mpt import MPT_ESTIMATORS, MPTLoss

__all__ = ["MPT_ESTIMATORS", "ExactLML", "MPTLoss", "Objective"]
