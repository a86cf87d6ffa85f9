"""The adaptive-size estimator: S_hat(x; M) / q(M), q fitted to the running RMS of the scores.

Proposition 1 of Moreno-Munoz, Recasens & Hauberg (NeurIPS 2023) writes
log p(x) = sum_{M=1..D} S(x; M). Drawing one size M ~ q and weighting its
score by 1/q(M) is unbiased for any q with q(M) > 0 on 1..D
(:class:`~mptlml.estimators.RandomSize`), and its variance::

    Var = sum_M E[S_hat(x; M)^2] / q(M) - log p(x)^2

is smallest at q(M) proportional to sqrt(E[S_hat(x; M)^2]), the root mean
square of the size's scores (importance sampling of the size). This estimator
keeps that RMS per *rate bin* (the bin of M / D, so that sequences of
different lengths D_i share statistics) from the scores of past draws, and
mixes it with a floor::

    q(M) = (1 - eps) * rms(bin(M / D)) / sum_M' rms(bin(M' / D)) + eps / D.

So every size keeps q(M) >= eps / D, and q of a draw depends only on the
draws before it: given the past, each draw is still an unbiased estimate of
log p(x), hence so is their mean (a martingale argument).

Who feeds the statistics
------------------------
:class:`mptlml.objectives.MPTLoss` calls :meth:`AdaptiveSize.observe` after
each call with the sizes it drew and their unweighted scores S_hat (detached):
nothing to do when training dense data. :class:`mptlml.hf.DataCollatorForMPT`
cannot see losses: it draws with the q fitted so far (uniform until observed).
To adapt it, pass an ``AdaptiveSize`` instance to the collator and call
``observe(m, s_hat, d)`` yourself with each batch's sizes M_i, the
sequences' S_hat = (1/M_i) sum_mask log p, and D_i (in the process that runs
the collator: a DataLoader with ``num_workers=0``). Evaluation
(:func:`mptlml.estimate_lml`) never adapts q, so two models scored with one
seed keep common random numbers. On ragged sequences each draw of sequence i
takes M ~ q over 1..D_i (the statistics are per rate bin, shared by all lengths).
"""

from __future__ import annotations

from typing import Any

import torch

from .._validation import check_positive_int
from .api import register
from .random_size import RandomSize

__all__ = ["MAX_BINS", "AdaptiveSize"]

#: most rate bins of :class:`AdaptiveSize` (two float64 statistics each)
MAX_BINS = 65536


