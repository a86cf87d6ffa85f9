"""Paired, differentiable conditional MPT bounds of preference pairs (DPO on masked LMs).

For a prompt x and a response y of T tokens, Proposition 1 read conditionally
gives the log-likelihood bound of the response,

    B(y | x) = sum_{M=1..T} S_y(M) = S_y(T) + E_{r ~ q} [ S_y(M_r) / q_T(M_r) ],   M_r < T,

S_y(M) the mean over masks of M response tokens of ``(1/M) sum_{j in mask} log p(y_j |
unmasked y, x)`` (the prompt always visible), a rate r drawn from a density q on (0, 1)
giving the size ``M_r = ceil(r (T - 1))`` and q_T(M) the q-mass of its rate interval (the
machinery of :func:`mptlml.compare`, :mod:`mptlml.estimators.sequential`). The whole
response (M = T, one mask) is scored once, exactly; a response whose 2^T - 1 masks are no
more than its draws' masked inputs, or than ``2^exact_length - 1``, is scored on all of
them (its bound is exact: the engine's one rule,
:func:`~mptlml.estimators.sequential.scores_every_mask`).

DPO on bounds. For a pair (x, y_w, y_l) of a policy pi and a frozen reference,

    m = beta [ (B_pi(y_w|x) - B_ref(y_w|x)) - (B_pi(y_l|x) - B_ref(y_l|x)) ],
    loss = -log sigmoid(m).

Each of the four bounds is estimated from P draws; the estimate of m is unbiased, its
gradient flows through the policy's bounds only (the reference runs under
``torch.no_grad``), and ``-log sigmoid`` of it is a biased estimate of the loss whose bias
and variance are both bounded by the variance of the estimated margin (LLaDA 1.5, VRPO).
That variance is cut here by **common random numbers**: per pair one stratified set of
rates (H = P / 2 strata of equal q-mass, two rates each) and one order of positions serve
all four bounds, so policy and reference score the very same masked inputs (one corrupted
input, two forwards), and chosen and rejected are masked at the same rates (as sizes on
their own lengths) and positions. Per draw k the margin's term is

    d_k = beta sum_{c in {w, l}} s_c [ (pi_ck - ref_ck) / (M_ck q_{T_c}(M_ck)) ],
    s_w = +1, s_l = -1,

pi_ck (ref_ck) the summed log-probabilities of the masked tokens under the policy
(reference), and the margin's Monte Carlo standard error is that of the mean of the d_k
over the strata (:func:`~mptlml.estimators.sequential.cells_error`, two draws per stratum).
Policy and reference nearly agree early in training, so the d_k nearly cancel: the
standard error of the margin is far below that of either bound.

Schemes (``masks=``), at equal masks per pair:

- ``"common"`` (default): the above;
- ``"independent"``: each of the four bounds draws its own rates and positions (the same
  estimator, no common random numbers: for comparison);
- ``"vrpo"``: LLaDA 1.5's rule: per response P sizes M ~ U{1..T}, one uniform mask each,
  the bound estimated by ``(T / M) sum_{j in mask} log p``; policy and reference share the
  masks, chosen and rejected do not.

The rate density q is uniform unless given (``density=``, a
:class:`~mptlml.estimators.sequential.RateDensity`); :class:`~mptlml.hf.MPTDPOTrainer`
learns it across steps from the draws it makes (:attr:`PreferenceBounds.spread_sum`).

Reference: Moreno-Munoz, Recasens, Hauberg, "On Masked Pre-training and the Marginal
Likelihood", NeurIPS 2023, Proposition 1; Rafailov et al., "Direct Preference
Optimization", NeurIPS 2023; Zhu et al., "LLaDA 1.5: Variance-Reduced Preference
Optimization for Large Language Diffusion Models", 2025 (VRPO).
"""

from __future__ import annotations

