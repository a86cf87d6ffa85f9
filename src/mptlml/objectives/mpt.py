"""The masked pre-training (MPT) objective, built on the core estimators.

Proposition 1 of Moreno-Munoz, Recasens & Hauberg (NeurIPS 2023)::

    log p(x) = sum_{M=1..D} S(x; M),
    S(x; M)  = E_{|mask| = M} [ (1/M) sum_{j in mask} log p(x_j | x_R) ].

:class:`MPTLoss` returns, per datum, a Monte Carlo estimate of the right-hand
side (the *negative* of the paper's MPT loss, so that it is maximised):

``"cumulative"``   sum_M (1/P) sum_p S_hat_p(x; M), P fresh masks per size;
                   unbiased for log p(x) (the paper's cumulative MPT loss).
``"random-size"``  (D/P) sum_p S_hat_p(x; M_p) with M_p ~ U{1..D}; unbiased.
``"fixed-rate"``   (D/P) sum_p S_hat_p(x; M) with M = max(1, floor(rate D));
                   biased: its expectation D S(x; M) differs from log p(x)
                   by a bias that does not depend on the mask draws.

Gradients flow through the model's conditionals (the masks are sampled, the
scores are differentiable functions of the parameters), so the gradient of
the estimate is an unbiased estimate of the gradient of its expectation.
"""

from __future__ import annotations

import torch

from .._validation import check_positive_int, make_generator
from ..estimation.engine import score_masks
from ..masks import MASK_SIZE_ESTIMATORS, check_mask_size_args, draw_mask_sizes
from ..models.base import MaskedModel
from .base import Objective

__all__ = ["MPT_ESTIMATORS", "MPTLoss"]

#: estimators MPTLoss can train with (the Monte Carlo ones of :func:`mptlml.estimate_lml`).
MPT_ESTIMATORS = MASK_SIZE_ESTIMATORS


class MPTLoss(Objective):
    """Negative masked pre-training loss per datum: an estimate of log p(x_n) to maximise.

    Parameters
    ----------
    model : MaskedModel
        Any model with masked conditionals log p(x_j | x_R).
    estimator : {"cumulative", "random-size", "fixed-rate"}
        Which estimator of Proposition 1 (see the module docstring).
    num_masks : int
        P: masks per size (cumulative) or per datum (random-size, fixed-rate),
        redrawn at every call.
    rate : float in (0, 1), optional
        Masking rate of ``"fixed-rate"`` (e.g. 0.15 for BERT, 0.2 in Fig. 2);
        M = max(1, floor(rate * D)).
    mask_size : int, optional
        Give M directly instead of ``rate`` (``"fixed-rate"`` only).
    share_masks : bool
        One mask per draw shared by all data (the paper's code) instead of
        independent masks per datum (default; lower variance).

    Examples
    --------
    >>> from mptlml.models import PPCA
    >>> from mptlml.objectives import MPTLoss
    >>> model = PPCA.random(6, 2, sigma2=0.2, seed=0)
    >>> x = model.sample(50, generator=0)
    >>> obj = MPTLoss(model, "cumulative", num_masks=2)
    >>> value = obj(x, generator=0)        # scalar to maximise
    >>> (-value).backward()                # gradients w.r.t. model.W

    References
    ----------
    Moreno-Munoz, Recasens, Hauberg (2023), Proposition 1, Sec. 3 and Fig. 2.
    """

    name = "mpt"

    def __init__(self, model: MaskedModel, estimator: str = "cumulative", *, num_masks: int = 1,
                 rate: float | None = None, mask_size: int | None = None,
                 share_masks: bool = False) -> None:
        super().__init__(model)
        if estimator not in MPT_ESTIMATORS:
            hint = (" (exhaustive and chain-rule are evaluation-only: use mptlml.estimate_lml)"
                    if estimator in ("exhaustive", "chain-rule") else "")
            raise ValueError(
                f"unknown MPT estimator {estimator!r}{hint}; choose one of "
                f"{', '.join(MPT_ESTIMATORS)}."
            )
        self.estimator = estimator
        self.num_masks = check_positive_int(num_masks, "num_masks")
        self.share_masks = bool(share_masks)
        d = model.num_tokens
        self.mask_size = check_mask_size_args(estimator, d, rate=rate, mask_size=mask_size)
        self.rate: float | None = None
        if self.mask_size is not None:
            self.rate = float(rate) if rate is not None else self.mask_size / d

    def extra_repr(self) -> str:
        s = f"estimator={self.estimator!r}, num_masks={self.num_masks}"
        if self.estimator == "fixed-rate":
            s += f", rate={self.rate}, mask_size={self.mask_size}"
        return s + (", share_masks=True" if self.share_masks else "")

    def per_datum(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Estimate of log p(x_n) for each row, ``(N,)`` float64, differentiable.

        All the masks of one call go through a single :func:`score_masks`
        call (one batched model evaluation per block).
        """
        return self._estimate(x, generator, mean_over_data=False)

    def batch_mean(self, x: torch.Tensor,
                   generator: torch.Generator | None = None) -> torch.Tensor:
        """Mean over the data of :meth:`per_datum` (same masks, same value).

        With ``share_masks`` the scores are averaged over the data inside the
        model (``masked_log_prob_mean``): for PPCA from sufficient statistics,
        O(D^2 K) per mask instead of O(N D K).
        """
        if not self.share_masks:
            return self.per_datum(x, generator).mean()
        return self._estimate(x, generator, mean_over_data=True)

    def _estimate(self, x: torch.Tensor, generator: torch.Generator | None,
                  mean_over_data: bool) -> torch.Tensor:
        n, d = x.shape
        p = self.num_masks
        g = make_generator(generator)
        rows = draw_mask_sizes(self.estimator, d, p, num_data=None if self.share_masks else n,
                               mask_size=self.mask_size, generator=g)
        s = score_masks(self.model, x, rows, share_masks=self.share_masks, generator=g,
                        mean_over_data=mean_over_data)
        if self.estimator == "cumulative":
            return s.view(d, p, *s.shape[1:]).sum(0).mean(0)
        return d * s.mean(0)
