"""Log-ratios of two masked LMs' conditional bounds on common masks (the ratio of RL).

For a prompt x and a completion y of T tokens, the conditional MPT bound of a model pi,

    B_pi(y | x) = S_y(T) + E_{r ~ q} [ S_y(M_r) / q_T(M_r) ],   M_r = ceil(r (T - 1)) < T,

(:mod:`mptlml.hf.preference`: the whole completion masked once, exactly, and P draws at
stratified rates), stands in for log pi(y | x). The log-ratio of two models,

    L(y | x) = B_pi(y | x) - B_old(y | x),

is estimated on **common masks**: both models score the very same masked inputs (one plan
per completion, :func:`~mptlml.hf.preference.plan_inputs`), so draw k's term is
``y_k = (s_pi,k - s_old,k) / (M_k q_T(M_k))``, which is small where the models agree. The
draw is by default **complementary** (``masks="complement"``,
:func:`~mptlml.estimators.sequential.stratified_rates`): the upper half of the rate strata
mirror the lower half, each mask's complement scored beside it, so a token's two
conditionals (masked with few others, and with many) enter in one antithetic pair. The
estimate is unbiased (each draw is a uniform mask at a stratified rate); its Monte Carlo
standard error comes from the pairs of independent antithetic units per mirrored stratum
pair (:func:`~mptlml.estimators.sequential.complement_cells`), or of draws per stratum
(``masks="stratified"``: :func:`~mptlml.estimators.sequential.stratum_cells`). A completion
of at most ``exact_length`` tokens is scored on all its 2^T - 1 masks: its log-ratio is the
exact difference of the bounds, standard error 0.

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
    stratum_cells,
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

#: how a completion's draws are made (module docstring)
LOGRATIO_MASKS = ("complement", "stratified")


@dataclass
class CommonPlans:
    """One plan of masks per completion, its model inputs, and how to read any model's sums.

    Attributes
    ----------
    plans : list
        Per completion its masks (over the completion) and their weights.
    inputs, targets : list of LongTensor
        Every masked input (framed, corrupted) and its targets (-100 where not scored), all
        completions' rows one after the other.
    starts : list of int
        The first row of each completion.
    complement : bool
        The draws are complementary (their SE is read by mirrored stratum pairs).
    """

    plans: list[_Plan]
    inputs: list[torch.Tensor]
    targets: list[torch.Tensor]
    starts: list[int]
    complement: bool

    def __len__(self) -> int:
        return len(self.plans)

    @property
    def exact(self) -> np.ndarray:
        """Completions scored on every mask (bool ``(B,)``)."""
        return np.array([p.draw_coef.shape[0] == 0 for p in self.plans])

    def sums(self, lm: Any, module: torch.nn.Module | None = None, *,
             grad: bool = False) -> torch.Tensor:
        """Summed log-probabilities of the masked targets of every row under a model ``(R,)``.

        :func:`~mptlml.hf.preference.masked_sums` of ``module`` (default ``lm.model``), with
        gradients when ``grad`` (in eval mode otherwise, its mode given back).
        """
        module = lm.model if module is None else module
        if grad:
            return masked_sums(module, lm, self.inputs, self.targets, grad=True)
        was = module.training
        module.eval()
        try:
            return masked_sums(module, lm, self.inputs, self.targets, grad=False).detach()
        finally:
            module.train(was)

    def bounds(self, sums: torch.Tensor) -> torch.Tensor:
        """Each completion's estimated bound from a model's row sums ``(B,)``."""
        return torch.stack([(p.coef.to(sums) * sums[s:s + p.masks.shape[0]]).sum()
                            for p, s in zip(self.plans, self.starts, strict=True)])

    def difference(self, a: torch.Tensor, b: torch.Tensor
                   ) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
        """``B_a - B_b`` per completion on the common masks, its SE and its dof ``(B,)``.

        The SE is 0 (dof inf) for an exact completion.
        """
        est = self.bounds(a - b)
        se = np.zeros(len(self.plans))
        dof = np.full(len(self.plans), math.inf)
        cells_of = complement_cells if self.complement else stratum_cells
        for i, (p, s) in enumerate(zip(self.plans, self.starts, strict=True)):
            if p.draw_coef.shape[0] == 0:
                continue
            d = (a - b)[s:s + p.masks.shape[0]].detach().double().cpu()
            draws = (p.draw_coef @ d).numpy()
            _, var, df = cells_error(cells_of(draws))
            se[i], dof[i] = math.sqrt(float(var.sum())), float(df.sum())
        return est, se, dof


def common_plans(lm: Any, ids: Sequence[torch.Tensor], num_context: Sequence[int], *,
                 num_masks: int = 8, seed: Any = 0, masks: str = "complement",
                 exact_length: int = EXACT_LENGTH) -> CommonPlans:
    """The plans of completions ``ids[i][num_context[i]:]`` (content ids of prompt + completion).

    Completion i draws from the stream (seed, i) or the i-th generator; P = ``num_masks``
    draws (a multiple of 4 for ``"complement"``, even for ``"stratified"``) at uniform
    stratified rates, plus the whole completion's mask; at most ``exact_length`` tokens:
    every mask.
    """
    p = check_positive_int(num_masks, "num_masks")
    if masks not in LOGRATIO_MASKS:
        raise ValueError(f"masks must be one of {LOGRATIO_MASKS}, got {masks!r}.")
    step, why = ((4, "two antithetic pairs per mirrored pair of strata")
                 if masks == "complement" else (2, "two draws per stratum"))
    if p % step:
        raise ValueError(f"num_masks must be a multiple of {step} for masks={masks!r} "
                         f"({why}), got {p}.")
    if isinstance(exact_length, bool) or not isinstance(exact_length, numbers.Integral) \
            or exact_length < 0:
        raise ValueError(f"exact_length must be an int >= 0, got {exact_length!r}.")
    gens = _generators(seed, len(ids))
    density = RateDensity(np.ones(NUM_RATE_BINS))
    plans, inputs, targets, starts = [], [], [], []
    for i, (full, n) in enumerate(zip(ids, num_context, strict=True)):
        t = len(full) - int(n)
        if t < 1:
            raise ValueError(f"completion {i} has no token of its own; pass a non-empty "
                             "completion.")
        if t <= max(int(exact_length), 1):
            plan = _exact_plan(t)
        else:
            strata, rates, order = stratified_rates(gens[i], p, t, density,
                                                    complement=masks == "complement")
            plan = _rate_plan(t, rates, order, strata, density)
        x, lab = plan_inputs(lm, full, int(n), plan.masks, gens[i])
        starts.append(len(inputs))
        inputs.extend(x.unbind(0))
        targets.extend(lab.unbind(0))
        plans.append(plan)
    return CommonPlans(plans, inputs, targets, starts, masks == "complement")


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
                     completions: Sequence[Any], *, num_masks: int = 8, seed: Any = 0,
                     masks: str = "complement", exact_length: int = EXACT_LENGTH,
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
    masks : {"complement", "stratified"}
        Complementary (antithetic) draws, or two independent draws per stratum.
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
                         exact_length=exact_length)
    s_pol = plans.sums(policy, policy_module, grad=True)
    s_old = plans.sums(old_policy)
    est, se, dof = plans.difference(s_pol, s_old)
    return LogRatios(logratio=est, logratio_stderr=se, dof=dof, exact=plans.exact,
                     policy_bound=plans.bounds(s_pol), old_bound=plans.bounds(s_old),
                     masked_inputs=len(plans.inputs))
