"""The estimators of Proposition 1: one class per estimator, one registry.

    log p(x) = sum_{M=1..D} S(x; M),
    S(x; M)  = E_{|mask| = M} [ (1/M) sum_{j in mask} log p(x_j | x_R) ]

(Moreno-Munoz, Recasens & Hauberg, NeurIPS 2023, Proposition 1.)

=================  ==========================================  ============  ========
name               estimate of log p(x)                        bias          data
=================  ==========================================  ============  ========
``exhaustive``     every mask of every size                    exact         dense
``cumulative``     sum_M S_hat(x; M), P masks per size         unbiased      both
``random-size``    S_hat(x; M) / q(M), M ~ q (uniform: D)      unbiased      dense
``adaptive-size``  same, q ~ running RMS of S_hat + floor      unbiased      dense
``fixed-rate``     D * S_hat(x; M), M = max(1, floor(rate D))  biased        dense
``chain-rule``     sum_t log p(x_pi(t) | x_pi(t+1..D))          unbiased      both
``riemann``        D_i * mean_k S(x_i; M_ik) on a rate grid     grid-biased   ragged
=================  ==========================================  ============  ========

Each is one file of this package. The registry (:func:`register`,
:func:`get`, :func:`available`) is the only list of their names:
:func:`estimate_lml`, :func:`mpt_curve`, :class:`mptlml.objectives.MPTLoss`
and :class:`mptlml.hf.DataCollatorForMPT` look estimators up there, so one
registered from outside the package works in all of them at once.
"""

from .adaptive_size import AdaptiveSize
from .api import estimate_lml, mpt_curve
from .base import (
    Draws,
    Estimator,
    RaggedScores,
    accepted_options,
    available,
    create,
    get,
    register,
    unregister,
)
from .chain_rule import ChainRule
from .cumulative import Cumulative
from .exhaustive import Exhaustive
from .fixed_rate import FixedRate
from .random_size import RandomSize
from .riemann import Riemann

__all__ = [
    "AdaptiveSize",
    "ChainRule",
    "Cumulative",
    "Draws",
    "Estimator",
    "Exhaustive",
    "FixedRate",
    "RaggedScores",
    "RandomSize",
    "Riemann",
    "accepted_options",
    "available",
    "create",
    "estimate_lml",
    "get",
    "mpt_curve",
    "register",
    "unregister",
]
