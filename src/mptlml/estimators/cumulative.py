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
from ..estimation.engine import Counter, score_grid, score_masks, score_nested
from ..estimation.ragged import exact_sum
from ..estimation.results import LMLEstimate, MPTCurve, announce_nonfinite
from ..estimation.stats import mean_stderr, strata_stderr
from ..models.base import MaskedModel
from ..models.protocols import RaggedMaskedModel
from ..models.sequence_input import encode
from .base import Draws, Estimator, RaggedScores, register
from .precision import PILOT_DATA, check_target, pilot_masks, plan_counts, stop_reason

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

    def masks_per_draw(self, num_tokens: int) -> int:
        """One mask of every size 1..D (cumulative) or one per step of an order (chain rule)."""
        return int(num_tokens)

    def evaluate(self, model: MaskedModel, x: torch.Tensor, generator: torch.Generator,
                 counter: Counter, progress: bool) -> Draws:
        """Every size's P masks, kept by size (the strata of the standard error), or nested orders.

        The masks of different sizes are independent, so the variance of a
        draw is the sum of the sizes' variances, each estimated from its P
        masks (and pooled over the data): see
        :func:`mptlml.estimation.stats.strata_stderr`. Nested masks are
        dependent across sizes, so their draws are one stratum. Shared masks
        go through the model's grid reduction (a whole grid of sizes per call,
        2-5x faster for a linear-Gaussian model at D = 512); their SE rests on
        the P draws of the data mean, and the estimate warns below 5 degrees
        of freedom.
        """
        d, p = x.shape[1], self.num_masks
        sizes = list(range(1, d + 1))
        if self.nested:
            s = score_nested(model, x, p, share_masks=self.share_masks, generator=generator,
                             progress=progress, counter=counter)  # (P, D, N)
            return Draws(s.sum(1), sizes, s.mean((0, 2)))
        if self.share_masks:
            # shared masks: a whole grid of sizes per model call (the model's fast reduction,
            # e.g. one quadratic form per draw); the SE then rests on the P draws of the data
            # mean (P - 1 degrees of freedom), and the estimate warns when they are too few
            samples, size_sums = score_grid(model, x, sizes, p, share_masks=True,
                                            generator=generator, progress=progress,
                                            counter=counter)
            assert size_sums is not None
            return Draws(samples, sizes, size_sums / p)
        return super().evaluate(model, x, generator, counter, progress)

    def curve(self, model: MaskedModel, x: Any, *, sizes: Sequence[int] | None = None,
              seed: int | torch.Generator | None = None, progress: bool = False,
              target_se: float | None = None, max_masks: int | None = None,
              allocation: str | None = None) -> MPTCurve:
        """The MPT curve of dense data: per size, the mean over P masks of S_hat(x_n; M).

        The terms of this estimator, size by size (all sizes by default, in
        which case the area is the cumulative estimate of log p(x); for a
        subset of sizes the area is D times their mean). ``stderr`` and
        ``area_stderr`` are over the data, ``per_sample_stderr`` and
        ``lml_stderr_mean`` over the masks. With ``target_se`` the masks per
        size are allocated for that Monte Carlo standard error of the mean
        area (:mod:`mptlml.estimators.precision`). See :func:`mptlml.mpt_curve`.
        """
        target_se, max_masks, allocation = check_target(target_se, max_masks, allocation)
        xt = model.validate_data(x)
        n, d = xt.shape
        p = self.num_masks
        size_list = list(range(1, d + 1)) if sizes is None else [check_size(m, d) for m in sizes]
        repeated = sorted({m for m in size_list if size_list.count(m) > 1})
        if repeated:
            raise ValueError(f"sizes {list(sizes or [])} repeat {repeated}: a repeated size "
                             "would count twice in the area; pass each size once.")
        if not size_list:
            raise ValueError("sizes is empty; pass at least one mask size in 1..D.")
        exact_sum = sorted(set(size_list)) == list(range(1, d + 1)) and len(size_list) == d
        coef = 1.0 if exact_sum else d / len(size_list)
        g = make_generator(seed)
        counter = Counter()
        target: dict[str, Any] = {}
        per_se = None
        with torch.no_grad(), model.reuse_data():
            if self.nested:
                if target_se is not None:
                    raise ValueError("target_se needs independent masks per size (nested=False).")
                s = score_nested(model, xt, p, share_masks=self.share_masks, generator=g,
                                 progress=progress, counter=counter)  # (P, D, N)
                idx = torch.tensor(size_list, dtype=torch.long, device=s.device) - 1
                per_sample = s[:, idx].mean(0).T.cpu()  # (N, S)
                mc_se = float("nan")
            else:
                cells, target = self._cells_for(model, xt, size_list, coef, target_se, max_masks,
                                                allocation, g, counter, progress)
                per_sample = torch.stack([c.mean(0) for c in cells], 1).cpu() / coef  # (N, S)
                per_se = torch.stack([mean_stderr(c)[1] for c in cells], 1).cpu() / coef
                _, mc_se, _ = strata_stderr(cells, shared=self.share_masks)
        mean, stderr = mean_stderr(per_sample)
        area_ps = per_sample.sum(1) if exact_sum else d * per_sample.mean(1)
        area, area_se = mean_stderr(area_ps)
        announce_nonfinite(per_sample, "the MPT curve")
        res = MPTCurve(
            sizes=size_list, rates=[m / d for m in size_list], mean=mean, stderr=stderr,
            per_sample=per_sample, area=float(area), area_stderr=float(area_se),
            area_is_exact_sum=exact_sum, num_tokens=d,
            num_masks=int(max(target["counts"])) if target else p,
            num_model_calls=counter.calls, num_masked_rows=counter.rows,
            num_masked_rows_per_sample=torch.full((n,), counter.rows // n, dtype=torch.long),
            lml_stderr_mean=mc_se, nested=self.nested, per_sample_stderr=per_se,
            seed=int(seed) if isinstance(seed, numbers.Integral) else None, lml=area_ps)
        if target:
            res.target_se, res.allocation = target_se, allocation
            res.stop_reason = stop_reason(mc_se, float(target_se), target["capped"])
            res.extra["masks_per_size"] = [int(c) for c in target["counts"]]
        return res

    def _cells_for(self, model: MaskedModel, x: torch.Tensor, sizes: list[int], coef: float,
                   target_se: float | None, max_masks: int | None, allocation: str,
                   g: torch.Generator, counter: Counter, progress: bool
                   ) -> tuple[list[torch.Tensor], dict[str, Any]]:
        """``coef * S_hat`` of the masks of each size: ``(P_M, N)`` per size.

        P_M = ``num_masks``, or, with ``target_se``, the counts a pilot plans
        for it (:func:`mptlml.estimators.precision.plan_counts`), scored afresh.
        """
        n = x.shape[0]
        size_t = torch.as_tensor(sizes, dtype=torch.long)
        target: dict[str, Any] = {}
        counts = torch.full((len(sizes),), self.num_masks, dtype=torch.long)
        if target_se is not None:
            sub = x if self.share_masks or n <= PILOT_DATA else x[
                torch.randperm(n, generator=g)[:PILOT_DATA].to(x.device)]
            p0 = pilot_masks(self.num_masks, 1 if self.share_masks else sub.shape[0])
            pilot = score_masks(model, sub, size_t.repeat_interleave(p0),
                                share_masks=self.share_masks, generator=g, progress=progress,
                                counter=counter).view(len(sizes), p0, -1) * coef
            v = (pilot.mean(2).var(1) if self.share_masks
                 else pilot.var(1).mean(1) / n).cpu().numpy()
            left = None if max_masks is None else max_masks - counter.rows / n
            plan, capped, wanted = plan_counts(v, np.ones(len(sizes)), target_se, allocation,
                                               left)
            counts = torch.as_tensor(plan)
            target = {"counts": plan.tolist(), "capped": capped,
                      "wanted": wanted + counter.rows / n}
        s = score_masks(model, x, size_t.repeat_interleave(counts), share_masks=self.share_masks,
                        generator=g, progress=progress, counter=counter)
        return [c * coef for c in s.split(counts.tolist())], target

    def estimate_to_target(self, model: MaskedModel, x: Any, target_se: float, *,
                           max_masks: int | None = None, allocation: str | None = None,
                           seed: int | torch.Generator | None = None,
                           progress: bool = False) -> LMLEstimate:
        """The cumulative estimate at a target Monte Carlo standard error of the mean LML.

        A pilot (:func:`~mptlml.estimators.precision.pilot_masks` masks per
        size), masks allocated over the sizes (``"neyman"``: in proportion to each size's spread;
        ``"uniform"``: the same P for every size) and a fresh estimate; see
        :mod:`mptlml.estimators.precision`. ``max_masks`` caps the masked
        inputs per datum, pilot included.
        """
        if self.nested:
            raise ValueError("target_se needs independent masks per size (nested=False).")
        target_se, max_masks, allocation = check_target(target_se, max_masks, allocation)
        assert target_se is not None
        xt = model.validate_data(x)
        n, d = xt.shape
        g = make_generator(seed)
        counter = Counter()
        with torch.no_grad(), model.reuse_data():
            cells, target = self._cells_for(model, xt, list(range(1, d + 1)), 1.0, target_se,
                                            max_masks, allocation, g, counter, progress)
            exact = None
            if model.has_log_marginal and not model.stochastic:
                exact = float(model._log_marginal(xt).double().mean())
        per_sample = torch.stack([c.mean(0) for c in cells]).sum(0).cpu()
        per_se, stderr, dof = strata_stderr(cells, shared=self.share_masks)
        mean = float(per_sample.mean())
        res = LMLEstimate(
            estimator=self.name, per_sample=per_sample, per_sample_stderr=per_se.cpu(),
            mean=mean, stderr=stderr,
            stderr_data=float(mean_stderr(per_sample)[1]),
            sizes=list(range(1, d + 1)),
            size_scores=torch.stack([c.mean() for c in cells]).cpu(),
            num_masks=int(max(target["counts"])), num_model_calls=counter.calls,
            num_masked_rows=counter.rows,
            num_masked_rows_per_sample=torch.full((n,), counter.rows // n, dtype=torch.long),
            stderr_dof=dof, target_se=target_se,
            stop_reason=stop_reason(stderr, target_se, target["capped"]),
            allocation=allocation, masks_per_size=target["counts"],
            masks_wanted=target["wanted"], exact=exact,
            bias=None if exact is None else mean - exact, shared_masks=self.share_masks,
            seed=int(seed) if isinstance(seed, numbers.Integral) else None)
        return res

    def score_sequences(self, model: RaggedMaskedModel, sequences: Any, seed: int,
                        progress: bool, run: dict[str, Any]) -> RaggedScores:
        toks = encode(model, sequences)
        lml, se, calls = exact_sum(model, toks, self.num_masks, seed, progress=progress, **run)
        rows = np.array([len(t) for t in toks], dtype=np.int64) * self.num_masks
        return RaggedScores(lml, se, calls, int(rows.sum()), rows)

