"""The MPT curve: S(x; M) against the masking rate M / D, and its area, for any model.

For a datum x of D tokens and a mask size M,

    S(x; M)  = E_mask[(1/M) sum_{j in mask} log p(x_j | x_R)],
    log p(x) = sum_{M=1..D} S(x; M)                     (Proposition 1).

:func:`mpt_curve` draws P uniform masks per size and datum and returns the
points S_hat(x_n; M) with their standard errors, and the area under them:

- dense ``(N, D)`` data: the terms of the cumulative estimator size by size
  (:class:`~mptlml.estimators.Cumulative`), over every size (the area is then
  the cumulative estimate of the mean LML) or a subset of sizes (the area is
  D times their mean);
- ragged sequences (a masked LM), each with its own D_i: on a grid of masking
  rates r_1 < ... < r_K (:mod:`mptlml.estimators.rates`), M_ik = max(1,
  round(r_k D_i)) masked units, the draws of the Riemann estimator
  (:func:`mptlml.estimators.riemann.rate_grid_scores`). The result holds the
  curve ``mean_i S_ik``, the paper's area ``L * sum_k w_k mean_i S_ik``, the
  per-sequence LML ``D_i * mean_k S_ik`` and, on request, the cumulative sum
  ``sum_{M=1..D_i} S_hat(x_i; M)``.

With ``target_se`` the masks are drawn in rounds of the sequential engine
(:mod:`mptlml.estimators.sequential`) until the standard error of the mean LML
is at the target: dense data allocate the masks per size as the rounds learn
their spread (Neyman), ragged sequences draw every rate of the grid alike.

Reference: Moreno-Munoz, Recasens, Hauberg, "On Masked Pre-training and the
Marginal Likelihood", NeurIPS 2023, Proposition 1, Sec. 4, Fig. 4, Table 2, Fig. 5.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .._scoring.dense import check_masked_inputs, score_nested
from .._validation import Interval, check_checkpoint_dir, check_options, check_size
from ..models.base import MaskedModel
from ..models.conditional import with_context
from ..models.protocols import RaggedMaskedModel
from .allocation import check_target, plan_remedy
from .api import given, ragged_seed, refuse_for_ragged
from .block import block_curve, block_model
from .cumulative import Cumulative
from .rates import check_rates, mask_sizes, rate_widths
from .results import (
    MPTCurve,
    announce_nonfinite,
    as_float64,
    warn_single_datum,
    warn_target_missed,
)
from .riemann import GridScores, Riemann, rate_counts, rate_grid_scores
from .runs import DenseRun
from .sequential import merge_stops, weighted_rounds
from .stats import cell_error, cell_sums, mean_stderr, strata_stderr

__all__ = ["mpt_curve"]

#: mpt_curve's own allowed values where they differ from the shared table
#: (:data:`mptlml._validation.MONTE_CARLO_OPTIONS`): ragged sequences take one count per rate
_CURVE_OPTIONS: dict[str, list[Any]] = {
    "num_masks": [Interval(numbers.Integral, 1, None), "positive int sequence"]}


def mpt_curve(model: MaskedModel | RaggedMaskedModel, x: Any, *, num_masks: int = 1,
              sizes: Sequence[int] | None = None, seed: int | torch.Generator | None = None,
              share_masks: bool = False, nested: bool = False, target_se: float | None = None,
              max_masks: int | None = None, allocation: str | None = None,
              progress: bool = False, rates: Any = None, nominal_length: float | None = None,
              cumulative: bool = False, whole_word: bool = False, ids: list[str] | None = None,
              token_budget: int | None = None, chunk_size: int | None = None,
              batch_size: int | None = None,
              checkpoint_dir: str | os.PathLike | None = None, context: Any = None) -> MPTCurve:
    """The MPT curve: S(x; M) against the masking rate M / D, with its area.

    For each size M (rate), ``num_masks`` uniform masks per datum give
    S_hat(x_n; M) = mean over masks of (1/M) sum_{j in mask} log p(x_j | x_R).
    The area sum_{M=1..D} S(x; M) is the cumulative estimate of log p(x)
    (Proposition 1; Fig. 4 of the paper).

    Parameters
    ----------
    model : MaskedModel or RaggedMaskedModel
    x : array-like (N, D), or a list of texts / token-id sequences (ragged)
    num_masks : int or sequence of int
        P masks per size (rate) and datum; on ragged sequences also one count
        per rate (an allocation). ``num_masks`` of the result is the largest.
    sizes : sequence of int, optional
        Dense data: mask sizes, integers in 1..D (default all; 2.7 is refused).
    seed : int or torch.Generator, optional
        Ragged sequences: an int; the masks (and input corruption) of
        sequence i come from a generator seeded by (seed, i).
    share_masks : bool
        Dense data: share masks across data (the paper's code).
    nested : bool
        Dense data: masks of all sizes from the prefixes of P random orders
        (see :func:`mptlml.estimate_lml`); every size is computed, ``sizes``
        are kept.
    target_se : float, optional
        Draw the masks in rounds (:func:`~mptlml.estimators.sequential.run_rounds`,
        the first of ``max(2, num_masks)`` masks per size or rate) until the Monte Carlo
        standard error of the mean of the per-datum LML estimates ``lml`` (dense: the
        area; ragged: ``D_i * mean_k S_ik``) is at most this, on at least
        :data:`~mptlml.estimators.sequential.TARGET_MIN_DOF` degrees of freedom. Dense
        data: each size's masks follow its spread as the rounds learn it (Neyman); the
        counts over the rounds are in ``extra["masks_per_size"]``.
    max_masks : int, optional
        With ``target_se``: the most masked inputs per datum (sequence; default those of
        :data:`~mptlml.estimators.sequential.MAX_TARGET_DRAWS` draws per size or rate).
    allocation : {None, "neyman", "uniform"}
        With ``target_se`` (default ``"neyman"``).
    progress : bool
        Show a progress bar.
    rates : array-like, optional
        Ragged sequences: masking rates in (0, 1), strictly increasing
        (default 0.01..0.99).
    nominal_length : float, optional
        Ragged sequences: L of the area ``L * sum_k w_k curve_k`` (paper:
        512); default the mean D_i.
    cumulative : bool
        Ragged sequences: also compute ``lml_cumulative``, ``sum_{M=1..D_i}
        S_hat(x_i; M)`` from P masks per M: the cumulative estimator's estimate (Monte
        Carlo, with its standard error; ``estimate_lml(..., "cumulative")`` on the same
        masks).
    whole_word : bool
        Ragged sequences: the units are words (a fast tokenizer's
        ``word_ids()``), not tokens: D_i counts words, M_ik words are masked
        with all their sub-tokens, and a word's log-prob is the sum of its
        sub-tokens' (the whole-word-masking score, :mod:`mptlml.estimators.pseudo_likelihood`).
        Recorded as ``extra["unit"] = "word"``.
    context : optional
        Score the conditional instead: one context per sequence (text or ids; one
        string for all), always visible and never scored; the sequences are the
        continuations (see :func:`mptlml.estimate_lml`). Dense data: the
        always-visible dimensions (bool mask or indices).
    ids : list of str, optional
        Ragged sequences: identifiers, kept in the result.
    token_budget, chunk_size, batch_size, checkpoint_dir
        Ragged sequences: padded tokens per forward pass (default 8192);
        sequences per checkpointed chunk (default 8); most inputs per forward pass (None: the budget
        alone decides); a folder where finished chunks are saved atomically
        (``curve``, ``cumulative``, ``pll``) and reused when the same run is
        started again.

    Returns
    -------
    MPTCurve
        Ragged sequences: ``per_sample`` (N, K) holds S_ik, ``sizes`` (N, K)
        M_ik, ``num_tokens`` (N,) D_i, ``lml`` the Riemann estimates
        ``D_i * mean_k S_ik``.
    """
    check_checkpoint_dir(checkpoint_dir, "mpt_curve")
    check_options("mpt_curve", overrides=_CURVE_OPTIONS, num_masks=num_masks, seed=seed,
                  share_masks=share_masks, nested=nested, target_se=target_se,
                  max_masks=max_masks, allocation=allocation, progress=progress,
                  nominal_length=nominal_length, cumulative=cumulative, whole_word=whole_word,
                  token_budget=token_budget, chunk_size=chunk_size, batch_size=batch_size)
    if context is not None:
        if whole_word:
            raise ValueError("context= does not combine with whole_word=True; score tokens.")
        model = with_context(model, context)
    if nominal_length is not None and (
            isinstance(nominal_length, bool) or not isinstance(nominal_length, numbers.Real)
            or not math.isfinite(float(nominal_length)) or float(nominal_length) <= 0):
        raise ValueError(f"nominal_length must be a positive number of tokens (L of the area "
                         f"L * sum_k w_k curve_k; the paper's 512), got {nominal_length!r}.")
    if target_se is not None and not isinstance(num_masks, numbers.Integral):
        raise TypeError(f"num_masks={num_masks!r} with target_se=: the masks per size (rate) "
                        "are then drawn for the target; pass an int (the first round's masks "
                        "per size, at least 2), or drop target_se to give the counts yourself.")
    if max_masks is not None and target_se is None:
        raise ValueError("max_masks applies to mpt_curve with target_se= only (the budget of "
                         "the masks allocated for a target standard error).")
    target_se, max_masks, allocation_ = check_target(target_se, max_masks, allocation)
    ragged_only = given(rates=rates, nominal_length=nominal_length, cumulative=cumulative,
                        whole_word=whole_word, ids=ids, token_budget=token_budget,
                        chunk_size=chunk_size, batch_size=batch_size,
                        checkpoint_dir=checkpoint_dir)
    if isinstance(model, RaggedMaskedModel):
        refuse_for_ragged(given(sizes=sizes, share_masks=share_masks, nested=nested))
        run = dict(token_budget=8192 if token_budget is None else token_budget,
                   chunk_size=8 if chunk_size is None else chunk_size, batch_size=batch_size,
                   checkpoint_dir=checkpoint_dir, progress=progress)
        curve = dict(rates=rates, nominal_length=nominal_length, cumulative=cumulative,
                     whole_word=whole_word, ids=ids)
        to_target = None if target_se is None else (target_se, max_masks, allocation)
        if block_model(model):  # the masks drawn inside each block
            return _announce(_block_model_curve(model, x, num_masks, ragged_seed(seed),
                                                **curve, **run, to_target=to_target))
        res = _ragged_curve(model, x, num_masks, ragged_seed(seed), **curve, **run,
                            to_target=to_target)
        return _announce(res)
    data = DenseRun(Cumulative(num_masks, share_masks=share_masks, nested=nested), model, x,
                    seed=seed, progress=progress, run=ragged_only)
    return _announce(_dense_curve(data, sizes, target_se, max_masks, allocation_))


def _announce(res: MPTCurve) -> MPTCurve:
    """Say when a curve's target standard error was not reached, or rests on one datum."""
    warn_single_datum(int(res.per_sample.shape[0]), "the curve", "stderr and area_stderr",
                      stacklevel=4)
    warn_target_missed("the curve's Monte Carlo standard error", res.stop_reason,
                       res.lml_stderr_mean, res.target_se)
    return res


