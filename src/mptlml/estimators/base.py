"""The estimator: one object per Monte Carlo estimator of Proposition 1, and their registry.

Proposition 1 of Moreno-Munoz, Recasens & Hauberg (NeurIPS 2023)::

    log p(x) = sum_{M=1..D} S(x; M),
    S(x; M)  = E_{|mask| = M} [ (1/M) sum_{j in mask} log p(x_j | x_R) ].

An :class:`Estimator` holds what distinguishes one estimator of this sum from
another, in one place:

- its **options**, validated once in ``__init__`` (the signature is the list
  of options it accepts; anything else is refused by :func:`create`);
- its **mask-size rule** :meth:`Estimator.sizes` and the **weight** of each
  size :meth:`Estimator.weights` (a trainable estimator: evaluation, training
  with :class:`mptlml.objectives.MPTLoss` and the Hugging Face collator all
  draw their sizes here);
- :meth:`Estimator.draws`, the P i.i.d. per-draw estimates of log p(x_n) that
  everything else is built on (the estimate and its standard error, the
  training objective, common random numbers in model selection, running
  means);
- :meth:`Estimator.estimate`, the estimate with its Monte Carlo standard error
  for dense data and, where the estimator applies, for ragged sequences.

A new estimator is one subclass and one :func:`register` call, inside the
package or outside it::

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

import inspect
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from .._validation import check_positive_int, make_generator
from ..estimation.engine import Counter, score_masks
from ..estimation.results import LMLEstimate, as_float64
from ..estimation.stats import mean_stderr, strata_stderr, sum_stderr
from ..models.base import MaskedModel
from ..models.protocols import RaggedMaskedModel

__all__ = ["Draws", "Estimator", "RaggedScores", "accepted_options", "available", "create",
           "get", "register", "unregister"]

_REGISTRY: dict[str, type[Estimator]] = {}
_HINTS = {"nested": "nested=True needs estimator='cumulative' (nested masks are the "
                          "prefixes of one order, one mask per size); got {estimator!r}.",
                "rate": "rate / mask_size only apply to estimator='fixed-rate'; the "
                        "{estimator!r} estimator does not use one mask size. Drop them or pass "
                        "estimator='fixed-rate'.",
                "rates": "rates= applies to ragged sequences (a masked LM) with "
                         "estimator='riemann'; for (N, D) data use mpt_curve(model, x, sizes=...)."}
_HINTS["mask_size"] = _HINTS["rate"]


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
        stratum's spread (:func:`mptlml.estimation.stats.strata_stderr`);
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
    """

    lml: np.ndarray
    stderr: np.ndarray
    num_model_calls: int
    num_masked_rows: int
    rows_per_sequence: np.ndarray | None = None


