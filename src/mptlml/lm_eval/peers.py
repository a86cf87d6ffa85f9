"""LLaDA's and Dream's lm-eval arguments, taken unchanged by the model ``mptlml``.

A user of LLaDA (``eval_llada.py``, its lm-eval model ``llada_dist``) or of Dream
(``eval/eval.py``, its model ``dream``) passes that adapter's ``--model_args``;
``mptlml`` takes them with their meaning, or refuses them before any work with a
message naming the argument and what to pass instead:

==============================  =========  ====================================================
argument                        whose      in mptlml
==============================  =========  ====================================================
``model_path``                  LLaDA      ``pretrained``
``mask_id``                     LLaDA      ``mask_token_id``
``mc_num``                      both       a fixed budget of N masks per request (candidate)
``is_check_greedy``             LLaDA      ``greedy`` (the same greedy-unmasking check)
``cfg``                         LLaDA      classifier-free guidance w: u + (w + 1)(c - u)
``classifier_free_guidance``    Dream      its w': u + w'(c - u), i.e. ``cfg = w' - 1``
``max_length``                  both       most tokens of one scored input (context cut left)
``add_bos_token``               Dream      the tokenizer's BOS before every context
``batch_size``                  both       their masks per Monte Carlo batch: ``scheme=llada``
``nll_type=mc``, ``log_type``   Dream      only ``mc`` and ``ftb`` (log p(target | prefix))
``parallelize``, ``autogptq``   Dream      only false
generation options              both       LLaDA's sampler: :mod:`mptlml.lm_eval.generation`
``sampling_eps``                Dream      refused: a rate floor of Dream's Bernoulli scheme
==============================  =========  ====================================================

:func:`translate` does this for :class:`mptlml.lm_eval.MPTLM`.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["ALIASES", "PEER_ARGUMENTS", "translate"]

#: LLaDA's and Dream's argument names that mptlml spells otherwise: theirs -> mptlml's
ALIASES = {"model_path": "pretrained", "mask_id": "mask_token_id", "is_check_greedy": "greedy"}
#: Dream's options of which mptlml does only one value (its default): name -> (value, why)
_ONLY = {
    "nll_type": ("mc", "the Monte Carlo ELBO; 'ar_ftb'/'ar_btf' score one fixed "
                       "autoregressive order, which mptlml does not"),
    "log_type": ("ftb", "log p(target | prefix); 'btf' and 'union' score the prefix too"),
    "parallelize": (False, "a model split over GPUs; run data-parallel with accelerate "
                           "launch instead"),
    "autogptq": (False, "GPTQ-quantised weights are not loaded by mptlml"),
}
#: every LLaDA / Dream argument taken (for ``--help`` and the docs)
PEER_ARGUMENTS = (*ALIASES, "mc_num", "cfg", "classifier_free_guidance", "max_length",
                  "add_bos_token", *_ONLY)


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"model_args {name} must be a finite number, got {value!r}.")
    return float(value)


def translate(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with LLaDA's and Dream's arguments in mptlml's terms; the rest unchanged.

    ``model_path``, ``mask_id``, ``is_check_greedy`` become ``pretrained``,
    ``mask_token_id``, ``greedy``; ``cfg`` (LLaDA's w) and
    ``classifier_free_guidance`` (Dream's w' = w + 1) become ``cfg``; Dream's
    ``nll_type``, ``log_type``, ``parallelize`` and ``autogptq`` are dropped at
    their one supported value. ``mc_num``, ``max_length`` and ``add_bos_token``
    pass through (:class:`~mptlml.lm_eval.MPTLM` takes them).

    Raises
    ------
    TypeError
        An argument given under both spellings.
    ValueError
        A value mptlml does not do (named, with what to pass).
    """
    out = dict(options)
    for theirs, ours in ALIASES.items():
        if theirs in out:
            if ours in out:
                raise TypeError(f"model_args {theirs} and {ours} are one argument (LLaDA's "
                                f"name and mptlml's); pass one of them.")
            out[ours] = out.pop(theirs)
    if "sampling_eps" in out:
        raise ValueError(
            f"model_args sampling_eps={out['sampling_eps']!r}: the rate floor of Dream's own "
            "Bernoulli masking scheme, which mptlml does not use (its masks have sizes "
            "1..T, never the empty mask); drop it.")
    for name, (only, why) in _ONLY.items():
        if name in out:
            value = out.pop(name)
            if value != only:
                raise ValueError(f"model_args {name}={value!r}: mptlml does {name}={only!r} "
                                 f"only ({why}); drop it or pass {only!r}.")
    if "classifier_free_guidance" in out:
        w = _number(out.pop("classifier_free_guidance"), "classifier_free_guidance")
        if "cfg" in out:
            raise TypeError("model_args cfg (LLaDA's) and classifier_free_guidance (Dream's) "
                            "are one guidance scale (cfg = classifier_free_guidance - 1); pass "
                            "one of them.")
        if w < 1:
            raise ValueError(f"model_args classifier_free_guidance={w!r}: Dream's scale "
                             "u + w(c - u) guides from 1 up (1: no guidance); pass w >= 1, or "
                             "LLaDA's cfg = w - 1.")
        out["cfg"] = w - 1.0
    if "cfg" in out:
        out["cfg"] = _number(out["cfg"], "cfg")
        if out["cfg"] < 0:
            raise ValueError(f"model_args cfg={out['cfg']!r}: LLaDA's guidance scale "
                             "u + (cfg + 1)(c - u) is >= 0 (0: no guidance).")
    return out
