"""Result types of the estimators: one per concept, the same fields for every model.

:class:`LMLEstimate` holds estimates of log p(x_n) per datum (or sequence),
:class:`MPTCurve` the MPT curve S(x; M) against the masking rate and its area
(Proposition 1 of Moreno-Munoz, Recasens & Hauberg, NeurIPS 2023),
:class:`TokenScores` the per-token (per-word) log-probabilities of a PLL. A dense
model (every datum has D tokens) and a masked LM on ragged sequences (D_i
tokens) fill the same fields (``mean``, ``stderr``, ``per_sample``,
``per_sample_stderr``; ``area``, ``area_stderr``, ``rates``, ...); a few
optional fields exist only for ragged sequences and are None otherwise.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch

from .._io import jsonable
from .._optional import require

__all__ = ["MIN_STDERR_DOF", "Comparison", "LLaDAScores", "LMLEstimate", "MPTCurve",
           "NonFiniteWarning", "TokenScores", "announce_estimate", "announce_nonfinite",
           "as_float64", "warn_single_datum", "warn_target_missed"]

#: below this many effective degrees of freedom the reported standard error is flagged
#: (Student's t with 5 dof exceeds 2 in 10% of runs, with 3 in 14%, with 1 in 30%)
MIN_STDERR_DOF = 5


def _numpy(v: Any) -> Any:
    return v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else v


class _Result:
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dictionary: tensors and arrays become lists, NaN becomes None."""
        return {f.name: jsonable(getattr(self, f.name))
                for f in fields(self)}  # type: ignore[arg-type]