import contextlib
import functools
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .. import settings
from .._validation import check_positive_int
from ..estimators.learned_rate import pair_spread
from ..estimators.sequential import (
    EXACT_LENGTH,
    NUM_RATE_BINS,
    RateDensity,
    cells_error,
    masks_at_rates,
    scores_every_mask,
    stratified_rates,
    stratum_cells,
)
from ..estimators.stats import enumerated_sum, mean_stderr
from ..masks import every_mask, sample_masks, uniform_sizes
from ..models.mlm_inputs import accepts_keyword, logits_of
from ..models.sequence_input import encode_with_context
from ..seeds import spawn
from .loss import IGNORE_INDEX, mpt_loss

__all__ = ["MASK_SCHEMES", "EncodedPairs", "PreferenceBounds", "check_exact_length", "dpo_loss",
           "encode_pairs", "masked_sums", "plan_inputs", "preference_bounds"]

#: how the masks of a pair's four bounds are drawn (module docstring)
MASK_SCHEMES = ("common", "independent", "vrpo")


def check_exact_length(exact_length: Any) -> int:
    """``exact_length`` checked: an int >= 0 whose every mask, 2^exact_length - 1 masked inputs
    per response, is within ``mptlml.settings.max_masks`` (the cap of every exact path)."""
    if isinstance(exact_length, bool) or not isinstance(exact_length, numbers.Integral) \
            or exact_length < 0:
        raise ValueError(f"exact_length must be an int >= 0, got {exact_length!r}.")
    cap = check_positive_int(settings.max_masks.value(), "max_masks")
    if 2 ** int(exact_length) - 1 > cap:
        raise ValueError(f"exact_length={exact_length} scores a response of that many tokens on "
                         f"every mask, 2^{exact_length} - 1 masked inputs, more than "
                         f"mptlml.settings.max_masks={cap}; lower exact_length (responses "
                         "past it are drawn) or raise mptlml.settings.max_masks.")
    return int(exact_length)


@dataclass
class EncodedPairs:
    """Preference pairs as the model's content ids: prompt + response, and the prompt's length.

    ``chosen[i]`` is the content ids of prompt i joined with its chosen response (the
    model's tokenisation of the joined text, :func:`~mptlml.models.sequence_input.
    encode_with_context`), of which the first ``chosen_context[i]`` are the prompt's;
    likewise ``rejected``.
    """

    chosen: list[torch.Tensor]
    chosen_context: list[int]
    rejected: list[torch.Tensor]
    rejected_context: list[int]

    def __len__(self) -> int:
        return len(self.chosen)


def encode_pairs(lm: Any, prompts: Sequence[Any], chosen: Sequence[Any],
                 rejected: Sequence[Any]) -> EncodedPairs:
    """Tokenise preference pairs with a :class:`~mptlml.models.MaskedLM`'s own tokenisation.

    Texts (or token-id lists) of prompts, chosen and rejected responses, one each per
    pair; an empty prompt makes the bounds unconditional. Refused: unequal counts, a
    single string, a response with no token of its own.
    """
    for name, v in (("prompts", prompts), ("chosen", chosen), ("rejected", rejected)):
        if isinstance(v, str | bytes):
            raise TypeError(f"{name} must be a list (one entry per pair), got a single "
                            f"string {v[:40]!r}; pass [{v[:40]!r}].")
    n = len(prompts)
    if n == 0 or len(chosen) != n or len(rejected) != n:
        raise ValueError(f"pass one prompt, one chosen and one rejected response per pair; got "
                         f"{n} prompts, {len(chosen)} chosen, {len(rejected)} rejected.")
    cw, nw = encode_with_context(lm, list(prompts), list(chosen))
    cl, nl = encode_with_context(lm, list(prompts), list(rejected))
    return EncodedPairs(cw, nw, cl, nl)


