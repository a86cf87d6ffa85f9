"""LLaDA's estimator of log p(x_T | x_C): systematic mask counts in batches, weight L / l.

LLaDA (Nie et al., "Large Language Diffusion Models", 2025; its lm-eval adapter
``eval_llada.py``, after SMDM) scores a continuation of L tokens given its context
by ``mc_num`` masked copies in batches of b. In each batch a start
``k ~ U{1..L}`` sets the b mask counts::

    l_j = ((round(linspace(k, k + (b - 1) L / b, b))_j - 1) mod L) + 1,   j = 0..b-1

(torch's float32 ``linspace`` and round-half-to-even), each count's positions
uniform among the L; a copy gives ``(L / l) sum_{j masked} log p(x_j | rest)`` =
``L * S_hat(x; l)``, and the estimate is the mean over the ``mc_num`` copies
(their batch means averaged). The counts visit every size about evenly, so the
mean is close to the MPT bound ``sum_{l=1..L} S(x; l)``, but not equal: where
``j L / b`` hits a half, round-half-to-even favours even sizes (a bias this
module states, not corrects: ``unbiased = False``).

The batches are independent (a fresh ``k`` each), so the spread of the
``mc_num / b`` batch means gives a standard error, which LLaDA does not report:
``sd(batch means) / sqrt(mc_num / b)``.

Given here so that a published LLaDA number can be reproduced with mptlml before
switching to its own estimators: :class:`LLaDA` (``estimate_lml(model, x,
"llada", num_masks=128, batch=32)``, ``context=`` for a conditional) and
:func:`llada_scores` (contexts and continuations, one seed per pair).
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .._scoring.ragged import run_pairs, sequence_seed
from .._validation import check_positive_int
from ..models.conditional import with_context
from ..models.protocols import RaggedMaskedModel
from ..seeds import check_seed, check_seeds, spawn
from .api import register
from .base import Estimator
from .results import LLaDAScores

__all__ = ["LLaDA", "llada_counts", "llada_masks", "llada_scores"]


def llada_counts(k: int, length: int, batch: int) -> np.ndarray:
    """LLaDA's mask counts of a batch started at ``k``: ``round(linspace(k, k + (b-1) L/b, b))``.

    torch's float32 ``linspace`` and round (half to even), wrapped into 1..L, as
    LLaDA's ``_forward_process`` computes them.
    """
    counts = torch.round(torch.linspace(float(k), k + (batch - 1) * (length / batch),
                                        steps=batch)).long()
    return (((counts - 1) % length) + 1).numpy()


def llada_masks(length: int, mc_num: int, batch: int, generator: torch.Generator
                ) -> torch.Tensor:
    """``(mc_num, L)`` masks of LLaDA's scheme: per batch a start k ~ U{1..L}, the counts
    :func:`llada_counts`, each count's positions uniform (a random permutation's first l)."""
    rows = []
    for _ in range(mc_num // batch):
        k = int(torch.randint(1, length + 1, (), generator=generator))
        for cnt in llada_counts(k, length, batch).tolist():
            m = torch.zeros(length, dtype=torch.bool)
            m[torch.randperm(length, generator=generator)[:cnt]] = True
            rows.append(m)
    return torch.stack(rows)


def _check(mc_num: int, batch: int) -> tuple[int, int]:
    mc_num = check_positive_int(mc_num, "num_masks (LLaDA's mc_num)")
    batch = check_positive_int(batch, "batch (LLaDA's batch_size)")
    if mc_num % batch:
        raise ValueError(f"LLaDA's scheme draws whole batches: num_masks (mc_num) = {mc_num} "
                         f"is not a multiple of batch = {batch}; pass a multiple.")
    return mc_num, batch


def _batch_means(model: Any, ids: list[torch.Tensor], nctx: Sequence[int],
                 seeds: Sequence[int], mc_num: int, batch: int, *, tag: str,
                 **run: Any) -> tuple[list[np.ndarray], int]:
    """Per pair, the ``mc_num / b`` batch means of ``L * S_hat(x; l)``; and the model calls.

    Pair i's masks come from a generator seeded by ``seeds[i]``; its first
    ``nctx[i]`` ids (the context) are never masked. An empty continuation has
    no batch (its log-likelihood is 0).
    """
    lengths = [len(t) - int(c) for t, c in zip(ids, nctx, strict=True)]

    def masks(i: int, d: int, g: torch.Generator) -> torch.Tensor:
        if lengths[i] == 0:
            return torch.zeros(0, d, dtype=torch.bool)
        m = llada_masks(lengths[i], mc_num, batch, torch.Generator().manual_seed(seeds[i]))
        return torch.cat([torch.zeros(mc_num, int(nctx[i]), dtype=torch.bool), m], dim=1)

    out = run_pairs(model, ids, masks, seed=0, tag=tag,
                    spec={"kind": "llada", "num_masks": mc_num, "batch": batch,
                          "seeds": [int(s) for s in seeds],
                          "total_pairs": mc_num * sum(n > 0 for n in lengths)},
                    desc="LLaDA's draws", **run)
    means = []
    for i, s in enumerate(out.sums):
        if lengths[i] == 0:
            means.append(np.zeros(0))
            continue
        m = masks(i, len(ids[i]), torch.Generator())  # the same masks again (seeds[i])
        size = m.sum(1).double().numpy()
        draws = lengths[i] * np.asarray(s, dtype=np.float64) / size
        means.append(draws.reshape(-1, batch).mean(1))
    return means, out.num_model_calls


@register
class LLaDA(Estimator):
    """LLaDA's estimate: the mean of ``(L / l) sum_{masked} log p``, l systematic per batch.

    Parameters
    ----------
    num_masks : int
        LLaDA's ``mc_num``: masked copies per sequence (a multiple of ``batch``).
    batch : int
        LLaDA's ``batch_size``: the copies of one batch, whose counts are
        spread systematically from one random start (:func:`llada_counts`).

    Notes
    -----
    Reproduces a published LLaDA number (``num_masks=128``; LLaDA's runs pass
    lm-eval's ``--batch_size 8`` as ``batch``); ``estimate_lml(..., context=)``
    scores a continuation given its context.
    """

    name = "llada"
    summary = "LLaDA's mean of (L / l) sum log p, l systematic per batch; rounding-biased"
    unbiased = False
    dense = False
    ragged = True

    def __init__(self, num_masks: int = 128, *, batch: int = 32) -> None:
        super().__init__(num_masks)
        self.num_masks, self.batch = _check(num_masks, batch)

    def enumerates_sequence(self, num_tokens: int) -> bool:
        """A one-token continuation has one mask, which every draw scores with weight
        L / l = 1: its estimate is exact (standard error 0, not a missing one), and it is
        scored once (as LLaDA's evaluation takes ``mc_num = 1`` for one-token answers)."""
        return int(num_tokens) == 1

    @property
    def draw_unit(self) -> int:
        """Draws come in whole batches: a round of the sequential engine is a multiple."""
        return self.batch

    def sequence_cells(self, model: RaggedMaskedModel, toks: list[torch.Tensor],
                       counts: Sequence[np.ndarray], seed: int,
                       **run: Any) -> tuple[list[list[np.ndarray]], int]:
        """One cell per sequence: its batch means (independent draws of one term)."""
        seeds = [sequence_seed(seed, i) for i in range(len(toks))]
        means, calls = _batch_means(model, toks, [0] * len(toks), seeds, self.num_masks,
                                    self.batch, tag=self.ragged_tag, **run)
        return [[m] for m in means], calls


def llada_scores(model: RaggedMaskedModel, contexts: Sequence[Any],
                 continuations: Sequence[Any], *, mc_num: int = 128, batch: int = 32,
                 seed: int | Sequence[int] = 0, token_budget: int = 8192,
                 batch_size: int | None = None, chunk_size: int = 64,
                 progress: bool = False, cfg_scale: float = 0.0) -> LLaDAScores:
    """LLaDA's estimate of log p(continuation | context) for each pair, with its error.

    Parameters
    ----------
    model : RaggedMaskedModel
    contexts, continuations : list of str (or token-id lists)
        One context (always visible, never scored; ``""`` none) per continuation.
    mc_num : int
        LLaDA's ``mc_num``: masked copies per pair (module docstring).
    batch : int
        LLaDA's ``batch_size``: masked copies per batch of systematic counts.
    seed : int or list of int
        Pair i's masks come from ``seed[i]``, or from (seed, i) with one int.
    token_budget : int
        As for :func:`mptlml.compare`.
    batch_size : int, optional
        As for :func:`mptlml.compare` (inputs per forward pass).
    chunk_size : int
        As for :func:`mptlml.compare`.
    progress : bool
        As for :func:`mptlml.compare`.
    cfg_scale : float
        LLaDA's ``cfg``: classifier-free guidance by the context, logits
        ``u + (cfg + 1)(c - u)`` (``u`` with the context masked too), as in
        :func:`mptlml.compare`; the scores are then guided scores. 0: none.

    Returns
    -------
    LLaDAScores
    """
    mc_num, batch = _check(mc_num, batch)
    ctxs, conts = list(contexts), list(continuations)
    if len(ctxs) != len(conts):
        raise ValueError(f"{len(ctxs)} contexts for {len(conts)} continuations: pass one "
                         "context per continuation.")
    seeds = ([spawn(check_seed(seed), i) for i in range(len(conts))]
             if isinstance(seed, numbers.Integral) and not isinstance(seed, bool)
             else check_seeds(seed, len(conts)))
    if not conts:
        return LLaDAScores(np.zeros(0), np.zeros(0), mc_num // batch,
                           np.zeros(0, dtype=np.int64), 0)
    scorer = with_context(model, ctxs, cfg_scale=cfg_scale)  # the contexts ride along
    ids = scorer.encode(conts)
    means, calls = _batch_means(scorer, ids, [0] * len(ids), seeds, mc_num, batch, tag="llada",
                                token_budget=token_budget, batch_size=batch_size,
                                chunk_size=chunk_size, progress=progress)
    n = mc_num // batch
    if n < 2:
        warnings.warn(f"llada_scores: mc_num={mc_num} is one batch of batch={batch}: the "
                      "standard errors (the spread of the batch means) are NaN; pass mc_num "
                      "of at least two batches for an error.", RuntimeWarning, stacklevel=2)
    scores = np.array([m.mean() if m.size else 0.0 for m in means])
    stderr = np.array([(m.std(ddof=1) / np.sqrt(n) if n > 1 else np.nan) if m.size else 0.0
                       for m in means])
    rows = np.array([mc_num if m.size else 0 for m in means], dtype=np.int64)
    return LLaDAScores(scores, stderr, n, rows, calls)
