"""Greedy decoding of a masked LM, for lm-eval's ``is_greedy``: would the model write this?

lm-eval's ``loglikelihood`` returns, beside log p(continuation | context),
whether greedy decoding would produce the continuation (the ``acc`` of a
``loglikelihood`` task such as LAMBADA, ``exact_match`` of a multiple-choice
task). A masked LM or masked-diffusion LM decodes by unmasking: starting from
the context followed by T masks, each step fills the one masked position the
model is most sure of (highest max_v p(v | input)) with its most probable
token, until none is left. This is the greedy (one token per step,
low-confidence remasking) decoder of masked-diffusion LMs, the rule LLaDA's
lm-eval adapter checks (Nie et al., "Large Language Diffusion Models", 2025).
The continuation is greedy when every step fills the position with the token
the continuation has there; the first step that does not stops that pair.

A block-diffusion LM decodes block by block: each step fills a position of the first block
that still has masked ones, the blocks before it clean (the blocks after it, masked, are
not visible to it).

The steps of many pairs run together: each step is one batch of the pairs
still decoding, through :meth:`mptlml.models.MaskedLM.top_predictions`
(length-bucketed under a token budget).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..models import MaskedLM

__all__ = ["greedy_reproduces"]


def greedy_reproduces(model: MaskedLM, ids: Sequence[torch.Tensor], num_context: Sequence[int],
                      *, token_budget: int = 8192, batch_size: int | None = None) -> list[bool]:
    """Whether greedy unmasking after each context writes exactly its continuation.

    Parameters
    ----------
    model : MaskedLM
    ids : list of LongTensor
        Content ids ``(C_i + T_i,)`` of each context + continuation (no special tokens).
    num_context : list of int
        C_i, the leading ids of each that are the context (always visible).
    token_budget : int
        Padded tokens of one forward pass.
    batch_size : int, optional
        Most inputs of one forward pass (None: as many as ``token_budget`` allows).

    Returns
    -------
    list of bool
        For each pair: True when all T_i steps fill the continuation's own tokens.
    """
    if len(ids) != len(num_context):
        raise ValueError(f"{len(ids)} id sequences for {len(num_context)} context lengths.")
    mask_id = int(model.mask_token_id)
    prefix = torch.tensor(model.prefix, dtype=torch.long)
    suffix = torch.tensor(model.suffix, dtype=torch.long)
    states = []
    for t, c in zip(ids, num_context, strict=True):
        if not 0 <= int(c) < len(t):
            raise ValueError(f"a context of {c} tokens leaves no continuation in {len(t)} ids.")
        s = torch.as_tensor(t, dtype=torch.long).clone()
        s[int(c):] = mask_id
        states.append(s)
    result = [True] * len(ids)
    alive = list(range(len(ids)))
    while alive:
        inputs = [torch.cat([prefix, states[i], suffix]) for i in alive]
        holes = [torch.nonzero(states[i] == mask_id)[:, 0] for i in alive]
        if getattr(model, "block_size", None) is not None:  # a block model decodes its
            b = int(model.block_size)                       # first unfinished block first
            holes = [h[(h + len(prefix)) // b == int(h[0] + len(prefix)) // b] for h in holes]
        tops = model.top_predictions(inputs, [h + len(prefix) for h in holes],
                                     token_budget=token_budget, batch_size=batch_size)
        still = []
        for i, h, (logp, token) in zip(alive, holes, tops, strict=True):
            k = int(torch.argmax(logp))  # the position the model is most sure of
            j = int(h[k])
            if int(token[k]) != int(ids[i][j]):
                result[i] = False
                continue
            states[i][j] = token[k]
            if len(h) > 1:
                still.append(i)
        alive = still
    return result
