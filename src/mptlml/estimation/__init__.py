"""How Monte Carlo draws of masked conditionals are run, and the results they give.

The estimators themselves (what is estimated, from which masks, with which
weights) live in :mod:`mptlml.estimators`; this package runs their draws.

Rooms:

``engine``    blocks and grids of masks scored through a dense model's reductions;
``runner``    the ragged-sequence runner (buckets, token budget, checkpoints, data parallel);
``distributed`` ranks, devices, sharding and gathering on accelerate's ``PartialState``;
``checkpoints`` the runner's validated, atomic chunk files;
``rates``     rate grids and the paper's area under the MPT curve;
``ragged``    PLL, MPT curves and the cumulative sum on ragged sequences;
``words``     per-token/per-word PLL (whole-word masking, PLL-word-l2r) and word masks;
``results``   :class:`LMLEstimate`, :class:`MPTCurve`: one result type per concept;
``stats``     the one mean / standard-error helper.

Reference: Moreno-Munoz, Recasens, Hauberg, "On Masked Pre-training and the
Marginal Likelihood", NeurIPS 2023, Proposition 1.
"""

from .engine import score_grid, score_masks, score_nested
from .ragged import mlm_curve, pll
from .rates import default_rates, mask_sizes, mpt_area, rate_grid, rate_widths
from .results import LMLEstimate, MPTCurve
from .stats import mean_stderr, sum_stderr
from .words import TokenScores

__all__ = [
    "LMLEstimate",
    "MPTCurve",
    "TokenScores",
    "default_rates",
    "mask_sizes",
    "mean_stderr",
    "mlm_curve",
    "mpt_area",
    "pll",
    "rate_grid",
    "rate_widths",
    "score_grid",
    "score_masks",
    "score_nested",
    "sum_stderr",
]
