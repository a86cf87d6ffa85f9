"""The exhaustive estimator: every mask of every size, Proposition 1 computed exactly.

    log p(x) = sum_{M=1..D} (1 / C(D, M)) sum_{|mask| = M} (1/M) sum_{j in mask} log p(x_j | x_R)

(Moreno-Munoz, Recasens & Hauberg, NeurIPS 2023, Proposition 1). It scores
2^D - 1 masks, so it refuses data past ``max_masks`` masked inputs per datum; for a
consistent model it equals the exact log-marginal likelihood (the package's first identity).
"""

from __future__ import annotations

import torch

from .. import settings
from .._scoring.dense import Counter, score_fixed_masks
from .._validation import check_positive_int
from ..masks import all_masks, count_masks
from ..models.base import MaskedModel
from .api import register
from .base import Draws, Estimator

__all__ = ["Exhaustive"]


@register
class Exhaustive(Estimator):
    """Every mask of every size: exact, ``2^D - 1`` masks (small D only).

    Parameters
    ----------
    num_masks : int
        Must be 1: every mask is scored once, exactly.
    max_masks : int, optional
        Refuse data needing more masked inputs per datum (sequence) than this, 2^D - 1
        (default ``mptlml.settings.max_masks``).
    share_masks : bool
        Accepted for symmetry: the enumerated masks are shared by every datum.

    Examples
    --------
    >>> import mptlml
    >>> from mptlml.models import PPCA
    >>> model = PPCA.random(5, 2, sigma2=0.2, seed=0)
    >>> est = mptlml.estimate_lml(model, model.sample(10, generator=0), "exhaustive")
    >>> abs(est.mean - est.exact_lml) < 1e-9
    True
    """

    name = "exhaustive"
    summary = "every mask of every size; exact; 2^D - 1 masks"
    dense_only = ("share_masks", "max_masks")
    #: ragged sequences (and continuations) too: each scored on its 2^D_i - 1 masks
    #: (:meth:`~mptlml.estimators.Estimator.enumerates_sequence`: the engine scores every
    #: mask), refused past ``max_masks``
    ragged = True

    def __init__(self, num_masks: int = 1, *, max_masks: int | None = None,
                 share_masks: bool = False) -> None:
        if num_masks != 1:
            raise ValueError("num_masks does not apply to estimator='exhaustive': it scores "
                             "every mask once, exactly. Drop num_masks.")
        super().__init__(1, share_masks=share_masks)
        self.max_masks = None if max_masks is None else check_positive_int(max_masks,
                                                                           "max_masks")

    def masks_per_draw(self, num_tokens: int) -> int:
        """Every mask: 2^D - 1."""
        return count_masks(num_tokens)

    def check_num_tokens(self, num_tokens: int) -> None:
        cap = self.max_masks if self.max_masks is not None else check_positive_int(
            settings.max_masks.value(), "max_masks")
        total = count_masks(num_tokens)
        if total > cap:
            raise ValueError(
                f"the exhaustive estimator needs 2^D - 1 = {total} masks for D={num_tokens}, "
                f"more than max_masks={cap}; use estimator='cumulative' (Monte Carlo), or raise "
                "the cap (estimate_lml's max_masks=, or mptlml.settings.max_masks, which "
                "every door applies).")

    def check_targetable(self) -> None:
        """Exact: no Monte Carlo error to bring to a target."""
        raise ValueError("target_se= does not apply to estimator='exhaustive': it is exact "
                         "(standard error 0). Drop target_se, or use 'cumulative' for a Monte "
                         "Carlo estimate at a target.")

    def evaluate(self, model: MaskedModel, x: torch.Tensor, generator: torch.Generator,
                 counter: Counter, progress: bool) -> Draws:
        d = model.num_tokens
        sizes = list(range(1, d + 1))
        s_by_size = torch.stack([score_fixed_masks(model, x, all_masks(d, m), counter, progress,
                                                   generator).mean(0) for m in sizes])  # (D, N)
        return Draws(s_by_size.sum(0, keepdim=True), sizes, s_by_size.mean(1), exact=True)
