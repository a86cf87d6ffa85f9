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
  and degrees of freedom, for dense data and ragged sequences alike (what
  differs between them is in :mod:`mptlml.estimators.runs`), and the same at
  a target standard error for any unbiased estimator, on the sequential engine
  (:mod:`mptlml.estimators.sequential`): rounds of draws, the draws of each
  *stratum* of a draw (a term whose draws are independent of the others': a
  mask size of ``cumulative``, the whole draw of ``random-size``) allocated in
  proportion to its spread as the rounds learn it.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from .._scoring.dense import Counter, score_masks
from .._scoring.ragged import run_pairs, sequence_seed
from .._validation import check_positive_int, make_generator
from ..masks import sample_masks
from ..models.base import MaskedModel
from ..models.protocols import RaggedMaskedModel
from .allocation import check_target
from .block import block_estimate, block_model, refuse_block_model
from .results import LMLEstimate
from .runs import DenseRun, start_run
from .sequential import EXACT_LENGTH, CellDraw, RoundDraw, scores_every_mask
from .stats import cell_sums

__all__ = ["Draws", "Estimator", "accepted_options", "check_size_rule"]


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
    #: whether its draws are the rate draw of the sequential engine (:class:`LearnedRate`)
    rate_draw: ClassVar[bool] = False
    #: options that only dense data take (refused for ragged sequences)
    dense_only: ClassVar[tuple[str, ...]] = ("share_masks",)
    ragged_tag: ClassVar[str] = ""

    def __init__(self, num_masks: int = 1, *, share_masks: bool = False) -> None:
        self.num_masks = check_positive_int(num_masks, "num_masks")
        if not isinstance(share_masks, bool):
            raise TypeError(f"share_masks must be True or False, got {share_masks!r}.")
        self.share_masks = share_masks

    @property
    def draw_unit(self) -> int:
        """Masks that come as one unit of a draw: the engine's rounds are whole multiples of
        it (1; LLaDA's estimator: its batch)."""
        return 1

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
        check_size_rule(self, rows, d)
        s = score_masks(model, x, rows, share_masks=self.share_masks, generator=g,
                        progress=progress, counter=counter, mean_over_data=mean_over_data)
        return rows, s

    def _combine(self, rows: torch.Tensor, s: torch.Tensor, d: int) -> torch.Tensor:
        return self._cells(rows, s, d).sum(0)

    def _cells(self, rows: torch.Tensor, s: torch.Tensor, d: int) -> torch.Tensor:
        """The weighted scores by (row of a draw, draw, ...): ``(rows_per_draw, P, ...)``."""
        w = self.weights(rows, d)
        check_size_rule(self, rows, d, w)
        w = w.to(device=s.device, dtype=s.dtype)
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

    def enumerates_sequence(self, num_tokens: int) -> bool:
        """Whether a sequence of ``num_tokens`` units is scored on every mask instead
        (exact, standard error 0): an unbiased estimator's, when its 2^D - 1 masks are no
        more than the masked inputs its draws would score, or than 2^EXACT_LENGTH - 1 (a
        few: :data:`~mptlml.estimators.sequential.EXACT_LENGTH`), the engine's one rule
        (:func:`~mptlml.estimators.sequential.scores_every_mask`). Both estimate the same
        sum."""
        if not self.unbiased or num_tokens < 1:
            return False
        return scores_every_mask(int(num_tokens),
                                 self.masks_per_draw(int(num_tokens)) * self.num_masks)

    def round_draw(self, num_masks: int, allocation: str | None = "neyman") -> RoundDraw:
        """The estimator's draw as the sequential engine runs it on ragged sequences: a
        round of ``num_masks`` draws per sequence
        (:class:`~mptlml.estimators.sequential.CellDraw` of :meth:`with_draws`, its rows
        allocated by ``allocation`` over a target's rounds; None: a plain estimate's one
        round, nothing allocated, each sequence's error the estimator's own,
        :meth:`sequence_error`); the rate draw overrides it
        (:class:`~mptlml.estimators.learned_rate.RateDraw`). An estimator drawing whole
        batches (``draw_unit`` b > 1, LLaDA's) is refused a round that is not at least two
        whole batches."""
        unit = int(self.draw_unit)
        if unit > 1 and (num_masks % unit or num_masks // unit < 2):
            # its draw is a batch of b masks, its SE the spread of the batch means (sd /
            # sqrt(n) on n - 1 dof): a part batch would draw more than the result says, one
            # batch has no spread (a NaN standard error, which would read as a decision)
            raise ValueError(
                f"estimator {self.name!r} draws whole batches of {unit} masks and its standard "
                f"error is the spread of the batch means: num_masks={num_masks} is "
                + (f"not a multiple of {unit}" if num_masks % unit else "one batch (no spread)")
                + f". Pass num_masks a multiple of {unit}, at least {2 * unit} (LLaDA's own: "
                "num_masks=128), or an instance with a smaller batch (LLaDA(128, batch=8)).")
        return CellDraw(self.with_draws(int(num_masks)), allocation)

    def scored_rows(self, num_tokens: int, counts: np.ndarray) -> int:
        """Masked inputs :meth:`ragged_cells` scores for a sequence of ``num_tokens`` units
        given its ``counts`` (draws per row of a draw): the default, ``counts[0]`` draws of
        :meth:`masks_per_draw` each; an estimator that enumerates a finite population says
        what it scored instead."""
        return int(self.masks_per_draw(int(num_tokens)) * int(np.max(counts)))

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
        draws = [int(c[0]) for c in counts]

        def draw_sizes(i: int, d: int, g: torch.Generator) -> torch.Tensor:
            m = self.sizes(torch.full((draws[i],), d), generator=g)
            check_size_rule(self, m, torch.full((draws[i],), d))
            return m

        def masks(i: int, d: int, g: torch.Generator) -> torch.Tensor:
            return sample_masks(d, draw_sizes(i, d, g), generator=g)

        out = run_pairs(model, toks, masks, seed=seed, tag=tag, units=units,
                        spec={"kind": "draws", "estimator": self.fingerprint(),
                              "num_masks": draws[0] if len(set(draws)) == 1 else draws,
                              "total_pairs": sum(draws)}, desc=f"{self.name} draws", **run)
        cells = []
        for i, (s, d) in enumerate(zip(out.sums, out.lengths, strict=True)):
            # the same sizes again, from the same generator
            m = draw_sizes(i, int(d), torch.Generator().manual_seed(sequence_seed(seed, i)))
            w = self.weights(m, torch.full_like(m, int(d)))
            check_size_rule(self, m, torch.full_like(m, int(d)), w)
            cells.append([(w * torch.as_tensor(s, dtype=torch.float64) / m).numpy()])
        return cells, out.num_model_calls

    # ---------------------------------------------------------------- estimates
    def estimate(self, model: MaskedModel | RaggedMaskedModel, x: Any, *,
                 seed: int | torch.Generator | None = None, progress: bool = False,
                 run: Mapping[str, Any] | None = None, target_se: float | None = None,
                 max_masks: int | None = None, allocation: str | None = None) -> LMLEstimate:
        """Estimate log p(x_n) per datum with its Monte Carlo standard error.

        One procedure for every estimator and both kinds of data (the kind
        decides the run, :mod:`mptlml.estimators.runs`): ``num_masks`` draws
        per stratum of a draw, or, with ``target_se`` (unbiased estimators), the
        sequential engine of :func:`mptlml.compare`
        (:func:`~mptlml.estimators.sequential.run_rounds`, no pilot):

        - ragged sequences (:meth:`~mptlml.estimators.runs.RaggedRun.to_target`): rounds of
          the estimator's draws per sequence until each one's SE is at
          ``target_se N / sqrt(N_mc)``;
        - dense data (:meth:`~mptlml.estimators.runs.DenseRun.to_target`): the data set is
          one member; round 0 draws ``max(2, num_masks)`` per stratum of a draw (a size of
          ``cumulative``; the draw itself for one-stratum estimators such as
          ``random-size``), later rounds double the draws so far (or draw what the target
          is predicted to need), each stratum's share Neyman's from its spread over the
          rounds so far (``c_h = P H sd_h / sum_k sd_k``, ``"uniform"``: ``P`` each),
          until the standard error of the mean is at most ``target_se`` on at least
          :data:`~mptlml.estimators.sequential.TARGET_MIN_DOF` degrees of freedom.

        Each round is unbiased given the past; the rounds are combined by their draws.
        ``stop_reason`` says whether the target was reached (``"target"``) or the budget
        spent first (``"budget"``, with a warning), ``num_masked_rows`` what it cost.

        Parameters
        ----------
        model : MaskedModel or RaggedMaskedModel
        x : (N, D) array-like, or a list of texts / token-id sequences (ragged)
        seed : int or torch.Generator, optional (ragged sequences: an int)
        progress : bool
        run : mapping, optional
            Ragged sequences: the runner's options (``token_budget``,
            ``batch_size``, ``chunk_size``, ``checkpoint_dir``).
        target_se : float, optional
            The Monte Carlo standard error of the mean LML to reach (nats).
        max_masks : int, optional
            With ``target_se``: the most masked inputs per datum (ragged sequence); default
            :data:`~mptlml.estimators.sequential.MAX_TARGET_DRAWS` draws' worth (on dense data
            per stratum, lowered to what ``mptlml.settings.max_masked_inputs`` allows).
        allocation : {None, "neyman", "uniform"}
            With ``target_se`` (default ``"neyman"``): the draws per stratum of dense data,
            and on ragged sequences the rate density of ``"learned-rate"`` or the rows of a
            draw (``"cumulative"``'s sizes), learned over the rounds.

        Returns
        -------
        LMLEstimate

        Warns
        -----
        RuntimeWarning
            When the estimate is not finite, its standard error unknown (one
            draw per datum) or resting on fewer than
            :data:`~mptlml.estimators.results.MIN_STDERR_DOF` degrees of freedom, or a
            target was missed (:func:`~mptlml.estimators.results.announce_estimate`).
        """
        asked = allocation
        target_se, budget, allocation = check_target(target_se, max_masks, allocation)
        if target_se is None and budget is not None:
            raise ValueError(f"max_masks={max_masks!r} is the budget of a target standard error "
                             "and applies with target_se= only.")
        if target_se is not None:
            self.check_targetable()
        ragged = isinstance(model, RaggedMaskedModel)
        self.check_applies(ragged=ragged)
        if ragged and block_model(model):  # the rate draw inside each block, or refused
            if not self.rate_draw:
                refuse_block_model(model, f"the {self.name!r} estimator")
            return block_estimate(self, model, x, seed=seed, progress=progress, run=run,
                                  target_se=target_se, max_masks=budget, allocation=asked,
                                  exact_length=EXACT_LENGTH)
        if target_se is not None and asked is not None and (
                (not self.rate_draw and self.ragged_strata(np.array([2]))[1] < 2) if ragged
                else len(self.strata(int(getattr(model, "num_tokens", 2))) or ()) < 2):
            raise ValueError(
                f"allocation={asked!r} does not apply to the {self.name!r} estimate of "
                f"{'ragged sequences' if ragged else 'dense data'} at a target: its draw is "
                "one term, nothing to allocate (the rate density is learned by "
                "estimator='learned-rate', the sizes by 'cumulative'). Drop allocation.")
        data = start_run(self, model, x, seed=seed, progress=progress, run=run)
        if target_se is None:
            return data.result()
        if isinstance(data, DenseRun):
            return data.to_target(target_se, budget, allocation)
        return data.to_target(target_se, budget, asked)

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

    def sequence_cells(self, model: RaggedMaskedModel, toks: list[torch.Tensor],
                       counts: Sequence[np.ndarray], seed: int,
                       **run: Any) -> tuple[list[list[np.ndarray]], int]:
        """The cells of a plain (untargeted) estimate: :meth:`ragged_cells` unless overridden.

        Each cell holds independent draws of one term; the estimate of sequence i
        sums its cells' means, its variance their variances of the mean (each
        cell of n draws giving n - 1 degrees of freedom).
        """
        return self.ragged_cells(model, toks, counts, seed, tag=self.ragged_tag, **run)

    def sequence_error(self, cells: list[np.ndarray], single_draws: bool
                       ) -> tuple[float, float, np.ndarray, np.ndarray]:
        """One sequence's estimate, its SE, and the variances and dof the call's Welch dof
        pools: :func:`~mptlml.estimators.stats.cell_sums` unless overridden."""
        return cell_sums(cells, single_draws)

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


def check_size_rule(est: Estimator, sizes: Any, num_tokens: int | torch.Tensor,
                    weights: Any = None) -> None:
    """Refuse mask sizes (and weights) that break the contract of a size rule.

    A draw of Proposition 1's estimators is ``sum_rows weight * S_hat(x; M_row)``
    with ``S_hat(x; M) = (1/M) sum_{j in mask} log p(x_j | x_R)`` over a uniform
    mask of M of the D tokens (Moreno-Munoz, Recasens & Hauberg, NeurIPS 2023,
    Proposition 1). That needs, for every row:

    - an integer size ``1 <= M <= D`` (per sequence ``1 <= M_i <= D_i``, and
      ``M_i = 0`` exactly where ``D_i = 0``: the empty sum);
    - a finite weight ``> 0`` where ``M >= 1`` (e.g. ``1 / q(M)`` or ``D``).

    :meth:`Estimator.sizes` / :meth:`Estimator.weights` of any estimator (a
    user's included) are checked here before their draws are used: by the
    estimate, by :class:`~mptlml.objectives.MPTLoss` and by
    :class:`mptlml.hf.DataCollatorForMPT`.

    Parameters
    ----------
    est : Estimator
        Whose rule drew them (named in the error).
    sizes : LongTensor
        ``(R,)`` or ``(R, N)`` rows of dense data, or one size per sequence.
    num_tokens : int or LongTensor
        D, or D_i per size (``sizes``' shape).
    weights : Tensor, optional
        The weights of ``sizes`` (:meth:`Estimator.weights`).

    Raises
    ------
    ValueError
        Naming the estimator, the offending size (or weight) and its D.
    """
    who = f"{type(est).__name__} ({est.name!r})"
    fix = "fix its sizes() / weights() (mptlml.estimators.Estimator documents the contract)."
    if not isinstance(sizes, torch.Tensor) or sizes.dtype.is_floating_point \
            or sizes.dtype.is_complex or sizes.dtype == torch.bool:
        raise ValueError(f"{who}.sizes() must return an integer tensor of mask sizes, got "
                         f"{type(sizes).__name__} {getattr(sizes, 'dtype', '')}; {fix}")
    m = sizes.detach().cpu().long()
    d = (num_tokens.detach().cpu().long() if isinstance(num_tokens, torch.Tensor)
         else torch.tensor(int(num_tokens)))
    if d.ndim and d.numel() == m.numel():
        d = d.reshape(m.shape)
    else:
        d = d.expand_as(m) if d.ndim == 0 else d
    if d.shape != m.shape:
        raise ValueError(f"{who}.sizes() returned shape {tuple(m.shape)} for "
                         f"{tuple(d.shape)} lengths; one size per sequence (or row) is needed; "
                         f"{fix}")
    bad = ((d > 0) & ((m < 1) | (m > d))) | ((d <= 0) & (m != 0))
    if bool(bad.any()):
        k = tuple(int(v) for v in bad.nonzero()[0])
        mk, dk = int(m[k]), int(d[k])
        why = ("a mask of 0 tokens scores nothing" if mk == 0 else
               "there is nothing to mask" if dk == 0 else
               f"only {dk} tokens can be masked" if mk > dk else "a size is positive")
        raise ValueError(f"{who}.sizes() drew M={mk} for a datum of D={dk} maskable tokens "
                         f"(at {k}); {why}: a size rule must draw 1 <= M <= D (0 only where "
                         f"D = 0). {fix[0].upper()}{fix[1:]}")
    if weights is None:
        return
    w = torch.as_tensor(weights).detach().cpu().double()
    if w.shape != m.shape:
        raise ValueError(f"{who}.weights() returned shape {tuple(w.shape)} for sizes of shape "
                         f"{tuple(m.shape)}; one weight per size is needed; {fix}")
    bad = (m > 0) & ~(torch.isfinite(w) & (w > 0))
    if bool(bad.any()):
        k = tuple(int(v) for v in bad.nonzero()[0])
        raise ValueError(f"{who}.weights() gave {float(w[k])} to size M={int(m[k])} of "
                         f"D={int(d[k])} (at {k}); every drawn size needs a finite weight > 0 "
                         f"(1/q(M) for a size drawn with probability q(M)). "
                         f"{fix[0].upper()}{fix[1:]}")