@dataclass
class PreferenceBounds:
    """The four conditional bounds of each pair on common masks, the margin and its SE.

    Attributes
    ----------
    policy_chosen, policy_rejected : Tensor ``(B,)``
        Estimates of B_pi(y_w | x), B_pi(y_l | x): differentiable for the policy.
    ref_chosen, ref_rejected : Tensor ``(B,)``
        The reference's, detached.
    margin : Tensor ``(B,)``
        ``beta [(policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)]``
        (differentiable).
    margin_se : float64 ndarray ``(B,)``
        Monte Carlo standard error of each margin from its paired draws (0 where both
        responses are exact).
    exact : bool ndarray ``(B,)``
        Both responses scored on every mask: the margin is exact.
    masked_rows : int
        Masked inputs scored per model (policy and reference score as many each).
    spread_sum, spread_count : float64 ndarray ``(NUM_RATE_BINS,)``
        Per rate bin, the sum of half squared differences of the two density-free margin
        terms of a stratum, and their count (``masks="common"`` only; zeros otherwise):
        the margin's spread by rate, from which an allocation is learned
        (:func:`~mptlml.estimators.sequential.density_of`).
    """

    policy_chosen: torch.Tensor
    policy_rejected: torch.Tensor
    ref_chosen: torch.Tensor
    ref_rejected: torch.Tensor
    margin: torch.Tensor
    margin_se: np.ndarray
    exact: np.ndarray
    masked_rows: int
    spread_sum: np.ndarray
    spread_count: np.ndarray

    @property
    def mean_margin_se(self) -> float:
        """Monte Carlo SE of the batch's mean margin: ``sqrt(sum_i se_i^2) / B``."""
        return float(np.sqrt(np.sum(self.margin_se ** 2)) / max(len(self.margin_se), 1))


def dpo_loss(margin: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """DPO's loss of margins: ``-log sigmoid(m)`` per pair (``"mean"``, ``"sum"`` or ``"none"``)."""
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}.")
    terms = -F.logsigmoid(margin)
    return terms if reduction == "none" else terms.sum() if reduction == "sum" else terms.mean()


def _check_pair_models(policy: Any, reference: Any) -> None:
    """Refuse a reference that reads other ids or other frames than the policy."""
    from ..models.masked_lm import MaskedLM

    for name, lm in (("policy", policy), ("reference", reference)):
        if not isinstance(lm, MaskedLM):
            raise TypeError(f"{name} must be an mptlml.models.MaskedLM (wrap a masked LM as "
                            f"MaskedLM(model, tokenizer)), got {type(lm).__name__}.")
    same = (policy.mask_token_id == reference.mask_token_id
            and policy.prefix == reference.prefix and policy.suffix == reference.suffix
            and policy.shift_logits == reference.shift_logits
            and policy.vocab_size == reference.vocab_size
            and policy.tokenizer.get_vocab() == reference.tokenizer.get_vocab())
    if not same:
        raise ValueError("policy and reference must share one tokenizer and its conventions "
                         "(vocabulary, mask id, special tokens around the content, shifted "
                         "logits): the bounds are of the same token ids. Pass a reference "
                         "copied from the policy's starting point.")


def _generators(generator: Any, n: int) -> list[torch.Generator]:
    """One generator per pair: from an int seed (stream (seed, pair)) or a list of them."""
    if isinstance(generator, numbers.Integral) and not isinstance(generator, bool):
        if int(generator) < 0:
            raise ValueError(f"seed must be a non-negative int, got {generator}.")
        return [torch.Generator().manual_seed(spawn(int(generator), i)) for i in range(n)]
    gens = list(generator) if isinstance(generator, Sequence) else None
    if gens is None or len(gens) != n or not all(isinstance(g, torch.Generator) for g in gens):
        raise TypeError(f"seed must be an int or a list of {n} torch.Generator (one per pair), "
                        f"got {type(generator).__name__}.")
    return gens


