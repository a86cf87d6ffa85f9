"""Block-diffusion LMs: which family is one, where its blocks lie, how a masked input is laid out.

A block-diffusion LM (BD3-LM, SDAR, LLaDA2.x, Fast-dLLM v2) with block size B factorises
left to right over blocks of B input positions, counted from the input's first position
(the BOS, a context, included), and is a masked-diffusion model within each block; its
attention is block-causal. By Proposition 1 within each block,

    log p(x) = sum_b log p(x_b | x_<b) >= sum_b sum_{M=1..|b|} S_b(x; M),
    S_b(x; M) = E_{mask in b, |mask| = M} [ (1/M) sum_{j in mask} log p(x_j | x_{b - mask}, x_<b) ],

the masks drawn inside block b, the earlier blocks clean and visible, the later ones not
visible. A masked input of a block model is therefore a mask per block, each block's masked
set scored against its own visible tokens and the clean earlier blocks:

- ``"xt_x0"`` (BD3-LM's training layout): the noised copy x_t (every block with its own
  mask) followed by the clean copy x_0, each padded with the mask id to the same length L
  (a multiple of B; ``config.model_length`` where the model fixes it); the model's
  block-diffusion attention lets x_t's block b see x_t's block b and x_0's blocks before b,
  so one forward of length 2L scores every block's mask at once;
- ``"prefix"``: the clean blocks before b and the noised block b, cut at the block's end:
  one forward per block (the prefix recomputed for each).

A block only partly filled (the last block of a text, or the block where a continuation
starts after its context) is padded with the mask id to its end: the tail is masked, as
the model was trained, and the block's term is the bound of the marginal of its first
tokens. Where a continuation starts inside a block, the block's context tokens are clean
and visible, and its term is the conditional MPT sum over the continuation's tokens of
that block only.

Reference: Arriola et al., "Block Diffusion: Interpolating Between Autoregressive and
Diffusion Language Models" (BD3-LM), ICLR 2025, Sec. 3 (the x_t + x_0 layout, its
attention mask); Moreno-Munoz, Recasens, Hauberg, "On Masked Pre-training and the
Marginal Likelihood", NeurIPS 2023, Proposition 1.
"""

from __future__ import annotations

from typing import Any

import torch

from .conventions import CONVENTIONS, LAYOUTS, Convention, convention_of

__all__ = ["block_inputs", "block_spans", "check_block_family"]


def _config_block(config: Any) -> tuple[Convention | None, int | None]:
    """The family a config names (by ``model_type``) and the block size it states."""
    b = getattr(config, "block_size", None)
    return convention_of(config), (int(b) if isinstance(b, int) and not isinstance(b, bool)
                                   else None)


def check_block_family(conv: Convention | None, config: Any, block_size: Any,
                       corruption: str) -> tuple[int | None, str | None, bool]:
    """A model's block size, layout and SUBS, refusing a family that does not match it.

    A full-attention family given to a block model (its config's ``model_type`` a block
    family's, dllm #93's failure) or a block family given to a model whose config names a
    full-attention family is refused by name, as is ``block_size=`` without a block family.
    Returns ``(B, layout, subs)``; ``(None, None, False)`` for a full-attention model.
    """
    named, stated = _config_block(config)
    fam = next((k for k, c in CONVENTIONS.items() if c is conv), None)
    if conv is not None and not conv.is_block and named is not None and named.is_block:
        raise ValueError(
            f"family={fam!r} is a full-attention family, but this model's config says "
            f"model_type={config.model_type!r}, a block-diffusion LM ({named.name}): a "
            "full-attention estimate of it means nothing. Leave family=None (read from the "
            f"config), or pass the block family.")
    if conv is not None and conv.is_block and named is not None and not named.is_block:
        raise ValueError(
            f"family={fam!r} is a block-diffusion family ({conv.name}), but this model's "
            f"config says model_type={config.model_type!r}, a full-attention LM "
            f"({named.name}). Leave family=None, or pass the model's own family.")
    if conv is None or not conv.is_block:
        if block_size is not None:
            raise ValueError(f"block_size={block_size!r} applies to a block-diffusion family "
                             f"({', '.join(k for k, c in CONVENTIONS.items() if c.is_block)}); "
                             f"this model's family is {'BERT-style' if conv is None else conv.name}"
                             ". Pass family= with it.")
        return None, None, False
    if block_size is None:
        b = stated if stated is not None else conv.block_size_of(config)
    else:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}.")
        if stated is not None and stated != block_size:
            raise ValueError(f"block_size={block_size} disagrees with the model's config "
                             f"(block_size={stated}); leave block_size=None.")
        b = int(block_size)
    if corruption != "mask":
        raise ValueError(f"corruption={corruption!r} does not apply to a block-diffusion LM "
                         "(its masked tokens are the mask id); use corruption='mask'.")
    assert conv.layout in LAYOUTS
    return int(b), conv.layout, bool(conv.subs)


def block_spans(length: int, offset: int, block_size: int) -> list[tuple[int, int]]:
    """The blocks of ``length`` content tokens that start at input position ``offset``.

    ``(start, end)`` in content coordinates, in order: block b holds the input positions
    ``[b B, (b + 1) B)``; the first span is short when the content starts inside a block
    (a BOS, a context before it), the last when it ends inside one.
    """
    out, j = [], 0
    while j < length:
        end = min(length, (offset + j) // block_size * block_size + block_size - offset)
        out.append((j, end))
        j = end
    return out


def block_inputs(clean: torch.Tensor, noised: torch.Tensor, positions: torch.Tensor,
                 block_size: int, layout: str, mask_id: int, length: int | None = None
                 ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A block model's input(s) for one masked row: ``[(input, scored positions), ...]``.

    ``clean`` and ``noised`` ``(T,)`` are the whole input (frame, context, content) clean and
    with the row's mask applied; ``positions`` the masked input positions to score. With
    ``"xt_x0"`` one input ``x_t + x_0`` of length 2L (L the multiple of B that holds T, or
    ``length`` where the model fixes it); with ``"prefix"`` one input per block holding a
    scored position: the clean input before the block, the noised block, padded with the
    mask id to the block's end.
    """
    t, b = int(clean.shape[0]), int(block_size)
    full = -(-t // b) * b
    if layout == "xt_x0":
        n = full if length is None else int(length)
        if n < t:
            raise ValueError(f"an input of {t} tokens is longer than the model's fixed length "
                             f"{n} (config.model_length): pass shorter texts.")
        pad = torch.full((n - t,), mask_id, dtype=torch.long)
        return [(torch.cat([noised, pad, clean, pad]), positions)]
    out = []
    blocks = positions // b
    for k in torch.unique(blocks).tolist():
        start, end = k * b, (k + 1) * b
        pad = torch.full((max(0, end - t),), mask_id, dtype=torch.long)
        out.append((torch.cat([clean[:start], noised[start:end], pad]),
                    positions[blocks == k]))
    return out

