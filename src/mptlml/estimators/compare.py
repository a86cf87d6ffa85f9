"""Candidates decided together: conditional MPT bounds on common random numbers.

A multiple-choice question gives one context C and K candidate continuations
T_1..T_K. For each, Proposition 1 applied to p(x_T | x_C) gives

    log p(x_T | x_C) = sum_{M=1..|T|} S_T(x; M)
                     = S_T(x; |T|) + E_{M ~ q} [ S_T(x; M) / q(M) ]   (M < |T|),

S_T the mean log-probability of M tokens masked inside T, the context always
visible. The M = |T| term has a single mask (everything in T): it is scored
once, exactly. A short continuation, whose 2^|T| - 2 other masks are no more
than ``max(num_masks, 2^EXACT_LENGTH - 2)``, is scored on every mask: its bound
is exact, with standard error 0. The other sizes are drawn by importance sampling over a rate
density q on (0, 1): a rate r gives M = ceil(r (|T| - 1)), so q(M) is the
q-mass of ((M-1)/(|T|-1), M/(|T|-1)].

Variance reduction, all unbiased:

- **stratified rates**: each round draws H strata of equal q-mass, two draws
  in each, so the sizes cover (0, 1) evenly (a systematic design, with a
  variance estimate of H degrees of freedom from the within-stratum pairs);
- **common random numbers**: the K candidates of a question share the rate
  draws and the uniform numbers that place the masked positions, so equal-
  length candidates are masked at the same sizes and positions; their
  difference then has far less variance than on independent masks, and its
  standard error is computed from the paired draws;
- **an allocation learned as the run goes**: after the first (uniform) round,
  q is proportional to the spread of a mask's score by rate (Neyman), that
  of the question's own draws shrunk toward the spread pooled over every
  candidate of the call, as if the pooled one were
  :data:`~mptlml.estimators.sequential.PRIOR_PAIRS` pairs per rate bin: a
  question's first rounds borrow the call's profile, its later ones follow its
  own (no pilot per sequence); each round is
  unbiased on its own and rounds are combined with weights in proportion
  to their draws.

Rounds double the draws so far (P, P, 2P, 4P, ... masks per candidate), so a
question looks at its result about log2(max_masks / P) times, not
max_masks / P times (``max_masks``: the most masked inputs scored per candidate, the
whole continuation's one included): the threshold below stays low, and the degrees of
freedom of the standard errors grow fast. Towards a ``target_se`` (without
``decide``) a round draws no more than the remainder the target is predicted
to need, ``n (se / target)^2 - n`` (times
:data:`~mptlml.estimators.sequential.NEED_MARGIN`), so the last round lands
near the target instead of overshooting it up to twofold.

With ``decide=True`` a candidate stops drawing once it is behind the leader by
more than ``z`` paired standard errors (successive elimination), or once its
difference to the leader is confidently within the indifference zone
``delta`` (``|diff| + z se < delta``: a practical tie), and a question stops
once every other candidate has, with
``z = t_{nu}^{-1}(1 - alpha / (2 R))`` for R the most rounds it may take
(Bonferroni over the looks) and nu the effective degrees of freedom of that
pair's paired standard error (Welch-Satterthwaite over the rounds' strata):
with calibrated standard errors, the chance that a question is declared
decided for a candidate that is not the best under the bound is at most
``alpha``; with the zone, the chance that the chosen candidate is more than
``delta`` below the best is at most ``alpha`` (the ranking-and-selection
guarantee of an indifference zone). A clear question stops after one round; a
near tie after about ``(z sigma / delta)^2`` draws, not ``max_masks``.

Reference: Moreno-Munoz, Recasens, Hauberg, "On Masked Pre-training and the
Marginal Likelihood", NeurIPS 2023, Proposition 1 (conditionally).
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import special

from .._validation import ALLOCATIONS, SEED_INT, Options, check_options
from ..models.conditional import with_context
from ..models.protocols import RaggedMaskedModel
from .block import BlockDraw, block_model, refuse_block_model
from .learned_rate import RateDraw
from .results import MIN_STDERR_DOF, Comparison, announce_nonfinite
from .sequential import (  # EXACT_LENGTH: compare's, for its callers
    EXACT_LENGTH,  # noqa: F401
    MAX_TARGET_DRAWS,
    TARGET_MIN_DOF,
    RoundDraw,
    Tally,
    draw_caps,
    fixed_rule,
    paired,
    round_sizes,
    run_rounds,
    target_rule,
)

__all__ = ["Comparison", "compare"]

#: most masked inputs per candidate with ``decide``, unless ``max_masks`` says: LLaDA's 128
#: masked inputs per candidate (measured with :data:`DELTA`: at most a third of LLaDA's cost
#: on easy and close question sets, benchmarks/bench_conditional.py; fewer looks, so a lower
#: threshold)
DECIDE_MAX_MASKS = 128
#: the indifference zone of ``decide`` (nats), unless ``delta`` says: a pair confidently
#: within it is a practical tie (measured: benchmarks/bench_conditional.py)
DELTA = 0.5

#: compare's own allowed values where they differ from the shared table
#: (:data:`mptlml._validation.MONTE_CARLO_OPTIONS`)
_OPTIONS: dict[str, list[Any]] = {"seed": [SEED_INT, "int sequence"],
                                  "allocation": [Options(ALLOCATIONS)],
                                  "precision": ["boolean"]}


def compare(model: Any, contexts: Sequence[Any], candidates: Sequence[Sequence[Any]], *,
            num_masks: int = 16, decide: bool = False, target_se: float | None = None,
            alpha: float = 0.05, delta: float | None = None, precision: bool | None = None,
            max_masks: int | None = None, allocation: str = "neyman",
            common_masks: bool = True, seed: int | Sequence[int] = 0,
            token_budget: int = 8192, batch_size: int | None = None, chunk_size: int = 64,
            progress: bool = False, cfg_scale: float = 0.0,
            estimator: str | Any = "learned-rate") -> Comparison:
    """Score the K candidate continuations of each question on common masks, and choose.

    Parameters
    ----------
    model : RaggedMaskedModel
        A masked LM or masked-diffusion LM (any model of the ragged protocol,
        :class:`~mptlml.models.protocols.RaggedMaskedModel`).
    contexts : list of str (or token-id lists)
        One context per question; always visible, never scored (``""``: none).
    candidates : list of lists of str (or token-id lists)
        The K_q candidate continuations of question q (K_q >= 1).
    num_masks : int
        Masks per candidate in the first round (even: two per rate stratum),
        besides the one mask of the whole continuation; later rounds double the
        total (``num_masks``, then ``2 num_masks``, ``4 num_masks``, ...).
    decide : bool
        Keep drawing rounds, per question, until its leader is decided (the
        sequential rule of the module docstring) or ``max_masks`` is spent.
    target_se : float, optional
        Keep drawing until every candidate's standard error is at most this, on
        at least :data:`~mptlml.estimators.sequential.TARGET_MIN_DOF` degrees of
        freedom (or ``max_masks`` is spent). Without ``decide``, ``target_se`` and
        ``max_masks``: one round.
    alpha : float
        Error rate of the sequential rule (``decide``); also sets ``decided``.
    delta : float, optional
        With ``decide``: the indifference zone in nats (default :data:`DELTA`;
        0 turns it off). A candidate whose paired difference to the leader is
        confidently inside ``(-delta, delta)`` (``|diff| + z paired_stderr <
        delta``) is a practical tie: it stops drawing (while it stays tied with
        the leader), and a question whose other candidates are all behind or
        tied stops (``stop_reason`` ``"tied"``, ``tied`` marks them). A close
        pair then costs about ``(z sigma / delta)^2`` draws instead of
        ``max_masks``. **Guarantee**: for a question that stops ``"decided"``
        or ``"tied"``, the chosen candidate's bound is within ``delta`` of the
        largest bound (the exhaustive sum) with probability at least
        ``1 - alpha``, when the paired standard errors are calibrated: a wrong
        stop needs a pair's interval ``diff +- z paired_stderr`` to miss the
        true difference at some look, at most ``alpha / R`` per look (R looks,
        Bonferroni); a question that spends ``max_masks`` first carries no
        guarantee and is reported undecided.
    precision : bool, optional
        With ``decide`` (default True; refused without it): a question also stops once
        every candidate not behind the leader nor tied with it is known, paired with the
        leader, at least as precisely as LLaDA's scheme would know that pair on
        ``max_masks`` masked inputs per candidate (``stop_reason`` ``"precision"``,
        undecided). **Guarantee**: the upper ``1 - alpha`` confidence bound of each such
        pair's paired standard error is at most ``sqrt((W_a + W_j) / max_masks)``, where
        ``W_k`` is the within-size part of the variance of one of LLaDA's draws of
        candidate k (its sizes uniform or systematic, each candidate its own masks:
        LLaDA's variance is at least that), estimated from k's own stratum pairs of equal
        size, unseen sizes counted 0 (it errs small); the rule reads standard errors only,
        never the margin, so the leader at the stop is the maximum of estimates whose
        every pair is at least as precise as LLaDA's, and orders each pair as the
        exhaustive sums do at least as often as LLaDA would (``Phi(|gap| / SE)`` falls
        with the SE). Applies to the rate draw (``estimator="learned-rate"``); other
        estimators draw an undecided question to ``max_masks``. False: undecided
        questions draw to ``max_masks``.
    max_masks : int, optional
        Most masked inputs scored per candidate, all rounds together (the last round takes
        what is left); the same unit as everywhere in the package (``estimate_lml``'s and
        ``mpt_curve``'s ``max_masks`` per sequence, the exhaustive estimator's cap). The
        rate draw's whole continuation, scored once, counts: ``max_masks=128`` is 127
        draws (126 in pairs: rounds draw an even count); an estimator whose draw scores
        several masked inputs (``"cumulative"``: T_k for a candidate of T_k tokens) gets
        ``max_masks // T_k`` draws. The candidates of a question draw together (common
        random numbers), so a question's draws per candidate are those that keep its
        longest drawn candidate within the cap. A candidate scored on every mask (its
        2^T - 1 masks, a short one: see ``exact``) is exempt: it costs 2^T - 1 whatever
        the cap. With ``decide`` it defaults to :data:`DECIDE_MAX_MASKS` (128, LLaDA's
        masked inputs per candidate), with ``target_se`` to the masked inputs of
        :data:`~mptlml.estimators.sequential.MAX_TARGET_DRAWS` (512) draws, as
        :func:`mptlml.estimate_lml`'s target (513 for the rate draw, 512 T_k for
        ``"cumulative"``).
        Alone (no ``decide``, no ``target_se``) it is a fixed budget, spent whole: rounds
        of doubling size, the allocation learned as they go (``stop_reason``
        ``"fixed"``). Refused when below the first round's masked inputs
        (``num_masks`` draws, plus the whole continuation's row for the rate draw).
    allocation : {"neyman", "uniform"}
        ``"neyman"``: rounds after the first draw rates in proportion to the
        spread by rate learned from the draws so far, pooled over the call (Neyman);
        ``"uniform"``: rates uniform every round.
    common_masks : bool
        Share rates and mask positions across a question's candidates (default);
        False draws each candidate independently (for comparison).
    seed : int or list of int
        The draws of question q, round r come from a generator seeded by
        (seed, q, r), or (seed[q], 0, r) with one seed per question (stable
        when questions are split across processes).
    token_budget : int
        As for :func:`mptlml.estimate_lml`.
    batch_size : int, optional
        As for :func:`mptlml.estimate_lml`.
    progress : bool
        As for :func:`mptlml.estimate_lml`.
    chunk_size : int
        Candidates whose masks go to the model together (batched under
        ``token_budget`` across questions; the unit of work split across
        processes).
    cfg_scale : float
        Classifier-free guidance by the context, as in :func:`mptlml.estimate_lml`
        (LLaDA's ``cfg``): the scores are then guided scores, not bounds. 0: none.
    estimator : str or Estimator
        Whose draws score the candidates: ``"learned-rate"`` (default,
        :class:`~mptlml.estimators.LearnedRate`), the rate draw above (stratified
        rates, the density learned over rounds, shared positions); or any registered
        ragged estimator (``mptlml.estimators.available(ragged=True)``, e.g.
        ``"cumulative"``, ``"random-size"``), built with ``num_masks`` draws per round and
        drawn in the same rounds, stop rules and cap
        (:class:`~mptlml.estimators.sequential.CellDraw`). Its draws are common random
        numbers across a question's candidates of one length (one seed: the same sizes,
        positions or orders, differenced draw by draw); candidates of different lengths
        draw independently. A biased estimator (``"fixed-rate"``, ``"riemann"``,
        ``"llada"``) ranks by its own score; ``allocation`` applies to the rate draw only.

    Returns
    -------
    Comparison

    Warns
    -----
    RuntimeWarning
        When a question was not decided, or missed ``target_se``, within
        ``max_masks``; when a standard error that is not exact came out 0
        (coinciding draws) or rests on fewer than
        :data:`~mptlml.estimators.results.MIN_STDERR_DOF` degrees of freedom.
    """
    check_options("compare", overrides=_OPTIONS, num_masks=num_masks, decide=decide,
                  target_se=target_se, alpha=alpha, delta=DELTA if delta is None else delta,
                  precision=True if precision is None else precision, max_masks=max_masks,
                  allocation=allocation, common_masks=common_masks, seed=seed,
                  token_budget=token_budget, batch_size=batch_size, chunk_size=chunk_size,
                  progress=progress)
    if not isinstance(model, RaggedMaskedModel):
        raise TypeError(
            f"compare scores candidate continuations of texts or token ids with a masked LM (a "
            f"RaggedMaskedModel); got {type(model).__name__}. For dense (N, D) data score the "
            "conditional with mptlml.estimate_lml(model, x, context=...) per candidate.")
    p = int(num_masks)
    draw = _draw_of(estimator, p, allocation)
    if p % 2 and isinstance(draw, RateDraw):
        raise ValueError(f"num_masks must be even (two masks per rate stratum); got {p}.")
    to_target = target_se is not None and not decide  # draw until each SE is at the target
    if delta is not None and not decide:
        raise ValueError(f"delta={delta!r} is the indifference zone of decide=True (a pair "
                         "confidently within delta nats is a practical tie); pass decide=True "
                         "or drop delta.")
    if precision is not None and not decide:
        raise ValueError(f"precision={precision!r} is a stop rule of decide=True (an undecided "
                         "question stops once known as precisely as LLaDA's scheme would know "
                         "it); pass decide=True or drop precision.")
    precision = True if precision is None else bool(precision)
    delta = float(DELTA if delta is None else delta)
    if decide and target_se is not None:
        raise ValueError("decide=True stops a question once its leader is decided, whatever "
                         "the standard errors; target_se= draws until each candidate's SE is at "
                         "the target. Pass one of the two.")
    max_masks = (int(max_masks) if max_masks is not None else DECIDE_MAX_MASKS if decide
                 else None)
    ctxs, cands = _questions_of(contexts, candidates)
    if isinstance(seed, numbers.Integral):
        seeds = [(int(seed), q) for q in range(len(ctxs))]
    else:
        seeds = [(int(s), 0) for s in seed]
    if len(seeds) != len(ctxs):
        raise ValueError(f"{len(seeds)} seeds for {len(ctxs)} questions: pass one int seed, or "
                         "one per question.")

    owner = [(q, k) for q, c in enumerate(cands) for k in range(len(c))]
    flat_ctx = [ctxs[q] for q, _ in owner]
    flat_cand = [cands[q][k] for q, k in owner]
    scorer = with_context(model, flat_ctx, cfg_scale=cfg_scale)  # the contexts ride along
    ids = scorer.encode(flat_cand)
    lengths = np.array([len(t) for t in ids])  # the continuations' (the scorer adds contexts)
    members = [[i for i, (qq, _) in enumerate(owner) if qq == q] for q in range(len(cands))]
    if block_model(scorer):  # a block-diffusion LM: the rate draw inside each block
        if not isinstance(draw, RateDraw):
            refuse_block_model(scorer, f"estimator={draw.name!r}")
        draw = BlockDraw(p, allocation, EXACT_LENGTH)
    _check_lengths(draw, lengths, owner)
    # draws per member, per question (by default with target_se: MAX_TARGET_DRAWS, as
    # estimate_lml's target)
    caps = draw_caps(draw, p, lengths, members, max_masks, noun="candidate",
                     group_noun="question",
                     default=MAX_TARGET_DRAWS if to_target else draw.round_size(p))
    # Bonferroni over the looks each question may take within its own cap
    tails = [alpha / (2 * len(round_sizes(p, c))) if decide else alpha / 2 for c in caps]

    def threshold(dof: float, q: int) -> float:
        """The z a leader of question q must clear: a t quantile at the paired SEs' dof.

        ``t_nu^{-1}(1 - tail) = -stdtrit(nu, tail)`` (the normal's where nu is infinite),
        scipy's special functions called directly: ``scipy.stats.t.isf``'s distribution
        machinery cost about 100 times more per call, a quarter of ``decide=True``'s time.
        """
        tail = tails[q]
        return float(-special.ndtri(tail) if not math.isfinite(dof) else
                     -special.stdtrit(dof, tail))

    def thresholds(q: int) -> Any:
        return lambda dof: threshold(dof, q)

    behind: list[set[int]] = [set() for _ in members]  # positions found behind (decide)
    to_target_rule = target_rule([float(target_se or 0.0)] * len(ids))

    def rule(q: int, idx: list[int], tallies: list[Tally], at_cap: bool
             ) -> tuple[set[int], str | None, float | None]:
        """The decision (with ``decide``), the target, or none (fixed draws)."""
        if not decide:
            return (to_target_rule if to_target else fixed_rule)(q, idx, tallies, at_cap)
        res = _question(tallies, idx, behind[q])
        passed = _passed(res, thresholds(q))
        tied = _tied(res, thresholds(q), delta)
        # a candidate behind the leader beyond its threshold stops drawing, one confidently
        # within delta of it pauses (it draws again if the leader changes and it is no longer
        # tied with the new one)
        behind[q] |= passed - {res["lead"]}
        # a candidate whose pair with the leader is known as precisely as LLaDA's scheme would
        # know it (on max_masks masked inputs per candidate) pauses as a tied one does
        precise = (_precise(res, idx, draw, max_masks, alpha) - passed - tied if precision
                   else set())
        drawing = {i for j, i in enumerate(idx)
                   if j not in behind[q] and j not in tied and j not in precise}
        if len(passed) == len(idx):
            return drawing, "decided", None
        if len(passed | tied) == len(idx):
            return drawing, "tied", None
        if len(passed | tied | precise) == len(idx):
            return drawing, "precision", None
        return drawing, "budget" if at_cap else None, None

    out = run_rounds(draw, scorer, ids, members, _keys(seeds, members, lengths, common_masks,
                                                       isinstance(draw, RateDraw | BlockDraw)),
                     num_masks=p, caps=caps, rule=rule,
                     run=dict(chunk_size=chunk_size, token_budget=token_budget,
                              batch_size=batch_size, progress=progress),
                     what=f"compare ({len(cands)} questions, {_cap_text(max_masks, to_target, p)})",
                     remedy="lower max_masks (or num_masks)")
    tallies = out.tallies
    exact = out.enumerated | np.array([t.enumerated for t in tallies], dtype=bool)
    cand_rows = np.array([t.rows for t in tallies], dtype=np.int64)
    out_rows = [_question(tallies, members[q], behind[q]) for q in range(len(cands))]
    # the threshold of the runner-up (the smallest margin); decided: every pair past its own
    z = [threshold(float(o["pair_dof"][int(np.argmin(o["z"]))]), q)
         for q, o in enumerate(out_rows)]
    res = Comparison(
        contexts=ctxs, candidates=cands, scores=[o["est"] for o in out_rows],
        stderr=[o["se"] for o in out_rows], choice=[int(o["lead"]) for o in out_rows],
        paired_stderr=[o["pse"] for o in out_rows], margin_z=[o["margin"] for o in out_rows],
        decided=[len(_passed(o, thresholds(q))) == len(o["z"]) for q, o in enumerate(out_rows)],
        tied=[np.isin(np.arange(len(o["z"])), sorted(_tied(o, thresholds(q), delta)))
              if decide else np.zeros(len(o["z"]), dtype=bool) for q, o in enumerate(out_rows)],
        z_threshold=z, exact=[exact[m] for m in members],
        stderr_dof=[o["dof"] for o in out_rows],
        num_masked_rows=[int(cand_rows[m].sum()) for m in members],
        candidate_masked_rows=[cand_rows[m] for m in members],
        rounds=list(out.rounds), stop_reason=list(out.stop_reason),
        num_model_calls=out.num_model_calls,
        common_masks=common_masks, seed=seed, model=getattr(model, "name", None),
        extra={"estimator": draw.name, "allocation": draw.allocation, "num_masks": p,
               "max_masks": max_masks, "max_draws": caps, "alpha": alpha,
               "delta": delta if decide else None, "precision": precision if decide else None,
               "target_se": target_se,
               "rate_density": draw.density.mass.tolist() if isinstance(draw, RateDraw | BlockDraw)
               else None,
               **({"blocks": [draw.blocks.get(i, (0, 0)) for i in range(len(ids))]}
                  if isinstance(draw, BlockDraw) else {})})
    announce_nonfinite(np.concatenate(res.scores), "the candidates' scores", "candidates")
    _announce(res, decide, target_se, _cap_text(max_masks, to_target, p))
    return res


def _draw_of(estimator: Any, num_masks: int, allocation: str) -> RoundDraw:
    """The rate draw (``"learned-rate"``), or a registered ragged estimator's draws, refused
    naming ``estimator`` when it does not score ragged sequences."""
    from .api import available, create, get

    if getattr(estimator, "rate_draw", False) or (
            isinstance(estimator, str) and estimator in available(ragged=True)
            and get(estimator).rate_draw):
        return create(estimator, for_ragged=True).round_draw(num_masks, allocation)

    try:
        cls = get(estimator)
    except ValueError:
        raise ValueError(f"estimator={estimator!r} is not a registered estimator; compare takes "
                         f"one of {', '.join(available(ragged=True))}.") from None
    if not cls.ragged:
        raise ValueError(f"estimator={cls.name!r} estimates dense (N, D) data only; compare "
                         "scores candidate continuations (ragged sequences): pass one of "
                         f"{', '.join(available(ragged=True))}.")
    est = create(estimator, for_ragged=True)  # its own defaults; num_masks draws per round
    if allocation != "neyman" and est.ragged_strata(np.array([2]))[1] < 2:
        raise ValueError(f"allocation={allocation!r} does not apply to the estimator "
                         f"{est.name!r}: its draw is one term, nothing to allocate (the rate "
                         "density is allocated by estimator='learned-rate', the sizes by "
                         "'cumulative'). Drop allocation, or change estimator.")
    return est.round_draw(num_masks, allocation)


def _check_lengths(draw: RoundDraw, lengths: np.ndarray, owner: list[tuple[int, int]]) -> None:
    """The estimator's own refusals of a sequence length (the exhaustive estimator's cap,
    ``mptlml.settings.max_masks`` masked inputs; a ``mask_size`` above the length), as
    ``estimate_lml`` applies them, before any candidate is scored; naming the candidate."""
    est = getattr(draw, "est", None)
    if est is None:
        return
    for d in np.unique(lengths):
        try:
            est.check_num_tokens(int(d))
        except ValueError as exc:
            q, k = owner[int(np.flatnonzero(lengths == d)[0])]
            raise ValueError(f"compare(estimator={est.name!r}): candidate {k} of question {q} "
                             f"has {int(d)} tokens; {exc}") from None


def _keys(seeds: list[tuple[int, int]], members: list[list[int]], lengths: np.ndarray,
          common: bool, rate: bool) -> list[tuple[int, ...]]:
    """The seed key of each candidate (:func:`~mptlml.estimators.sequential.round_seed`): the
    question's ``(seed, q)`` (common random numbers) for the rate draw; for an estimator's
    draws the question's for the first candidate of its length, ``(seed, q, f + 1)`` for the
    others (candidate f the first of its length: equal lengths share draws, other lengths
    draw independently); its own ``(seed, q, j + 1)`` without ``common_masks``."""
    keys: list[tuple[int, ...]] = [(0, 0)] * len(lengths)
    for q, idx in enumerate(members):
        s0, s1 = seeds[q]
        first: dict[int, int] = {}
        for j, i in enumerate(idx):
            if not common:
                keys[i] = (s0, s1, j + 1)
            elif rate:
                keys[i] = (s0, s1)
            else:  # the first length's key is the question's: an estimate's of sequence q
                f = first.setdefault(int(lengths[i]), j)
                keys[i] = (s0, s1) if f == 0 else (s0, s1, f + 1)
    return keys


def _questions_of(contexts: Any, candidates: Any) -> tuple[list[Any], list[list[Any]]]:
    """The questions as lists: one context and a list of candidates each, refused when not."""
    if isinstance(contexts, str | bytes) or isinstance(candidates, str | bytes):
        raise TypeError("compare takes a list of contexts and a list of candidate lists (one "
                        "per context), e.g. compare(lm, ['the cat sat on'], [[' a mat', ' the "
                        "dog']]); got a single string.")
    ctxs, cands = list(contexts), list(candidates)
    if not ctxs and not cands:
        raise ValueError("compare got no questions (contexts and candidates are empty): pass "
                         "at least one context and its list of candidates.")
    if len(ctxs) != len(cands):
        raise ValueError(f"{len(ctxs)} contexts for {len(cands)} candidate lists: pass one "
                         "list of candidates per context.")
    for q, c in enumerate(cands):
        if isinstance(c, str | bytes):
            raise TypeError(
                f"candidates[{q}] is the string {c!r}, not a list of candidates (it would be "
                f"scored letter by letter); pass a list per question, e.g. [[{c!r}]] for one "
                "candidate.")
    cands = [list(c) for c in cands]
    if any(len(c) == 0 for c in cands):
        raise ValueError("every question needs at least one candidate.")
    return ctxs, cands


def _cap_text(max_masks: int | None, to_target: bool, p: int) -> str:
    """The cap of a call in words: ``max_masks`` masked inputs, the target's default draws, or
    one round."""
    if max_masks is not None:
        return f"at most max_masks={max_masks} masked inputs per candidate"
    if to_target:
        return f"at most {MAX_TARGET_DRAWS} draws per candidate, target_se's default cap"
    return f"one round of num_masks={p} per candidate"


def _announce(res: Comparison, decide: bool, target_se: float | None, cap: str) -> None:
    """Warn, once per call, about what a comparison could not settle, in one line.

    ``"compare: 7 of 40 questions undecided after max_masks=128 masked inputs per candidate, 3 with
    fewer than 5 dof (first: [..]); ..."``: budgets spent before a decision or the target,
    standard errors 0 that are not exact (every draw of a stratum on one mask), and
    standard errors on fewer than :data:`MIN_STDERR_DOF` degrees of freedom reported
    without a decision; what to do follows.
    """
    n = len(res.scores)
    spent = [q for q, s in enumerate(res.stop_reason) if s == "budget"]
    precise = [q for q, s in enumerate(res.stop_reason) if s == "precision"]
    missing = [q for q in range(n) if math.isnan(res.margin_z[q])
               or np.any(np.isnan(res.stderr[q]))]
    zero = [q for q in range(n) if np.any((res.stderr[q] == 0) & ~res.exact[q])]
    # a decided (or tied) question's threshold already is a t quantile at its dof: only SEs
    # reported without a decision are flagged
    few = [q for q in range(n) if res.stderr_dof[q] < MIN_STDERR_DOF
           and not (decide and (res.decided[q] or res.stop_reason[q] == "tied"))]
    parts: list[tuple[list[int], str]] = []
    fixes: list[str] = []
    if spent:
        what = "undecided" if decide else f"still above target_se={target_se}"
        parts.append((spent, f"{what} after {cap.removeprefix('at most ')}"))
        fixes.append("their choice may flip on other masks (see margin_z and paired_stderr)"
                     if decide else "their standard errors are larger than asked")
        fixes.append("raise max_masks to spend more on them")
    if precise:
        parts.append((precise, "undecided at LLaDA's precision (stop_reason 'precision': their "
                      "margins known at least as precisely as LLaDA's scheme would know them on "
                      "max_masks masked inputs per candidate)"))
        fixes.append("their choice is as reliable as LLaDA's; raise max_masks to decide more")
    if missing:
        parts.append((missing, "with a missing standard error (NaN: a cell of fewer than two "
                      "draws, or an SE 0 from draws that fell on one mask), marked undecided"))
        fixes.append("a missing SE is never a decision: draw at least two draws per cell "
                     "(more masks, or another estimator)")
    if zero:
        parts.append((zero, "with a standard error 0 that is not exact"))
        fixes.append("a 0 from draws that fell on one mask understates the Monte Carlo error")
    if few:
        parts.append((few, f"with fewer than {MIN_STDERR_DOF} dof"))
        fixes.append("an error beyond 2 SE then happens far more often than 5% of the time")
    if zero or few:
        fixes.append("use more masks (num_masks, or decide=/target_se= for more rounds)")
    if parts:
        line = ", ".join(f"{len(qs)}{f' of {n} questions' if j == 0 else ''} {what} "
                         f"(first: {qs[:5]})" for j, (qs, what) in enumerate(parts))
        warnings.warn(f"compare: {line}; {'; '.join(fixes)}.", RuntimeWarning, stacklevel=3)


def _passed(res: dict[str, Any], threshold: Any) -> set[int]:
    """The leader and every candidate behind it by more than its pair's threshold."""
    return {j for j, (z, d) in enumerate(zip(res["z"], res["pair_dof"], strict=True))
            if z > threshold(float(d))}


def _tied(res: dict[str, Any], threshold: Any, delta: float) -> set[int]:
    """The candidates confidently within ``delta`` of the leader (a practical tie).

    Pair (leader, j): ``g = est[lead] - est[j] >= 0`` with paired SE ``s``; tied when the
    interval ``g +- z s`` at the pair's threshold lies inside ``(-delta, delta)``, i.e.
    ``g + z s < delta``. The leader itself is not tied to itself.
    """
    if delta <= 0:
        return set()
    lead = res["lead"]
    out = set()
    for j, (s, d) in enumerate(zip(res["pse"], res["pair_dof"], strict=True)):
        if j == lead or math.isnan(res["z"][j]):  # a missing SE ties nothing (_pair_z)
            continue
        g = float(res["est"][lead] - res["est"][j])
        if abs(g) + threshold(float(d)) * float(s) < delta:
            out.add(j)
    return out


def _pair_z(g: float, ps: float, dof: float, lead: Tally, other: Tally) -> float:
    """``g / ps``, the leader's margin over a candidate in paired standard errors; NaN where the
    SE is missing.

    A paired SE is missing when it is NaN (a cell of fewer than two draws: LLaDA's draw with
    one batch, an estimator drawing one draw per candidate), or when it is 0 on 0 or NaN
    degrees of freedom, or 0 without both candidates enumerated while the difference is not 0
    (every pair of draws fell on one mask: the 0 says nothing of the spread). A missing SE is
    never a decision: its z is NaN, which passes no threshold, ties nothing and is not
    precise (the question ends undecided, and :func:`compare` warns). An SE 0 of two
    enumerated candidates is exact (z infinite, or 0 for equal sums); so is a difference 0
    on every draw (two copies of one candidate: z 0).
    """
    if not math.isfinite(ps) or not dof > 0:
        return math.nan
    if ps > 0:
        return g / ps
    if g == 0:
        return 0.0
    if lead.enumerated and other.enumerated:
        return math.inf if g > 0 else -math.inf
    return math.nan


def _precise(res: dict[str, Any], idx: list[int], draw: RoundDraw, max_masks: int | None,
             alpha: float) -> set[int]:
    """The candidates whose pair with the leader is known at least as precisely as LLaDA's
    scheme would know it on ``max_masks`` masked inputs per candidate.

    Pair (leader a, candidate j): LLaDA scores each candidate on its own ``n = max_masks``
    draws, so its SE of ``a - j`` is ``sqrt((V_a + V_j) / n)``, ``V_k`` its variance of one
    draw of k, at least its within-size part ``W_k``
    (:meth:`~mptlml.estimators.sequential.RateDraw.reference_var`, estimated from k's own
    stratum pairs of equal size, unseen sizes 0: it errs small). j is precise when the
    paired SE's upper ``1 - alpha`` confidence bound is at most that,
    ``s sqrt(nu / chi2_{nu}(alpha)) <= sqrt((W_a + W_j) / n)`` (s on nu Welch degrees of
    freedom, ``chi2_nu(alpha)`` the chi-square's lower alpha quantile: the variance estimate
    as ``sigma^2 chi2_nu / nu``), and each drawn candidate's ``W`` rests on at least
    :data:`~mptlml.estimators.sequential.TARGET_MIN_DOF` pairs. Empty where the draw cannot
    estimate ``W`` (an estimator other than the rate draw) or without a cap.
    """
    if max_masks is None:
        return set()
    ref = [draw.reference_var(i) for i in idx]
    if any(r is None for r in ref):
        return set()
    lead = res["lead"]
    out = set()
    for j in range(len(idx)):
        if j == lead:
            continue
        pair = [ref[lead], ref[j]]
        drawn = [r for r, i in zip(pair, (idx[lead], idx[j]), strict=True)
                 if not draw.enumerates(int(draw.lengths[i]))]
        if not drawn or any(n < TARGET_MIN_DOF for _, n in drawn):
            continue
        target = math.sqrt((pair[0][0] + pair[1][0]) / max_masks)
        if target > 0 and precision_bound(float(res["pse"][j]), float(res["pair_dof"][j]),
                                          alpha) <= target:
            out.add(j)
    return out


def precision_bound(se: float, dof: float, alpha: float) -> float:
    """The upper ``1 - alpha`` confidence bound of a standard error ``se`` on ``dof`` degrees
    of freedom: ``se sqrt(nu / chi2_nu(alpha))`` (``se^2 ~ sigma^2 chi2_nu / nu``; ``se``
    itself where nu is infinite, NaN where it is missing: not finite, or nu <= 0)."""
    if not math.isfinite(se) or not dof > 0:
        return math.nan
    if not math.isfinite(dof):
        return se
    return se * math.sqrt(dof / float(special.chdtri(dof, 1.0 - alpha)))


def _question(tallies: list[Tally], idx: list[int], out: set[int] | None = None
              ) -> dict[str, Any]:
    """Estimates, SEs, paired SEs to the leader and the margin of one question.

    ``out``: the positions (in ``idx``) of candidates already found behind,
    which cannot lead.
    """
    k = len(idx)
    est, se, dof = np.zeros(k), np.zeros(k), []
    for j, i in enumerate(idx):
        est[j], se[j], d = tallies[i].stats()
        dof.append(d)
    out = out or set()
    lead = max((j for j in range(k) if j not in out), key=lambda j: est[j])
    pse = np.zeros(k)
    zs, pair_dof = np.full(k, math.inf), np.full(k, math.inf)  # the leader's own: inf
    for j in range(k):
        if j == lead:
            continue
        g, ps, d = paired(tallies[idx[lead]], tallies[idx[j]])
        pse[j], pair_dof[j] = ps, d
        zs[j] = _pair_z(g, ps, d, tallies[idx[lead]], tallies[idx[j]])
        dof.append(d)
    return {"est": est, "se": se, "lead": lead, "pse": pse, "z": zs, "pair_dof": pair_dof,
            "margin": float(zs.min()), "dof": float(min(dof)), "se_dof": np.array(dof[:k])}