def _as_cpu(value: Any, name: str) -> torch.Tensor:
    """``value`` (a tensor, list or number) as a detached CPU tensor, refused if not numeric."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"observe: {name} must be a tensor or a list of numbers, got "
                        f"{type(value).__name__}.") from None


@register
class AdaptiveSize(RandomSize):
    """``S_hat(x; M) / q(M)``, M ~ q, q proportional to the running RMS of S_hat per rate bin.

    Parameters
    ----------
    num_masks : int
        P draws of (M, mask) per datum.
    share_masks : bool
        One (M, mask) per draw shared by every datum (dense data).
    stratified : bool
        Spread the sizes of the data over the quantile strata of q (dense data).
    eps : float in (0, 1]
        Floor: ``q = (1 - eps) q_adapted + eps / D``, so q(M) >= eps / D.
        ``eps=1`` is the uniform random-size estimator.
    num_bins : int
        Rate bins of M / D over (0, 1]: size M of D tokens is in bin
        ``ceil(num_bins * M / D) - 1``.
    decay : float in (0, 1]
        Forgetting factor of the statistics per :meth:`observe` call
        (1: the mean of every score so far; < 1 follows a model that trains).

    Notes
    -----
    Before any observation, and for bins never observed, q is uniform over
    the unobserved part (each unobserved bin takes the largest observed RMS,
    so it keeps being explored). Unbiased for any state of the statistics;
    the variance is the lowest for an importance-sampled size when the RMS
    is that of the current model.

    References
    ----------
    Moreno-Munoz, Recasens, Hauberg (2023), Proposition 1.

    Examples
    --------
    >>> import torch
    >>> from mptlml.models import PPCA
    >>> from mptlml.objectives import MPTLoss
    >>> model = PPCA.random(8, 2, sigma2=0.2, seed=0)
    >>> x = model.sample(50, generator=0)
    >>> loss = MPTLoss(model, "adaptive-size", num_masks=4)
    >>> for step in range(5):
    ...     value = loss(x, generator=step)   # observes its own scores
    >>> q = loss.estimator_.size_probs(8)
    >>> bool((q >= 0.1 / 8 - 1e-12).all()) and abs(float(q.sum()) - 1) < 1e-12
    True
    """

    name = "adaptive-size"
    summary = "S_hat(x; M) / q(M), M ~ q ~ running RMS of S_hat per rate bin + floor; unbiased"

    def __init__(self, num_masks: int = 1, *, share_masks: bool = False,
                 stratified: bool = False, eps: float = 0.1, num_bins: int = 16,
                 decay: float = 0.95) -> None:
        super().__init__(num_masks, share_masks=share_masks, stratified=stratified)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps <= 1:
            raise ValueError(f"eps must be a number in (0, 1] (the floor eps / D keeps every "
                             f"size possible), got {eps!r}.")
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0 < decay <= 1:
            raise ValueError(f"decay must be a number in (0, 1], got {decay!r}.")
        self.eps = float(eps)
        self.num_bins = check_positive_int(num_bins, "num_bins")
        if self.num_bins > MAX_BINS:
            raise ValueError(f"num_bins={num_bins} is more rate bins than any sequence has "
                             f"sizes to fill (at most {MAX_BINS}); bins finer than 1/D share "
                             f"no statistics. Pass num_bins <= {MAX_BINS} (default 16).")
        self.decay = float(decay)
        self._sum2 = torch.zeros(self.num_bins, dtype=torch.float64)
        self._count = torch.zeros(self.num_bins, dtype=torch.float64)

    # ---------------------------------------------------------------- the statistics
    def bins(self, sizes: torch.Tensor, num_tokens: int | torch.Tensor) -> torch.Tensor:
        """Rate bin of each size: ``ceil(num_bins * M / D) - 1`` in 0..num_bins-1."""
        d = torch.as_tensor(num_tokens, dtype=torch.float64)
        r = sizes.double() / d.clamp_min(1)
        return (torch.ceil(r * self.num_bins).long() - 1).clamp(0, self.num_bins - 1)

    def bin_rms(self) -> torch.Tensor:
        """Running RMS of S_hat per rate bin, ``(num_bins,)``; NaN where never observed."""
        return torch.where(self._count > 0, (self._sum2 / self._count.clamp_min(1e-300)).sqrt(),
                           float("nan"))

    def observe(self, sizes: torch.Tensor, scores: torch.Tensor,
                num_tokens: int | torch.Tensor) -> None:
        """Update the per-bin statistics with drawn sizes and their unweighted S_hat.

        Parameters
        ----------
        sizes : LongTensor (or a list)
            The sizes of the draw (``(R,)`` or ``(R, N)`` rows of dense data;
            ``(B,)`` for sequences, 0 where D_i = 0 is skipped).
        scores : Tensor
            S_hat(x; M) of each row, ``sizes``' shape or ``(R, N)`` for
            ``(R,)`` sizes (a mask shared by the data); detached here.
        num_tokens : int or LongTensor ``(B,)``
            D, or D_i per sequence.
        """
        s = _as_cpu(scores, "scores").double()
        m = _as_cpu(sizes, "sizes")
        if m.dtype.is_floating_point and bool((m != m.round()).any()):
            bad = m[m != m.round()][0]
            raise ValueError(f"observe: sizes must be whole numbers of masked tokens, got "
                             f"{float(bad):g}; pass the sizes that were drawn.")
        m = m.long()
        if m.ndim == 1 and s.ndim == 2:
            m = m[:, None].expand_as(s)
        if m.shape != s.shape:
            raise ValueError(f"observe: sizes {tuple(m.shape)} and scores {tuple(s.shape)} "
                             "do not match (one score per drawn size).")
        d = (_as_cpu(num_tokens, "num_tokens").long()
             if isinstance(num_tokens, torch.Tensor | list | tuple)
             else torch.tensor(check_positive_int(num_tokens, "num_tokens")))
        d = d.expand_as(m) if d.ndim == 0 else d
        if d.shape != m.shape:
            raise ValueError(f"observe: num_tokens {tuple(d.shape)} must be an int or one "
                             f"per size {tuple(m.shape)}.")
        bad = (m < 0) | (m > d.clamp_min(0)) | ((d <= 0) & (m != 0))
        if bool(bad.any()):
            k = tuple(int(v) for v in bad.nonzero()[0])
            raise ValueError(f"observe: size M={int(m[k])} of D={int(d[k])} tokens (at {k}) "
                             "cannot have been drawn (1 <= M <= D, 0 where D = 0); pass the "
                             "sizes, scores and D of one draw.")
        keep = m > 0
        s, m, d = s[keep], m[keep], d[keep]
        if not bool(torch.isfinite(s).all()):
            bad = int((~torch.isfinite(s)).nonzero()[0, 0])
            raise ValueError(f"observe: score {float(s[bad])} at size M={int(m[bad])} of "
                             f"D={int(d[bad])} is not finite; the size distribution cannot "
                             "adapt to it (check the model's log-probabilities).")
        sq = s.square()
        if not bool(torch.isfinite(sq).all()):
            bad = int((~torch.isfinite(sq)).nonzero()[0, 0])
            raise ValueError(f"observe: score {float(s[bad])} at size M={int(m[bad])} of "
                             f"D={int(d[bad])} is too large: its square overflows float64, "
                             "and the running RMS of the scores would become NaN. Scores are "
                             "mean log-probabilities per masked token (check the model).")
        total = self._sum2 * self.decay
        total.index_add_(0, self.bins(m, d), sq)
        if not bool(torch.isfinite(total).all()):
            raise ValueError("observe: the running sum of squared scores overflows float64; "
                             "the scores are far too large for log-probabilities (check the "
                             "model), or call reset().")
        self._sum2.copy_(total)
        self._count.mul_(self.decay).index_add_(0, self.bins(m, d), torch.ones_like(s))

    def fingerprint(self) -> dict[str, Any]:
        """Name, options and the statistics q is fitted to (they decide the sizes drawn)."""
        return {**super().fingerprint(), "sum2": self._sum2.tolist(),
                "count": self._count.tolist()}

    def reset(self) -> None:
        """Forget every observation (q is uniform again)."""
        self._sum2.zero_()
        self._count.zero_()

    def size_probs(self, num_tokens: int) -> torch.Tensor:
        """q(M) over M = 1..D: ``(1 - eps) rms(bin(M/D)) / sum + eps / D`` (float64)."""
        d = check_positive_int(num_tokens, "num_tokens")
        rms = self.bin_rms()
        seen = ~torch.isnan(rms)
        if not bool(seen.any()) or not bool((rms[seen] > 0).any()):
            return torch.full((d,), 1.0 / d, dtype=torch.float64)
        rms = torch.where(seen, rms, rms[seen].max())
        a = rms[self.bins(torch.arange(1, d + 1), d)]
        if not float(a.sum()) > 0:
            return torch.full((d,), 1.0 / d, dtype=torch.float64)
        q = (1.0 - self.eps) * a / a.sum() + self.eps / d
        return q / q.sum()
