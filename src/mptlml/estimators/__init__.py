"""The estimators of Proposition 1: their maths in one package, one file per estimator.

    log p(x) = sum_{M=1..D} S(x; M),
    S(x; M)  = E_{|mask| = M} [ (1/M) sum_{j in mask} log p(x_j | x_R) ]

(Moreno-Munoz, Recasens & Hauberg, NeurIPS 2023, Proposition 1.)

=================  ==========================================  ============  ========
name               estimate of log p(x)                        bias          data
=================  ==========================================  ============  ========
``exhaustive``     every mask of every size                    exact         dense
``cumulative``     sum_M S_hat(x; M), P masks per size         unbiased      both
``random-size``    S_hat(x; M) / q(M), M ~ q (uniform: D)      unbiased      both
``adaptive-size``  same, q ~ running RMS of S_hat + floor      unbiased      both
``fixed-rate``     D * S_hat(x; M), M = max(1, floor(rate D))  biased        both
``chain-rule``     sum_t log p(x_pi(t) | x_pi(t+1..D))          unbiased      both
``riemann``        D_i * mean_k S(x_i; M_ik) on a rate grid     grid-biased   ragged
``learned-rate``   S(x; D) + S_hat(x; M) / q(M), r ~ q learned  unbiased      ragged
``llada``          mean (L/l) sum log p, l systematic/batch     rounding      ragged
=================  ==========================================  ============  ========

On ragged sequences (a masked LM) each sequence has its own D_i. Rooms:

``base``        :class:`Estimator`: options, the size rule, draws, its strata, and the one
                estimate procedure (plain, or at a target standard error for any unbiased
                estimator), dense and ragged alike
``runs``        what differs between the kinds of data: the data made ready, the summary of
                an estimate and its draws to a target (on the engine), dense or ragged
``api``         the registry (:func:`register`, :func:`get`, :func:`available`,
                :func:`create`) and the front door :func:`estimate_lml`
``cumulative``, ``random_size``, ``adaptive_size``, ``fixed_rate``, ``exhaustive``,
``chain_rule``, ``riemann``, ``llada``   one estimator each, its dense and ragged maths
``curve``       :func:`mpt_curve`, dense and ragged
``allocation``  a target's options (``target_se``, ``max_masks``, ``allocation``) and the
                rate bins of a ragged allocation
``sequential``  the sequential engine: rounds of draws, Neyman's counts and the learned rate
                density, stop rules (one vocabulary), the cap; under every target (dense
                and ragged), curves and compare
``pseudo_likelihood``  :func:`pll`, the pseudo-log-likelihood per sequence, token or word
``rates``       rate grids and the paper's area; ``results``: the result types;
``stats``       the one mean / standard-error helper

The masks are scored by :mod:`mptlml._scoring`, which knows no estimator.
"""

from .adaptive_size import AdaptiveSize
from .api import available, create, estimate_lml, get, register, unregister
from .base import Draws, Estimator, accepted_options
from .chain_rule import ChainRule
from .compare import compare
from .cumulative import Cumulative
from .curve import mpt_curve
from .exhaustive import Exhaustive
from .fixed_rate import FixedRate
from .learned_rate import LearnedRate
from .llada import LLaDA, llada_scores
from .pseudo_likelihood import pll
from .random_size import RandomSize
from .rates import mpt_area
from .results import (
    Comparison,
    LLaDAScores,
    LMLEstimate,
    MPTCurve,
    NonFiniteWarning,
    TokenScores,
)
from .riemann import Riemann

__all__ = [
    "AdaptiveSize",
    "ChainRule",
    "Comparison",
    "Cumulative",
    "Draws",
    "Estimator",
    "Exhaustive",
    "FixedRate",
    "LLaDA",
    "LLaDAScores",
    "LMLEstimate",
    "LearnedRate",
    "MPTCurve",
    "NonFiniteWarning",
    "RandomSize",
    "Riemann",
    "TokenScores",
    "accepted_options",
    "available",
    "compare",
    "create",
    "estimate_lml",
    "get",
    "llada_scores",
    "mpt_area",
    "mpt_curve",
    "pll",
    "register",
    "unregister",
]
