"""Generation from a masked-diffusion LM: LLaDA's sampler (low-confidence remasking in blocks).

The completion of ``N`` tokens starts fully masked after the prompt and is cut into
``N / block_length`` blocks filled left to right (semi-autoregressive). Each block gets
``steps / num_blocks`` steps; at step s of a block holding ``m`` masked tokens the number
unmasked is ``k_s = floor(m / S) + [s < m mod S]`` (S steps per block: as even as
possible, the first ones one more). At each step the model sees the whole current
sequence and, at every masked position j of the current block,

    x0_j = argmax_v ( l_jv + T g_jv ),   g_jv ~ Gumbel(0, 1) i.i.d.  (T = 0: the argmax),
    c_j  = softmax(l_j)[x0_j]                ("low_confidence")
         | u_j ~ U(0, 1)                     ("random"),

l the logits (over the allowed ids: every id but the mask id, unless restricted; the
confidence reads the model's own softmax); the ``k_s`` positions of highest c_j are set
to their x0_j and the others stay masked (remasked). Positions of later blocks are never
unmasked early (their confidence is -inf). ``l + T g`` is LLaDA's ``exp(l) / (-log u)^T``
in log space (the same argmax; Gumbel-max sampling from ``softmax(l / T)``).

Every row draws its noise from its own stream (seed, row), so a prompt's completion does
not depend on the batch it is in; at ``temperature=0`` the sampler is deterministic. The
model input is the model's frame around ``prompt + completion`` (its prefix and suffix:
[CLS] ... [SEP] for BERT, LLaDA's BOS), the same input its scores are read from; with
shifted logits (Dream's head) the logits of position i are read at i - 1.

Reference: Nie et al., "Large Language Diffusion Models", 2025 (LLaDA), Sec. 2.4 and
Appendix B.3 (semi-autoregressive low-confidence remasking).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .._validation import check_positive_int
from ..models.masked_lm import MaskedLM
from ..models.mlm_inputs import accepts_keyword, evaluation_mode, logits_of
from ..models.sequence_input import as_token_ids
from ..seeds import spawn

__all__ = ["REMASKING", "Generation", "generate", "transfer_counts"]

#: how the positions kept masked at a step are chosen (module docstring)
REMASKING = ("low_confidence", "random")


@dataclass
class Generation:
    """Completions of a batch of prompts.

    Attributes
    ----------
    ids : list of LongTensor
        Each prompt's ``max_new_tokens`` generated content ids.
    texts : list of str
        Each completion decoded (special tokens skipped).
    prompt_ids : list of LongTensor
        Each prompt's content ids, as the model read them.
    forwards : int
        Forward rows run (one per prompt and step).
    """

    ids: list[torch.Tensor]
    texts: list[str]
    prompt_ids: list[torch.Tensor]
    forwards: int


def transfer_counts(masked: int, steps: int) -> list[int]:
    """Tokens unmasked at each of ``steps`` steps of a block of ``masked`` masked tokens.

    ``floor(masked / steps)`` each, the first ``masked mod steps`` one more (LLaDA's
    schedule: a linear one in expectation, made exact in integers).
    """
    base, extra = divmod(int(masked), int(steps))
    return [base + (s < extra) for s in range(int(steps))]


def _check(max_new_tokens: Any, steps: Any, block_length: Any, temperature: Any,
           remasking: Any) -> tuple[int, int, int, float]:
    n = check_positive_int(max_new_tokens, "max_new_tokens")
    s = n if steps is None else check_positive_int(steps, "steps")
    b = n if block_length is None else check_positive_int(block_length, "block_length")
    if n % b:
        raise ValueError(f"max_new_tokens={n} is not a multiple of block_length={b}: the "
                         "completion is cut into equal blocks; pass a divisor of it.")
    if s % (n // b):
        raise ValueError(f"steps={s} is not a multiple of the {n // b} blocks "
                         f"(max_new_tokens / block_length): each block gets steps / blocks "
                         f"steps; pass a multiple of {n // b}.")
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or not (
            math.isfinite(float(temperature)) and float(temperature) >= 0):
        raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got "
                         f"{temperature!r}.")
    if remasking not in REMASKING:
        raise ValueError(f"remasking must be one of {REMASKING}, got {remasking!r}.")
    return n, s, b, float(temperature)


def _forward(lm: MaskedLM, module: torch.nn.Module, x: torch.Tensor,
             lengths: torch.Tensor) -> torch.Tensor:
    """Logits ``(B, L, V)`` (float64) of right-padded inputs, shifted for a shifted head.

    Rows of one length share a forward when the module takes no ``attention_mask``.
    """
    takes_mask = accepts_keyword(getattr(lm, "model", module), "attention_mask")
    groups = [torch.arange(len(x))] if takes_mask else [
        (lengths == n).nonzero().flatten() for n in lengths.unique()]
    out: torch.Tensor | None = None
    dev = next(module.parameters()).device
    for rows in groups:
        width = int(lengths[rows].max())
        ids = x[rows, :width]
        extra = {}
        if takes_mask:
            att = (torch.arange(width) < lengths[rows][:, None]).long()
            extra = {"attention_mask": att.to(dev)}
        logits = logits_of(module(input_ids=ids.to(dev), **extra), "the model",
                           ids.shape).double().cpu()
        if lm.shift_logits:  # Dream's head: position i predicted at i - 1
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        if out is None:
            out = torch.zeros(len(x), x.shape[1], logits.shape[-1], dtype=torch.float64)
        out[rows, :width] = logits
    assert out is not None
    return out


def generate(lm: MaskedLM, prompts: Sequence[Any], *, max_new_tokens: int = 128,
             steps: int | None = None, block_length: int | None = None,
             temperature: float = 0.0, remasking: str = "low_confidence",
             seed: int | Sequence[int] = 0,
             batch_size: int | None = None, allowed_ids: Sequence[int] | None = None,
             module: torch.nn.Module | None = None) -> Generation:
    """Complete each prompt with LLaDA's sampler (module docstring).

    Parameters
    ----------
    lm : MaskedLM
        Any :class:`~mptlml.models.MaskedLM` (BERT-style, LLaDA, Dream's shifted head, a
        plain module with a mask id).
    prompts : list of str or token-id lists
        The prompts (content, without special tokens; the model's frame is added).
    max_new_tokens : int
        Tokens generated per prompt (LLaDA's ``gen_length``).
    steps : int, optional
        Sampling steps in all (a multiple of the number of blocks); default
        ``max_new_tokens`` (one token per step).
    block_length : int, optional
        Tokens per semi-autoregressive block (a divisor of ``max_new_tokens``); default
        ``max_new_tokens`` (one block).
    temperature : float
        Gumbel noise scale T (0: greedy, deterministic).
    remasking : {"low_confidence", "random"}
        Which masked positions are kept masked at a step.
    seed : int or list of int
        Row i draws its noise from the stream (seed, i), or from ``seed[i]``'s stream.
    batch_size : int, optional
        Prompts per forward (default: all).
    allowed_ids : sequence of int, optional
        The ids a position may take (default: every id but the mask id, which is never
        generated); the argmax runs over them, the confidence is the model's softmax.
    module : torch.nn.Module, optional
        The module whose forward gives the logits (default ``lm.model``; a trainer passes
        its wrapped model).

    Returns
    -------
    Generation
    """
    if not isinstance(lm, MaskedLM):
        raise TypeError(f"lm must be an mptlml.models.MaskedLM, got {type(lm).__name__}.")
    if isinstance(prompts, str | bytes):
        raise TypeError(f"prompts must be a list (one entry per completion), got a single "
                        f"string {prompts[:40]!r}; pass [{prompts[:40]!r}].")
    n_new, n_steps, block, temp = _check(max_new_tokens, steps, block_length, temperature,
                                         remasking)
    prompts = list(prompts)
    if not prompts:
        raise ValueError("prompts is empty: pass at least one prompt.")
    seeds = [seed] if isinstance(seed, numbers.Integral) else list(seed)
    if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= 0
               for v in seeds) or (not isinstance(seed, numbers.Integral)
                                   and len(seeds) != len(prompts)):
        raise ValueError(f"seed must be an int >= 0 or one such int per prompt, got {seed!r}.")
    streams = ([spawn(int(seed), i) for i in range(len(prompts))]
               if isinstance(seed, numbers.Integral) else [spawn(int(v)) for v in seeds])
    bs = len(prompts) if batch_size is None else check_positive_int(batch_size, "batch_size")
    enc = lm.encode(prompts)
    frame = len(lm.prefix) + len(lm.suffix)
    longest = max(len(p) for p in enc) + n_new + frame
    if longest > lm.max_length:
        raise ValueError(f"a prompt of {longest - n_new - frame} tokens with max_new_tokens="
                         f"{n_new} needs {longest} positions, over the model's "
                         f"{lm.max_length}; pass shorter prompts or fewer new tokens.")
    if lm.shift_logits and not lm.prefix and min(len(p) for p in enc) == 0:
        raise ValueError("an empty prompt with a shifted head and no BOS: the first token "
                         "has no position before it to be read from; pass a prompt.")
    module = lm.model if module is None else module
    banned = torch.zeros(lm.vocab_size, dtype=torch.bool)
    if allowed_ids is None:
        banned[int(lm.mask_token_id)] = True
    else:
        allowed = as_token_ids(list(allowed_ids), "allowed_ids", "pass integer vocabulary ids")
        if len(allowed) == 0 or allowed.min() < 0 or allowed.max() >= lm.vocab_size or (
                allowed == int(lm.mask_token_id)).any():
            raise ValueError(f"allowed_ids must be non-empty ids of the vocabulary (0.."
                             f"{lm.vocab_size - 1}) other than the mask id "
                             f"{lm.mask_token_id}.")
        banned[:] = True
        banned[allowed] = False
    out_ids: list[torch.Tensor] = []
    forwards = 0
    with torch.no_grad(), evaluation_mode(module):
        for start in range(0, len(enc), bs):
            rows = enc[start:start + bs]
            gens = [torch.Generator().manual_seed(streams[start + i]) for i in range(len(rows))]
            done, used = _sample(lm, module, rows, gens, n_new, n_steps, block, temp, remasking,
                                 banned)
            out_ids.extend(done)
            forwards += used
    tok = lm.tokenizer
    texts = [tok.decode(ids.tolist(), skip_special_tokens=True) for ids in out_ids]
    return Generation(ids=out_ids, texts=texts, prompt_ids=enc, forwards=forwards)


def _sample(lm: MaskedLM, module: torch.nn.Module, prompts: list[torch.Tensor],
            gens: list[torch.Generator], n_new: int, n_steps: int, block: int, temp: float,
            remasking: str, banned: torch.Tensor) -> tuple[list[torch.Tensor], int]:
    """LLaDA's sampler over one batch of prompts: the completions and the forward rows."""
    pre = torch.tensor(lm.prefix, dtype=torch.long)
    suf = torch.tensor(lm.suffix, dtype=torch.long)
    mask_id = int(lm.mask_token_id)
    rows = [torch.cat([pre, p.long(), torch.full((n_new,), mask_id), suf]) for p in prompts]
    lengths = torch.tensor([len(r) for r in rows])
    x = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True,
                                        padding_value=int(lm.pad_token_id))
    starts = [len(pre) + len(p) for p in prompts]  # first completion position of each row
    num_blocks = n_new // block
    per_block = n_steps // num_blocks
    forwards = 0
    for b in range(num_blocks):
        counts = [transfer_counts(block, per_block)] * len(rows)  # every block starts masked
        for s in range(per_block):
            logits = _forward(lm, module, x, lengths)
            forwards += len(rows)
            for i, g in enumerate(gens):
                lo, hi = starts[i] + b * block, starts[i] + (b + 1) * block
                l_blk = logits[i, lo:hi]  # (block, V)
                masked = x[i, lo:hi] == mask_id
                pick_from = l_blk.masked_fill(banned[:l_blk.shape[-1]], -math.inf)
                if temp > 0:
                    u = torch.rand(l_blk.shape, generator=g, dtype=torch.float64)
                    x0 = (pick_from - temp * torch.log(-torch.log(u))).argmax(-1)
                else:
                    x0 = pick_from.argmax(-1)
                if remasking == "low_confidence":
                    conf = torch.softmax(l_blk, -1).gather(1, x0[:, None]).squeeze(1)
                else:
                    conf = torch.rand(block, generator=g, dtype=torch.float64)
                conf = torch.where(masked, conf, torch.tensor(-math.inf, dtype=torch.float64))
                k = counts[i][s]
                if k:
                    pick = torch.topk(conf, k).indices
                    x[i, lo + pick] = x0[pick]
    out = [x[i, starts[i]:starts[i] + n_new].clone() for i in range(len(rows))]
    return out, forwards
