"""The estimator: one object per Monte Carlo estimator of Proposition 1, on any kind of data.

Proposition 1 of Moreno-Munoz, Recasens & Hauberg (NeurIPS 2023)::

    log p(x) = sum_{M=1..D} S(x; M),
    S(x; M)  = E_{|mask| = M} [ (1/M) sum_{j in mask} log p(x_j | x_R) ].

An :class:`Estimator` holds what distinguishes one estimator of this sum from
another, in one place:

- its **options**, validated once in ``__init__`` (the signature is the list
  of options it accepts; anything else is refused by
  :func:`~mptlml.estimators.api.create`);
- its **mask-size rule** :meth:`Estimator.sizes` and the **weight** of each
  size :meth:`Estimator.weights` (a trainable estimator: evaluation, training
  with :class:`mptlml.objectives.MPTLoss` and the Hugging Face collator all
  draw their sizes here). The same rule estimates dense ``(N, D)`` data and
  ragged sequences, where each sequence has its own D_i and draws its own
  sizes (:meth:`Estimator.ragged_cells`);
- :meth:`Estimator.draws`, the P i.i.d. per-draw estimates of log p(x_n) that
  everything else is built on (the estimate and its standard error, the
  training objective, common random numbers in model selection, running
  means);
- :meth:`Estimator.estimate`, the estimate with its Monte Carlo standard error
  and degrees of freedom, for dense data and ragged sequences alike, and
  :meth:`Estimator.estimate_to_target`, the same at a target standard error
  for any unbiased estimator: a pilot measures the spread of each *stratum*
  of a draw (a term whose draws are independent of the others': a mask size
  of ``cumulative``, the whole draw of ``random-size``), the masks are
  allocated over the strata (:mod:`mptlml.estimators.allocation`) and fresh
  draws give the estimate.

A new estimator is one subclass and one :func:`~mptlml.estimators.api.register`
call, inside the package or outside it::

    >>> import torch
    >>> from mptlml.estimators import RandomSize, register
    >>> class SmallSizes(RandomSize):
    ...     '''M ~ q(M) proportional to 1/M; weight 1/q(M) on S_hat(x; M) (unbiased).'''
    ...     name = "small-sizes"
    ...     def size_probs(self, num_tokens):
    ...         q = 1.0 / torch.arange(1, num_tokens + 1, dtype=torch.float64)
    ...         return q / q.sum()
    >>> _ = register(SmallSizes, replace=True)
"""

from __future__ import annotations

import copy
import inspect
import math
import numbers
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from .._scoring.dense import Counter, score_masks
from .._scoring.ragged import check_run_size, run_pairs, seq_seed, unit_counts
from .._validation import check_positive_int, make_generator
from ..masks import sample_masks
from ..models.base import MaskedModel
from ..models.protocols import RaggedMaskedModel
from ..models.sequence_input import encode
from .allocation import (
    check_target,
    fresh_seed,
    pilot_data,
    pilot_masks,
    pilot_subset,
    plan_counts,
    stop_reason,
    stratum_variances,
    warn_target_missed,
)
from .results import LMLEstimate, announce_nonfinite, as_float64
from .stats import mean_stderr, strata_stderr, sum_stderr, welch_dof

__all__ = ["MIN_STDERR_DOF", "Draws", "Estimator", "RaggedScores", "accepted_options"]

#: below this many effective degrees of freedom the reported standard error is flagged
#: (Student's t with 5 dof exceeds 2 in 10% of runs, with 3 in 14%, with 1 in 30%)
MIN_STDERR_DOF = 5


@dataclass
class Draws:
    """What :meth:`Estimator.evaluate` returns for dense data.

    Attributes
    ----------
    samples : torch.Tensor, (P, N)
        P i.i.d. estimates of log p(x_n) per datum (float64).
    sizes : list of int
        The mask sizes the summary ``size_scores`` runs over.
    size_scores : torch.Tensor, (len(sizes),)
        Mean over data and draws of S_hat(x; M) per size (NaN where a size was
        never drawn, or where the estimator has no per-size scores).
    exact : bool
        True when the samples enumerate every mask (no Monte Carlo error).
    cells : torch.Tensor, (H, P, N), optional
        The terms of the draws by independent stratum (a mask size):
        ``samples = cells.sum(0)``. Given, the standard errors pool each
        stratum's spread (:func:`mptlml.estimators.stats.strata_stderr`);
        None: one stratum, the draws themselves.
    """

    samples: torch.Tensor
    sizes: list[int]
    size_scores: torch.Tensor
    exact: bool = False
    cells: torch.Tensor | None = None


