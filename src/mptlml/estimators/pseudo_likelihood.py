"""The pseudo-log-likelihood of masked LMs, per sequence, token or word.

For a sequence of content tokens x_1..x_D grouped into words w(1..D) (from the
fast tokenizer's ``word_ids()``), three pseudo-log-likelihoods:

- ``"original"`` (Salazar et al. 2020): every token masked alone,
  ``PLL = sum_t log p(x_t | x_{-t})`` = ``D * S(x; 1)``, the M = 1 term of
  Proposition 1 (Moreno-Munoz, Recasens & Hauberg, NeurIPS 2023) times D;
- whole-word (``whole_word=True``): every word masked as a whole, its score the
  sum of its sub-tokens' log-probs given the rest,
  ``log p(word_w | x_{-w}) ~ sum_{t in w} log p(x_t | x_{-w})``. This is the
  standard whole-word-masking score of the literature: it is the joint
  conditional of the word only if the model's sub-token predictions are
  independent given the visible context (an MLM predicts masked positions
  independently);
- ``"word_l2r"`` (PLL-word-l2r, Kauf & Ivanova 2023): token t is scored with
  itself and the *later* sub-tokens of its word masked,
  ``sum_t log p(x_t | x without {s in word(t): s >= t})``; a word's score is
  the sum over its sub-tokens (a left-to-right chain rule inside the word).

The words come from the model (its ``encode_words``, through
:func:`mptlml._scoring.ragged.encode_units`); a whole-word MPT curve
(:func:`mptlml.mpt_curve` with ``whole_word=True``) counts the same units.

References: Salazar et al., "Masked Language Model Scoring", ACL 2020; Kauf &
Ivanova, "A Better Way to Do Masked Language Model Scoring", ACL 2023.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from .._scoring.ragged import encode_units, run_pairs, targeted, unit_counts, word_model
from .._validation import check_checkpoint_dir, check_options
from ..models.conditional import with_context
from ..models.protocols import RaggedMaskedModel
from .block import block_model, block_pll
from .results import TokenScores, announce_nonfinite

__all__ = ["VARIANTS", "pll"]

VARIANTS = ("original", "word_l2r")


def pll(model: RaggedMaskedModel, sequences: Sequence[str] | Sequence[Sequence[int]], *,
        per_token: bool = False, whole_word: bool = False, variant: str = "original",
        token_budget: int = 8192, chunk_size: int = 8, batch_size: int | None = None,
        checkpoint_dir: str | os.PathLike | None = None,
        progress: bool = False, context: Any = None,
        cfg_scale: float = 0.0) -> torch.Tensor | TokenScores:
    """Pseudo-log-likelihood of each sequence, ``sum_j log p(x_j | x_{-j})``.

    Every non-special token is masked alone (D_i masked copies per sequence),
    exactly; this is what MLM scorers (mlm-scoring, minicons with a sum
    reduction) report, and it equals ``D_i * S(x_i; 1)``. The run options
    (``token_budget``, ``batch_size``, ``chunk_size``, ``checkpoint_dir``) are
    those of :func:`mptlml.mpt_curve`.

    Parameters
    ----------
    per_token : bool
        Return :class:`~mptlml.estimators.results.TokenScores`: one log-prob per
        token (per word with ``whole_word``) and the token strings, as
        minicons' ``token_score`` gives them.
    whole_word : bool
        Mask every word's sub-tokens together (words from a fast tokenizer's
        ``word_ids()``): ``sum_w sum_{t in w} log p(x_t | x_{-w})``.
    variant : {"original", "word_l2r"}
        ``"word_l2r"``: PLL-word-l2r (Kauf & Ivanova 2023), token t scored with
        the later sub-tokens of its word also masked (module docstring).
    context : optional
        Score the conditional instead: one context per sequence (text or ids; one
        string for all), always visible and never scored; the sequences are the
        continuations (see :func:`mptlml.estimate_lml`): ``sum_{j in T} log p(x_j | x_{-j})``.
    cfg_scale : float
        Classifier-free guidance by ``context``, as in :func:`mptlml.estimate_lml`: a
        guided score, not a pseudo-log-likelihood of the model. 0: none.

    Returns
    -------
    torch.Tensor
        float64, shape ``(N,)``; a :class:`~mptlml.estimators.results.TokenScores`
        with ``per_token=True``.

    Notes
    -----
    On a block-diffusion LM (a model with a ``block_size``) the PLL is
    block-causal: ``sum_b sum_{j in b} log p(x_j | x_{b - j}, x_<b)``, each token masked
    alone with its own block's other tokens and the earlier blocks visible and the later
    blocks not (``|b| S_b(x; 1)`` summed over the blocks), every block of a row scored in
    one forward where the layout allows (:func:`~mptlml.estimators.block.block_pll`);
    ``whole_word``, ``variant="word_l2r"``, ``cfg_scale`` and ``checkpoint_dir`` are
    refused there.
    """
    check_options("pll", per_token=per_token, whole_word=whole_word, token_budget=token_budget,
                  chunk_size=chunk_size, batch_size=batch_size, progress=progress)
    check_checkpoint_dir(checkpoint_dir, "pll")
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}.")
    if not isinstance(whole_word, bool) or not isinstance(per_token, bool):
        raise TypeError(f"whole_word and per_token must be bool, got {whole_word!r} and "
                        f"{per_token!r}.")
    if whole_word and variant != "original":
        raise ValueError(f"whole_word=True masks each word's sub-tokens together; variant="
                         f"{variant!r} scores them one by one. Pass one of the two.")
    if context is not None:
        if per_token or whole_word or variant != "original":
            raise ValueError("context= scores the continuation's tokens one at a time; it does "
                             "not combine with per_token, whole_word or variant='word_l2r'.")
    block = block_model(model)
    if block and (whole_word or variant != "original" or cfg_scale != 0
                  or checkpoint_dir is not None):
        raise ValueError(
            f"{getattr(model, 'name', 'this model')} is a block-diffusion LM: its PLL masks each "
            "token alone inside its block (block-causal); whole_word, variant='word_l2r', "
            "cfg_scale and checkpoint_dir do not apply to it here. Drop them.")
    model = with_context(model, context, cfg_scale=cfg_scale)
    if per_token:
        word_model(model, "per-token output")  # token strings: refused before the run
    l2r = variant == "word_l2r"
    ids, words, texts = encode_units(model, sequences, words=whole_word or l2r,
                                     what="whole-word scoring" if whole_word else "PLL-word-l2r")
    maps = words or []

    def eye(i: int, d: int, g: torch.Generator) -> torch.Tensor:
        return torch.eye(d, dtype=torch.bool)  # each unit (token, or word) masked alone

    def l2r_codes(i: int, d: int, g: torch.Generator) -> torch.Tensor:
        return _l2r_codes(maps[i])

    make: Callable[[int, int, torch.Generator], torch.Tensor] = eye
    scorer: Any = model
    units = None
    if whole_word:
        name, tag, unit, units = "whole_word", "pll_whole_word", "word", words
    elif l2r:
        name, tag, unit, make, scorer = "word_l2r", "pll_word_l2r", "token", l2r_codes, targeted(
            model, "PLL-word-l2r")
    else:
        name, tag, unit = "original", "pll", "token"
    spec: dict[str, Any] = {"kind": "pll", "total_pairs": int(unit_counts(ids, units).sum())}
    if name != "original":
        spec["variant"] = name
    if block:  # block-causal: its own block's other tokens and the earlier blocks visible
        sums = block_pll(model, ids, token_budget=token_budget, batch_size=batch_size,
                         progress=progress)[0]
    else:
        sums = run_pairs(scorer, ids, make, seed=0, tag=tag, spec=spec, desc="PLL",
                         units=units, chunk_size=chunk_size, token_budget=token_budget,
                         batch_size=batch_size, checkpoint_dir=checkpoint_dir,
                         progress=progress).sums
    tokens: list[list[str]] = []
    if per_token:
        tokens = (texts if whole_word else  # type: ignore[assignment]
                  [word_model(model, "per-token output").token_strings(t) for t in ids])
    unit_words = (None if words is None else
                  [torch.arange(int(w.max()) + 1) for w in words] if whole_word else words)
    res = TokenScores(
        total=torch.tensor([float(v.sum()) for v in sums], dtype=torch.float64),
        log_probs=[np.asarray(v, dtype=np.float64) for v in sums], tokens=tokens,
        unit=unit, variant=name, words=unit_words, word_texts=texts,
        model=getattr(model, "name", None))
    announce_nonfinite(res.total, "the PLL", "sequences")
    return res if per_token else res.total


def _l2r_codes(w: torch.Tensor) -> torch.Tensor:
    """``(D, D)`` codes: row t scores token t with t and its word's later tokens hidden."""
    d = w.numel()
    pos = torch.arange(d)
    hidden = (w[None, :] == w[:, None]) & (pos[None, :] >= pos[:, None])
    return hidden.to(torch.int8) + torch.eye(d, dtype=torch.int8)