class Estimator:
    """An MPT estimator of log p(x) (Proposition 1): base class of every estimator.

    Subclasses set the class attributes, validate their options in
    ``__init__``, and implement either the size rule (:meth:`sizes` and
    :meth:`weights`: then :meth:`draws` works unchanged and the estimator can
    train) or their own :meth:`evaluate` (and :meth:`score_sequences` for
    ragged sequences).

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
        Whether E[draw] = log p(x) for a consistent model.
    dense, ragged : bool
        Whether it estimates dense ``(N, D)`` data / ragged sequences.
    trainable : bool
        Whether it has a size rule (:meth:`sizes`), so that
        :class:`~mptlml.objectives.MPTLoss` can train with it.
    per_sequence_sizes : bool
        Whether :meth:`sizes` draws one size per sequence of a batch (the
        Hugging Face collator needs this).
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
        out = self._combine(rows, s, x.shape[1])
        if learn:  # after the draw: its sizes depended only on the draws before it
            self.observe(rows, s.detach(), x.shape[1])
        return out

    def _score_rows(self, model: MaskedModel, x: torch.Tensor, g: torch.Generator,
                    progress: bool, counter: Counter | None,
                    mean_over_data: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        n, d = x.shape
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
        d = x.shape[1]
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

    # ---------------------------------------------------------------- estimates
    def estimate(self, model: MaskedModel | RaggedMaskedModel, x: Any, *,
                 seed: int | torch.Generator | None = None, progress: bool = False,
                 run: Mapping[str, Any] | None = None) -> LMLEstimate:
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

        Returns
        -------
        LMLEstimate
        """
        if isinstance(model, RaggedMaskedModel):
            self.check_applies(ragged=True)
            if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
                raise TypeError(f"for ragged sequences pass an int seed, got {seed!r}.")
            out = self.score_sequences(model, x, int(seed), progress, dict(run or {}))
            n = out.lml.size
            return LMLEstimate(
                estimator=self.name, per_sample=as_float64(out.lml),
                per_sample_stderr=as_float64(out.stderr), mean=float(out.lml.mean()),
                stderr=float(sum_stderr(out.stderr)) / n,
                stderr_data=float(mean_stderr(out.lml)[1]),
                sizes=None, size_scores=None, num_masks=self.num_masks,
                num_model_calls=out.num_model_calls, num_masked_rows=out.num_masked_rows,
                num_masked_rows_per_sample=None if out.rows_per_sequence is None
                else torch.as_tensor(out.rows_per_sequence, dtype=torch.long),
                seed=int(seed), model=model.name)
        if run:
            raise TypeError(f"unexpected arguments {sorted(run)} (only for ragged sequences).")
        self.check_applies(ragged=False)
        if not isinstance(model, MaskedModel):
            raise TypeError(
                f"model must be an mptlml.models.MaskedModel (a model of (N, D) data) or a "
                f"RaggedMaskedModel (a masked LM), got {type(model).__name__}.")
        xt = model.validate_data(x)
        n, d = xt.shape
        self.check_num_tokens(d)
        counter = Counter()
        with torch.no_grad(), model.reuse_data():
            out = self.evaluate(model, xt, make_generator(seed), counter, progress)
            exact = None
            if model.has_log_marginal and not model.stochastic:
                exact = float(model._log_marginal(xt).double().mean())
        per_sample = out.samples.mean(0)
        if out.exact:
            per_se, stderr, dof = torch.zeros_like(per_sample), 0.0, math.inf
        else:
            cells = out.cells if out.cells is not None else out.samples[None]
            per_se, stderr, dof = strata_stderr(cells, shared=self.share_masks)
        mean = float(per_sample.mean())
        rows_per_datum = counter.rows // n
        return LMLEstimate(
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
            seed=int(seed) if isinstance(seed, numbers.Integral) else None)

    @classmethod
    def check_applies(cls, *, ragged: bool) -> None:
        """Refuse data this estimator does not estimate (ragged sequences or dense data)."""
        if not (cls.ragged if ragged else cls.dense):
            kind = "ragged sequences (a masked LM)" if ragged else "dense (N, D) data"
            names = available(ragged=True) if ragged else available(dense=True)
            raise ValueError(f"estimator {cls.name!r} does not apply to {kind}; choose one of "
                             f"{', '.join(names)}.")

    @staticmethod
    def sequence_lengths(num_tokens: torch.Tensor) -> torch.Tensor:
        """The D_i of a batch of sequences as a flat LongTensor, checked >= 0."""
        d = num_tokens.long().flatten()
        if bool((d < 0).any()):
            raise ValueError(f"num_tokens must be >= 0, got {d.tolist()}.")
        return d

    def check_num_tokens(self, num_tokens: int) -> None:
        """Refuse options that do not fit data of ``num_tokens`` tokens (e.g. M > D)."""

    def score_sequences(self, model: RaggedMaskedModel, sequences: Any, seed: int,
                        progress: bool, run: dict[str, Any]) -> RaggedScores:
        """Per-sequence estimates on ragged sequences (estimators with ``ragged = True``)."""
        raise NotImplementedError(f"the {self.name!r} estimator has no ragged scoring.")