@dataclass
class LMLEstimate(_Result):
    """An estimate of log p(x_n) for each datum (or sequence).

    Attributes
    ----------
    estimator : str
    per_sample : torch.Tensor, (N,)
        Estimate of log p(x_n) per datum (float64).
    per_sample_stderr : torch.Tensor, (N,)
        Monte Carlo standard error of each per-sample estimate (NaN where it
        cannot be computed, e.g. one mask per datum and size).
    mean : float
        Mean of ``per_sample`` (the average LML per datum).
    stderr : float
        Monte Carlo standard error of ``mean`` over the masks (NaN if unknown).
    stderr_data : float
        Standard error of ``mean`` across data points, std / sqrt(N).
    sizes : list of int or None
        Mask sizes that were evaluated (None for ragged sequences, where they
        are 1..D_i per sequence).
    size_scores : torch.Tensor or None, (len(sizes),)
        Mean over data of S_hat(x; M) per evaluated size (NaN where a size was
        never drawn).
    num_masks : int
        P, masks (or orders) per size and datum.
    num_model_calls : int
        Calls to the model (blocks of masks; forward passes for a masked LM).
    num_masked_rows : int
        Masked inputs scored in total: (mask, datum) pairs for dense data,
        (sequence, masked copy) pairs for a masked LM. The cost to compare
        two settings at equal standard error.
    num_masked_rows_per_sample : torch.Tensor or None, (N,)
        Masked inputs scored for each datum (sequence); sums to
        ``num_masked_rows``.
    stderr_dof : float or None
        Effective degrees of freedom of ``stderr`` (Welch-Satterthwaite over
        the pooled variance estimates of the sizes and data; inf when exact).
        Below about 5, ``mean / stderr`` is far from normal (|z| > 2 in more
        than 10% of runs) and a warning says so.
    target_se : float or None
        The standard error asked for (``estimate_lml(..., target_se=)``).
    stop_reason : str or None
        With ``target_se``, one of
        :data:`~mptlml.estimators.sequential.STOP_REASONS`: ``"target"`` (reached),
        ``"budget"`` (``max_masks`` spent first; ``stderr`` is then above the target) or
        ``"exact"`` (ragged: every sequence scored on every mask). None without a target.
    allocation : str or None
        With ``target_se`` (and in :func:`mptlml.compare`): ``"neyman"`` or ``"uniform"``
        (``mptlml._validation.ALLOCATIONS``); None where a draw has nothing to allocate.
    masks_per_size : list of int or None
        With ``target_se`` on dense data: the draws of each stratum (size) over the rounds
        (``num_masks`` is the largest); None on ragged sequences, whose ``num_masks`` is
        then the most draws of a sequence.
    rate : float or None
        Masking rate (fixed-rate only).
    exact_lml : float or None
        Mean exact log p(x) when the model has an exact ``log_marginal``.
    bias : float or None
        ``mean - exact_lml`` when ``exact_lml`` is known.
    shared_masks, nested : bool
    seed : int or None
    model : str or None
        The model's label (masked LMs).
    num_blocks, exact_blocks : LongTensor (N,) or None
        A block-diffusion LM's block bound (:mod:`mptlml.estimators.block`): each
        sequence's blocks, and how many of them were enumerated (exact, standard error 0);
        None for any other model.
    """

    estimator: str
    per_sample: torch.Tensor
    per_sample_stderr: torch.Tensor
    mean: float
    stderr: float
    stderr_data: float
    sizes: list[int] | None
    size_scores: torch.Tensor | None
    num_masks: int
    num_model_calls: int
    num_masked_rows: int
    num_masked_rows_per_sample: torch.Tensor | None = None
    stderr_dof: float | None = None
    target_se: float | None = None
    stop_reason: str | None = None
    allocation: str | None = None
    masks_per_size: list[int] | None = None
    rate: float | None = None
    exact_lml: float | None = None
    bias: float | None = None
    shared_masks: bool = False
    nested: bool = False
    seed: int | None = None
    model: str | None = None
    num_blocks: torch.Tensor | None = None
    exact_blocks: torch.Tensor | None = None

    def to_pandas(self) -> Any:
        """A tidy ``pandas.DataFrame``: one row per datum (or sequence).

        Columns ``datum`` (its index), ``lml`` (``per_sample``), ``lml_stderr``
        (``per_sample_stderr``) and the settings that identify the estimate:
        ``estimator``, ``model``, ``num_masks``, ``rate``, ``seed``. The
        aggregate (``mean``, ``stderr``, ...) stays on the object.
        """
        require("pandas", "to_pandas()")
        import pandas as pd

        lml = np.asarray(_numpy(self.per_sample), dtype=np.float64).reshape(-1)
        return pd.DataFrame({
            "datum": np.arange(lml.shape[0]), "lml": lml,
            "lml_stderr": np.asarray(_numpy(self.per_sample_stderr),
                                     dtype=np.float64).reshape(-1),
            "estimator": self.estimator, "model": self.model, "num_masks": self.num_masks,
            "rate": self.rate, "seed": self.seed,
        })


