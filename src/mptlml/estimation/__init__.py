"""Estimation of the log-marginal likelihood from masked conditionals.

Rooms:

``results``   :class:`LMLEstimate`, :class:`MPTCurve`: one result type per concept,
              the same fields for dense models and masked LMs;
``engine``    blocks of masks scored through the model's reductions (dense data);
``dense``     one function per estimator of dense data, in a registry;
``runner``    the ragged-sequence runner (buckets, token budget, checkpoints, data parallel);
``distributed`` ranks, devices, sharding and gathering on accelerate's ``PartialState``;
``rates``     rate grids and the paper's area under the MPT curve;
``ragged``    PLL, curves and LML estimators of ragged sequences, in a registry;
``words``     per-token/per-word PLL (whole-word masking, PLL-word-l2r) and word masks;
``api``       :func:`estimate_lml` and :func:`mpt_curve`, which dispatch on the
              model's protocol (never on its family).

Reference: Moreno-Munoz, Recasens, Hauberg, "On Masked Pre-training and the
Marginal Likelihood", NeurIPS 2023, Proposition 1.
"""

from .api import estimate_lml, mpt_curve
from .dense import DENSE_ESTIMATORS, ESTIMATORS
from .engine import score_grid, score_masks, score_nested
from .ragged import RAGGED_ESTIMATORS, mlm_curve, pll
from .rates import default_rates, mask_sizes, mpt_area, rate_grid, rate_widths
from .registry import EstimatorSpec
from .results import LMLEstimate, MPTCurve
from .words import TokenScores

__all__ = [
    "DENSE_ESTIMATORS",
    "ESTIMATORS",
    "RAGGED_ESTIMATORS",
    "EstimatorSpec",
    "LMLEstimate",
    "MPTCurve",
    "TokenScores",
    "default_rates",
    "estimate_lml",
    "mask_sizes",
    "mlm_curve",
    "mpt_area",
    "mpt_curve",
    "pll",
    "rate_grid",
    "rate_widths",
    "score_grid",
    "score_masks",
    "score_nested",
]
