"""``MPTGRPOTrainer``: GRPO of a masked-diffusion LM on MPT bounds scored on common masks.

Constructed as TRL's ``GRPOTrainer``::

    args = MPTGRPOConfig(output_dir=..., num_generations=8, max_completion_length=16,
                         beta=0.04, num_masks=7, max_steps=200)
    trainer = MPTGRPOTrainer(model=model, reward_funcs=[reward], args=args,
                             train_dataset=prompts, processing_class=tokenizer)

with ``prompts`` a ``datasets.Dataset`` (or a list of dicts) with a ``prompt`` string
column (other columns are passed to the reward functions by name, as TRL does), and each
reward function ``f(prompts=, completions=, **columns) -> list[float]``.

What one rollout does
---------------------
Each of ``per_device_train_batch_size / num_generations`` prompts is completed
``num_generations`` times by LLaDA's sampler (:func:`mptlml.generate`, at
``temperature``); the rewards ``r_i`` (summed over the reward functions) give the
group-normalised advantages ``A_i = (r_i - mean_g r) / (sd_g r + 1e-4)``. Each completion
gets one plan of masks (:func:`~mptlml.hf.logratio.common_plans`: stratified draws and the
whole completion's mask, whose per-token scores control the draws; or every mask of a short
completion), on which the old policy (the model as it is at the rollout), the policy and
the reference are all scored: one set of masked inputs, three models. The old policy's and
the reference's scores are kept (no grad); the policy is scored again with gradients at
each of the ``num_iterations`` updates that reuse the rollout. The bounds below are those
of :func:`~mptlml.hf.policy_logratios` with the same options (``masks``,
``control_variate``), and so are the standard errors logged.

The loss of an update, over the B completions,

    L = (1/B) sum_i [ -min(rho_i A_i, clip(rho_i, 1 - eps, 1 + eps) A_i) + beta k3_i ],
    rho_i = exp(B_pi(y_i|x_i) - B_old(y_i|x_i)),
    k3_i  = exp(d_i) - d_i - 1,   d_i = B_ref(y_i|x_i) - B_pi(y_i|x_i),

has its gradient through the policy's bound only: the sequence-level ratio of the bounds
(d1's and coupled-GRPO's ratio is of their one- or two-mask estimates of the same bound)
and Schulman's k3 estimator of KL(pi || ref).

The logs (per logging window, averaged over its steps): ``loss``, ``reward`` (mean over the
step's completions), ``reward_std`` (the mean of the groups' standard deviations), ``kl``
(mean k3), ``logratio_mc_se`` (the Monte Carlo SE of the step's mean log-ratio
``sqrt(sum_i se_i^2) / B``; 0 at the first update of a rollout, where pi = old on the same
masks), ``kl_mc_se`` (the delta-method SE of the mean k3, ``|exp(d) - 1| se_d``),
``masked_inputs`` (masked inputs per model and step), ``num_masks``, and the drift monitor
``drift/bound_gap``, ``drift/bound_rmse``: on the step's completions short enough to
enumerate (at most ``drift_length`` tokens), the policy's bound estimated from
``num_masks`` draws minus its exact value on every mask (mean and root mean square): the
estimator's drift from the conditional bound during training, measured.

With ``logratio_target_se`` the draws per completion follow the noise: after each update
whose ``logratio_mc_se`` is above 0, the next rollout draws
``P' = P (se / target)^2`` (rounded up to the draw's multiple, within
``[4, max_num_masks]``), SE falling as ``1 / sqrt(P)``.

The reference. ``ref_model=None`` with ``beta > 0``: a model with a peft adapter is its own
reference with the adapter disabled (``disable_adapter()``: one copy of the weights, as
SPG, ESPO and dllm do); any other model gets a frozen deep copy made at construction.
``beta=0`` keeps no reference.

Refused before any step: ``num_generations < 2``, a batch that is not a multiple of it, a
dataset without a ``prompt`` column or with an empty prompt, gradient accumulation; and
before the first update, a reward function that does not return one finite number per
completion.

Why transformers' ``Trainer`` and not TRL's ``GRPOTrainer``: TRL's trainer computes
per-token log-probabilities of a causal LM in one forward (``_get_per_token_logps``),
generates with ``model.generate`` or vLLM and shapes its loss per token; a masked-diffusion
LM has none of these, so a subclass would override generation, scoring, the loss and the
logs, keeping only the data plumbing, and would follow TRL's private API from release to
release. ``transformers.Trainer`` gives the optimizer, schedule, logging (``report_to``),
checkpoints and devices, as for :class:`~mptlml.hf.MPTDPOTrainer`; the configuration keeps
TRL's names.

Reference: Shao et al., "DeepSeekMath", 2024 (GRPO); Zhao et al., "d1", 2025; Gong et al.,
"DiffuCoder", 2025 (coupled-GRPO); Schulman, "Approximating KL divergence", 2020 (k3).
"""