@dataclass
class MPTCurve(_Result):
    """The MPT curve S(x; M) against the masking rate M / D, and its area.

    Attributes
    ----------
    sizes : list of int, or LongTensor (N, S)
        Mask sizes; per sequence, M_ik = max(1, round(r_k D_i)), for ragged
        sequences.
    rates : list of float
        ``M / D`` (the rate grid r_k for ragged sequences).
    mean : torch.Tensor, (S,)
        Mean over data of S_hat(x; M) (float64).
    stderr : torch.Tensor, (S,)
        Standard error of ``mean`` across data points.
    per_sample : torch.Tensor, (N, S)
        S_hat(x_n; M), averaged over the P masks.
    area : float
        Dense models: ``sum_M mean(M)`` over all sizes, the cumulative estimate
        of the mean LML; with a subset of sizes the Riemann estimate
        ``D * average over the sizes`` (``area_is_exact_sum`` is then False).
        Ragged sequences: the paper's ``L * sum_k w_k mean_k`` with widths
        w_k = r_k - r_{k-1} (r_0 = 0) and L = ``nominal_length``.
    area_stderr : float
        Standard error of ``area`` across data points.
    area_is_exact_sum : bool
    num_tokens : int or LongTensor (N,)
        D, or D_i per sequence.
    num_masks : int
        P, masks per size (rate) and datum.
    num_model_calls : int
    num_masked_rows : int
        Masked inputs scored in total ((mask, datum) or (sequence, masked
        copy) pairs, the exact sum's included when requested).
    num_masked_rows_per_sample : torch.Tensor or None, (N,)
        Masked inputs scored per datum (sequence).
    lml_stderr_mean : float or None
        Monte Carlo standard error of the mean over data of ``lml`` (the
        masks' error; ``area_stderr`` is the spread across data).
    target_se, stop_reason, allocation
        As in :class:`LMLEstimate`, for ``mpt_curve(..., target_se=)``.
    nested : bool
    seed : int or None
    extra : dict
    per_sample_stderr : torch.Tensor or None, (N, S)
        Monte Carlo standard error of ``per_sample`` (ragged sequences; NaN when P = 1).
    lml : torch.Tensor or None, (N,)
        Per-sample LML estimate from the curve: the area of each datum's curve
        (dense), ``D_i * mean_k S_ik`` (ragged; the Riemann form of sum_M S).
    lml_stderr : torch.Tensor or None, (N,)
        Mask-sampling standard error of ``lml`` (ragged; successive differences when P = 1).
    lml_cumulative, lml_cumulative_stderr : torch.Tensor or None, (N,)
        ``sum_{M=1..D_i} S_hat(x_i; M)`` (the cumulative estimate, P masks per size) and
        its Monte Carlo standard error, with ``mpt_curve(..., cumulative=True)``.
    nominal_length : float or None
        L of the ragged area.
    model, corruption : str or None
        The masked LM's label and masking scheme.
    ids : list of str or None
        Sequence identifiers given by the caller.
    """

    sizes: list[int] | torch.Tensor
    rates: list[float]
    mean: torch.Tensor
    stderr: torch.Tensor
    per_sample: torch.Tensor
    area: float
    area_stderr: float
    area_is_exact_sum: bool
    num_tokens: int | torch.Tensor
    num_masks: int
    num_model_calls: int
    num_masked_rows: int = 0
    num_masked_rows_per_sample: torch.Tensor | None = None
    lml_stderr_mean: float | None = None
    target_se: float | None = None
    stop_reason: str | None = None
    allocation: str | None = None
    nested: bool = False
    seed: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    per_sample_stderr: torch.Tensor | None = None
    lml: torch.Tensor | None = None
    lml_stderr: torch.Tensor | None = None
    lml_cumulative: torch.Tensor | None = None
    lml_cumulative_stderr: torch.Tensor | None = None
    nominal_length: float | None = None
    model: str | None = None
    corruption: str | None = None
    ids: list[str] | None = field(default=None, repr=False)

    def masks_per_point(self) -> list[int] | int:
        """Masks per datum of each size (rate): the allocation after a target (or a list of
        counts), else ``num_masks`` for every one."""
        counts = self.extra.get("masks_per_size", self.extra.get("masks_per_rate"))
        if counts is not None and len(counts) == len(self.rates):
            return [int(c) for c in counts]
        return self.num_masks

    def plot(self, ax: Any = None, *, label: str | None = None) -> Any:
        """Draw the curve: mean S(x; M) against the masking rate, ±1 SE band; returns the Axes.

        The band is ``stderr`` (the spread across data points); the legend gives
        ``label`` (default: the model's name) and the ``area``. Calling it again
        with the same ``ax`` adds another curve in a new colour (a label with
        ``random init`` is drawn dashed in its pair's colour). Needs matplotlib
        (the ``report`` extra); :func:`mptlml.estimators.plots.plot_curves` draws it.
        """
        from .plots import plot_curves

        name = label or self.model or "MPT curve"
        return plot_curves({f"{name} (area {self.area:.1f})": (
            self.rates, _numpy(self.mean), _numpy(self.stderr))}, title="MPT curve", ax=ax)

    def to_pandas(self, per_sample: bool = False) -> Any:
        """A tidy ``pandas.DataFrame`` of the curve.

        By default one row per size (dense models) or rate (ragged sequences):
        ``rate``, ``size`` (dense only, else None), ``mean``, ``stderr`` and
        ``num_masks`` (each point's own, :meth:`masks_per_point`), ``model``.
        With ``per_sample=True``, one row per
        (datum, size/rate): ``datum``, ``id`` (ragged, when given), ``rate``,
        ``size``, ``score`` (S_hat(x_n; M)) and ``score_stderr`` (ragged; NaN
        where unknown).
        """
        require("pandas", "to_pandas()")
        import pandas as pd

        rates = np.asarray(self.rates, dtype=np.float64)
        dense = not isinstance(self.sizes, torch.Tensor)
        if not per_sample:
            return pd.DataFrame({
                "rate": rates, "size": list(self.sizes) if dense else [None] * len(rates),
                "mean": np.asarray(_numpy(self.mean), dtype=np.float64),
                "stderr": np.asarray(_numpy(self.stderr), dtype=np.float64),
                "num_masks": self.masks_per_point(), "model": self.model,
            })
        scores = np.asarray(_numpy(self.per_sample), dtype=np.float64)  # (N, S)
        n, s = scores.shape
        sizes = (np.tile(np.asarray(self.sizes), n) if dense
                 else np.asarray(_numpy(self.sizes)).reshape(-1))
        se = (np.asarray(_numpy(self.per_sample_stderr), dtype=np.float64).reshape(-1)
              if self.per_sample_stderr is not None else np.full(n * s, np.nan))
        out = pd.DataFrame({"datum": np.repeat(np.arange(n), s), "rate": np.tile(rates, n),
                            "size": sizes, "score": scores.reshape(-1), "score_stderr": se})
        if self.ids is not None:
            out.insert(1, "id", np.repeat(np.asarray(self.ids, dtype=object), s))
        return out


