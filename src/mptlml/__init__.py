"""mptlml: masked pre-training as an estimator of the log-marginal likelihood.

    log p(x) = sum_{M=1..D} S(x; M),
    S(x; M)  = E_mask[(1/M) sum_{j in mask} log p(x_j | x_R)]

(Moreno-Munoz, Recasens, Hauberg, NeurIPS 2023, Proposition 1.)
"""

from . import estimators, settings
from .estimators import (
    Comparison,
    Estimator,
    LMLEstimate,
    MPTCurve,
    TokenScores,
    compare,
    estimate_lml,
    mpt_area,
    mpt_curve,
    pll,
    register,
)
from .hf.generation import generate

__version__ = "0.1.0"

__all__ = [
    "Comparison",
    "Estimator",
    "LMLEstimate",
    "MPTCurve",
    "TokenScores",
    "__version__",
    "compare",
    "estimate_lml",
    "estimators",
    "generate",
    "mpt_area",
    "mpt_curve",
    "pll",
    "register",
    "settings",
]