from __future__ import annotations

import copy
import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .._optional import require
from ..estimators.runs import EXACT_LENGTH
from ..seeds import spawn
from .dpo import _disable_dropout
from .generation import REMASKING, generate
from .logratio import LOGRATIO_MASKS, CommonPlans, common_plans

try:
    from transformers import Trainer, TrainingArguments
except ImportError:
    require("transformers", "mptlml.hf.MPTGRPOTrainer")  # names the extra when it is missing
    raise

__all__ = ["MPTGRPOConfig", "MPTGRPOTrainer"]

_ROLLOUT, _SAMPLE, _DRIFT = 0, 1, 2  # stream tags


@dataclass
class MPTGRPOConfig(TrainingArguments):
    """``TrainingArguments`` plus GRPO's (TRL's names) and the masks' (mptlml's).

    Attributes
    ----------
    num_generations : int
        Completions per prompt (the group; >= 2).
    max_completion_length : int
        Tokens generated per completion.
    beta : float
        Weight of the k3 KL to the reference (0: no reference).
    epsilon : float
        PPO's clipping range of the ratio.
    num_iterations : int
        Updates per rollout (the old policy is the rollout's model).
    temperature : float
        The sampler's temperature.
    steps, block_length : int, optional
        The sampler's steps and block length (default: the completion's length).
    remasking : {"low_confidence", "random"}
        The sampler's remasking.
    num_masks : int
        Draws per completion and step, besides the whole completion's mask (7: 8 masked
        inputs per model and completion).
    masks : {"stratified", "complement"}
        How the draws are made (:mod:`mptlml.hf.logratio`).
    control_variate : bool
        The whole-mask row's per-token scores control the draws (:mod:`mptlml.hf.logratio`).
    exact_length : int
        Completions of at most this many tokens are scored on every mask.
    logratio_target_se : float, optional
        A target for ``logratio_mc_se``: the draws per step follow it.
    max_num_masks : int
        Most draws per completion under ``logratio_target_se``.
    drift_length : int
        The drift monitor's completions: those of at most this many tokens (0: off).
    """

    num_generations: int = 8
    max_completion_length: int = 16
    beta: float = 0.04
    epsilon: float = 0.2
    num_iterations: int = 1
    temperature: float = 1.0
    steps: int | None = None
    block_length: int | None = None
    remasking: str = "low_confidence"
    num_masks: int = 7
    masks: str = "stratified"
    control_variate: bool = True
    exact_length: int = EXACT_LENGTH
    logratio_target_se: float | None = None
    max_num_masks: int = 64
    drift_length: int = 0
    remove_unused_columns: bool = field(default=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.num_generations, bool) or not isinstance(self.num_generations, int) \
                or self.num_generations < 2:
            raise ValueError(f"num_generations must be an int >= 2 (group-normalised "
                             f"advantages compare completions of one prompt), got "
                             f"{self.num_generations!r}.")
        if self.per_device_train_batch_size % self.num_generations:
            raise ValueError(f"per_device_train_batch_size={self.per_device_train_batch_size} "
                             f"(completions per step) must be a multiple of num_generations="
                             f"{self.num_generations}.")
        for name in ("max_completion_length", "num_iterations", "num_masks", "max_num_masks"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}.")
        for name in ("beta", "epsilon", "temperature"):
            v = getattr(self, name)
            if not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}.")
        if self.masks not in LOGRATIO_MASKS:
            raise ValueError(f"masks must be one of {LOGRATIO_MASKS}, got {self.masks!r}.")
        if not isinstance(self.control_variate, bool):
            raise ValueError(f"control_variate must be True or False, got "
                             f"{self.control_variate!r}.")
        if self.remasking not in REMASKING:
            raise ValueError(f"remasking must be one of {REMASKING}, got {self.remasking!r}.")
        if self.logratio_target_se is not None and not (
                isinstance(self.logratio_target_se, int | float)
                and self.logratio_target_se > 0):
            raise ValueError(f"logratio_target_se must be a number > 0 or None, got "
                             f"{self.logratio_target_se!r}.")
        if self.gradient_accumulation_steps != 1:
            raise ValueError("MPTGRPOTrainer takes gradient_accumulation_steps=1 (a step is "
                             "one rollout's batch); raise per_device_train_batch_size.")