@dataclass
class TokenScores:
    """Per-unit log-probs of a PLL run (:func:`mptlml.pll` with ``per_token=True``).

    Attributes
    ----------
    total : torch.Tensor, (N,)
        PLL of each sequence (float64): the sum of its ``log_probs``, equal to
        what ``pll(...)`` returns without ``per_token``.
    log_probs : list of float64 ndarray ``(U_i,)``
        One log-prob per unit of each sequence, in order.
    tokens : list of list of str
        The units: vocabulary strings of the content tokens (``unit="token"``)
        or the words' texts (``unit="word"``).
    unit : {"token", "word"}
        Whole-word scoring has word units; the other variants token units.
    variant : {"original", "whole_word", "word_l2r"}
    words : list of LongTensor ``(U_i,)`` or None
        The word (0..W_i-1) of each unit, for word-level runs.
    word_texts : list of list of str or None
        The W_i words of each sequence, for word-level runs.
    model : str or None
        The model's name.
    """

    total: torch.Tensor
    log_probs: list[np.ndarray]
    tokens: list[list[str]]
    unit: str
    variant: str
    words: list[torch.Tensor] | None = None
    word_texts: list[list[str]] | None = None
    model: str | None = None

    def to_pandas(self, ids: Sequence[str] | None = None) -> Any:
        """A tidy ``pandas.DataFrame``: one row per unit (token, or word) of each sequence.

        Columns, as in the other results' tables: ``datum`` (the sequence's
        index), ``id`` when ``ids`` are given (one per sequence, as
        ``MPTCurve.to_pandas(per_sample=True)``'s), ``position`` (the unit's
        place among the content units, from 0), ``token`` (the unit's string),
        ``log_prob``, ``word`` (the unit's word, word-level runs), ``model``
        (the model's name), ``variant`` and ``unit``. ``log_prob`` summed per
        ``datum`` is ``total``. ``mptlml curve``'s ``pll_tokens.csv`` has these columns.
        """
        require("pandas", "TokenScores.to_pandas()")
        import pandas as pd

        return pd.DataFrame(self._rows(ids))

    def _rows(self, ids: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """The rows of :meth:`to_pandas` as dicts (a run's CSV, without pandas)."""
        if len(self.tokens) != len(self.log_probs):
            raise ValueError("these scores carry no token strings; run pll(..., per_token=True).")
        names = None if ids is None else [str(i) for i in ids]
        if names is not None and len(names) != len(self.log_probs):
            raise ValueError(f"ids has {len(names)} entries for {len(self.log_probs)} sequences.")
        rows = []
        for i, (toks, lp) in enumerate(zip(self.tokens, self.log_probs, strict=True)):
            for j, (t, v) in enumerate(zip(toks, lp, strict=True)):
                row: dict[str, Any] = {"datum": i}
                if names is not None:
                    row["id"] = names[i]
                row |= {"position": j, "token": t, "log_prob": float(v)}
                if self.words is not None:
                    row["word"] = int(self.words[i][j])
                row |= {"model": self.model, "variant": self.variant, "unit": self.unit}
                rows.append(row)
        return rows

    def word_log_probs(self) -> list[np.ndarray]:
        """Per-word scores: the sum of each word's units' log-probs ``(W_i,)``."""
        if self.words is None:
            raise ValueError("these scores carry no word map; run pll(..., whole_word=True) "
                             "or pll(..., variant='word_l2r') for per-word scores.")
        return [np.bincount(w.numpy(), weights=lp, minlength=int(w.max()) + 1)
                for w, lp in zip(self.words, self.log_probs, strict=True)]


def as_float64(a: Any) -> torch.Tensor:
    """A float64 CPU tensor of ``a`` (numpy arrays convert exactly)."""
    return torch.as_tensor(np.asarray(a, dtype=np.float64))


@dataclass
class LLaDAScores:
    """:func:`llada_scores`' result, one entry per (context, continuation) pair.

    Attributes
    ----------
    scores : numpy.ndarray
        LLaDA's estimate of log p(continuation | context).
    stderr : numpy.ndarray
        Its Monte Carlo standard error from the spread of the batch means (NaN
        with one batch, announced; 0 for an empty continuation).
    batches : int
        ``mc_num / batch``, the independent batch means of each pair.
    masked_inputs : numpy.ndarray
        Masked inputs scored per pair (``mc_num``; 0 for an empty continuation).
    num_model_calls : int
        Forward passes.
    """

    scores: np.ndarray
    stderr: np.ndarray
    batches: int
    masked_inputs: np.ndarray
    num_model_calls: int



class NonFiniteWarning(RuntimeWarning):
    """A result holds NaN or infinite values (the model gave non-finite log-probabilities)."""


def announce_nonfinite(values: Any, what: str, unit: str = "data", stacklevel: int = 3) -> int:
    """Warn (:class:`NonFiniteWarning`) when ``values`` hold NaN or inf; return how many rows do.

    The one check every front door runs on what it returns (estimates, curves,
    PLLs), so that a NaN never leaves a result unannounced. ``values`` is
    ``(N,)`` or ``(N, ...)``: a row with any non-finite entry counts once.
    """
    v = torch.as_tensor(np.asarray(_numpy(values), dtype=np.float64))
    if v.numel() == 0:
        return 0
    bad = ~torch.isfinite(v.reshape(v.shape[0], -1) if v.ndim else v.reshape(1, 1)).all(1)
    k = int(bad.sum())
    if k:
        i = int(bad.nonzero()[0, 0])
        row = v[i] if v.ndim else v
        first = float(row.reshape(-1)[~torch.isfinite(row.reshape(-1))][0])
        warnings.warn(
            f"{what} is not finite for {k} of {bad.numel()} {unit} (first: index {i}, value "
            f"{first}): the model gave NaN or infinite log-probabilities. Check those inputs and "
            "the model's parameters (a NaN weight, an overflow); with float16 or bfloat16, try "
            "float32 or float64.", NonFiniteWarning, stacklevel=stacklevel)
    return k


def warn_single_datum(num_data: int, what: str, spread: str, stacklevel: int = 4) -> bool:
    """Warn that one datum leaves the spread over data unknown (its standard error NaN).

    With N = 1 the sample variance over data has no degree of freedom, so
    ``spread`` (e.g. ``stderr_data``) is NaN; the Monte Carlo standard error
    (over masks) is still defined. Returns whether it warned.
    """
    if num_data != 1:
        return False
    warnings.warn(f"{what} rests on one datum: {spread} (the spread over data) cannot be "
                  "computed and is NaN; the Monte Carlo standard error over masks is not "
                  "affected. Pass two or more data to know how the estimate varies over data.",
                  RuntimeWarning, stacklevel=stacklevel)
    return True


def warn_target_missed(what: str, reason: str | None, stderr: float, target: float | None, *,
                       stacklevel: int = 4) -> bool:
    """Warn when a target standard error was not reached (estimates and curves alike):
    ``reason`` "budget", ``max_masks`` ran out first. Returns whether it warned."""
    if reason != "budget":
        return False
    warnings.warn(f"max_masks was spent before the target: {what} {stderr:.4g} > target_se "
                  f"{target:.4g}. Raise max_masks or the target.", RuntimeWarning,
                  stacklevel=stacklevel)
    return True


def announce_estimate(est: LMLEstimate, depth: int = 0) -> LMLEstimate:
    """Never let an estimate leave unannounced: NaN, an unknown SE, few dof, a missed target.

    Warns (:class:`NonFiniteWarning`) when the estimate is not finite, and
    (RuntimeWarning) when its standard error cannot be computed, when it
    rests on fewer than :data:`MIN_STDERR_DOF` effective degrees of freedom,
    or when a target standard error was missed (:func:`warn_target_missed`).
    Returns ``est``. The warnings name the line that called
    :func:`mptlml.estimate_lml` (through ``Estimator.estimate`` and its run; ``depth``
    more frames between the run and this call).
    """
    bad = announce_nonfinite(est.per_sample, f"the {est.estimator!r} estimate of log p(x)",
                             stacklevel=6 + depth)
    warn_single_datum(int(np.asarray(_numpy(est.per_sample)).size),
                      f"the {est.estimator!r} estimate", "stderr_data", stacklevel=6 + depth)
    if not bad and math.isnan(est.stderr):
        warnings.warn(
            f"the standard error of the {est.estimator!r} estimate cannot be computed from "
            f"{est.num_masks} Monte Carlo draw(s) per datum (it needs at least 2); stderr is "
            "NaN. Pass num_masks >= 2 to know how precise the estimate is.", RuntimeWarning,
            stacklevel=5 + depth)
    elif (not warn_target_missed("stderr", est.stop_reason, est.stderr, est.target_se,
                                 stacklevel=6 + depth)
          and est.stderr_dof is not None and est.stderr_dof < MIN_STDERR_DOF
          and est.stderr > 1e-9 * max(1.0, abs(est.mean))):  # not an exact sum
        warnings.warn(
            f"the standard error of the {est.estimator!r} estimate rests on about "
            f"{est.stderr_dof:.1f} effective degrees of freedom (fewer than {MIN_STDERR_DOF}): "
            "|mean - truth| > 2 stderr will happen far more often than 5% of the time. Use "
            "more masks (num_masks)" + (" or independent masks (share_masks=False)"
                                        if est.shared_masks else "") + ".",
            RuntimeWarning, stacklevel=5 + depth)
    return est


@dataclass
class Comparison(_Result):
    """Conditional bounds of the candidates of each question, compared on common masks.

    Attributes
    ----------
    scores : list of float64 arrays ``(K_q,)``
        Estimate of log p(candidate | context) (the conditional MPT bound).
    stderr : list of arrays ``(K_q,)``
        Its Monte Carlo standard error.
    choice : list of int
        Index of the leader (largest estimate) of each question.
    paired_stderr : list of arrays ``(K_q,)``
        Standard error of ``scores[choice] - scores[k]`` from the paired draws
        (0 for the leader itself).
    margin_z : list of float
        Smallest ``(leader - other) / paired_stderr`` over the other candidates.
    decided : list of bool
        Whether the leader is ahead of every other candidate by ``z_threshold``
        paired standard errors.
    z_threshold : list of float
        The threshold of ``decided`` of each question (:func:`compare`'s
        sequential rule: a t quantile at the paired SEs' degrees of freedom).
    exact : list of arrays ``(K_q,)`` of bool
        Whether a candidate's bound is an exact sum over every mask (a short
        continuation): its standard error 0 is then exact, not an estimate.
    stderr_dof : list of float
        Effective degrees of freedom of each question's standard errors (smallest).
    num_masked_rows : list of int
        Masked inputs scored for each question (all its candidates): its cost.
    candidate_masked_rows : list of int arrays ``(K_q,)``
        The same per candidate (an exact candidate's cost is its 2^T - 1 masks).
    rounds : list of int
        Rounds of draws each question took.
    tied : list of arrays ``(K_q,)`` of bool
        With ``decide``: whether a candidate is confidently within ``delta`` of
        the leader at the end (``|diff| + z paired_stderr < delta``, a practical
        tie; :func:`compare`'s guarantee covers it).
    stop_reason : list of str
        One of :data:`~mptlml.estimators.sequential.STOP_REASONS`: ``"fixed"`` (no
        ``decide``, no target: ``num_masks``, or ``max_masks`` alone, spent whole),
        ``"decided"``, ``"tied"`` (with ``decide``: every other candidate behind the
        leader or tied with it, at least one tied), ``"target"``, ``"budget"``
        (``max_masks`` spent before a decision or the target), or ``"exact"`` (every
        candidate short enough to be scored on every mask).
    num_model_calls : int
        Forward passes of the whole call.
    """

    contexts: list[Any]
    candidates: list[list[Any]]
    scores: list[np.ndarray]
    stderr: list[np.ndarray]
    choice: list[int]
    paired_stderr: list[np.ndarray]
    margin_z: list[float]
    decided: list[bool]
    tied: list[np.ndarray]
    z_threshold: list[float]
    exact: list[np.ndarray]
    stderr_dof: list[float]
    num_masked_rows: list[int]
    candidate_masked_rows: list[np.ndarray]
    rounds: list[int]
    stop_reason: list[str]
    num_model_calls: int = 0
    common_masks: bool = True
    seed: Any = None
    model: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def plot(self, question: int | None = None, *, ax: Any = None) -> Any:
        """One question's candidates with their SEs (:func:`~.plots.plot_comparison`); the Axes."""
        from .plots import plot_comparison

        return plot_comparison(self, question, ax=ax)

    def to_pandas(self) -> Any:
        """One row per (question, candidate): score, SE, paired SE to the leader, choice, cost.

        ``num_masked_rows`` is the candidate's own cost (``candidate_masked_rows``).
        """
        require("pandas", "Comparison.to_pandas()")
        import pandas as pd

        rows = []
        for q, cands in enumerate(self.candidates):
            lead = self.choice[q]
            for k, cand in enumerate(cands):
                rows.append({
                    "question": q, "candidate": k,
                    "continuation": cand if isinstance(cand, str) else list(cand),
                    "score": float(self.scores[q][k]), "stderr": float(self.stderr[q][k]),
                    "diff_to_leader": float(self.scores[q][k] - self.scores[q][lead]),
                    "paired_stderr": float(self.paired_stderr[q][k]),
                    "exact": bool(self.exact[q][k]), "chosen": k == lead,
                    "decided": bool(self.decided[q]), "tied": bool(self.tied[q][k]),
                    "num_masked_rows": int(self.candidate_masked_rows[q][k]),
                    "stop_reason": self.stop_reason[q]})
        return pd.DataFrame(rows)
