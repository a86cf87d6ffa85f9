"""An estimate on one kind of data: dense ``(N, D)`` data, or ragged sequences.

:meth:`mptlml.estimators.Estimator.estimate` is one procedure for every
estimator on both kinds of data: the plain estimate, or, for a target
standard error, rounds of the sequential engine
(:func:`~mptlml.estimators.sequential.run_rounds`). What differs between the
kinds lives here:

- the data made ready: validated ``(N, D)`` data with the run's generator
  (:class:`DenseRun`), or the sequences' content ids with the run's seed, round r
  of sequence i drawing from ``round_seed((seed, i), r)`` (:class:`RaggedRun`);
- the plain estimate: on dense data the estimator's ``num_masks`` draws per
  stratum (:meth:`DenseRun.result`: its evaluation, shared or nested masks
  included, standard errors pooled over the strata,
  :func:`~mptlml.estimators.stats.strata_stderr`); on ragged sequences one round
  of the engine under the fixed rule (:meth:`RaggedRun.result`);
- at a target: :meth:`DenseRun.to_target` (the data set is one member of the
  engine, :class:`~mptlml.estimators.sequential.DenseDraw`: rounds of draws per
  stratum, Neyman's counts learned over the rounds) and :meth:`RaggedRun.to_target`
  (each sequence a member, :class:`~mptlml.estimators.sequential.CellDraw` or
  :class:`~mptlml.estimators.learned_rate.RateDraw`);
- the result: :func:`build_estimate`, the one builder of an announced
  :class:`~mptlml.estimators.results.LMLEstimate`, and :func:`rounds_estimate`
  (an engine run of single sequences).

The strata pool differently: on dense data each stratum's spread is pooled
over the data (or taken from the data means with shared masks); on ragged
sequences each sequence learns the spreads of the rows of a draw (the sizes 1..D_i of
``cumulative``), shrunk toward the call's of the same stratum.

Reference: Moreno-Munoz, Recasens, Hauberg, "On Masked Pre-training and the
Marginal Likelihood", NeurIPS 2023, Proposition 1.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from .. import settings
from .._scoring.dense import Counter, check_masked_inputs
from .._validation import make_generator
from ..models.base import MaskedModel
from ..models.protocols import RaggedMaskedModel
from ..models.sequence_input import encode
from .allocation import plan_remedy
from .results import LMLEstimate, announce_estimate, as_float64
from .sequential import (
    EXACT_LENGTH,
    MAX_TARGET_DRAWS,
    DenseDraw,
    RoundDraw,
    SequentialRun,
    draw_caps,
    fixed_rule,
    merge_stops,
    run_rounds,
    target_rule,
)
from .stats import mean_stderr, strata_stderr, welch_dof

__all__ = ["EXACT_LENGTH", "DenseRun", "RaggedRun", "build_estimate", "rounds_estimate",
           "run_what", "start_run"]


def run_what(est: Any, whole: list[int], drawn: list[int]) -> str:
    """What a plain ragged run would score, for its refusal: the sequences scored on every
    mask (``whole``: 2^D - 1 masked inputs each; those of at most :data:`EXACT_LENGTH` units
    whatever ``num_masks``, longer ones because their draws would cost as much) and those
    drawn (``drawn``: ``num_masks`` draws of
    :meth:`~mptlml.estimators.Estimator.masks_per_draw` each)."""
    what = f"the {est.name!r} estimate"
    if not whole:
        return what
    each = (f"{min(whole):,}" if min(whole) == max(whole)
            else f"{min(whole):,} to {max(whole):,}")
    rest = f", and {len(drawn)} drawn, {sum(drawn):,} masked inputs" if drawn else ""
    return (f"{what} ({len(whole)} sequence(s) scored on every mask, 2^D - 1 = {each} "
            f"masked inputs each: exact, always up to {EXACT_LENGTH} units, longer ones "
            f"where their draws would cost as much{rest})")


def build_estimate(est: Any, lml: Any, lml_stderr: Any, *, stderr: float, dof: float,
                   calls: int, rows: int, rows_per_sample: Any, **fields: Any) -> LMLEstimate:
    """The one builder of an :class:`~mptlml.estimators.results.LMLEstimate`, announced.

    Every run's result ends here (:meth:`DenseRun.result`, :meth:`DenseRun.to_target`,
    :meth:`RaggedRun.result`, :func:`rounds_estimate`): ``lml`` and ``lml_stderr`` are the
    per-datum estimates and their Monte Carlo standard errors, ``stderr`` and ``dof`` the
    mean's standard error and its effective degrees of freedom (the run's own: pooled over
    strata, or the engine's rounds), ``calls`` and ``rows`` the model calls and masked
    inputs, ``rows_per_sample`` those per datum (None when not known per datum); ``mean``
    and ``stderr_data`` (the spread over the data) are derived here, and the estimate is
    announced (:func:`~mptlml.estimators.results.announce_estimate`: NaN, an unknown SE,
    few dof, a missed target). ``fields`` are the result's other fields.
    """
    lml = as_float64(lml)
    fields.setdefault("sizes", None)
    fields.setdefault("size_scores", None)
    return announce_estimate(LMLEstimate(
        estimator=est.name, per_sample=lml, per_sample_stderr=as_float64(lml_stderr),
        mean=float(lml.mean()), stderr=float(stderr), stderr_data=float(mean_stderr(lml)[1]),
        num_model_calls=int(calls), num_masked_rows=int(rows),
        num_masked_rows_per_sample=None if rows_per_sample is None
        else torch.as_tensor(np.asarray(rows_per_sample), dtype=torch.long),
        stderr_dof=dof, **fields), depth=1)


def rounds_estimate(est: Any, out: SequentialRun, **fields: Any) -> LMLEstimate:
    """The estimate of an engine's run whose groups are single sequences: per sequence its
    tally's estimate, SE and dof (:meth:`~mptlml.estimators.sequential.Tally.stats`), the
    mean's standard error ``sqrt(sum_i se_i^2) / N`` on the Welch dof of the drawn sequences
    (inf when every one is exact), the masked inputs each scored, the draws of the most-drawn
    group (``num_masks``) and the groups' merged stop reason
    (:func:`~mptlml.estimators.sequential.merge_stops`), unless ``fields`` say (``dof``
    too)."""
    stats = [t.stats() for t in out.tallies]
    lml = np.array([e for e, _, _ in stats])
    se_i = np.array([s for _, s, _ in stats])
    dofs = np.array([d for _, _, d in stats])
    rows = np.array([t.rows for t in out.tallies], dtype=np.int64)
    drawn = se_i > 0
    fields.setdefault("stop_reason", merge_stops(out.stop_reason))
    fields.setdefault("num_masks", int(max(out.drawn)))
    fields.setdefault("dof", welch_dof(torch.from_numpy(se_i[drawn] ** 2),
                                       torch.from_numpy(dofs[drawn]))
                      if drawn.any() else math.inf)
    return build_estimate(
        est, lml, se_i, stderr=float(np.sqrt(np.sum(se_i ** 2))) / len(lml),
        calls=out.num_model_calls, rows=int(rows.sum()), rows_per_sample=rows, **fields)


def start_run(est: Any, model: Any, x: Any, *, seed: Any, progress: bool,
              run: Mapping[str, Any] | None) -> DenseRun | RaggedRun:
    """The run of ``est`` on ``x``: ragged for a :class:`RaggedMaskedModel`, else dense."""
    if isinstance(model, RaggedMaskedModel):
        return RaggedRun(est, model, x, seed=seed, progress=progress, run=run)
    return DenseRun(est, model, x, seed=seed, progress=progress, run=run)


class DenseRun:
    """An estimate on dense ``(N, D)`` data: the validated data, one generator, one counter.

    Parameters
    ----------
    est : Estimator
        The estimator (:class:`mptlml.estimators.Estimator`: its hooks draw).
    model : MaskedModel
    x : array-like ``(N, D)``
    seed : int, torch.Generator or None
    progress : bool
    run : mapping, optional
        Refused: the runner's options are for ragged sequences.
    """

    def __init__(self, est: Any, model: Any, x: Any, *, seed: Any, progress: bool,
                 run: Mapping[str, Any] | None = None) -> None:
        if run:
            raise TypeError(f"unexpected arguments {sorted(run)} (only for ragged sequences).")
        if not isinstance(model, MaskedModel):
            raise TypeError(
                f"model must be an mptlml.models.MaskedModel (a model of (N, D) data) or a "
                f"RaggedMaskedModel (a masked LM), got {type(model).__name__}.")
        self.generator = make_generator(seed)
        self.seed = int(seed) if isinstance(seed, numbers.Integral) else None
        self.est, self.model, self.progress = est, model, progress
        self.x = model.validate_data(x)
        self.n, self.d = self.x.shape[0], model.num_tokens
        est.check_num_tokens(self.d)
        self.counter = Counter()
        #: the mask size of each stratum of a draw, or None for one stratum
        self.strata = est.strata(self.d)
        self.num_strata = 1 if self.strata is None else len(self.strata)

    def _exact(self) -> float | None:
        """The mean exact log p(x), when the model has one (and is not stochastic); called
        under ``torch.no_grad()`` and the model's ``reuse_data()``."""
        if not self.model.has_log_marginal or self.model.stochastic:
            return None
        return float(self.model._log_marginal(self.x).double().mean())

    def _rows_per_datum(self) -> torch.Tensor:
        """Masked inputs scored per datum: every datum scores the same rows."""
        return torch.full((self.n,), self.counter.rows // self.n, dtype=torch.long)

    def result(self) -> LMLEstimate:
        """The estimate: ``num_masks`` draws per stratum."""
        est, x, n, d, counter = self.est, self.x, self.n, self.d, self.counter
        per_datum = est.num_masks * est.masks_per_draw(d)
        check_masked_inputs(per_datum * n, f"the {est.name!r} estimate of {n} data "
                            f"({per_datum:,} masked inputs per datum)", "lower num_masks")
        with torch.no_grad(), self.model.reuse_data():
            out = est.evaluate(self.model, x, self.generator, counter, self.progress)
            exact = self._exact()
        per_sample = out.samples.mean(0)
        if out.exact:
            per_se, stderr, dof = torch.zeros_like(per_sample), 0.0, math.inf
        else:
            pooled = out.cells if out.cells is not None else out.samples[None]
            per_se, stderr, dof = strata_stderr(pooled, shared=est.share_masks)
        mean = float(per_sample.mean())
        return build_estimate(
            est, per_sample.cpu(), per_se.cpu(), stderr=stderr, dof=dof, calls=counter.calls,
            rows=counter.rows, rows_per_sample=self._rows_per_datum(), sizes=out.sizes,
            size_scores=out.size_scores.cpu(), num_masks=out.samples.shape[0],
            rate=est.recorded_rate(d), exact_lml=exact,
            bias=None if exact is None else mean - exact, shared_masks=est.share_masks or out.exact,
            nested=bool(getattr(est, "nested", False)), seed=self.seed)

    def rounds(self, target_se: float, max_masks: int | None, allocation: str, what: str, *,
               sizes: list[int] | None = None, scale: float = 1.0
               ) -> tuple[SequentialRun, DenseDraw]:
        """The estimator's draws at a target SE of the mean over the data, in rounds.

        The data set is the one member of one group of
        :func:`~mptlml.estimators.sequential.run_rounds`
        (:class:`~mptlml.estimators.sequential.DenseDraw`): round 0 draws ``num_masks`` per
        stratum (at least 2), the rounds then double the draws so far or draw what the
        target is predicted to need, Neyman's counts learned over the rounds, until the
        standard error of the mean is at most ``target_se`` on at least
        :data:`~mptlml.estimators.sequential.TARGET_MIN_DOF` degrees of freedom
        (``"target"``) or the cap is spent (``"budget"``). The cap: ``max_masks // m``
        draws per stratum (``max_masks`` masked inputs per datum, ``m`` those of one draw of
        every stratum: :func:`~mptlml.estimators.sequential.draw_caps`), refused before any
        draw beyond ``mptlml.settings.max_masked_inputs`` or below 2; without ``max_masks``,
        :data:`~mptlml.estimators.sequential.MAX_TARGET_DRAWS`, lowered to what the setting
        allows for these N data.
        """
        est, n, d = self.est, self.n, self.d
        draw = DenseDraw(est, d, n, self.generator, self.counter, progress=self.progress,
                         allocation=allocation, sizes=sizes, scale=scale)
        # the first round: num_masks draws per stratum (at least 2), fewer within a cap
        # asked for (2 at least: refused below)
        cap = draw_caps(draw, 2, np.array([d]), [[0]], max_masks, noun="datum", group_noun="",
                        default=min(MAX_TARGET_DRAWS, settings.max_masked_inputs.value()
                                    // (draw.per_draw * n)))[0]
        p = min(max(2, int(est.num_masks)), cap)
        with torch.no_grad(), self.model.reuse_data():
            out = run_rounds(draw, self.model, [self.x], [[0]], [(0, 0)], num_masks=p,
                             caps=[cap], rule=target_rule([float(target_se)]), run={},
                             what=f"{what} at target_se={target_se:g}",
                             remedy=plan_remedy("datum"))
        return out, draw

    def to_target(self, target_se: float, max_masks: int | None,
                  allocation: str) -> LMLEstimate:
        """The estimate at a target standard error of the mean (:meth:`rounds`).

        Per datum, ``lml_n = sum_h sum_r w_r mean_p y_rhp,n`` (the rounds' per-stratum means
        combined by their draws, ``w_r`` round r's share), its standard error
        ``sqrt(sum_h sum_r w_r^2 s2_rh,n / P_rh)``; the mean's standard error and degrees of
        freedom are the engine's (:meth:`~mptlml.estimators.sequential.Tally.stats`).
        """
        est, n, d = self.est, self.n, self.d
        out, draw = self.rounds(target_se, max_masks, allocation,
                                f"the {est.name!r} estimate of {n} data")
        tally = out.tallies[0]
        _, stderr, dof = tally.stats()
        means, var, counts = draw.combined(tally)
        per_sample = torch.from_numpy(means.sum(0))
        mean = float(per_sample.mean())
        with torch.no_grad(), self.model.reuse_data():
            exact = self._exact()
        return build_estimate(
            est, per_sample, np.sqrt(var.sum(0)), stderr=stderr, dof=dof,
            calls=self.counter.calls, rows=self.counter.rows,
            rows_per_sample=self._rows_per_datum(), sizes=self.strata,
            size_scores=None if self.strata is None else torch.from_numpy(means.mean(1)),
            num_masks=int(counts.max()), rate=est.recorded_rate(d), exact_lml=exact,
            bias=None if exact is None else mean - exact, shared_masks=est.share_masks,
            nested=bool(getattr(est, "nested", False)), seed=self.seed,
            target_se=float(target_se), stop_reason=out.stop_reason[0],
            allocation=draw.allocation, masks_per_size=counts.tolist())


class RaggedRun:
    """An estimate on ragged sequences, on the sequential engine: each sequence one member.

    Parameters
    ----------
    est : Estimator
        The estimator (:class:`mptlml.estimators.Estimator`): its draw
        (:meth:`~mptlml.estimators.Estimator.round_draw`) is what the engine runs.
    model : RaggedMaskedModel
    sequences : list of texts or token-id sequences
    seed : int
        Round r of sequence i draws from ``round_seed((seed, i), r)``
        (:func:`~mptlml.estimators.sequential.round_seed`), as question i of
        :func:`mptlml.compare` does.
    progress : bool
    run : mapping, optional
        The runner's options (``token_budget``, ``batch_size``, ``chunk_size``,
        ``checkpoint_dir``).
    """

    def __init__(self, est: Any, model: RaggedMaskedModel, sequences: Any, *,
                 seed: Any, progress: bool, run: Mapping[str, Any] | None = None) -> None:
        if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
            raise TypeError(f"for ragged sequences pass an int seed, got {seed!r}.")
        self.est, self.model, self.seed = est, model, int(seed)
        self.run = {**dict(run or {}), "progress": progress}
        self.toks = encode(model, sequences)
        self.n = len(self.toks)
        self.lengths = np.array([len(t) for t in self.toks], dtype=np.int64)
        for d in np.unique(self.lengths):
            est.check_num_tokens(int(d))

    def _rounds(self, draw: RoundDraw, p: int, caps: list[int], rule: Any, what: str,
                remedy: str | None) -> SequentialRun:
        n = self.n
        return run_rounds(draw, self.model, self.toks, [[i] for i in range(n)],
                          [(self.seed, i) for i in range(n)], num_masks=p, caps=caps,
                          rule=rule, run=self.run, what=what, remedy=remedy)

    def result(self) -> LMLEstimate:
        """The plain estimate: one round of ``num_masks`` draws per sequence under the fixed
        rule (:func:`~mptlml.estimators.sequential.fixed_rule`); a sequence the draw
        enumerates is scored on every mask (exact). Each sequence's SE is the estimator's
        own error of its cells (:meth:`~mptlml.estimators.sequential.RoundDraw.round_error`);
        with one draw a cell, from the successive differences over the rows, its degrees of
        freedom unknown (None)."""
        est, p = self.est, int(self.est.num_masks)
        draw = est.round_draw(p, None)
        first = draw.round_size(p)
        whole = [2 ** int(d) - 1 for d in self.lengths if draw.enumerates(int(d))]
        drawn = [draw.most_rows(int(d), first) for d in self.lengths
                 if not draw.enumerates(int(d))]
        fewer = p > 1 and bool(drawn or max(whole) > 2 ** EXACT_LENGTH - 1)
        out = self._rounds(draw, p, [first] * self.n, fixed_rule, run_what(est, whole, drawn),
                           "lower num_masks" if fewer else None)
        single = p == 1 and any(not t.enumerated for t in out.tallies)
        return rounds_estimate(est, out, stop_reason=None, num_masks=p, seed=self.seed,
                               model=self.model.name, **({"dof": None} if single else {}))

    def to_target(self, target_se: float, max_masks: int | None,
                  allocation: str | None) -> LMLEstimate:
        """The estimate at a target standard error of the mean, on the sequential engine.

        Each sequence is drawn in rounds (:func:`~mptlml.estimators.sequential.run_rounds`)
        by the estimator's own draws (:class:`~mptlml.estimators.sequential.CellDraw`; the
        rate draw of :class:`~mptlml.estimators.LearnedRate`, the draw of
        :func:`mptlml.compare`, with the rate density learned over the rounds, pooled over
        the call) until its standard error is at most

            t_i = target_se * N / sqrt(N_mc)

        on at least :data:`~mptlml.estimators.sequential.TARGET_MIN_DOF` degrees of freedom
        (N sequences, N_mc of them drawn, the others scored on every mask, exactly), so that
        ``se(mean) = sqrt(sum_i se_i^2) / N <= target_se``; or until ``max_masks`` masked
        inputs per sequence are spent (``stop_reason="budget"``; the conversion and the
        refusal below the first round: :func:`~mptlml.estimators.sequential.draw_caps`). No
        pilot: each round is unbiased given the past and the rounds are combined by their
        draws. A sequence of one question costs here what it costs in
        :func:`mptlml.compare` (same draws, same rounds, same seed).
        """
        est, n = self.est, self.n
        p = max(2, 2 * math.ceil(est.num_masks / 2))
        draw = est.round_draw(p, allocation or "neyman")
        n_mc = sum(not draw.enumerates(int(d)) for d in self.lengths)
        t_i = target_se * n / math.sqrt(max(n_mc, 1))
        caps = draw_caps(draw, p, self.lengths, [[i] for i in range(n)], max_masks,
                         default=MAX_TARGET_DRAWS)
        out = self._rounds(draw, p, caps, target_rule([t_i] * n),
                           f"the {est.name!r} estimate at target_se={target_se:g}",
                           plan_remedy("sequence"))
        return rounds_estimate(est, out, target_se=target_se, allocation=draw.allocation,
                               seed=self.seed, model=self.model.name)