# ---------------------------------------------------------------------- the registry
def accepted_options(cls: type[Estimator]) -> tuple[str, ...]:
    """The options an estimator class accepts: the keyword parameters of its ``__init__``."""
    params = inspect.signature(cls.__init__).parameters
    return tuple(p for p in params if p != "self"
                 and params[p].kind not in (inspect.Parameter.VAR_POSITIONAL,
                                            inspect.Parameter.VAR_KEYWORD))


def register(cls: type[Estimator], *, replace: bool = False) -> type[Estimator]:
    """Add an estimator class to the registry under ``cls.name`` (usable as a decorator).

    After this, ``estimate_lml(model, x, cls.name)``, ``MPTLoss(model, cls.name)``
    and ``DataCollatorForMPT(tokenizer, cls.name)`` find it (where it applies).

    Raises
    ------
    ValueError
        If ``cls.name`` is empty or already taken (pass ``replace=True``).
    """
    if not (isinstance(cls, type) and issubclass(cls, Estimator)):
        raise TypeError(f"register takes an Estimator subclass, got {cls!r}.")
    if not isinstance(cls.name, str) or not cls.name:
        raise ValueError(f"{cls.__name__} needs a class attribute name = '...' to register.")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls and not replace:
        raise ValueError(f"an estimator named {cls.name!r} is registered already "
                         f"({_REGISTRY[cls.name].__name__}); pick another name or pass "
                         "replace=True.")
    _REGISTRY[cls.name] = cls
    return cls


def unregister(name: str) -> None:
    """Remove ``name`` from the registry (for estimators registered at run time)."""
    _REGISTRY.pop(name, None)


def get(name: str | Estimator | type[Estimator]) -> type[Estimator]:
    """The estimator class registered under ``name`` (a class or instance passes through)."""
    if isinstance(name, Estimator):
        return type(name)
    if isinstance(name, type) and issubclass(name, Estimator):
        return name
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"unknown estimator {name!r}; choose one of {', '.join(_REGISTRY)}.")
    return _REGISTRY[name]


def available(*, dense: bool | None = None, ragged: bool | None = None,
              trainable: bool | None = None,
              per_sequence_sizes: bool | None = None) -> tuple[str, ...]:
    """Names of the registered estimators with the given properties (None: any)."""
    want = {"dense": dense, "ragged": ragged, "trainable": trainable,
            "per_sequence_sizes": per_sequence_sizes}
    return tuple(n for n, c in _REGISTRY.items()
                 if all(v is None or getattr(c, k) == v for k, v in want.items()))


def create(estimator: str | Estimator | type[Estimator], *, for_ragged: bool = False,
           hints: Mapping[str, str] | None = None, **options: Any) -> Estimator:
    """An estimator instance from a name (or class), refusing options it does not accept.

    ``options`` are the caller's arguments that were set (None and False mean
    "not given" and are dropped). An option the estimator does not take is
    refused with ``hints[option]`` when given (by default the package's
    messages for dense data), else a message naming the options it does take;
    never ignored. An instance passes through, and then
    no option may be given.
    """
    given = {k: v for k, v in options.items() if v is not None and v is not False}
    if isinstance(estimator, Estimator):
        extra = {k for k in given if k != "num_masks" or given[k] != estimator.num_masks}
        if extra:
            raise TypeError(f"an Estimator instance carries its options; got {sorted(extra)} "
                            f"besides {estimator!r}. Set them on the instance instead.")
        return estimator
    cls = get(estimator)
    accepted = set(accepted_options(cls))
    if for_ragged:
        accepted -= set(cls.dense_only)
    bad = sorted(set(given) - accepted)
    hints = _HINTS if hints is None and not for_ragged else (hints or {})
    for opt in bad:
        if opt in hints:
            raise ValueError(hints[opt].format(estimator=cls.name))
    if bad:
        kind = "ragged sequences" if for_ragged else "dense data (N, D)"
        uses = ", ".join(sorted(accepted - {"num_masks"})) or "none"
        raise TypeError(f"argument(s) {bad} do not apply to estimator {cls.name!r} on {kind} "
                        f"(its options: {uses}); drop them.")
    return cls(**given)
