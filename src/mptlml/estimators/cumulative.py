"""The cumulative estimator: sum over every size M of a Monte Carlo average of S_hat(x; M).

Proposition 1 of Moreno-Munoz, Recasens & Hauberg (NeurIPS 2023)::

    log p(x) = sum_{M=1..D} S(x; M),
    S(x; M)  = E_{|mask| = M} [ (1/M) sum_{j in mask} log p(x_j | x_R) ].

Draw p holds one uniform mask of every size, and its estimate is
``sum_{M=1..D} S_hat_p(x; M)``: unbiased (the paper's "cumulative MPT loss").
``nested=True`` takes the D masks of a draw as the prefixes of one random
order (still unbiased per size, dependent across sizes, cheaper per mask).
On ragged sequences each sequence sums its own sizes 1..D_i.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .._validation import check_size, make_generator
from ..estimation.engine import Counter, score_grid, score_nested
from ..estimation.ragged import exact_sum
from ..estimation.results import MPTCurve
from ..estimation.stats import mean_stderr
from ..estimation.words import encode
from ..models.base import MaskedModel
from ..models.protocols import RaggedMaskedModel
from .base import Draws, Estimator, RaggedScores, register

__all__ = ["Cumulative"]


@register
class Cumulative(Estimator):
    """``sum_{M=1..D} (1/P) sum_p S_hat_p(x; M)``, P uniform masks per size. Unbiased.

    Parameters
    ----------
    num_masks : int
        P masks per size (and datum).
    share_masks : bool
        One mask per (size, draw) shared by every datum (dense data).
    nested : bool
        The masks of a draw are the prefixes of one random order (dense data).

    Examples
    --------
    >>> import mptlml
    >>> from mptlml.models import PPCA
    >>> model = PPCA.random(6, 2, sigma2=0.2, seed=0)
    >>> x = model.sample(30, generator=0)
    >>> est = mptlml.estimate_lml(model, x, "cumulative", num_masks=8, seed=0)
    >>> abs(est.mean - est.exact) < 5 * est.stderr + 1e-9
    True
    """

    name = "cumulative"
    summary = "sum_M S_hat(x; M), P uniform masks per size; unbiased"
    ragged = True
    trainable = True
    dense_only = ("share_masks", "nested")

    def __init__(self, num_masks: int = 1, *, share_masks: bool = False,
                 nested: bool = False) -> None:
        super().__init__(num_masks, share_masks=share_masks)
        if not isinstance(nested, bool):
            raise TypeError(f"nested must be True or False, got {nested!r}.")
        self.nested = nested

    def sizes(self, num_tokens: int | torch.Tensor, *, num_data: int | None = None,
              generator: torch.Generator | None = None) -> torch.Tensor:
        if isinstance(num_tokens, torch.Tensor):
            raise ValueError("the cumulative estimator draws every size of each sequence; per-"
                             "sequence sizes are drawn by 'random-size' or 'fixed-rate'.")
        if self.nested:
            raise ValueError("nested masks are scored as prefixes of random orders; they have "
                             "no independent size rule (use nested=False to train).")
        return torch.arange(1, int(num_tokens) + 1).repeat_interleave(self.num_masks)

    def weights(self, sizes: torch.Tensor, num_tokens: int | torch.Tensor) -> torch.Tensor:
        return torch.ones(sizes.shape, dtype=torch.float64)

    def evaluate(self, model: MaskedModel, x: torch.Tensor, generator: torch.Generator,
                 counter: Counter, progress: bool) -> Draws:
        """Every size's P masks, kept by size (the strata of the standard error), or nested orders.

        The masks of different sizes are independent, so the variance of a
        draw is the sum of the sizes' variances, each estimated from its P
        masks (and pooled over the data): see
        :func:`mptlml.estimation.stats.strata_stderr`. Nested masks are
        dependent across sizes, so their draws are one stratum.
        """
        d, p = x.shape[1], self.num_masks
        sizes = list(range(1, d + 1))
        if self.nested:
            s = score_nested(model, x, p, share_masks=self.share_masks, generator=generator,
                             progress=progress, counter=counter)  # (P, D, N)
            return Draws(s.sum(1), sizes, s.mean((0, 2)))
        return super().evaluate(model, x, generator, counter, progress)

    def curve(self, model: MaskedModel, x: Any, *, sizes: Sequence[int] | None = None,
              seed: int | torch.Generator | None = None, progress: bool = False) -> MPTCurve:
        """The MPT curve of dense data: per size, the mean over P masks of S_hat(x_n; M).

        The terms of this estimator, size by size (all sizes by default, in
        which case the area is the cumulative estimate of log p(x); for a
        subset of sizes the area is D times their mean). Standard errors are
        over the data. See :func:`mptlml.mpt_curve`.
        """
        xt = model.validate_data(x)
        n, d = xt.shape
        p = self.num_masks
        size_list = list(range(1, d + 1)) if sizes is None else [check_size(m, d) for m in sizes]
        if not size_list:
            raise ValueError("sizes is empty; pass at least one mask size in 1..D.")
        g = make_generator(seed)
        counter = Counter()
        with torch.no_grad(), model.reuse_data():
            if self.nested:
                s = score_nested(model, xt, p, share_masks=self.share_masks, generator=g,
                                 progress=progress, counter=counter)  # (P, D, N)
                idx = torch.tensor(size_list, dtype=torch.long, device=s.device) - 1
                per_sample = s[:, idx].mean(0).T.cpu()  # (N, S)
            else:
                s, _ = score_grid(model, xt, size_list, p, by="size",
                                  share_masks=self.share_masks, generator=g, progress=progress,
                                  counter=counter)
                per_sample = (s / p).T.cpu()  # (N, S)
        mean, stderr = mean_stderr(per_sample)
        exact_sum = sorted(set(size_list)) == list(range(1, d + 1)) and len(size_list) == d
        area_ps = per_sample.sum(1) if exact_sum else d * per_sample.mean(1)
        area, area_se = mean_stderr(area_ps)
        return MPTCurve(
            sizes=size_list, rates=[m / d for m in size_list], mean=mean, stderr=stderr,
            per_sample=per_sample, area=float(area), area_stderr=float(area_se),
            area_is_exact_sum=exact_sum, num_tokens=d, num_masks=p,
            num_model_calls=counter.calls, nested=self.nested,
            seed=int(seed) if isinstance(seed, numbers.Integral) else None, lml=area_ps)

    def score_sequences(self, model: RaggedMaskedModel, sequences: Any, seed: int,
                        progress: bool, run: dict[str, Any]) -> RaggedScores:
        toks = encode(model, sequences)
        lml, se, calls = exact_sum(model, toks, self.num_masks, seed, progress=progress, **run)
        rows = np.array([len(t) for t in toks], dtype=np.int64) * self.num_masks
        return RaggedScores(lml, se, calls, int(rows.sum()), rows)

