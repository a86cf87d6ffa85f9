"""Train masked LMs by masked pre-training with every mask size (Hugging Face integration).

Theory
------
Let q(x_j | x_R) be the conditionals of any masked LM, consistent with one
joint distribution or not (a transformer's need not be). For a sequence x of
D tokens and a uniformly random order pi of its positions, the t-th factor of
the chain rule in the order pi, ``q(x_pi(t) | x_pi(t+1..D))``, scores one
position of a uniformly random mask of size t. Hence (Moreno-Munoz et al.
2023, Prop. 1, read for arbitrary conditionals)

    sum_{M=1..D} S(x; M) = E_pi [ log q_pi(x) ],
    q_pi(x) = prod_t q(x_pi(t) | x_pi(t+1..D)),
    S(x; M) = E_{|mask|=M} [ (1/M) sum_{j in mask} log q(x_j | x_R) ].

Each q_pi is a normalised distribution over sequences, so by Jensen the MPT
sum is a lower bound on ``log (1/D!) sum_pi q_pi(x)``, the log-likelihood of
the order mixture; it is exact when the conditionals come from one joint.
This is the any-order autoregressive / absorbing masked-diffusion likelihood
bound (Uria et al. 2014, "A deep and tractable density estimator";
Hoogeboom et al. 2022, "Autoregressive diffusion models" (ARDM); Sahoo et al.
2024, "Simple and effective masked diffusion language models" (MDLM)).

Drawing M ~ U{1..D} and a uniform mask of size M, ``D * S_hat(x; M)`` =
``(D/M) sum_{j in mask} log q(x_j | x_R)`` is an unbiased estimate of the
MPT sum: the *random-size* estimator, whose weight D/M is MDLM's 1/t. BERT's
fixed 15% rate instead estimates ``D * S(x; 0.15 D)``, a biased stand-in that
only sees one point of the MPT curve.

Consequences: an MLM trained with :class:`DataCollatorForMPT` and
:func:`mpt_loss` maximises a proper likelihood bound; the LML estimates of
:func:`mptlml.estimate_lml` on a :class:`mptlml.models.MaskedLM` are values
of the same bound, comparable across models and with exact likelihoods of
tractable models on the same data; and the model can be sampled by
unmasking one position at a time in a random order.

Usage
-----
With transformers' ``Trainer``::

    from mptlml.hf import DataCollatorForMPT, MPTTrainer
    trainer = MPTTrainer(model=model, args=args, train_dataset=ds,
                         data_collator=DataCollatorForMPT(tokenizer))

In a plain PyTorch loop::

    collate = DataCollatorForMPT(tokenizer, seed=0)
    for examples in loader:              # lists of tokenizer outputs
        loss = mpt_batch_loss(model, collate(examples))
        loss.backward(); opt.step(); opt.zero_grad()

Preference optimisation (DPO) on paired conditional bounds:
:func:`preference_bounds` (:mod:`mptlml.hf.preference`) and :class:`MPTDPOTrainer`
(:mod:`mptlml.hf.dpo`).

GRPO of masked-diffusion LMs on bounds scored on common masks: :func:`policy_logratios`
(:mod:`mptlml.hf.logratio`) and :class:`MPTGRPOTrainer`, :class:`MPTGRPOConfig`
(:mod:`mptlml.hf.grpo`).

Generation by LLaDA's sampler (low-confidence remasking over semi-autoregressive blocks):
:func:`generate` (:mod:`mptlml.hf.generation`, also ``mptlml.generate``).

Sampling by unmasking in a random order: :func:`sample_random_order`
(:mod:`mptlml.hf.orders`); the chain rule over random orders is the
``"chain-rule"`` estimator of :func:`mptlml.estimate_lml`.
"""

from __future__ import annotations

from typing import Any

from .collator import CORRUPTIONS, DataCollatorForMPT
from .generation import REMASKING, Generation, generate, transfer_counts
from .logratio import LOGRATIO_MASKS, CommonPlans, LogRatios, common_plans, policy_logratios
from .loss import IGNORE_INDEX, mpt_batch_loss, mpt_loss
from .orders import sample_random_order
from .preference import (
    MASK_SCHEMES,
    EncodedPairs,
    PreferenceBounds,
    dpo_loss,
    encode_pairs,
    masked_sums,
    plan_inputs,
    preference_bounds,
)

__all__ = [
    "CORRUPTIONS",
    "IGNORE_INDEX",
    "LOGRATIO_MASKS",
    "REMASKING",
    "MASK_SCHEMES",
    "DataCollatorForMPT",
    "CommonPlans",
    "DataCollatorForPreference",
    "EncodedPairs",
    "Generation",
    "LogRatios",
    "MPTDPOTrainer",
    "MPTGRPOConfig",
    "MPTGRPOTrainer",
    "MPTTrainer",
    "PreferenceBounds",
    "common_plans",
    "dpo_loss",
    "encode_pairs",
    "generate",
    "masked_sums",
    "plan_inputs",
    "mpt_batch_loss",
    "mpt_loss",
    "policy_logratios",
    "preference_bounds",
    "sample_random_order",
    "transfer_counts",
]


def __getattr__(name: str) -> Any:
    if name == "MPTTrainer":  # imports transformers.Trainer (slow): only on use
        from .trainer import MPTTrainer

        return MPTTrainer
    if name in ("MPTGRPOTrainer", "MPTGRPOConfig"):  # transformers.Trainer too
        from . import grpo

        return getattr(grpo, name)
    if name in ("MPTDPOTrainer", "DataCollatorForPreference"):  # transformers.Trainer too
        from . import dpo

        return getattr(dpo, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