@dataclass
class RaggedScores:
    """Per-sequence estimates of an estimator on ragged sequences (a masked LM).

    Attributes
    ----------
    lml, stderr : numpy.ndarray, (N,)
        Estimate of log p(x_i) per sequence and its Monte Carlo standard error.
    num_model_calls : int
        Forward passes.
    num_masked_rows : int
        (sequence, masked input) pairs scored.
    rows_per_sequence : numpy.ndarray, (N,), optional
        Masked inputs scored per sequence (sums to ``num_masked_rows``).
    dof : float, optional
        Welch-Satterthwaite degrees of freedom of the standard error of the
        mean over sequences (None when a stratum holds a single draw).
    """

    lml: np.ndarray
    stderr: np.ndarray
    num_model_calls: int
    num_masked_rows: int
    rows_per_sequence: np.ndarray | None = None
    dof: float | None = None


class Estimator:
    """An MPT estimator of log p(x) (Proposition 1): base class of every estimator.

    Subclasses set the class attributes, validate their options in
    ``__init__``, and implement either the size rule (:meth:`sizes` and
    :meth:`weights`: then :meth:`draws` works unchanged, the estimator can
    train, and it estimates ragged sequences through the same rule) or their
    own :meth:`evaluate` (and :meth:`ragged_cells` for ragged sequences).

    Parameters
    ----------
    num_masks : int
        P, the number of i.i.d. draws per datum.
    share_masks : bool
        One mask per draw shared by every datum (the paper's code) instead of
        independent masks per datum (default; lower variance). Dense data.

    Attributes
    ----------
    name : str
        The registry name (``estimate_lml(model, x, name)``).
    summary : str
        One line: the formula and whether it is unbiased.
    unbiased : bool
        Whether E[draw] = log p(x) for a consistent model (and so whether a
        target standard error applies).
    dense, ragged : bool
        Whether it estimates dense ``(N, D)`` data / ragged sequences.
    trainable : bool
        Whether it has a size rule (:meth:`sizes`), so that
        :class:`~mptlml.objectives.MPTLoss` can train with it.
    per_sequence_sizes : bool
        Whether :meth:`sizes` draws one size per sequence of a batch (the
        Hugging Face collator needs this).
    ragged_tag : str
        The folder of its checkpoints under a run's ``checkpoint_dir``
        (default: its name with ``_`` for ``-``).
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    unbiased: ClassVar[bool] = True
    dense: ClassVar[bool] = True
    ragged: ClassVar[bool] = False
    trainable: ClassVar[bool] = False
    per_sequence_sizes: ClassVar[bool] = False
    #: options that only dense data take (refused for ragged sequences)
    dense_only: ClassVar[tuple[str, ...]] = ("share_masks",)
    ragged_tag: ClassVar[str] = ""

    def __init__(self, num_masks: int = 1, *, share_masks: bool = False) -> None:
        self.num_masks = check_positive_int(num_masks, "num_masks")
        if not isinstance(share_masks, bool):
            raise TypeError(f"share_masks must be True or False, got {share_masks!r}.")
        self.share_masks = share_masks

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options().items())
        return f"{type(self).__name__}({opts})"

    def options(self) -> dict[str, Any]:
        """The options of this estimator, by the names of its ``__init__``."""
        return {k: getattr(self, k) for k in accepted_options(type(self))
                if hasattr(self, k)}

    def fingerprint(self) -> dict[str, Any]:
        """What decides its draws besides the seed, for a checkpoint: name and options."""
        return {"name": self.name, **{k: v for k, v in self.options().items()
                                      if k != "num_masks"}}

    # ---------------------------------------------------------------- size rule
    def sizes(self, num_tokens: int | torch.Tensor, *, num_data: int | None = None,
              generator: torch.Generator | None = None) -> torch.Tensor:
        """The mask sizes of one call: ``(R,)`` or ``(R, N)`` rows, R = rows per draw * P.

        Dense data (``num_tokens`` an int D): the rows of the P draws,
        laid out ``(rows_per_draw, P)`` size-major, one size per datum when
        ``num_data`` is given. Ragged sequences (``num_tokens`` a LongTensor of
        D_i): one size per sequence, ``(B,)`` (0 where D_i = 0).
        """
        raise NotImplementedError(
            f"the {self.name!r} estimator has no mask-size rule: it cannot train or draw sizes "
            "for a collator; use 'cumulative', 'random-size' or 'fixed-rate'.")

    def weights(self, sizes: torch.Tensor, num_tokens: int | torch.Tensor) -> torch.Tensor:
        """The weight of S_hat(x; M) of each row in its draw (float64, ``sizes``' shape).

        A draw is ``sum_rows weight * S_hat(x; M_row)``; for the collator, the
        weight of the summed masked log-probs of sequence i is ``weight_i / M_i``.
        """
        raise NotImplementedError(f"the {self.name!r} estimator has no mask-size rule.")

    def observe(self, sizes: torch.Tensor, scores: torch.Tensor,
                num_tokens: int | torch.Tensor) -> None:
        """Learn from the sizes of a past draw and their unweighted S_hat (default: nothing).

        :class:`~mptlml.objectives.MPTLoss` calls it after each call with the
        rows of :meth:`sizes` and their scores (detached), so an estimator may
        adapt its size rule to the draws seen so far (e.g.
        :class:`~mptlml.estimators.AdaptiveSize`); a size rule that depends
        only on past draws keeps each draw unbiased given the past.
        """

    def with_draws(self, num_masks: int) -> Estimator:
        """This estimator (its options and state) with ``num_masks`` draws instead."""
        out = copy.copy(self)
        out.num_masks = check_positive_int(num_masks, "num_masks")
        return out

    # ---------------------------------------------------------------- draws
    def draws(self, model: MaskedModel, x: torch.Tensor, *,
              generator: torch.Generator | int | None = None, progress: bool = False,
              counter: Counter | None = None, mean_over_data: bool = False,
              learn: bool = False) -> torch.Tensor:
        r"""P i.i.d. estimates of log p(x_n): ``(P, N)``, or ``(P,)`` with ``mean_over_data``.

        Each draw is ``sum_rows weight_row * S_hat(x; M_row)`` over fresh
        uniform masks of the sizes of :meth:`sizes`. Differentiable with respect
        to the model's parameters (gradients flow unless called under
        ``torch.no_grad()``). With ``mean_over_data`` (shared masks only) the
        model averages each mask's scores over the data itself (e.g. from
        the data's second moments). The same generator state gives the same
        masks whatever the model, so two models scored with one seed share
        their masks (common random numbers). With ``learn`` (training), the
        estimator then :meth:`observe`\ s this draw's sizes and scores.
        """
        rows, s = self._score_rows(model, x, make_generator(generator), progress, counter,
                                   mean_over_data)
        out = self._combine(rows, s, model.num_tokens)
        if learn:  # after the draw: its sizes depended only on the draws before it
            self.observe(rows, s.detach(), model.num_tokens)
        return out

    def _score_rows(self, model: MaskedModel, x: torch.Tensor, g: torch.Generator,
                    progress: bool, counter: Counter | None,
                    mean_over_data: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        n, d = x.shape[0], model.num_tokens
        rows = self.sizes(d, num_data=None if self.share_masks else n, generator=g)
        s = score_masks(model, x, rows, share_masks=self.share_masks, generator=g,
                        progress=progress, counter=counter, mean_over_data=mean_over_data)
        return rows, s

    def _combine(self, rows: torch.Tensor, s: torch.Tensor, d: int) -> torch.Tensor:
        return self._cells(rows, s, d).sum(0)

    def _cells(self, rows: torch.Tensor, s: torch.Tensor, d: int) -> torch.Tensor:
        """The weighted scores by (row of a draw, draw, ...): ``(rows_per_draw, P, ...)``."""
        w = self.weights(rows, d).to(device=s.device, dtype=s.dtype)
        y = w.reshape(*w.shape, *([1] * (s.ndim - w.ndim))) * s
        return y.view(-1, self.num_masks, *y.shape[1:])

    def evaluate(self, model: MaskedModel, x: torch.Tensor, generator: torch.Generator,
                 counter: Counter, progress: bool) -> Draws:
        """The draws of an estimate, with per-size summaries (no gradients needed).

        The default scores the size rule through :meth:`draws`; estimators with
        a faster reduction of the same draws (a whole grid of sizes at once,
        every mask, random orders) override it.
        """
        rows, s = self._score_rows(model, x, generator, progress, counter)
        d = model.num_tokens
        idx = (rows if rows.ndim == 2 else rows[:, None].expand(-1, x.shape[0]))
        idx = idx.reshape(-1).cpu() - 1
        tot = torch.zeros(d, dtype=torch.float64).index_add_(0, idx, s.reshape(-1).cpu())
        cnt = torch.bincount(idx, minlength=d).double()
        size_scores = torch.where(cnt > 0, tot / cnt.clamp_min(1), float("nan"))
        cells = self._cells(rows, s, d)
        if s.ndim == 1:  # mean over data: one value per row
            cells = cells[..., None]
        return Draws(cells.sum(0), list(range(1, d + 1)), size_scores, cells=cells)

    def masks_per_draw(self, num_tokens: int) -> int:
        """Masked inputs one draw scores per datum (its cost): 1 unless overridden."""
        return 1

    def recorded_rate(self, num_tokens: int) -> float | None:
        """The masking rate to record with an estimate (fixed-rate only)."""
        return None

    # ---------------------------------------------------------------- strata
    def strata(self, num_tokens: int) -> list[int] | None:
        """The mask size of each independent term of a dense draw, or None for one term.

        A draw is a sum of independent strata (cumulative: one term per size
        1..D); None (the default) means the draw is its own single stratum
        (random-size: one size drawn per draw).
        """
        return None

    def stratum_draws(self, model: MaskedModel, x: torch.Tensor, counts: Sequence[int],
                      generator: torch.Generator, counter: Counter,
                      progress: bool) -> list[torch.Tensor]:
        """``counts[h]`` fresh draws of each stratum h of a draw: one ``(P_h, N)`` tensor each.

        The default (one stratum) is the size rule's draws, ``counts[0]`` of them.
        """
        (p,) = counts
        est = self.with_draws(int(p))
        rows, s = est._score_rows(model, x, generator, progress, counter)
        return [est._cells(rows, s, model.num_tokens).sum(0)]

    def ragged_strata(self, lengths: np.ndarray) -> tuple[list[np.ndarray], int]:
        """The stratum of each row of a draw of each sequence, and the number of strata.

        A ragged draw of sequence i is a sum of rows (cumulative: the sizes
        1..D_i); a target standard error pools each row's spread over the
        sequences within its stratum. The default: one row per draw, one
        stratum.
        """
        return [np.zeros(1, dtype=np.int64) for _ in lengths], 1

    def ragged_cells(self, model: RaggedMaskedModel, toks: list[torch.Tensor],
                     counts: Sequence[np.ndarray], seed: int, *, tag: str,
                     units: list[torch.Tensor] | None = None,
                     **run: Any) -> tuple[list[list[np.ndarray]], int]:
        """Per sequence and row of a draw, ``counts[i][r]`` draws' terms; and the model calls.

        The default runs the size rule on each sequence: ``counts[i][0]``
        draws of one size each, ``M ~ sizes(D_i)``, a uniform mask of M of its
        D_i units, and the term ``weight(M, D_i) * S_hat(x_i; M)`` (uniform
        random-size: ``(D_i / M) sum_{j in mask} log p(x_j | x_R)``). Sizes and
        masks of sequence i come from a generator seeded by (seed, i).
        """
        lengths = unit_counts(toks, units)
        draws = [int(c[0]) for c in counts]

        def draw_sizes(i: int, g: torch.Generator) -> torch.Tensor:
            return self.sizes(torch.full((draws[i],), int(lengths[i])), generator=g)

        def masks(i: int, d: int, g: torch.Generator) -> torch.Tensor:
            return sample_masks(d, draw_sizes(i, g), generator=g)

        total = sum(draws)
        out = run_pairs(model, toks, masks, seed=seed, tag=tag, units=units,
                        spec={"kind": "draws", "estimator": self.fingerprint(),
                              "num_masks": draws[0] if len(set(draws)) == 1 else draws,
                              "total_pairs": total}, desc=f"{self.name} draws", **run)
        cells = []
        for i, s in enumerate(out.sums):  # the same sizes again, from the same generator
            m = draw_sizes(i, torch.Generator().manual_seed(seq_seed(seed, i)))
            w = self.weights(m, torch.full_like(m, int(lengths[i])))
            cells.append([(w * torch.as_tensor(s, dtype=torch.float64) / m).numpy()])
        return cells, out.num_model_calls

    # ---------------------------------------------------------------- estimates
    def estimate(self, model: MaskedModel | RaggedMaskedModel, x: Any, *,
                 seed: int | torch.Generator | None = None, progress: bool = False,
                 run: Mapping[str, Any] | None = None, target_se: float | None = None,
                 max_masks: int | None = None, allocation: str | None = None) -> LMLEstimate:
        """Estimate log p(x_n) per datum with its Monte Carlo standard error.

        Parameters
        ----------
        model : MaskedModel or RaggedMaskedModel
        x : (N, D) array-like, or a list of texts / token-id sequences (ragged)
        seed : int or torch.Generator, optional (ragged sequences: an int)
        progress : bool
        run : mapping, optional
            Ragged sequences: the runner's options (``token_budget``,
            ``batch_size``, ``chunk_size``, ``checkpoint_dir``).
        target_se, max_masks, allocation
            Draw until this standard error instead of ``num_masks`` per
            stratum: :meth:`estimate_to_target`.

        Returns
        -------
        LMLEstimate

        Warns
        -----
        RuntimeWarning
            When the estimate is not finite, its standard error unknown (one
            draw per datum) or resting on fewer than :data:`MIN_STDERR_DOF`
            degrees of freedom, or a target was missed.
        """
        if target_se is not None or allocation is not None:  # (check_target refuses the latter)
            return self.estimate_to_target(model, x, target_se, max_masks=max_masks,
                                           allocation=allocation, seed=seed, progress=progress,
                                           run=run)
        if max_masks is not None:
            raise ValueError(f"max_masks={max_masks!r} is the budget of a target standard error "
                             "and applies with target_se= only.")
        if isinstance(model, RaggedMaskedModel):
            self.check_applies(ragged=True)
            if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
                raise TypeError(f"for ragged sequences pass an int seed, got {seed!r}.")
            out = self.score_sequences(model, x, int(seed), progress, dict(run or {}))
            n = out.lml.size
            return _announce(LMLEstimate(
                estimator=self.name, per_sample=as_float64(out.lml),
                per_sample_stderr=as_float64(out.stderr), mean=float(out.lml.mean()),
                stderr=float(sum_stderr(out.stderr)) / n,
                stderr_data=float(mean_stderr(out.lml)[1]),
                sizes=None, size_scores=None, num_masks=self.num_masks,
                num_model_calls=out.num_model_calls, num_masked_rows=out.num_masked_rows,
                num_masked_rows_per_sample=None if out.rows_per_sequence is None
                else torch.as_tensor(out.rows_per_sequence, dtype=torch.long),
                stderr_dof=out.dof, seed=int(seed), model=model.name))
        if run:
            raise TypeError(f"unexpected arguments {sorted(run)} (only for ragged sequences).")
        xt = self._dense_data(model, x)
        n, d = xt.shape[0], model.num_tokens
        self.check_num_tokens(d)
        counter = Counter()
        with torch.no_grad(), model.reuse_data():
            out = self.evaluate(model, xt, make_generator(seed), counter, progress)
            exact = _exact_mean(model, xt)
        per_sample = out.samples.mean(0)
        if out.exact:
            per_se, stderr, dof = torch.zeros_like(per_sample), 0.0, math.inf
        else:
            cells = out.cells if out.cells is not None else out.samples[None]
            per_se, stderr, dof = strata_stderr(cells, shared=self.share_masks)
        mean = float(per_sample.mean())
        rows_per_datum = counter.rows // n
        return _announce(LMLEstimate(
            estimator=self.name, per_sample=per_sample.cpu(), per_sample_stderr=per_se.cpu(),
            mean=mean, stderr=stderr,
            stderr_data=float(mean_stderr(per_sample)[1]),
            sizes=out.sizes, size_scores=out.size_scores.cpu(), num_masks=out.samples.shape[0],
            num_model_calls=counter.calls, num_masked_rows=counter.rows,
            num_masked_rows_per_sample=torch.full((n,), rows_per_datum, dtype=torch.long),
            stderr_dof=dof, rate=self.recorded_rate(d), exact=exact,
            bias=None if exact is None else mean - exact,
            shared_masks=self.share_masks or out.exact,
            nested=bool(getattr(self, "nested", False)),
            seed=int(seed) if isinstance(seed, numbers.Integral) else None))

    def estimate_to_target(self, model: MaskedModel | RaggedMaskedModel, x: Any,
                           target_se: float | None, *, max_masks: int | None = None,
                           allocation: str | None = None,
                           seed: int | torch.Generator | None = None, progress: bool = False,
                           run: Mapping[str, Any] | None = None) -> LMLEstimate:
        """The estimate at a target Monte Carlo standard error of the mean LML (if unbiased).

        1. A pilot (:func:`~mptlml.estimators.allocation.pilot_masks` draws per
           stratum, on at most :data:`~mptlml.estimators.allocation.PILOT_DATA`
           data) measures each stratum's spread: per size of ``cumulative``
           (per bin of M / D_i on ragged sequences), of the draws themselves
           for one-stratum estimators such as ``random-size``.
        2. The draws per stratum for the target follow
           (:func:`~mptlml.estimators.allocation.plan_counts`: ``"neyman"`` in
           proportion to each stratum's spread, ``"uniform"`` the same for
           all), within ``max_masks`` masked inputs per datum, pilot included.
        3. Fresh draws give the estimate: unbiased given the plan, its
           standard error pooled over the strata.

        ``stop_reason`` says whether the target was reached; the cost is in
        ``num_masked_rows`` and ``masks_wanted``. See
        :mod:`mptlml.estimators.allocation`.
        """
        target_se, max_masks, allocation = check_target(target_se, max_masks, allocation)
        if target_se is None:
            raise ValueError("estimate_to_target needs target_se= (a positive number, nats).")
        self.check_targetable()
        if isinstance(model, RaggedMaskedModel):
            self.check_applies(ragged=True)
            if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
                raise TypeError(f"for ragged sequences pass an int seed, got {seed!r}.")
            return _announce(self._ragged_to_target(model, x, target_se, max_masks, allocation,
                                                    int(seed), progress, dict(run or {})))
        if run:
            raise TypeError(f"unexpected arguments {sorted(run)} (only for ragged sequences).")
        xt = self._dense_data(model, x)
        n, d = xt.shape[0], model.num_tokens
        self.check_num_tokens(d)
        strata = self.strata(d)
        h = 1 if strata is None else len(strata)
        g = make_generator(seed)
        counter = Counter()
        with torch.no_grad(), model.reuse_data():
            sub = pilot_data(xt, self.share_masks, g)
            p0 = pilot_masks(self.num_masks, 1 if self.share_masks else sub.shape[0])
            pilot = torch.stack(self.stratum_draws(model, sub, [p0] * h, g, counter, progress))
            pilot_rows = counter.rows
            left = None if max_masks is None else max_masks - pilot_rows / n
            costs = np.full(h, self.masks_per_draw(d) / h)
            plan, capped, wanted = plan_counts(stratum_variances(pilot, n, self.share_masks),
                                               costs, target_se, allocation, left)
            cells = self.stratum_draws(model, xt, plan.tolist(), g, counter, progress)
            exact = _exact_mean(model, xt)
        per_sample = torch.stack([c.mean(0) for c in cells]).sum(0).cpu()
        per_se, stderr, dof = strata_stderr(cells, shared=self.share_masks)
        mean = float(per_sample.mean())
        return _announce(LMLEstimate(
            estimator=self.name, per_sample=per_sample, per_sample_stderr=per_se.cpu(),
            mean=mean, stderr=stderr,
            stderr_data=float(mean_stderr(per_sample)[1]), sizes=strata,
            size_scores=None if strata is None else torch.stack([c.mean() for c in cells]).cpu(),
            num_masks=int(max(plan)), num_model_calls=counter.calls,
            num_masked_rows=counter.rows,
            num_masked_rows_per_sample=torch.full((n,), counter.rows // n, dtype=torch.long),
            stderr_dof=dof, target_se=target_se,
            stop_reason=stop_reason(stderr, target_se, capped),
            allocation=allocation, masks_per_size=plan.tolist(),
            masks_wanted=wanted + pilot_rows / n,
            rate=self.recorded_rate(d), exact=exact,
            bias=None if exact is None else mean - exact, shared_masks=self.share_masks,
            seed=int(seed) if isinstance(seed, numbers.Integral) else None))

    def _ragged_to_target(self, model: RaggedMaskedModel, sequences: Any, target_se: float,
                          max_masks: int | None, allocation: str, seed: int, progress: bool,
                          run: dict[str, Any]) -> LMLEstimate:
        """:meth:`estimate_to_target` on ragged sequences: strata pooled over the sequences."""
        toks = encode(model, sequences)
        n = len(toks)
        lengths = np.array([len(t) for t in toks], dtype=np.int64)
        strata, h = self.ragged_strata(lengths)
        cost = [self.masks_per_draw(int(d)) / max(len(s), 1) for d, s in zip(lengths, strata,
                                                                              strict=True)]
        sub = pilot_subset(n, seed)
        p0 = pilot_masks(self.num_masks, sum(len(strata[i]) for i in sub) // h)
        cells, calls = self.ragged_cells(model, [toks[i] for i in sub],
                                         [np.full(len(strata[i]), p0) for i in sub], seed,
                                         tag=self.ragged_tag + "_pilot", progress=progress, **run)
        pilot_rows = p0 * np.array([self.masks_per_draw(int(lengths[i])) for i in sub],
                                   dtype=np.int64)
        tot, cnt = np.zeros(h), np.zeros(h)
        for i, cell in zip(sub, cells, strict=True):
            np.add.at(tot, strata[i], [c.var(ddof=1) for c in cell])
            np.add.at(cnt, strata[i], 1)
        var = np.where(cnt > 0, tot / np.maximum(cnt, 1), np.nan)
        var = np.where(np.isnan(var), np.nanmax(var) if np.isfinite(var).any() else 0.0, var)
        n_rows, row_cost = np.zeros(h), np.zeros(h)
        for s, c in zip(strata, cost, strict=True):
            np.add.at(n_rows, s, 1)
            np.add.at(row_cost, s, c)
        # variance of the mean LML with P_b draws per row: sum_b var_b n_b / (N^2 P_b);
        # cost per datum: sum_b (masked inputs of the rows of b) P_b / N
        left = None if max_masks is None else max_masks - int(pilot_rows.sum()) / n
        plan, capped, wanted = plan_counts(var * n_rows / n ** 2, np.maximum(row_cost / n, 1e-12),
                                           target_se, allocation, left)
        per_seq = [plan[s] for s in strata]
        cells, calls2 = self.ragged_cells(model, toks, per_seq, fresh_seed(seed),
                                          tag=self.ragged_tag + "_target", progress=progress,
                                          **run)
        lml = np.array([sum(float(c.mean()) for c in cell) for cell in cells])
        var_i = [np.array([c.var(ddof=1) / c.size for c in cell]) for cell in cells]
        se_i = np.sqrt([float(vi.sum()) for vi in var_i])
        terms = np.concatenate(var_i) / n ** 2 if n else np.zeros(0)
        dofs = np.concatenate([np.array([c.size - 1 for c in cell], dtype=np.float64)
                               for cell in cells]) if n else np.zeros(0)
        stderr = float(np.sqrt(terms.sum())) if terms.size else 0.0
        rows = np.array([int(round(float((p * c).sum()))) for p, c in zip(per_seq, cost,
                                                                          strict=True)],
                        dtype=np.int64)
        rows[sub] += pilot_rows
        return LMLEstimate(
            estimator=self.name, per_sample=as_float64(lml), per_sample_stderr=as_float64(se_i),
            mean=float(lml.mean()), stderr=stderr, stderr_data=float(mean_stderr(lml)[1]),
            sizes=None, size_scores=None, num_masks=int(max(plan)),
            num_model_calls=calls + calls2, num_masked_rows=int(rows.sum()),
            num_masked_rows_per_sample=torch.as_tensor(rows),
            stderr_dof=welch_dof(torch.from_numpy(terms), torch.from_numpy(dofs)),
            target_se=target_se, stop_reason=stop_reason(stderr, target_se, capped),
            allocation=allocation, masks_per_size=plan.tolist(),
            masks_wanted=wanted + int(pilot_rows.sum()) / n, seed=seed, model=model.name)

    def check_targetable(self) -> None:
        """Refuse a target standard error where it does not apply (a biased estimator)."""
        if not self.unbiased:
            raise ValueError(
                f"target_se= needs an unbiased estimator (its standard error is then its error); "
                f"{self.name!r} is biased. Use one of the unbiased estimators, e.g. "
                "'cumulative' or 'random-size'.")

    @classmethod
    def check_applies(cls, *, ragged: bool) -> None:
        """Refuse data this estimator does not estimate (ragged sequences or dense data)."""
        if not (cls.ragged if ragged else cls.dense):
            kind = "ragged sequences (a masked LM)" if ragged else "dense (N, D) data"
            raise ValueError(f"estimator {cls.name!r} does not apply to {kind}; "
                             f"mptlml.estimators.available({'ragged' if ragged else 'dense'}"
                             "=True) lists those that do.")

    @staticmethod
    def sequence_lengths(num_tokens: torch.Tensor) -> torch.Tensor:
        """The D_i of a batch of sequences as a flat LongTensor, checked >= 0."""
        d = num_tokens.long().flatten()
        if bool((d < 0).any()):
            raise ValueError(f"num_tokens must be >= 0, got {d.tolist()}.")
        return d

    def check_num_tokens(self, num_tokens: int) -> None:
        """Refuse options that do not fit data of ``num_tokens`` tokens (e.g. M > D)."""

    def _dense_data(self, model: Any, x: Any) -> torch.Tensor:
        self.check_applies(ragged=False)
        if not isinstance(model, MaskedModel):
            raise TypeError(
                f"model must be an mptlml.models.MaskedModel (a model of (N, D) data) or a "
                f"RaggedMaskedModel (a masked LM), got {type(model).__name__}.")
        return model.validate_data(x)

    def score_sequences(self, model: RaggedMaskedModel, sequences: Any, seed: int,
                        progress: bool, run: dict[str, Any]) -> RaggedScores:
        """Per-sequence estimates on ragged sequences: P draws of each row of a draw.

        ``lml_i`` sums the rows' means, its standard error their errors
        (successive differences over the rows when P = 1, see
        :func:`~mptlml.estimators.stats.sum_stderr`).
        """
        toks = encode(model, sequences)
        lengths = np.array([len(t) for t in toks], dtype=np.int64)
        p = self.num_masks
        strata, _ = self.ragged_strata(lengths)
        rows = np.array([self.masks_per_draw(int(d)) for d in lengths], dtype=np.int64) * p
        check_run_size(rows.tolist(), lengths, f"the {self.name!r} estimate")
        cells, calls = self.ragged_cells(model, toks, [np.full(len(s), p) for s in strata], seed,
                                         tag=self.ragged_tag, progress=progress, **run)
        tot, tse, var = [], [], []
        for cell in cells:
            stats = [mean_stderr(c) for c in cell]
            mean = np.array([m for m, _ in stats])
            se = np.array([e for _, e in stats])
            tot.append(float(mean.sum()))
            tse.append(float(sum_stderr(se if p > 1 else None, mean)))
            var.append(se ** 2)
        dof = (welch_dof(torch.from_numpy(np.concatenate(var)), float(p - 1))
               if p > 1 and var else None)
        return RaggedScores(np.array(tot), np.array(tse), calls, int(rows.sum()), rows, dof)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.__dict__.get("ragged_tag") and cls.name:
            cls.ragged_tag = cls.name.replace("-", "_")


def accepted_options(cls: type[Estimator]) -> tuple[str, ...]:
    """The options an estimator class accepts: the keyword parameters of its ``__init__``."""
    params = inspect.signature(cls.__init__).parameters
    return tuple(p for p in params if p != "self"
                 and params[p].kind not in (inspect.Parameter.VAR_POSITIONAL,
                                            inspect.Parameter.VAR_KEYWORD))


def _exact_mean(model: MaskedModel, x: torch.Tensor) -> float | None:
    """The mean exact log p(x) when the model has one (for ``exact`` and ``bias``)."""
    if model.has_log_marginal and not model.stochastic:
        return float(model._log_marginal(x).double().mean())
    return None


def _announce(est: LMLEstimate) -> LMLEstimate:
    """Never let a NaN leave silently: warn on a non-finite estimate and on an unknown SE."""
    bad = announce_nonfinite(est.per_sample, f"the {est.estimator!r} estimate of log p(x)",
                             stacklevel=5)
    if not bad and math.isnan(est.stderr):
        warnings.warn(
            f"the standard error of the {est.estimator!r} estimate cannot be computed from "
            f"{est.num_masks} Monte Carlo draw(s) per datum (it needs at least 2); stderr is "
            "NaN. Pass num_masks >= 2 to know how precise the estimate is.", RuntimeWarning,
            stacklevel=4)
    elif (not warn_target_missed("stderr", est.stop_reason, est.stderr, est.target_se,
                                 wanted=est.masks_wanted, stacklevel=5)
          and est.stderr_dof is not None and est.stderr_dof < MIN_STDERR_DOF
          and est.stderr > 1e-9 * max(1.0, abs(est.mean))):  # not an exact sum
        warnings.warn(
            f"the standard error of the {est.estimator!r} estimate rests on about "
            f"{est.stderr_dof:.1f} effective degrees of freedom (fewer than {MIN_STDERR_DOF}): "
            "|mean - truth| > 2 stderr will happen far more often than 5% of the time. Use "
            "more masks (num_masks)" + (" or independent masks (share_masks=False)"
                                        if est.shared_masks else "") + ".",
            RuntimeWarning, stacklevel=4)
    return est