@dataclass
class _Rollout:
    """One rollout: completions, advantages, plans and the frozen models' per-token scores."""

    prompts: list[Any]
    completions: list[str]
    rewards: np.ndarray
    advantages: torch.Tensor
    plans: CommonPlans
    ids: list[torch.Tensor]
    num_context: list[int]
    old: torch.Tensor
    ref: torch.Tensor | None
    group_std: float


def _prompts_of(data: Any) -> list[Any]:
    """The ``prompt`` column, refused before any step when missing or with an empty prompt."""
    if data is None:
        raise TypeError("MPTGRPOTrainer needs train_dataset= (rows with a 'prompt' string).")
    cols = getattr(data, "column_names", None)
    if cols is None and len(data):
        first = data[0]
        cols = list(first) if isinstance(first, Mapping) else None
    if cols is None or "prompt" not in cols:
        raise ValueError(f"the training dataset must have a 'prompt' column (TRL's format); "
                         f"it has {cols}.")
    prompts = [row["prompt"] for row in data]
    for i, p in enumerate(prompts):
        if (isinstance(p, str) and not p.strip()) or (not isinstance(p, str) and not len(p)):
            raise ValueError(f"prompt {i} is empty: every completion is scored given its "
                             "prompt; drop the row or give it a prompt.")
    return prompts


