"""lm-eval's ``generate_until`` answered by LLaDA's sampler (:func:`mptlml.generate`).

A request is ``(context, gen_kwargs)``: the context is tokenised as the model's content
(cut on the left to leave room for the completion), completed by
:func:`~mptlml.hf.generation.generate`, decoded, and cut before the first of
``gen_kwargs["until"]`` (lm-eval's stop strings; LLaDA's ``eval_llada.py`` does the same).

The sampler's settings come from ``--model_args``, under LLaDA's names (``eval_llada.py``)
or Dream's (``eval/eval.py``):

==========================  ==========  ============================================
model_args                  whose       :func:`mptlml.generate`'s
==========================  ==========  ============================================
``gen_length``              LLaDA       ``max_new_tokens``
``max_new_tokens``          Dream       ``max_new_tokens``
``steps``                   LLaDA       ``steps``
``diffusion_steps``         Dream       ``steps``
``block_length``            LLaDA       ``block_length``
``remasking``               LLaDA       ``remasking`` (``low_confidence``, ``random``)
``temperature``             both        ``temperature``
``alg``, ``alg_temp``,      Dream       refused: Dream's own sampler (not LLaDA's);
``top_p``, ``top_k``,                   only LLaDA's is implemented
``escape_until``
==========================  ==========  ============================================

Without ``gen_length`` a request generates its ``max_gen_toks`` tokens (lm-eval's, 256 by
default); steps and block length default to the completion's length (one token per step,
one block). A task's ``temperature`` (with ``do_sample``) applies where the model_args set
none. Each request draws its noise from the run's seed and its own context, so its answer
does not depend on the other requests of the run.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from .._optional import require
from .._validation import check_positive_int
from ..hf.generation import REMASKING, generate
from ..models import MaskedLM
from ..seeds import spawn, text_key

__all__ = ["GENERATION_ARGUMENTS", "GenerationSettings", "answer_generation",
           "generation_settings"]

#: LLaDA's and Dream's generation model_args -> mptlml.generate's names
GENERATION_ARGUMENTS = {"gen_length": "max_new_tokens", "max_new_tokens": "max_new_tokens",
                        "steps": "steps", "diffusion_steps": "steps",
                        "block_length": "block_length", "remasking": "remasking",
                        "temperature": "temperature"}
#: Dream's sampler options (its own sampler, not LLaDA's)
_DREAM_SAMPLER = ("alg", "alg_temp", "top_p", "top_k", "escape_until")
#: the gen_kwargs of a request that are read (the others are refused)
_GEN_KWARGS = ("until", "max_gen_toks", "do_sample", "temperature")
#: lm-eval's default of max_gen_toks
_MAX_GEN_TOKS = 256


@dataclass(frozen=True)
class GenerationSettings:
    """The sampler's settings from ``--model_args`` (None: from the request, or the default)."""

    max_new_tokens: int | None = None
    steps: int | None = None
    block_length: int | None = None
    remasking: str = "low_confidence"
    temperature: float | None = None


def _value(value: Any) -> Any:
    """A model_args string read as lm-eval reads one ("8" -> 8, "0.5" -> 0.5)."""
    if isinstance(value, str):
        require("lm_eval", "mptlml.lm_eval (the lm-evaluation-harness backend)")
        from lm_eval.utils import handle_arg_string

        return handle_arg_string(value)
    return value


