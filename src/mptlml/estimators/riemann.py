"""The Riemann estimator on ragged sequences: D_i times the mean of the MPT curve on a rate grid.

With M = r * D_i, ``sum_{M=1..D_i} S(x_i; M) ~ D_i * mean_k S(x_i; M_ik)`` over
a grid of masking rates r_1 < ... < r_K, M_ik = max(1, round(r_k D_i)): the
Riemann form of Proposition 1 that the paper's Table 2 areas use (Moreno-Munoz,
Recasens & Hauberg, NeurIPS 2023, Sec. 4). Biased by the grid; it is the LML
that :func:`mptlml.mpt_curve` reports per sequence (``curve.lml``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..estimation.ragged import mlm_curve
from ..models.protocols import RaggedMaskedModel
from .base import Estimator, RaggedScores, register

__all__ = ["Riemann"]


@register
class Riemann(Estimator):
    """``D_i * mean_k S_hat(x_i; M_ik)`` over a rate grid (ragged sequences). Biased by the grid.

    Parameters
    ----------
    num_masks : int
        P masks per (sequence, rate).
    rates : array-like, optional
        Masking rates in (0, 1), strictly increasing (default 0.01..0.99).
    """

    name = "riemann"
    summary = "D_i * mean_k S(x_i; M_ik) over a rate grid; biased by the grid"
    unbiased = False
    dense = False
    ragged = True

    def __init__(self, num_masks: int = 1, *, rates: Any = None) -> None:
        super().__init__(num_masks)
        self.rates = rates

    def score_sequences(self, model: RaggedMaskedModel, sequences: Any, seed: int,
                        progress: bool, run: dict[str, Any]) -> RaggedScores:
        res = mlm_curve(model, sequences, rates=self.rates, num_masks=self.num_masks, seed=seed,
                        progress=progress, **run)
        assert res.lml is not None and res.lml_stderr is not None
        assert res.num_masked_rows_per_sample is not None
        return RaggedScores(np.asarray(res.lml.numpy()), np.asarray(res.lml_stderr.numpy()),
                            res.num_model_calls, res.num_masked_rows,
                            np.asarray(res.num_masked_rows_per_sample.numpy()))
