"""mptlml: masked pre-training as an estimator of the log-marginal likelihood.

    log p(x) = sum_{M=1..D} S(x; M),
    S(x; M)  = E_mask[(1/M) sum_{j in mask} log p(x_j | x_R)]

(Moreno-Munoz, Recasens, Hauberg, NeurIPS 2023, Proposition 1.)
"""

from .estimators import ESTIMATORS, LMLEstimate, MPTCurve, estimate_lml, mpt_curve
from .sequences import MLMCurveResult, mlm_curve, mpt_area, pll

__version__ = "0.1.0"

__all__ = [
    "ESTIMATORS",
    "LMLEstimate",
    "MLMCurveResult",
    "MPTCurve",
    "__version__",
    "estimate_lml",
    "mlm_curve",
    "mpt_area",
    "mpt_curve",
    "pll",
]
