"""The masked pre-training (MPT) objective: the mean of an estimator's draws.

Proposition 1 of Moreno-Munoz, Recasens & Hauberg (NeurIPS 2023)::

    log p(x) = sum_{M=1..D} S(x; M),
    S(x; M)  = E_{|mask| = M} [ (1/M) sum_{j in mask} log p(x_j | x_R) ].

:class:`MPTLoss` returns, per datum, the mean of the P draws of a trainable
estimator of :mod:`mptlml.estimators` (the *negative* of the paper's MPT loss,
so that it is maximised): ``"cumulative"`` (the paper's cumulative MPT loss;
unbiased), ``"random-size"`` (D * S_hat(x; M), M ~ U{1..D}; unbiased; or any
size distribution q with weight 1/q(M)), ``"fixed-rate"`` (D * S_hat(x; M) at
one size; biased), or any trainable estimator registered by the user.

Gradients flow through the model's conditionals (the masks are sampled, the
scores are differentiable functions of the parameters), so the gradient of
the estimate is an unbiased estimate of the gradient of its expectation.
"""

from __future__ import annotations

from typing import Any

import torch

from .._validation import make_generator
from ..estimators import Estimator, available, create, get
from ..models.base import MaskedModel
from .base import Objective

__all__ = ["MPTLoss"]


class MPTLoss(Objective):
    """Negative masked pre-training loss per datum: an estimate of log p(x_n) to maximise.

    Parameters
    ----------
    model : MaskedModel
        Any model with masked conditionals log p(x_j | x_R).
    estimator : str or Estimator
        A trainable estimator (``mptlml.estimators.available(trainable=True)``):
        ``"cumulative"``, ``"random-size"``, ``"fixed-rate"``, or one
        registered by the user; or an instance.
    num_masks : int, optional
        P: masks per size (cumulative) or per datum (random-size, fixed-rate),
        redrawn at every call. Default 1 (an Estimator instance: its own).
    rate : float in (0, 1), optional
        Masking rate of ``"fixed-rate"`` (e.g. 0.15 for BERT, 0.2 in Fig. 2);
        M = max(1, floor(rate * D)).
    mask_size : int, optional
        Give M directly instead of ``rate`` (``"fixed-rate"`` only).
    share_masks : bool
        One mask per draw shared by all data (the paper's code) instead of
        independent masks per datum (default; lower variance).
    **options
        Any other option of the estimator (e.g. ``stratified`` of random-size).

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

    def __init__(self, model: MaskedModel, estimator: str | Estimator = "cumulative", *,
                 num_masks: int | None = None, rate: float | None = None,
                 mask_size: int | None = None, share_masks: bool = False,
                 **options: Any) -> None:
        super().__init__(model)
        cls = get(estimator)
        if not cls.trainable or not cls.dense:
            raise ValueError(
                f"the {cls.name!r} estimator cannot train: it has no mask-size rule for dense "
                f"data (exhaustive and chain-rule are evaluation-only: use "
                f"mptlml.estimate_lml); choose one of {', '.join(available(trainable=True))}.")
        self.estimator_ = create(estimator, num_masks=num_masks, rate=rate,
                                 mask_size=mask_size, share_masks=share_masks, **options)
        self.estimator_.check_num_tokens(model.num_tokens)
        self.estimator = self.estimator_.name
        self.num_masks = self.estimator_.num_masks
        self.share_masks = self.estimator_.share_masks
        size = getattr(self.estimator_, "size", None)
        self.mask_size: int | None = size(model.num_tokens) if callable(size) else None
        self.rate: float | None = self.estimator_.recorded_rate(model.num_tokens)

    def extra_repr(self) -> str:
        return repr(self.estimator_)

    def per_datum(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Estimate of log p(x_n) for each row, ``(N,)`` float64, differentiable.

        The mean of the estimator's P draws (:meth:`mptlml.estimators.Estimator.draws`);
        all the masks of one call go through one batched model evaluation per block.
        """
        return self._draws(x, generator).mean(0)

    def _draws(self, x: torch.Tensor, generator: torch.Generator | None,
               mean_over_data: bool = False) -> torch.Tensor:
        """The estimator's draws; an estimator that learns from its draws then observes them.

        The sizes of this call were drawn before the observation, so the size
        rule of a draw depends only on past draws (each draw stays unbiased).
        """
        return self.estimator_.draws(self.model, x, generator=make_generator(generator),
                                     mean_over_data=mean_over_data, learn=True)

    def batch_mean(self, x: torch.Tensor,
                   generator: torch.Generator | None = None) -> torch.Tensor:
        """Mean over the data of :meth:`per_datum` (same masks, same value).

        With ``share_masks`` the scores are averaged over the data inside the
        model (``masked_log_prob_mean``): for PPCA from sufficient statistics,
        O(D^2 K) per mask instead of O(N D K).
        """
        if not self.share_masks:
            return self.per_datum(x, generator).mean()
        return self._draws(x, generator, mean_over_data=True).mean(0)