def generation_settings(args: dict[str, Any]) -> GenerationSettings:
    """Take the generation options out of ``args`` (in place) and check them.

    Raises
    ------
    TypeError
        An option under two names (LLaDA's and Dream's), or Dream's sampler options.
    ValueError
        A value out of range.
    """
    dream = sorted(set(args) & set(_DREAM_SAMPLER))
    if dream:
        raise TypeError(f"model_args {dream}: options of Dream's own sampler. mptlml generates "
                        "with LLaDA's (low-confidence remasking over blocks: gen_length, "
                        "steps, block_length, remasking, temperature); drop them.")
    got: dict[str, Any] = {}
    for theirs, ours in GENERATION_ARGUMENTS.items():
        if theirs in args:
            if ours in got:
                raise TypeError(f"model_args {theirs} names {ours}, given already under "
                                "another name (LLaDA's or Dream's); pass one of them.")
            got[ours] = _value(args.pop(theirs))
    for name in ("max_new_tokens", "steps", "block_length"):
        if name in got:
            got[name] = check_positive_int(got[name], f"model_args {name}")
    if "remasking" in got and got["remasking"] not in REMASKING:
        raise ValueError(f"model_args remasking={got['remasking']!r}: pass one of {REMASKING}.")
    if "temperature" in got:
        t = got["temperature"]
        if isinstance(t, bool) or not isinstance(t, int | float) or not (
                math.isfinite(t) and t >= 0):
            raise ValueError(f"model_args temperature={t!r}: pass a number >= 0 (0: greedy).")
        got["temperature"] = float(t)
    return GenerationSettings(**got)


def _request_settings(settings: GenerationSettings, kwargs: dict[str, Any]
                      ) -> tuple[tuple[str, ...], int, int | None, int | None, float]:
    """A request's stop strings, completion length, steps, block length and temperature."""
    other = sorted(set(kwargs) - set(_GEN_KWARGS))
    if other:
        raise ValueError(f"generate_until gen_kwargs {other} are not taken by mptlml's sampler "
                         f"(it reads {', '.join(_GEN_KWARGS)}); drop them from the task.")
    until = kwargs.get("until", [])
    until = (until,) if isinstance(until, str) else tuple(until)
    n = settings.max_new_tokens
    if n is None:
        n = check_positive_int(kwargs.get("max_gen_toks", _MAX_GEN_TOKS),
                               "gen_kwargs max_gen_toks")
    temp = settings.temperature
    if temp is None:
        temp = float(kwargs.get("temperature", 0.0)) if kwargs.get("do_sample") else 0.0
    return until, n, settings.steps, settings.block_length, temp


def _cut(text: str, until: tuple[str, ...]) -> str:
    """``text`` before the first occurrence of any stop string."""
    for stop in until:
        if stop and stop in text:
            text = text.split(stop)[0]
    return text


def answer_generation(lm: MaskedLM, requests: list[tuple[str, dict[str, Any]]],
                      settings: GenerationSettings, *, seed: int, content_limit: int,
                      batch_size: int | None = None) -> list[str]:
    """Answers of ``generate_until`` requests ``(context, gen_kwargs)``, in order.

    Requests of equal settings are generated in batches; a context is cut on the left to
    ``content_limit - max_new_tokens`` tokens; request i's noise comes from the stream of
    (seed, its context, its settings).
    """
    groups: dict[tuple, list[int]] = defaultdict(list)
    plans = []
    for i, (_, kwargs) in enumerate(requests):
        plan = _request_settings(settings, dict(kwargs))
        plans.append(plan)
        groups[plan[1:]].append(i)
    out: list[str] = [""] * len(requests)
    for (n, steps, block, temp), idx in groups.items():
        room = content_limit - n
        if room < 0:
            raise ValueError(f"generate_until: {n} new tokens do not fit the model's "
                             f"{content_limit} content tokens; pass a smaller gen_length.")
        ctx = lm.encode([requests[i][0] for i in idx])
        ctx = [c[len(c) - room:] if len(c) > room else c for c in ctx]
        seeds = [spawn(seed, text_key(repr((requests[i][0], n, steps, block, temp))))
                 for i in idx]
        gen = generate(lm, [c.tolist() for c in ctx], max_new_tokens=n, steps=steps,
                       block_length=block, temperature=temp, remasking=settings.remasking,
                       seed=seeds, batch_size=batch_size)
        tok = lm.tokenizer
        specials = [t for t in getattr(tok, "all_special_tokens", []) if t]
        for j, i in enumerate(idx):  # cut on the raw text (a stop string may be special)
            text = _cut(tok.decode(gen.ids[j].tolist(), skip_special_tokens=False), plans[i][0])
            for t in specials:
                text = text.replace(t, "")
            out[i] = text
    return out