@dataclass
class _Plan:
    """The masks of one response for one model role, and how each row is weighed."""

    masks: torch.Tensor  # (R, T) bool over the response
    coef: torch.Tensor  # (R,) float64: the bound is sum_r coef_r * s_r
    draw_coef: torch.Tensor  # (P, R): draw k's term is sum_r draw_coef[k, r] * s_r
    rates: np.ndarray | None  # (P,) the rates of the draws (None: exact or vrpo)
    strata: np.ndarray | None  # (P,) stratum of each draw (None: i.i.d. draws or exact)


@functools.lru_cache(maxsize=16)
def _every_mask_weights(t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every mask of t positions and its weight in the exact sum, ``sum_r coef_r s_r``.

    :func:`~mptlml.estimators.stats.enumerated_sum` is linear in the masks' sums: its
    coefficients are its values at unit vectors ((1 / M_r) / #masks of size M_r).
    """
    m = every_mask(t)
    sizes = m.sum(1).numpy()
    eye = np.eye(len(sizes))
    coef = torch.tensor([enumerated_sum(eye[r], sizes) for r in range(len(sizes))],
                        dtype=torch.float64)
    return m, coef


def _exact_plan(t: int) -> _Plan:
    m, coef = _every_mask_weights(t)
    return _Plan(m, coef, torch.zeros(0, len(coef), dtype=torch.float64), None, None)


def _rate_plan(t: int, rates: np.ndarray, order: torch.Tensor, strata: np.ndarray,
               density: RateDensity) -> _Plan:
    """P masks at the shared rates and order, then the whole response (scored once)."""
    # the stratum's two draws as drawn (no swap of a repeat): the margin's SE is read off
    # (y_1 - y_2)^2 / 4 per stratum, which the swap would make conservative by orders of
    # magnitude on 2-token responses (a pair of the two masks of a size is then exhaustive)
    m, sizes = masks_at_rates(t, rates, order, distinct_pairs=False)
    p = len(rates)
    w = 1.0 / (sizes * density.size_probs(sizes, t))  # y_k = s_k / (M_k q(M_k))
    draw = torch.zeros(p, p + 1, dtype=torch.float64)
    draw[torch.arange(p), torch.arange(p)] = torch.from_numpy(w)
    coef = torch.cat([torch.from_numpy(w) / p, torch.tensor([1.0 / t], dtype=torch.float64)])
    return _Plan(torch.cat([m, torch.ones(1, t, dtype=torch.bool)]), coef, draw, rates, strata)


def _vrpo_plan(t: int, p: int, g: torch.Generator) -> _Plan:
    """VRPO's rule: P sizes M ~ U{1..T}, one uniform mask each, weight T / M."""
    sizes = uniform_sizes(torch.full((p,), t), g)
    m = sample_masks(t, sizes, generator=g)
    w = t / sizes.double()
    return _Plan(m, w / p, torch.diag(w), None, None)


def _plans(tw: int, tl: int, p: int, g: torch.Generator, scheme: str, density: RateDensity,
           exact_length: int) -> list[list[_Plan]]:
    """``[[policy_w, policy_l], [ref_w, ref_l]]`` plans of one pair (shared objects: one input)."""
    asked = p if scheme == "vrpo" else p + 1  # masked inputs of a response's draws
    exact = [scores_every_mask(t, asked, exact_length) for t in (tw, tl)]
    if scheme == "vrpo":
        both = [_exact_plan(t) if e else _vrpo_plan(t, p, g)
                for t, e in zip((tw, tl), exact, strict=True)]
        return [both, both]
    if scheme == "common":
        strata, rates, order = stratified_rates(g, p, max(tw, tl), density)
        both = [_exact_plan(t) if e else _rate_plan(t, rates, order, strata, density)
                for t, e in zip((tw, tl), exact, strict=True)]
        return [both, both]
    out = []
    for _ in range(2):  # independent: every bound its own rates and positions
        row = []
        for t, e in zip((tw, tl), exact, strict=True):
            if e:
                row.append(_exact_plan(t))
            else:
                strata, rates, order = stratified_rates(g, p, t, density)
                row.append(_rate_plan(t, rates, order, strata, density))
        out.append(row)
    return out


def plan_inputs(lm: Any, ids: torch.Tensor, num_context: int, masks: torch.Tensor,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Model inputs ``(R, L)`` of a response's masks ``(R, T)`` and their targets.

    ``ids`` is the content of prompt + response, of which the first ``num_context`` are
    the prompt's (never masked); the rows are framed and corrupted by ``lm.corrupt``, the
    targets the true ids at masked positions and -100 elsewhere (:func:`masked_sums`).
    """
    m = torch.zeros(masks.shape[0], len(ids), dtype=torch.bool)
    m[:, num_context:] = masks
    x = lm.corrupt(ids, m, generator)
    lab = torch.full(x.shape, IGNORE_INDEX, dtype=torch.long)
    cols = torch.arange(len(ids)) + len(lm.prefix)
    lab[:, cols] = torch.where(m, ids, torch.full_like(ids, IGNORE_INDEX))
    return x, lab


def masked_sums(module: torch.nn.Module, lm: Any, inputs: list[torch.Tensor],
                targets: list[torch.Tensor], *, grad: bool,
                per_token: bool = False) -> torch.Tensor:
    """Summed log-probabilities of the masked targets of each model input, ``(R,)``.

    ``inputs[r]`` is a full model input (special tokens included, masks applied) and
    ``targets[r]`` the same length, the true id at scored positions and -100 elsewhere.
    One forward of ``module`` over the padded rows (rows of one length per forward when
    the module takes no ``attention_mask``), with gradients when ``grad`` (and gradients
    are on), else under ``torch.no_grad``; the per-row sums are minus
    :func:`~mptlml.hf.mpt_loss` with unit weights. With ``lm.shift_logits`` position i is
    read from the logits at i - 1. With ``per_token`` the log-probabilities themselves,
    ``(R, L)`` (L the longest input): entry ``[r, i]`` is ``log p(targets[r][i] | inputs[r])``
    at a scored position i and 0 elsewhere (its rows sum to the sums).
    """
    # the unwrapped model's signature (a DistributedDataParallel wrapper takes **kwargs)
    takes_mask = accepts_keyword(getattr(lm, "model", module), "attention_mask")
    lengths = torch.tensor([x.shape[0] for x in inputs])
    groups = [torch.arange(len(inputs))] if takes_mask else [
        (lengths == n).nonzero().flatten() for n in lengths.unique()]
    dev = next(module.parameters()).device
    pad = torch.nn.utils.rnn.pad_sequence
    parts, order = [], []
    ctx = contextlib.nullcontext() if grad else torch.no_grad()
    with ctx:
        for rows in groups:
            sel = rows.tolist()
            ids = pad([inputs[r] for r in sel], batch_first=True,
                      padding_value=int(lm.pad_token_id))
            lab = pad([targets[r] for r in sel], batch_first=True, padding_value=IGNORE_INDEX)
            att = (torch.arange(ids.shape[1]) < lengths[rows][:, None]).long()
            extra = {"attention_mask": att.to(dev)} if takes_mask else {}
            logits = logits_of(module(input_ids=ids.to(dev), **extra), "the model", ids.shape)
            if lm.shift_logits:  # Dream's head: position i predicted at i - 1
                logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
            if per_token:
                lab = lab.to(dev)
                scored = lab != IGNORE_INDEX
                dt = torch.float64 if logits.dtype == torch.float64 else torch.float32
                tok = torch.zeros(lab.shape, dtype=dt, device=dev)
                tok[scored] = -F.cross_entropy(logits[scored].to(dt), lab[scored],
                                               reduction="none")
                parts.append(F.pad(tok, (0, int(lengths.max()) - tok.shape[1])))
            else:
                parts.append(-mpt_loss(logits, lab, torch.ones(len(sel), device=dev),
                                       reduction="none"))
            order.append(rows)
    out = torch.cat(parts)
    return out[torch.cat(order).argsort().to(out.device)]


def _stratified_se(draws: np.ndarray) -> float:
    """SE of the mean of H strata with two draws each, in stratum order: one cell per stratum.

    ``se^2 = sum_h (y_h1 - y_h2)^2 / (4 H^2)`` (compare's stratified round:
    :func:`~mptlml.estimators.sequential.stratum_cells`).
    """
    return math.sqrt(float(cells_error(stratum_cells(draws))[1].sum()))


def preference_bounds(policy: Any, reference: Any, prompts: Sequence[Any] | EncodedPairs,
                      chosen: Sequence[Any] | None = None,
                      rejected: Sequence[Any] | None = None, *, beta: float = 0.1,
                      num_masks: int = 8, masks: str = "common",
                      density: RateDensity | None = None, seed: Any = 0,
                      exact_length: int = EXACT_LENGTH,
                      policy_module: torch.nn.Module | None = None) -> PreferenceBounds:
    """The four conditional MPT bounds of each preference pair, on common masks, and the margin.

    Parameters
    ----------
    policy, reference : MaskedLM
        Two :class:`~mptlml.models.MaskedLM` of one tokenizer and its conventions. The
        policy's bounds carry gradients; the reference runs under ``torch.no_grad``.
    prompts : list of str (or token-id lists), or EncodedPairs
        One prompt per pair (always visible, never scored); or an :class:`EncodedPairs`
        (:func:`encode_pairs`) alone, without ``chosen`` and ``rejected``.
    chosen : list of str (or token-id lists)
        The preferred response of each pair.
    rejected : list of str (or token-id lists)
        The other response of each pair.
    beta : float
        DPO's inverse temperature (> 0).
    num_masks : int
        Draws P per response (even: two per rate stratum), besides the one mask of the
        whole response; the cost is P + 1 masked inputs per response and model (2^T - 1
        for an exact response; P for ``"vrpo"``).
    masks : {"common", "independent", "vrpo"}
        How the four bounds' masks are drawn (module docstring).
    density : RateDensity, optional
        The rate density q of the draws (uniform when None).
    seed : int or list of torch.Generator
        Pair i draws from the stream (seed, i), or from the i-th generator.
    exact_length : int
        Responses of at most this many tokens are scored on every mask (exact), and any
        whose 2^T - 1 masks are no more than its draws' masked inputs
        (:func:`~mptlml.estimators.sequential.scores_every_mask`; 0 or 1: only those and
        one-token responses, which have a single mask).
    policy_module : torch.nn.Module, optional
        The module whose forward computes the policy's logits (default ``policy.model``;
        a trainer passes its wrapped model, e.g. DistributedDataParallel's).

    Returns
    -------
    PreferenceBounds
    """
    _check_pair_models(policy, reference)
    if isinstance(beta, bool) or not isinstance(beta, numbers.Real) or not (
            math.isfinite(float(beta)) and float(beta) > 0):
        raise ValueError(f"beta must be a finite number > 0 (DPO's 0.1 is usual), got {beta!r}.")
    p = check_positive_int(num_masks, "num_masks")
    if masks not in MASK_SCHEMES:
        raise ValueError(f"masks must be one of {MASK_SCHEMES}, got {masks!r}.")
    if masks != "vrpo" and p % 2:
        raise ValueError(f"num_masks must be even (two draws per rate stratum), got {p}.")
    check_exact_length(exact_length)
    if isinstance(prompts, EncodedPairs):
        if chosen is not None or rejected is not None:
            raise TypeError("pass EncodedPairs alone (as prompts), or the three lists.")
        enc = prompts
    else:
        if chosen is None or rejected is None:
            raise TypeError("pass prompts, chosen and rejected (one list each).")
        enc = encode_pairs(policy, prompts, chosen, rejected)
    density = density if density is not None else RateDensity(np.ones(NUM_RATE_BINS))
    gens = _generators(seed, len(enc))
    beta = float(beta)

    # every (pair, response, role) gets its plan; identical plans share one masked input
    plans, inputs_of = [], {}
    rows_in: dict[int, list[torch.Tensor]] = {0: [], 1: []}
    tg: dict[int, list[torch.Tensor]] = {0: [], 1: []}
    for i in range(len(enc)):
        full = (enc.chosen[i], enc.rejected[i])
        nctx = (enc.chosen_context[i], enc.rejected_context[i])
        pl = _plans(len(full[0]) - nctx[0], len(full[1]) - nctx[1], p, gens[i], masks,
                    density, int(exact_length))
        plans.append(pl)
        for role in (0, 1):
            for c in (0, 1):
                plan = pl[role][c]
                key = (id(plan), role)
                if (id(plan), 0) in inputs_of and masks != "independent":
                    inputs_of[key] = inputs_of[(id(plan), 0)]  # the policy's input, shared
                    continue
                x, lab = plan_inputs(policy, full[c], nctx[c], plan.masks, gens[i])
                start = len(rows_in[role])
                rows_in[role].extend(x.unbind(0))
                tg[role].extend(lab.unbind(0))
                inputs_of[key] = start
    # the reference scores what the policy scores (its own rows for "independent")
    ref_rows = rows_in[1] if masks == "independent" else rows_in[0]
    ref_tg = tg[1] if masks == "independent" else tg[0]
    s_pol = masked_sums(policy_module if policy_module is not None else policy.model, policy,
                        rows_in[0], tg[0], grad=True)
    ref_mod = reference.model
    was = ref_mod.training
    ref_mod.eval()
    try:
        s_ref = masked_sums(ref_mod, reference, ref_rows, ref_tg, grad=False).detach()
    finally:
        ref_mod.train(was)

    est = {k: [] for k in ("pw", "pl", "rw", "rl")}
    se = np.zeros(len(enc))
    exact = np.zeros(len(enc), dtype=bool)
    spread_sum = np.zeros(NUM_RATE_BINS)
    spread_n = np.zeros(NUM_RATE_BINS)
    for i, pl in enumerate(plans):
        draws = None
        for role, sums in ((0, s_pol), (1, s_ref)):
            for c, name in ((0, "w"), (1, "l")):
                plan = pl[role][c]
                start = inputs_of[(id(plan), role)]
                s = sums[start:start + plan.masks.shape[0]]
                est[("p" if role == 0 else "r") + name].append((plan.coef.to(s) * s).sum())
                if plan.draw_coef.shape[0]:
                    sign = (1.0 if c == 0 else -1.0) * (1.0 if role == 0 else -1.0)
                    dk = beta * sign * (plan.draw_coef.to(s) @ s).detach().double().cpu().numpy()
                    draws = dk if draws is None else draws + dk
        if draws is None:
            exact[i] = True
            continue
        sampled = [pl[0][c] for c in (0, 1) if pl[0][c].draw_coef.shape[0]]
        strata = sampled[0].strata
        if masks == "independent" or strata is None:
            se[i] = float(mean_stderr(draws)[1]) if masks == "vrpo" else _stratified_se(draws)
            continue
        se[i] = _stratified_se(draws)
        # the allocation's evidence: density-free terms d_k q(r_k), spread within a stratum
        rates = sampled[0].rates
        pair_spread(spread_sum, spread_n, rates, draws, density)
    pw, plo = torch.stack(est["pw"]), torch.stack(est["pl"])
    rw, rl = torch.stack(est["rw"]).detach(), torch.stack(est["rl"]).detach()
    margin = beta * ((pw - rw) - (plo - rl))
    return PreferenceBounds(policy_chosen=pw, policy_rejected=plo, ref_chosen=rw,
                            ref_rejected=rl, margin=margin, margin_se=se, exact=exact,
                            masked_rows=len(rows_in[0]), spread_sum=spread_sum,
                            spread_count=spread_n)
