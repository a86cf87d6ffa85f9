"""Masked-LM inputs: corruption of the masked positions, and length-bucketed scoring.

:func:`corrupt` is the one corruption rule of the package, used when scoring
(:class:`~mptlml.models.masked_lm.MaskedLM`) and when training
(:class:`~mptlml.hf.DataCollatorForMPT`): ``"mask"`` replaces every masked
position by [MASK]; ``"bert"`` is BERT's 80/10/10 rule (80% [MASK], 10% a
uniformly random non-special token, 10% unchanged; Devlin et al. 2019).

:func:`score_in_buckets` scores ragged inputs: inputs of different lengths
T_k are sorted by length and cut into consecutive groups whose padded size
``len(group) * max T_k`` stays within a token budget (and, optionally, a
number of inputs); each group is padded, given an attention mask, and scored
in one forward pass. Sorting makes the padding small; results come back in
the inputs' order, so they do not depend on the batching (up to
floating-point padding effects).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["CORRUPTIONS", "accepts_keyword", "corrupt", "dense_mask_rows", "evaluation_mode",
           "logits_of", "ragged_mask_list", "score_in_buckets"]

#: how masked positions are corrupted (:func:`corrupt`).
CORRUPTIONS = ("mask", "bert")

#: ``forward(input_ids, attention_mask, rows, cols, targets[, unconditional=]) -> (n,)``
#: log-probs.
Forward = Callable[..., torch.Tensor]


def corrupt(x: torch.Tensor, masked: torch.Tensor, *, corruption: str, mask_token_id: int,
            replacement_ids: torch.Tensor,
            generator: torch.Generator | None = None) -> torch.Tensor:
    """``x`` with its ``masked`` positions corrupted (a new tensor; same shape).

    ``"mask"``: [MASK] everywhere masked (no randomness). ``"bert"``: draws
    ``u ~ U[0, 1)`` and a replacement from ``replacement_ids`` for every
    position (in that order, from ``generator``; None: torch's global one),
    then [MASK] where ``u < 0.8``, the replacement where ``0.8 <= u < 0.9``,
    the original token otherwise.
    """
    if corruption == "mask":
        out = x.clone()
        out[masked] = mask_token_id
        return out
    u = torch.rand(masked.shape, generator=generator)
    rnd = replacement_ids[torch.randint(replacement_ids.numel(), masked.shape,
                                        generator=generator)]
    out = torch.where(masked & (u < 0.8), mask_token_id, x)
    return torch.where(masked & (u >= 0.8) & (u < 0.9), rnd, out)


@contextlib.contextmanager
def evaluation_mode(module: nn.Module) -> Iterator[None]:
    """Run ``module`` in eval mode (no dropout) and give every submodule its mode back after.

    A model left in train mode (``model.train()``, or by a training loop such as
    ``MPTTrainer``) would otherwise be scored with dropout on, which changes
    every log-probability without a word.
    """
    modes = [(m, m.training) for m in module.modules()]
    if not any(t for _, t in modes):
        yield
        return
    module.eval()
    try:
        yield
    finally:
        for m, t in modes:
            m.training = t


def accepts_keyword(module: nn.Module, name: str) -> bool:
    """Whether ``module``'s forward takes the keyword ``name`` (or any keyword)."""
    try:
        params = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return True
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD
                                 for p in params.values())


def logits_of(output: Any, name: str = "the model") -> torch.Tensor:
    """The logits ``(B, T, V)`` in a forward's output: a tensor, ``.logits`` or a tuple's first."""
    if isinstance(output, torch.Tensor):
        logits = output
    elif isinstance(getattr(output, "logits", None), torch.Tensor):
        logits = output.logits
    elif isinstance(output, tuple | list) and output and isinstance(output[0], torch.Tensor):
        logits = output[0]
    else:
        raise TypeError(
            f"{name} returned {type(output).__name__}, not logits: a module scored by MaskedLM "
            "must return a (batch, length, vocabulary) tensor, or an object with .logits "
            "(load a model with its language-model head, e.g. AutoModelForMaskedLM).")
    if logits.ndim != 3:
        raise ValueError(f"{name} returned logits of shape {tuple(logits.shape)}; MaskedLM "
                         "needs (batch, length, vocabulary).")
    return logits


