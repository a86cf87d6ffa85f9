"""LLaDA's and Dream's lm-eval arguments, in one table, taken unchanged by mptlml's models.

A user of LLaDA (``eval_llada.py``, its lm-eval model ``llada_dist``) or of Dream
(``eval/eval.py``, its model ``dream``) passes that adapter's ``--model_args``; the
models ``mptlml``, ``llada_dist`` and ``dream`` (:mod:`mptlml.lm_eval.backend`) take
them with their meaning, or refuse them before any work with a message naming the
argument, as the user spelt it, and what to pass instead. :data:`PEERS` is the one
table of them (the guide prints it):

==============================  =========  ====================================================
argument                        whose      in mptlml
==============================  =========  ====================================================
``model_path``                  LLaDA      ``pretrained``
``mask_id``                     LLaDA      ``mask_token_id``
``is_check_greedy``             LLaDA      ``greedy`` (the same greedy-unmasking check)
``mc_num``                      both       a fixed budget of N masked inputs per request
``cfg``                         LLaDA      classifier-free guidance w: u + (w + 1)(c - u)
``classifier_free_guidance``    Dream      its w': u + w'(c - u), i.e. ``cfg = w' - 1``
``max_length``                  both       most tokens of one scored input (context cut left)
``add_bos_token``               Dream      the tokenizer's BOS before every context
``batch_size``                  both       (``llada_dist``/``dream``, and lm-eval's
                                           ``--batch_size``) their masks per Monte Carlo
                                           batch: ``batch`` of ``estimator=llada``
``nll_type=mc``, ``log_type``   Dream      only ``mc`` and ``ftb`` (log p(target | prefix))
``parallelize``, ``autogptq``   Dream      only false
generation options              both       LLaDA's sampler: :mod:`mptlml.lm_eval.generation`
``sampling_eps``                Dream      refused: a rate floor of Dream's Bernoulli scheme
==============================  =========  ====================================================

:func:`translate` applies it; :data:`MODEL_DEFAULTS` are the defaults the peers' own
model names (``--model llada_dist``, ``--model dream``) add, as their adapters do.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["MODEL_DEFAULTS", "PEERS", "PEER_ARGUMENTS", "Peer", "translate"]


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"model_args {name} must be a finite number, got {value!r}.")
    return float(value)


def _llada_cfg(value: Any) -> float:
    w = _number(value, "cfg")
    if w < 0:
        raise ValueError(f"model_args cfg={value!r}: LLaDA's guidance scale "
                         "u + (cfg + 1)(c - u) is >= 0 (0: no guidance).")
    return w


def _dream_cfg(value: Any) -> float:
    w = _number(value, "classifier_free_guidance")
    if w < 1:
        raise ValueError(f"model_args classifier_free_guidance={value!r}: Dream's scale "
                         "u + w(c - u) guides from 1 up (1: no guidance); pass w >= 1, or "
                         "LLaDA's cfg = w - 1.")
    return w - 1.0


@dataclass(frozen=True)
class Peer:
    """One peer argument: whose it is and what it is in mptlml.

    Attributes
    ----------
    whose : str
        ``"LLaDA"``, ``"Dream"`` or ``"both"``.
    ours : str or None
        mptlml's name for it; None: dropped at its one value (``only``) or refused.
    convert : callable, optional
        The value in mptlml's terms (checked), e.g. Dream's guidance scale ``w' -> w' - 1``.
    only : object
        The one value mptlml does, when ``ours`` is None and ``refuse`` is None.
    refuse : str, optional
        Why it is refused whatever its value.
    """

    whose: str
    ours: str | None
    convert: Callable[[Any], Any] | None = None
    only: Any = None
    refuse: str | None = None


#: every LLaDA / Dream argument mptlml reads: name -> :class:`Peer`
PEERS: dict[str, Peer] = {
    "model_path": Peer("LLaDA", "pretrained"),
    "mask_id": Peer("LLaDA", "mask_token_id"),
    "is_check_greedy": Peer("LLaDA", "greedy"),
    "mc_num": Peer("both", "mc_num"),
    "cfg": Peer("LLaDA", "cfg", _llada_cfg),
    "classifier_free_guidance": Peer("Dream", "cfg", _dream_cfg),
    "max_length": Peer("both", "max_length"),
    "add_bos_token": Peer("Dream", "add_bos_token"),
    "nll_type": Peer("Dream", None, only=("mc", "the Monte Carlo ELBO; 'ar_ftb'/'ar_btf' score "
                                                "one fixed autoregressive order, which mptlml "
                                                "does not")),
    "log_type": Peer("Dream", None, only=("ftb", "log p(target | prefix); 'btf' and 'union' "
                                                 "score the prefix too")),
    "parallelize": Peer("Dream", None, only=(False, "a model split over GPUs; run "
                                                    "data-parallel with accelerate launch "
                                                    "instead")),
    "autogptq": Peer("Dream", None, only=(False, "GPTQ-quantised weights are not loaded by "
                                                 "mptlml")),
    "sampling_eps": Peer("Dream", None, refuse=(
        "the rate floor of Dream's own Bernoulli masking scheme, which mptlml does not use "
        "(its masks have sizes 1..T, never the empty mask); drop it")),
}
#: every LLaDA / Dream argument taken (for ``--help`` and the docs)
PEER_ARGUMENTS = tuple(k for k, v in PEERS.items() if v.refuse is None)

#: what the peers' own model names add to ``--model_args`` (as their adapters' defaults):
#: remote code (LLaDA's and Dream's checkpoints), 128 masked inputs per request
MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "llada_dist": {"trust_remote_code": True, "mc_num": 128},
    "dream": {"trust_remote_code": True, "mc_num": 128},
}


def translate(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``options`` with LLaDA's and Dream's arguments in mptlml's terms (:data:`PEERS`).

    Returns
    -------
    options : dict
        The rest unchanged; each peer argument under mptlml's name (converted), or
        dropped at its one supported value.
    spelt : dict
        mptlml's name -> the name the user passed, for every translated argument: the
        messages name what the user wrote (``is_check_greedy``, not ``greedy``).

    Raises
    ------
    TypeError
        An argument given under two spellings (``model_path`` and ``pretrained``; ``cfg``
        and ``classifier_free_guidance``). The generation options are read before, by
        :func:`mptlml.lm_eval.generation.generation_settings`.
    ValueError
        A value mptlml does not do (named, with what to pass).
    """
    out = {k: v for k, v in options.items() if k not in PEERS}
    spelt: dict[str, str] = {}
    for name, value in options.items():
        peer = PEERS.get(name)
        if peer is None:
            continue
        if peer.refuse is not None:
            raise ValueError(f"model_args {name}={value!r}: {peer.refuse}.")
        if peer.ours is None:
            only, why = peer.only
            if value != only:
                raise ValueError(f"model_args {name}={value!r}: mptlml does {name}={only!r} "
                                 f"only ({why}); drop it or pass {only!r}.")
            continue
        if peer.ours in out:
            raise TypeError(f"model_args {name} and {spelt.get(peer.ours, peer.ours)} are one "
                            f"argument ({peer.whose}'s name and another); pass one of them.")
        out[peer.ours] = peer.convert(value) if peer.convert else value
        spelt[peer.ours] = name
    return out, spelt
