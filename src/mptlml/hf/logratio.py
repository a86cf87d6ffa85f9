"""Log-ratios of two masked LMs' conditional bounds on common masks (the ratio of RL).

For a prompt x and a completion y of T tokens, the conditional MPT bound of a model pi,

    B_pi(y | x) = S_y(T) + E_{r ~ q} [ S_y(M_r) / q_T(M_r) ],   M_r = ceil(r (T - 1)) < T,

(:mod:`mptlml.hf.preference`: the whole completion masked once, exactly, and P draws at
stratified rates), stands in for log pi(y | x). The log-ratio of two models,

    L(y | x) = B_pi(y | x) - B_old(y | x),

is estimated on **common masks**: both models score the very same masked inputs (one plan
per completion, :func:`~mptlml.hf.preference.plan_inputs`), so every term is a difference
that is small where the models agree.

**The control variate** (``control_variate=True``, the default). The row of the whole
completion masked is scored anyway; its per-token log-probabilities ``f_j = log p(y_j | x,
all of y masked)`` control each draw. Draw k, a uniform mask ``A_k`` of ``M_k`` tokens at a
stratified rate, with weight ``w_k = 1 / (M_k q_T(M_k))`` and summed masked
log-probabilities ``s_k``, gives the term

    y_k = w_k (s_k - sum_{j in A_k} f_j) + (T - 1) / T s_full,   s_full = sum_j f_j,

and the bound's estimate is ``s_full / T + mean_k y_k = s_full + mean_k w_k (s_k - sum_{j
in A_k} f_j)``: the one-step (d1-like) sum of the whole-masked row corrected, without bias,
by what masking fewer tokens changes. Unbiased for any rate density: a uniform mask of size
M holds each token with probability M / T, so ``E[w_k sum_{j in A_k} f_j | M_k = M] =
s_full / (T q_T(M))``, and over ``M ~ q_T`` on the sizes ``1..T-1`` of the draws that is
``(T - 1) / T s_full`` (the bound's S(T) is the whole-mask row's own term, ``s_full / T``).
The control is linear in the scores, so the log-ratio is the same estimator of the
per-token differences ``f_j(pi) - f_j(old)``. Its Monte Carlo standard error is that of a
mean of P terms read as independent, ``var(y, ddof=1) / P`` on P - 1 degrees of freedom
(conservative for stratified and antithetic draws, whose terms are not positively
correlated).

**The draw** (``masks=``): ``"stratified"`` (default), P strata of equal q-mass with one
uniform rate each, each with its own order of positions
(:func:`~mptlml.estimators.sequential.stratified_rates` with ``per_stratum=1``: any P of
at least 2; the i.i.d. standard error above, which errs on the large side); or
``"complement"``, two rates per stratum, the upper half of the strata mirroring the lower
half, each mask's complement scored beside it (antithetic pairs, P a multiple of 4).
Without the control variate the complementary draw's standard error comes from the pairs of
antithetic units per mirrored stratum pair
(:func:`~mptlml.estimators.sequential.complement_cells`).

A completion of at most ``exact_length`` tokens is scored on all its 2^T - 1 masks: its
log-ratio is the exact difference of the bounds, standard error 0.

The same plans score any number of models (:class:`CommonPlans`): the GRPO trainer scores
the old policy, the policy and the reference on them.

Reference: Moreno-Munoz, Recasens, Hauberg, "On Masked Pre-training and the Marginal
Likelihood", NeurIPS 2023, Proposition 1; Gong et al., "DiffuCoder", 2025 (coupled-GRPO's
mask-and-complement pairs); Zhao et al., "d1", 2025 (the one-step estimator).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._validation import check_positive_int
from ..estimators.runs import EXACT_LENGTH
from ..estimators.sequential import (
    NUM_RATE_BINS,
    RateDensity,
    cells_error,
    complement_cells,
    stratified_rates,
)
from ..models.sequence_input import encode_with_context
from .preference import (
    _check_pair_models,
    _exact_plan,
    _generators,
    _Plan,
    _rate_plan,
    masked_sums,
    plan_inputs,
)

__all__ = ["LOGRATIO_MASKS", "CommonPlans", "LogRatios", "common_plans", "policy_logratios"]

#: how a completion's draws are made (module docstring); the first is the default
LOGRATIO_MASKS = ("stratified", "complement")


@dataclass
class CommonPlans:
    """One plan of masks per completion, its model inputs, and how to read any model's scores.

    Attributes
    ----------
    plans : list
        Per completion its masks (over the completion) and their weights.
    inputs, targets : list of LongTensor
        Every masked input (framed, corrupted) and its targets (-100 where not scored), all
        completions' rows one after the other.
    starts : list of int
        The first row of each completion.
    columns : list of LongTensor
        Each completion's positions in its model inputs (``(T,)``).
    complement : bool
        The draws are complementary (``masks="complement"``).
    control_variate : bool
        The whole-mask row's per-token scores control the draws (module docstring).
    """

    plans: list[_Plan]
    inputs: list[torch.Tensor]
    targets: list[torch.Tensor]
    starts: list[int]
    columns: list[torch.Tensor]
    complement: bool
    control_variate: bool

    def __len__(self) -> int:
        return len(self.plans)

    @property
    def exact(self) -> np.ndarray:
        """Completions scored on every mask (bool ``(B,)``)."""
        return np.array([p.draw_coef.shape[0] == 0 for p in self.plans])

    def scores(self, lm: Any, module: torch.nn.Module | None = None, *,
               grad: bool = False) -> torch.Tensor:
        """Log-probabilities of every row's masked targets under a model, ``(R, L)``.

        :func:`~mptlml.hf.preference.masked_sums` ``(per_token=True)`` of ``module``
        (default ``lm.model``): entry ``[r, i]`` is the log-probability of row r's target at
        position i, 0 where it is not scored. With gradients when ``grad`` (in eval mode
        otherwise, its mode given back).
        """
        module = lm.model if module is None else module
        if grad:
            return masked_sums(module, lm, self.inputs, self.targets, grad=True, per_token=True)
        was = module.training
        module.eval()
        try:
            return masked_sums(module, lm, self.inputs, self.targets, grad=False,
                               per_token=True).detach()
        finally:
            module.train(was)

    def _tokens(self, scores: torch.Tensor, i: int) -> torch.Tensor:
        """Completion i's rows restricted to its own positions ``(R_i, T)``."""
        s, r = self.starts[i], self.plans[i].masks.shape[0]
        return scores[s:s + r][:, self.columns[i].to(scores.device)]

    def _controls(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The control's coefficients on the whole-mask row's token scores of completion i:
        per draw ``D (P, T)``, ``D[k, j] = (T - 1) / T - w_k [j in A_k]``, and their mean
        over the draws ``(T,)`` (the bound's)."""
        p = self.plans[i]
        t = p.masks.shape[1]
        n = p.draw_coef.shape[0]
        w = p.draw_coef[torch.arange(n), torch.arange(n)]
        d = (t - 1) / t - w[:, None] * p.masks[:n].double()
        return d, d.mean(0)

    def bounds(self, scores: torch.Tensor) -> torch.Tensor:
        """Each completion's estimated bound from a model's :meth:`scores` ``(B,)``."""
        out = []
        for i, p in enumerate(self.plans):
            tok = self._tokens(scores, i)
            b = (p.coef.to(tok) * tok.sum(1)).sum()
            if self.control_variate and p.draw_coef.shape[0]:
                b = b + (self._controls(i)[1].to(tok) * tok[-1]).sum()
            out.append(b)
        return torch.stack(out)

    def draws(self, scores: torch.Tensor, i: int) -> np.ndarray:
        """Completion i's draw terms ``y_k`` (float64 ``(P,)``; empty for an exact one):
        their mean plus the whole-mask row's ``s_full / T`` is its bound."""
        p = self.plans[i]
        tok = self._tokens(scores, i).detach().double().cpu()
        y = p.draw_coef @ tok.sum(1)
        if self.control_variate and p.draw_coef.shape[0]:
            y = y + self._controls(i)[0] @ tok[-1]
        return y.numpy()

    def difference(self, a: torch.Tensor, b: torch.Tensor
                   ) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
        """``B_a - B_b`` per completion on the common masks, its SE and its dof ``(B,)``.

        ``a`` and ``b`` are two models' :meth:`scores`. With the control variate the SE is
        ``sqrt(var(y, ddof=1) / P)`` of the difference's draw terms on P - 1 dof; without
        it, read from the draw's cells. It is 0 (dof inf) for an exact completion.
        """
        diff = a - b
        est = self.bounds(diff)
        se = np.zeros(len(self.plans))
        dof = np.full(len(self.plans), math.inf)
        for i, p in enumerate(self.plans):
            if p.draw_coef.shape[0] == 0:
                continue
            y = self.draws(diff, i)
            # the P terms as one cell of independent draws (var(ddof=1) / P on P - 1 dof), or
            # the complementary draw's antithetic units
            cells = ([y] if self.control_variate or not self.complement
                     else complement_cells(y))
            _, var, df = cells_error(cells)
            se[i], dof[i] = math.sqrt(float(var.sum())), float(df.sum())
        return est, se, dof


def common_plans(lm: Any, ids: Sequence[torch.Tensor], num_context: Sequence[int], *,
                 num_masks: int = 7, seed: Any = 0, masks: str = "stratified",
                 control_variate: bool = True,
                 exact_length: int = EXACT_LENGTH) -> CommonPlans:
    """The plans of completions ``ids[i][num_context[i]:]`` (content ids of prompt + completion).

    Completion i draws from the stream (seed, i) or the i-th generator; P = ``num_masks``
    draws (at least 2, a multiple of 4 for ``"complement"``; the default 7 and the whole
    mask: 8 masked inputs) at uniform
    stratified rates, plus the whole completion's mask; at most ``exact_length`` tokens:
    every mask. ``control_variate``: the bounds and SEs read off the plans use the
    whole-mask row's token scores as a control (module docstring).
    """
    p = check_positive_int(num_masks, "num_masks")
    if masks not in LOGRATIO_MASKS:
        raise ValueError(f"masks must be one of {LOGRATIO_MASKS}, got {masks!r}.")
    if not isinstance(control_variate, bool):
        raise TypeError(f"control_variate must be True or False, got {control_variate!r}.")
    if masks == "complement" and p % 4:
        raise ValueError(f"num_masks must be a multiple of 4 for masks='complement' (two "
                         f"antithetic pairs per mirrored pair of strata), got {p}.")
    if p < 2:
        raise ValueError(f"num_masks must be at least 2 (a standard error needs two draws), "
                         f"got {p}.")
    if isinstance(exact_length, bool) or not isinstance(exact_length, numbers.Integral) \
            or exact_length < 0:
        raise ValueError(f"exact_length must be an int >= 0, got {exact_length!r}.")
    gens = _generators(seed, len(ids))
    density = RateDensity(np.ones(NUM_RATE_BINS))
    plans, inputs, targets, starts, columns = [], [], [], [], []
    for i, (full, n) in enumerate(zip(ids, num_context, strict=True)):
        t = len(full) - int(n)
        if t < 1:
            raise ValueError(f"completion {i} has no token of its own; pass a non-empty "
                             "completion.")
        if t <= max(int(exact_length), 1):
            plan = _exact_plan(t)
        else:
            strata, rates, order = stratified_rates(
                gens[i], p, t, density, complement=masks == "complement",
                per_stratum=2 if masks == "complement" else 1)
            plan = _rate_plan(t, rates, order, strata, density)
        x, lab = plan_inputs(lm, full, int(n), plan.masks, gens[i])
        starts.append(len(inputs))
        columns.append(torch.arange(t) + len(lm.prefix) + int(n))
        inputs.extend(x.unbind(0))
        targets.extend(lab.unbind(0))
        plans.append(plan)
    return CommonPlans(plans, inputs, targets, starts, columns, masks == "complement",
                       control_variate)


@dataclass
class LogRatios:
    """Per completion the estimated log-ratio of two models' bounds and its standard error.

    Attributes
    ----------
    logratio : Tensor ``(B,)``
        ``B_policy(y | x) - B_old(y | x)``, differentiable for the policy.
    logratio_stderr : float64 ndarray ``(B,)``
        Its Monte Carlo standard error (0 for an exact completion).
    dof : float64 ndarray ``(B,)``
        Degrees of freedom of each standard error (inf: exact).
    exact : bool ndarray ``(B,)``
        Scored on every mask: the log-ratio of the bounds is exact.
    policy_bound, old_bound : Tensor ``(B,)``
        Each model's estimated bound (the policy's differentiable).
    masked_inputs : int
        Masked inputs scored per model (both score the same).
    """

    logratio: torch.Tensor
    logratio_stderr: np.ndarray
    dof: np.ndarray
    exact: np.ndarray
    policy_bound: torch.Tensor
    old_bound: torch.Tensor
    masked_inputs: int

    @property
    def mean_stderr(self) -> float:
        """Monte Carlo SE of the mean log-ratio: ``sqrt(sum_i se_i^2) / B``."""
        return float(np.sqrt(np.sum(self.logratio_stderr ** 2)) / max(len(self.logratio_stderr),
                                                                        1))


def policy_logratios(policy: Any, old_policy: Any, prompts: Sequence[Any],
                     completions: Sequence[Any], *, num_masks: int = 7, seed: Any = 0,
                     masks: str = "stratified", control_variate: bool = True,
                     exact_length: int = EXACT_LENGTH,
                     policy_module: torch.nn.Module | None = None) -> LogRatios:
    """``log pi(y | x) - log pi_old(y | x)`` per completion, by bounds on common masks.

    Parameters
    ----------
    policy, old_policy : MaskedLM
        Two :class:`~mptlml.models.MaskedLM` of one tokenizer and its conventions. The
        policy's bound carries gradients (when they are on); the old policy runs under
        ``torch.no_grad``.
    prompts : list of str or token-id lists
        One prompt per completion (always visible, never scored).
    completions : list of str or token-id lists
        The completions (content: no special tokens).
    num_masks : int
        Draws P per completion besides the whole completion's mask: P + 1 masked inputs per
        model (2^T - 1 for an exact one).
    seed : int or list of torch.Generator
        Completion i draws from the stream (seed, i), or from the i-th generator.
    masks : {"stratified", "complement"}
        Two independent draws per rate stratum, or complementary (antithetic) draws.
    control_variate : bool
        Control each draw by the whole-mask row's per-token scores (module docstring); the
        SE then reads the P draw terms as independent (P - 1 dof). False: the plain draw
        terms, the SE from the draw's cells.
    exact_length : int
        Completions of at most this many tokens are scored on every mask (exact).
    policy_module : torch.nn.Module, optional
        The module that computes the policy's logits (default ``policy.model``).

    Returns
    -------
    LogRatios
    """
    _check_pair_models(policy, old_policy)
    for name, v in (("prompts", prompts), ("completions", completions)):
        if isinstance(v, str | bytes):
            raise TypeError(f"{name} must be a list (one entry per completion), got a single "
                            f"string {v[:40]!r}; pass [{v[:40]!r}].")
    if len(prompts) != len(completions) or not len(completions):
        raise ValueError(f"pass one prompt per completion; got {len(prompts)} prompts and "
                         f"{len(completions)} completions.")
    ids, n = encode_with_context(policy, list(prompts), list(completions))
    plans = common_plans(policy, ids, n, num_masks=num_masks, seed=seed, masks=masks,
                         control_variate=control_variate, exact_length=exact_length)
    s_pol = plans.scores(policy, policy_module, grad=True)
    s_old = plans.scores(old_policy)
    est, se, dof = plans.difference(s_pol, s_old)
    return LogRatios(logratio=est, logratio_stderr=se, dof=dof, exact=plans.exact,
                     policy_bound=plans.bounds(s_pol), old_bound=plans.bounds(s_old),
                     masked_inputs=len(plans.inputs))