def score_in_buckets(forward: Forward, pad_id: int, inputs: Sequence[torch.Tensor],
                     positions: Sequence[torch.Tensor], targets: Sequence[torch.Tensor], *,
                     token_budget: int = 8192, batch_size: int | None = None,
                     progress: Any = None, equal_lengths: bool = False,
                     unconditional: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor]:
    """Score ``targets[k]`` at ``positions[k]`` of every input ``inputs[k]``.

    Parameters
    ----------
    forward : callable
        ``forward(input_ids, attention_mask, rows, cols, targets)``: log-probs
        ``(n,)`` of a padded batch at the given (row, column) positions (or
        ``(n, k)``: k numbers per position, e.g. a top log-prob and its token id).
    pad_id : int
        Padding token id.
    inputs : list of LongTensor ``(T_k,)``
    positions, targets : list of LongTensor ``(m_k,)``
    token_budget : int
        Upper bound on ``batch_size * padded_length`` of one forward pass.
    batch_size : int, optional
        Upper bound on the inputs of one forward pass (besides the budget).
    progress : tqdm-like, optional
        ``progress.update(n)`` after each forward pass of n inputs.
    equal_lengths : bool
        Only inputs of one length share a forward pass (no padding), for a
        model that takes no attention mask and would otherwise attend to pads.
    unconditional : list of LongTensor ``(T_k,)``, optional
        A second input per input, of its length (classifier-free guidance: the
        same input with its prompt masked too), padded alike and passed to
        ``forward`` as ``unconditional=`` ``(b, T)``; it counts against the
        token budget like its input.

    Returns
    -------
    list of float64 tensors ``(m_k,)`` (``(m_k, k)`` for a forward of k numbers per position)
    """
    n = len(inputs)
    width = 1 if unconditional is None else 2  # a guided input runs twice
    lengths = torch.tensor([len(t) for t in inputs])
    order = torch.argsort(lengths, stable=True).tolist()
    out: list[torch.Tensor | None] = [None] * n
    i = 0
    while i < n:
        j = i + 1
        while j < n and (j - i + 1) * width * int(lengths[order[j]]) <= token_budget and (
                batch_size is None or j - i < batch_size) and (
                not equal_lengths or lengths[order[j]] == lengths[order[i]]):
            j += 1
        tmax = int(lengths[order[j - 1]])  # ascending order: the last is the longest
        idx = order[i:j]
        b = len(idx)
        ids = torch.full((b, tmax), pad_id, dtype=torch.long)
        uids = None if unconditional is None else ids.clone()
        att = torch.zeros((b, tmax), dtype=torch.long)
        rs, cs, ts = [], [], []
        for r, k in enumerate(idx):
            t = inputs[k]
            ids[r, :len(t)] = t
            if uids is not None:
                uids[r, :len(t)] = unconditional[k]  # type: ignore[index]
            att[r, :len(t)] = 1
            rs.append(torch.full((len(positions[k]),), r, dtype=torch.long))
            cs.append(positions[k])
            ts.append(targets[k])
        extra = {} if uids is None else {"unconditional": uids}
        lp = forward(ids, att, torch.cat(rs), torch.cat(cs), torch.cat(ts), **extra)
        lp = lp.double().cpu().split([len(positions[k]) for k in idx])
        for k, v in zip(idx, lp, strict=True):
            out[k] = v
        if progress is not None:
            progress.update(b)
        i = j
    return out  # type: ignore[return-value]


def dense_mask_rows(mask: Any, n: int, d: int) -> tuple[list[torch.Tensor], bool]:
    """The masks of N equal-length sequences of D tokens, one ``(B, D)`` tensor per sequence.

    ``mask`` is bool ``(D,)``, ``(B, D)`` (shared by every sequence) or
    ``(B, N, D)`` (per sequence), as in :class:`~mptlml.models.base.MaskedModel`.
    Also returns whether the input was ``(D,)`` (the result is squeezed).
    """
    m = mask if isinstance(mask, torch.Tensor) else torch.as_tensor(mask)
    if m.dtype != torch.bool or m.ndim not in (1, 2, 3) or m.shape[-1] != d:
        raise ValueError(f"mask must be bool of shape (D,), (B, D) or (B, N, D) with "
                         f"D={d}; got {m.dtype} {tuple(m.shape)}.")
    squeeze = m.ndim == 1
    m3 = m[None] if squeeze else m
    if m3.ndim == 2:
        m3 = m3[:, None, :].expand(-1, n, -1)
    if m3.shape[1] != n:
        raise ValueError(f"a (B, N, D) mask needs N={n}; got {tuple(m3.shape)}.")
    return [m3[:, i, :] for i in range(n)], squeeze


def ragged_mask_list(mask: Any, ids: Sequence[torch.Tensor],
                     ) -> tuple[list[torch.Tensor], list[bool]]:
    """One bool ``(Q_i, D_i)`` mask per ragged sequence, and which were given as ``(D_i,)``."""
    if not isinstance(mask, list | tuple) or len(mask) != len(ids):
        raise ValueError(f"for ragged sequences pass a list of {len(ids)} bool masks, one per "
                         "sequence, each of shape (D_i,) or (Q_i, D_i).")
    masks, flat = [], []
    for i, (t, m) in enumerate(zip(ids, mask, strict=True)):
        m = torch.as_tensor(m)
        if m.dtype != torch.bool or m.shape[-1] != len(t) or m.ndim not in (1, 2):
            raise ValueError(f"mask {i} must be bool of shape (D_i,) or (Q_i, D_i) with "
                             f"D_i={len(t)}; got {m.dtype} {tuple(m.shape)}.")
        flat.append(m.ndim == 1)
        masks.append(m[None] if m.ndim == 1 else m)
    return masks, flat