class MPTGRPOTrainer(Trainer):
    """``transformers.Trainer`` that trains a masked(-diffusion) LM by GRPO on MPT bounds.

    Parameters
    ----------
    model : transformers masked LM, a module with ``mask_token_id``, or a peft model
        The policy, trained.
    reward_funcs : list of callables
        ``f(prompts=, completions=, **columns) -> list[float]``, one number per completion;
        summed.
    args : MPTGRPOConfig
    train_dataset : Dataset or list of dicts
        A ``prompt`` column (text); other columns go to the reward functions.
    processing_class : tokenizer
        The model's tokenizer.
    ref_model : same kind, optional
        The frozen reference (module docstring for None).
    mask_token_id, family : optional
        As for :class:`~mptlml.models.MaskedLM`.
    **kwargs
        The rest of ``transformers.Trainer``'s arguments (``callbacks``, ``optimizers``).
    """

    def __init__(self, model: Any = None, reward_funcs: Sequence[Callable] | Callable = (),
                 args: MPTGRPOConfig | None = None, train_dataset: Any = None,
                 processing_class: Any = None, ref_model: Any = None, *,
                 mask_token_id: int | None = None, family: str | None = None,
                 **kwargs: Any) -> None:
        from ..models.masked_lm import MaskedLM

        if model is None or processing_class is None:
            raise TypeError("MPTGRPOTrainer needs model= (the policy, a masked LM) and "
                            "processing_class= (its tokenizer).")
        if not isinstance(args, MPTGRPOConfig):
            raise TypeError(f"args must be an MPTGRPOConfig (TRL's GRPO names and the masks'), "
                            f"got {type(args).__name__}.")
        funcs = [reward_funcs] if callable(reward_funcs) else list(reward_funcs)
        if not funcs or not all(callable(f) for f in funcs):
            raise TypeError("reward_funcs must be a callable or a non-empty list of them: "
                            "f(prompts=, completions=, **columns) -> list[float].")
        if ref_model is model:
            raise ValueError("ref_model is the model itself: its bounds would move with the "
                             "policy. Pass ref_model=None or a copy of the starting point.")
        self.prompts_all = _prompts_of(train_dataset)
        self.reward_funcs = funcs
        _disable_dropout(model)
        base = model.get_base_model() if hasattr(model, "disable_adapter") else model
        conv = {"mask_token_id": mask_token_id, "family": family}
        self.policy_lm = MaskedLM(base, processing_class, **conv)
        self.adapter_reference = ref_model is None and args.beta > 0 and hasattr(
            model, "disable_adapter")
        self.ref_lm = None
        if ref_model is None and args.beta > 0 and not self.adapter_reference:
            ref_model = copy.deepcopy(model)
        if ref_model is not None:
            ref_model.eval().requires_grad_(False)
            self.ref_lm = MaskedLM(ref_model, processing_class, **conv)
        self.num_masks_now = args.num_masks
        self._rollout: _Rollout | None = None
        self._records: list[dict[str, float]] = []
        self.rollouts = 0
        super().__init__(model=model, args=args, train_dataset=train_dataset,
                         processing_class=processing_class,
                         data_collator=lambda rows: {"rows": list(rows)}, **kwargs)
        if self.ref_lm is not None:
            self.ref_lm.model.to(self.args.device)

    # ------------------------------------------------------------------ data
    def get_train_dataloader(self) -> Any:
        """Prompts per step: ``per_device_train_batch_size / num_generations``, shuffled."""
        n = self.args.per_device_train_batch_size // self.args.num_generations
        g = torch.Generator().manual_seed(int(self.args.seed))
        return torch.utils.data.DataLoader(list(self.train_dataset), batch_size=n, shuffle=True,
                                           generator=g, collate_fn=self.data_collator,
                                           drop_last=True)

    # ------------------------------------------------------------------ rollouts
    def _rewards(self, rows: list[Mapping[str, Any]], prompts: list[Any],
                 completions: list[str]) -> np.ndarray:
        cols = {k: [r[k] for r in rows] for k in rows[0] if k != "prompt"}
        total = np.zeros(len(completions))
        for f in self.reward_funcs:
            name = getattr(f, "__name__", type(f).__name__)
            got = f(prompts=prompts, completions=completions, **cols)
            vals = np.asarray(list(got) if got is not None else [], dtype=np.float64)
            if vals.shape != (len(completions),) or not np.isfinite(vals).all():
                got_n = vals.shape[0] if vals.ndim else "no"
                raise ValueError(f"reward function {name} returned {got_n} values (or a "
                                 f"non-finite one) for {len(completions)} "
                                 "completions; it must return one finite float per completion.")
            total += vals
        return total

    def _score_frozen(self, module: torch.nn.Module, plans: CommonPlans
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
        old = plans.scores(self.policy_lm, module)
        if self.args.beta == 0:
            return old, None
        if self.adapter_reference:
            with module.disable_adapter():
                return old, plans.scores(self.policy_lm, module)
        assert self.ref_lm is not None
        return old, plans.scores(self.ref_lm)

    def _new_rollout(self, module: torch.nn.Module, rows: list[Mapping[str, Any]]) -> _Rollout:
        a, step = self.args, int(self.state.global_step)
        g = a.num_generations
        rows = [r for r in rows for _ in range(g)]
        prompts = [r["prompt"] for r in rows]
        seeds = [spawn(int(a.seed), _SAMPLE, step, i) for i in range(len(rows))]
        gen = generate(self.policy_lm, prompts, max_new_tokens=a.max_completion_length,
                       steps=a.steps, block_length=a.block_length, temperature=a.temperature,
                       remasking=a.remasking, seed=seeds, module=module,
                       allowed_ids=self._allowed())
        rewards = self._rewards(rows, prompts, gen.texts)
        grouped = rewards.reshape(-1, g)
        adv = (grouped - grouped.mean(1, keepdims=True)) / (grouped.std(1, ddof=1,
                                                                        keepdims=True) + 1e-4)
        ids = [torch.cat([p, c]) for p, c in zip(gen.prompt_ids, gen.ids, strict=True)]
        gens = [torch.Generator().manual_seed(spawn(int(a.seed), _ROLLOUT, step, i))
                for i in range(len(rows))]
        plans = common_plans(self.policy_lm, ids, [len(p) for p in gen.prompt_ids],
                             num_masks=self.num_masks_now, seed=gens, masks=a.masks,
                             control_variate=a.control_variate, exact_length=a.exact_length)
        old, ref = self._score_frozen(module, plans)
        self.rollouts += 1
        return _Rollout(prompts, gen.texts, rewards,
                        torch.as_tensor(adv.reshape(-1), dtype=torch.float64), plans, ids,
                        [len(p) for p in gen.prompt_ids], old, ref,
                        float(grouped.std(1, ddof=1).mean()))

    def _allowed(self) -> list[int]:
        """Content ids: every id but the tokenizer's special ones and the mask id."""
        lm = self.policy_lm
        special = set(lm.special_ids) | {int(lm.mask_token_id)}
        return [i for i in range(min(lm.vocab_size, len(lm.tokenizer))) if i not in special]

    # ------------------------------------------------------------------ loss
    def compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any],
                     return_outputs: bool = False, num_items_in_batch: Any = None) -> Any:
        """GRPO's clipped objective on bounds plus beta k3 (module docstring)."""
        a = self.args
        module = self.accelerator.unwrap_model(model)
        if self._rollout is None or int(self.state.global_step) % a.num_iterations == 0:
            self._rollout = self._new_rollout(module, inputs["rows"])
        ro = self._rollout
        s_pol = ro.plans.scores(self.policy_lm, model, grad=True)
        lr, lr_se, _ = ro.plans.difference(s_pol, ro.old)
        adv = ro.advantages.to(lr)
        ratio = torch.exp(lr)
        per = -torch.minimum(ratio * adv, torch.clamp(ratio, 1 - a.epsilon, 1 + a.epsilon) * adv)
        kl_mean, kl_se = 0.0, 0.0
        if ro.ref is not None:
            d, d_se, _ = ro.plans.difference(ro.ref.to(s_pol), s_pol)
            k3 = torch.exp(d) - d - 1
            per = per + a.beta * k3
            kl_mean = float(k3.detach().mean())
            e = np.expm1(d.detach().double().cpu().numpy())
            kl_se = float(np.sqrt(np.sum((e * d_se) ** 2)) / len(d_se))
        loss = per.mean()
        b = len(lr_se)
        rec = {"reward": float(ro.rewards.mean()), "reward_std": ro.group_std, "kl": kl_mean,
               "logratio_mc_se": float(np.sqrt(np.sum(lr_se ** 2)) / b),
               "kl_mc_se": kl_se, "masked_inputs": float(len(ro.plans.inputs)),
               "num_masks": float(self.num_masks_now)}
        rec.update(self._drift(model, ro))
        self._records.append(rec)
        self._resize(rec["logratio_mc_se"])
        return (loss, {"logratio": lr.detach()}) if return_outputs else loss

    def _resize(self, se: float) -> None:
        """The next rollout's draws under ``logratio_target_se`` (SE ~ 1 / sqrt(P))."""
        target = self.args.logratio_target_se
        if target is None or se <= 0:
            return
        step = 4 if self.args.masks == "complement" else 1
        want = self.num_masks_now * (se / target) ** 2
        p = int(math.ceil(want / step) * step)
        self.num_masks_now = int(min(max(p, 4), self.args.max_num_masks // step * step))

    def _drift(self, model: torch.nn.Module, ro: _Rollout) -> dict[str, float]:
        """The drift monitor: estimated minus exact bound on the short completions."""
        n = self.args.drift_length
        if n <= 0:
            return {}
        keep = [i for i, p in enumerate(ro.plans.plans) if p.masks.shape[1] <= n]
        if not keep:
            return {}
        lm = self.policy_lm
        full = [ro.ids[i] for i in keep]
        ctx = [ro.num_context[i] for i in keep]
        step = int(self.state.global_step)
        seeds = [torch.Generator().manual_seed(spawn(int(self.args.seed), _DRIFT, step, i))
                 for i in range(len(keep))]
        with torch.no_grad():
            est_plans = common_plans(lm, full, ctx, num_masks=self.num_masks_now, seed=seeds,
                                     masks=self.args.masks,
                                     control_variate=self.args.control_variate,
                                     exact_length=0)
            exact_plans = common_plans(lm, full, ctx, exact_length=n)
            est = est_plans.bounds(est_plans.scores(lm, model)).double().cpu().numpy()
            ex = exact_plans.bounds(exact_plans.scores(lm, model)).double().cpu().numpy()
        gap = est - ex
        return {"drift/bound_gap": float(gap.mean()),
                "drift/bound_rmse": float(np.sqrt(np.mean(gap ** 2)))}

    # ------------------------------------------------------------------ logs
    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        """transformers' log, with the GRPO metrics averaged over the steps since the last."""
        recs, self._records = self._records, []
        if recs:
            keys = defaultdict(list)
            for r in recs:
                for k, v in r.items():
                    keys[k].append(v)
            logs = {**logs, **{k: float(np.mean(v)) for k, v in keys.items()}}
        super().log(logs, *args, **kwargs)