# ---------------------------------------------------------------------- dense data
def _dense_curve(data: DenseRun, sizes: Sequence[int] | None, target_se: float | None,
                 max_masks: int | None, allocation: str) -> MPTCurve:
    """Per size, the mean over P masks of S_hat(x_n; M): the cumulative estimator's terms.

    ``stderr`` and ``area_stderr`` are over the data, ``per_sample_stderr``
    and ``lml_stderr_mean`` over the masks. With ``target_se`` the masks per
    size are drawn in rounds (:meth:`~mptlml.estimators.runs.DenseRun.rounds`) until
    the Monte Carlo standard error of the mean area is at the target; the points are the
    rounds' per-size means combined by their draws (``sum_r w_r mean_p S_hat_rp``, ``w_r``
    round r's share, :func:`~mptlml.estimators.sequential.weighted_rounds`), their
    standard errors ``sqrt(sum_r w_r^2 s2_r / P_r)``.
    """
    est, model, xt, n, d = data.est, data.model, data.x, data.n, data.d
    g, counter, progress = data.generator, data.counter, data.progress
    p = est.num_masks
    size_list = list(range(1, d + 1)) if sizes is None else [check_size(m, d) for m in sizes]
    repeated = sorted({m for m in size_list if size_list.count(m) > 1})
    if repeated:
        raise ValueError(f"sizes {list(sizes or [])} repeat {repeated}: a repeated size "
                         "would count twice in the area; pass each size once.")
    if not size_list:
        raise ValueError("sizes is empty; pass at least one mask size in 1..D.")
    all_sizes = sorted(set(size_list)) == list(range(1, d + 1)) and len(size_list) == d
    coef = 1.0 if all_sizes else d / len(size_list)
    target: dict[str, Any] = {}
    per_se = None
    if est.nested and target_se is not None:
        raise ValueError("target_se needs independent masks per size (nested=False).")
    if target_se is not None:
        out, draw = data.rounds(target_se, max_masks, allocation, f"the curve of {n} data",
                                sizes=size_list, scale=coef)
        means, var, counts = draw.combined(out.tallies[0])  # (S, N) each, times coef
        per_sample = torch.from_numpy(means.T / coef)
        per_se = torch.from_numpy(np.sqrt(var.T) / coef)
        _, mc_se, _ = out.tallies[0].stats()
        target = {"counts": counts.tolist(), "stop": out.stop_reason[0],
                  "allocation": draw.allocation}
    else:
        with torch.no_grad(), model.reuse_data():
            if est.nested:
                s = score_nested(model, xt, p, share_masks=est.share_masks, generator=g,
                                 progress=progress, counter=counter)  # (P, D, N)
                idx = torch.tensor(size_list, dtype=torch.long, device=s.device) - 1
                per_sample = s[:, idx].mean(0).T.cpu()  # (N, S)
                mc_se = float("nan")
            else:
                counts = [p] * len(size_list)
                check_masked_inputs(sum(counts) * n, f"the curve of {n} data "
                                    f"({sum(counts):,} masked inputs per datum)",
                                    "lower num_masks")
                cells = [c * coef for c in est.stratum_draws(model, xt, counts, g, counter,
                                                             progress, sizes=size_list)]
                per_sample = torch.stack([c.mean(0) for c in cells], 1).cpu() / coef  # (N, S)
                per_se = torch.stack([mean_stderr(c)[1] for c in cells], 1).cpu() / coef
                _, mc_se, _ = strata_stderr(cells, shared=est.share_masks)
    mean, stderr = mean_stderr(per_sample)
    area_ps = per_sample.sum(1) if all_sizes else d * per_sample.mean(1)
    area, area_se = mean_stderr(area_ps)
    announce_nonfinite(per_sample, "the MPT curve", stacklevel=4)  # the caller of mpt_curve
    res = MPTCurve(
        sizes=size_list, rates=[m / d for m in size_list], mean=mean, stderr=stderr,
        per_sample=per_sample, area=float(area), area_stderr=float(area_se),
        area_is_exact_sum=all_sizes, num_tokens=d,
        num_masks=int(max(target["counts"])) if target else p,
        num_model_calls=counter.calls, num_masked_rows=counter.rows,
        num_masked_rows_per_sample=torch.full((n,), counter.rows // n, dtype=torch.long),
        lml_stderr_mean=mc_se, nested=est.nested, per_sample_stderr=per_se,
        seed=data.seed, lml=area_ps)
    if target:
        res.target_se, res.allocation = target_se, target["allocation"]
        res.stop_reason = target["stop"]
        res.extra["masks_per_size"] = [int(c) for c in target["counts"]]
    return res


# ---------------------------------------------------------------------- block models
def _block_model_curve(model: Any, sequences: Any, num_masks: Any, seed: int, *,
                       rates: Any, nominal_length: float | None, cumulative: bool,
                       whole_word: bool, ids: list[str] | None,
                       to_target: Any, **run: Any) -> MPTCurve:
    """A block-diffusion LM's curve: rate r_k masks ``max(1, round(r_k |b|))`` tokens of
    every block b, scored block-causally (:func:`~mptlml.estimators.block.block_curve`);
    ``S_ik = (1 / D_i) sum_b |b| S_hat_b(x_i; M_bk)``, ``lml`` ``D_i mean_k S_ik``."""
    if to_target is not None or cumulative or whole_word or run.get("checkpoint_dir"):
        raise ValueError(
            f"{model.name} is a block-diffusion LM: its curve draws the masks inside each "
            "block in one run; target_se, cumulative, whole_word and checkpoint_dir do not "
            "apply to it here. Drop them (estimate_lml(model, texts, 'learned-rate', "
            "target_se=...) gives the block bound at a target).")
    from ..models.sequence_input import encode

    grid_rates = check_rates(rates)
    counts = rate_counts(num_masks, grid_rates.size)
    toks = encode(model, list(sequences))
    out = block_curve(model, toks, grid_rates, counts, seed,
                      token_budget=run["token_budget"], batch_size=run["batch_size"],
                      progress=run["progress"])
    scores, lengths = out["scores"], out["lengths"]
    length = float(lengths.mean()) if nominal_length is None else float(nominal_length)
    curve_mean, curve_se = mean_stderr(scores, axis=0)
    area_mean, area_se = mean_stderr(length * (scores * rate_widths(grid_rates)).sum(1), axis=0)
    res = MPTCurve(
        sizes=torch.from_numpy(out["sizes"]), rates=grid_rates.tolist(),
        mean=as_float64(curve_mean), stderr=as_float64(curve_se), per_sample=as_float64(scores),
        area=float(area_mean), area_stderr=float(area_se), area_is_exact_sum=False,
        num_tokens=torch.from_numpy(lengths), num_masks=int(counts.max()),
        num_model_calls=out["calls"], seed=int(seed),
        lml_stderr_mean=float(np.sqrt(np.sum(out["lml_stderr"] ** 2))) / len(toks),
        per_sample_stderr=as_float64(out["scores_stderr"]), lml=as_float64(out["lml"]),
        lml_stderr=as_float64(out["lml_stderr"]), nominal_length=length, model=model.name,
        corruption=model.fingerprint().get("corruption"), ids=ids,
        extra={"num_blocks": out["num_blocks"].tolist(),
               "exact_cells": out["exact"].tolist()})
    res.num_masked_rows = int(out["rows"].sum())
    res.num_masked_rows_per_sample = torch.from_numpy(out["rows"])
    if len(set(counts.tolist())) > 1:
        res.extra["masks_per_rate"] = counts.tolist()
    announce_nonfinite(res.per_sample, "the MPT curve", "sequences", stacklevel=4)
    announce_nonfinite(res.lml_stderr, "the block curve's standard error (one mask per "
                       "rate of a drawn block; num_masks >= 2 gives it)", "sequences",
                       stacklevel=4)
    return res


# ---------------------------------------------------------------------- ragged sequences
def _ragged_curve(model: RaggedMaskedModel, sequences: Any, num_masks: Any, seed: int, *,
                  rates: Any = None, nominal_length: float | None = None, cumulative: bool = False,
                  whole_word: bool = False, ids: list[str] | None = None,
                  remedy: str | None = None,
                  to_target: tuple[float, int | None, str | None] | None = None,
                  **run: Any) -> MPTCurve:
    """The curve, area and per-sequence LML of ragged sequences (the Riemann draws).

    ``remedy``: what to lower when the run is too large (default: the caller's
    ``num_masks`` or rates; :func:`~mptlml.estimators.riemann.rate_grid_scores`).
    ``to_target``: ``(target_se, max_masks, allocation)``: the draws are then the
    sequential engine's (:func:`_draws_to_target`), recorded with their cost and stop reason.
    """
    curve = dict(rates=rates, cumulative=cumulative, whole_word=whole_word)
    target = None if to_target is None else _draws_to_target(
        model, sequences, *to_target, num_masks, seed, curve, run)
    grid, toks, words = (rate_grid_scores(model, sequences, rates, num_masks, seed,
                                          whole_word=whole_word, remedy=remedy, **run)
                         if target is None else (target[0], target[1], None))
    lengths, scores, counts = grid.lengths, grid.scores, grid.counts
    p = int(counts.max())
    length = float(lengths.mean()) if nominal_length is None else float(nominal_length)
    seq_areas = length * (scores * rate_widths(grid.rates)).sum(axis=1)
    rows = np.full(len(toks), int(counts.sum()), dtype=np.int64)
    curve_mean, curve_se = mean_stderr(scores, axis=0)
    area_mean, area_se = mean_stderr(seq_areas, axis=0)
    unit = {"unit": "word"} if whole_word else {}
    res = MPTCurve(
        sizes=torch.from_numpy(grid.sizes), rates=grid.rates.tolist(),
        mean=as_float64(curve_mean), stderr=as_float64(curve_se), per_sample=as_float64(scores),
        area=float(area_mean), area_stderr=float(area_se),
        area_is_exact_sum=False, num_tokens=torch.from_numpy(lengths), num_masks=p,
        num_model_calls=grid.num_model_calls, seed=int(seed),
        lml_stderr_mean=float(np.sqrt(np.sum(grid.lml_stderr ** 2))) / len(toks),
        per_sample_stderr=as_float64(grid.scores_stderr), lml=as_float64(grid.lml),
        lml_stderr=as_float64(grid.lml_stderr), nominal_length=length, model=model.name,
        corruption=model.fingerprint().get("corruption"), ids=ids, extra=dict(unit))
    announce_nonfinite(res.per_sample, "the MPT curve", "sequences", stacklevel=4)
    if cumulative:
        cells, calls = Cumulative(p).ragged_cells(
            model, toks, [np.full(int(d), p) for d in lengths], seed, tag="cumulative", units=words,
            **run)
        sums = [cell_sums(c, p == 1) for c in cells]
        tot, tse = [t for t, _, _, _ in sums], [e for _, e, _, _ in sums]
        res.lml_cumulative, res.lml_cumulative_stderr = as_float64(tot), as_float64(tse)
        announce_nonfinite(tot, "the cumulative sum over M", "sequences", stacklevel=4)
        res.num_model_calls += calls
        rows = rows + lengths * p
    res.num_masked_rows, res.num_masked_rows_per_sample = int(rows.sum()), torch.from_numpy(rows)
    if target is not None:
        out, target_se = target[2]
        rows = np.array([t.rows for t in out.tallies], dtype=np.int64)
        res.num_masked_rows = int(rows.sum())
        res.num_masked_rows_per_sample = torch.from_numpy(rows)
        res.target_se = target_se
        res.stop_reason = merge_stops(out.stop_reason)
        res.extra["rounds"] = list(out.rounds)
    elif len(set(counts.tolist())) > 1:  # an allocation over the rates
        res.extra["masks_per_rate"] = counts.tolist()
    return res


def _draws_to_target(model: RaggedMaskedModel, sequences: Any, target_se: float,
                     max_masks: int | None, allocation: str | None, num_masks: int, seed: int,
                     curve: dict[str, Any], run: dict[str, Any]
                     ) -> tuple[GridScores, list[torch.Tensor], Any]:
    """The ragged curve's draws at a target SE of the mean LML ``D_i mean_k S_ik``.

    Each sequence draws the Riemann terms in rounds (:class:`~mptlml.estimators.Riemann`'s
    cells, one per rate: ``(D_i / K) S_hat(x_i; M_ik)`` over its masks;
    :func:`~mptlml.estimators.sequential.run_rounds`) until its SE is at most
    ``target_se * sqrt(N)`` on at least
    :data:`~mptlml.estimators.sequential.TARGET_MIN_DOF` degrees of freedom (so that the
    mean's is at most ``target_se``), or ``max_masks`` masked inputs (``K`` per draw) are
    spent; no pilot, as :func:`mptlml.estimate_lml` and :func:`mptlml.compare`. The curve's
    points are the rounds' cells combined by their draws: ``S_ik = (K / D_i) sum_r w_r
    mean(cell_rk)``, their SEs the same sums' (``w_r`` a round's share of the draws).
    """
    if curve.get("cumulative"):
        raise ValueError("cumulative=True does not combine with target_se (its sum over every "
                         "size is "
                         "a separate estimate); use estimate_lml(..., target_se=) for it.")
    if curve.get("whole_word"):
        raise ValueError("whole_word=True does not combine with target_se (the rounds score "
                         "tokens); drop one of the two.")
    if allocation is not None:
        raise ValueError(f"allocation={allocation!r} does not apply to a ragged curve at a "
                         "target: its rounds draw every rate of the grid alike. Drop it.")
    from ..models.sequence_input import encode
    from .sequential import MAX_TARGET_DRAWS, CellDraw, draw_caps, run_rounds, target_rule

    grid_rates = check_rates(curve.get("rates"))
    k = grid_rates.size
    toks = encode(model, list(sequences))
    n = len(toks)
    p = max(2, int(num_masks))
    est = Riemann(p, rates=grid_rates)
    draw = CellDraw(est)
    lengths = np.array([len(t) for t in toks], dtype=np.int64)
    # max_masks: masked inputs per sequence, K per draw (by default MAX_TARGET_DRAWS draws)
    caps = draw_caps(draw, p, lengths, [[i] for i in range(n)], max_masks,
                     default=MAX_TARGET_DRAWS)
    out = run_rounds(draw, model, toks, [[i] for i in range(n)],
                     [(seed, i) for i in range(n)], num_masks=p, caps=caps,
                     rule=target_rule([target_se * math.sqrt(n)] * n), run=run,
                     what=f"the curve at target_se={target_se:g}",
                     remedy=plan_remedy("sequence"))
    scores, scores_se = np.zeros((n, k)), np.zeros((n, k))
    for i, t in enumerate(out.tallies):
        weighted = weighted_rounds(t.rounds, t.by_cell)
        for j in range(k):
            cells = [w[j] for w in weighted.values()]
            scores[i, j] = sum(float(c.mean()) for c in cells) * k / lengths[i]
            scores_se[i, j] = math.sqrt(sum(cell_error(c)[1] for c in cells)) * k / lengths[i]
    stats = [t.stats() for t in out.tallies]
    grid = GridScores(grid_rates, np.full(k, max(out.drawn)), lengths,
                      np.stack([mask_sizes(int(d), grid_rates) for d in lengths]), scores,
                      scores_se, np.array([e for e, _, _ in stats]),
                      np.array([s for _, s, _ in stats]), out.num_model_calls)
    return grid, toks, (out, target_se)
