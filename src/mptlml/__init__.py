"""mptlml: masked pre-training as an estimator of the log-marginal likelihood.

    log p(x) = sum_{M=1..D} S(x; M),
    S(x; M)  = E_mask[(1/M) sum_{j in mask} log p(x_j | x_R)]

(Moreno-Munoz, Recasens, Hauberg, NeurIPS 2023, Proposition 1.)
"""

from . import settings
from .estimation import (
    ESTIMATORS,
    LMLEstimate,
    MPTCurve,
    TokenScores,
    estimate_lml,
    mlm_curve,
    mpt_area,
    mpt_curve,
    pll,
)

__version__ = "0.1.0"

__all__ = [
    "ESTIMATORS",
    "LMLEstimate",
    "MPTCurve",
    "TokenScores",
    "__version__",
    "estimate_lml",
    "mlm_curve",
    "mpt_area",
    "mpt_curve",
    "pll",
    "settings",
]

