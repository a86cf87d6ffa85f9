"""Tokens and words of a masked LM's sequences (plain functions of its public parts).

A *word* is a run of sub-tokens that the tokenizer's pre-tokenizer kept
together (``"unhappy"`` -> ``un ##happy``), read from a fast tokenizer's
``word_ids()``. Word-level scores need one operation beyond the ragged
protocol: the input hides a set M of content positions but only a subset
T of M is scored,

    sum_{j in T} log p(x_j | x_{-M}),   T subset of M,

which PLL-word-l2r uses (T = one sub-token, M = it and the later sub-tokens
of its word; Kauf & Ivanova 2023). :meth:`MaskedLM.ragged_target_log_prob
<mptlml.models.masked_lm.MaskedLM.ragged_target_log_prob>` computes it after
:func:`check_targets`; with T = M it is ``ragged_masked_log_prob``.

The functions here take the model's public parts only (its ``tokenizer``,
``preprocess`` and ``encode``); :class:`~mptlml.models.masked_lm.MaskedLM`
implements :class:`~mptlml.models.protocols.WordMaskedModel` with them.

Reference: C. Kauf, A. Ivanova, "A Better Way to Do Masked Language Model
Scoring", ACL 2023 (arXiv:2305.10588).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .sequence_input import normalise_sequences

__all__ = ["check_targets", "encode_words", "require_fast_tokenizer", "token_strings"]


def require_fast_tokenizer(tokenizer: Any, what: str) -> None:
    """Raise unless ``tokenizer`` is a fast (Rust ``tokenizers``) tokenizer with ``word_ids``."""
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(
            f"{what} needs a fast tokenizer: words come from its word_ids(), which "
            f"{type(tokenizer).__name__} (a slow, pure-Python tokenizer) does not provide. "
            "Load the tokenizer with AutoTokenizer.from_pretrained(name) (fast by default), "
            "or score tokens instead (whole_word=False, variant='original')."
        )


def token_strings(tokenizer: Any, ids: torch.Tensor) -> list[str]:
    """The vocabulary strings of content ids ``(D,)`` (e.g. ``["un", "##happy"]``)."""
    return [str(t) for t in tokenizer.convert_ids_to_tokens([int(i) for i in ids])]


def encode_words(model: Any, sequences: Sequence[str],
                 ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[list[str]]]:
    """Content ids, the word of each token, and the words' texts.

    The one definition of a masked LM's words:
    :class:`~mptlml.models.masked_lm.MaskedLM` takes it as its method
    ``encode_words`` (of :class:`~mptlml.models.protocols.WordMaskedModel`),
    through which the word-level scores reach it.

    Parameters
    ----------
    model : MaskedLM (anything with ``tokenizer``, ``preprocess`` and ``encode``)
    sequences : list of str
        Texts (token-id sequences carry no word boundaries and are refused).

    Returns
    -------
    ids : list of LongTensor ``(D_i,)``
        As ``model.encode`` returns them (validated, truncated if allowed).
    words : list of LongTensor ``(D_i,)``
        ``words[i][j]`` is the word (0..W_i-1, in order) of token j.
    texts : list of list of str
        The W_i words of each sequence, cut from the (preprocessed) text.

    Raises
    ------
    ValueError
        For a slow tokenizer or a content token the tokenizer gives no word.
    """
    tokenizer, preprocess = model.tokenizer, model.preprocess
    require_fast_tokenizer(tokenizer, "whole-word scoring")
    seqs = normalise_sequences(sequences)
    if not all(isinstance(s, str) for s in seqs):
        raise TypeError("whole-word scoring needs a list of texts: token-id sequences carry "
                        "no word boundaries (the tokenizer's word_ids() come from text).")
    ids = model.encode(seqs)
    texts = [preprocess(s) if preprocess else s for s in seqs]
    enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    words, spans = [], []
    for i, (t, text) in enumerate(zip(ids, texts, strict=True)):
        d = len(t)
        if [int(v) for v in enc["input_ids"][i][:d]] != t.tolist():
            raise ValueError(f"sequence {i}: the tokenizer's ids with offsets differ from "
                             "encode(); whole-word scoring cannot map its tokens to words.")
        wid = enc.word_ids(i)[:d]
        if any(w is None for w in wid):
            raise ValueError(f"sequence {i} has a content token without a word (word_ids() "
                             f"gave None at position {wid.index(None)}); score it with "
                             "whole_word=False, variant='original'.")
        _, inv = torch.unique(torch.tensor(wid, dtype=torch.long), return_inverse=True)
        words.append(inv)
        lo: dict[int, int] = {}
        hi: dict[int, int] = {}
        for w, (a, b) in zip(inv.tolist(), enc["offset_mapping"][i][:d], strict=True):
            lo[w], hi[w] = min(lo.get(w, a), a), max(hi.get(w, b), b)
        spans.append([text[lo[w]:hi[w]] for w in range(len(lo))])
    return ids, words, spans


def check_targets(masks: Sequence[torch.Tensor], targets: Sequence[torch.Tensor]) -> None:
    """Refuse targets T that are not bool subsets of their masks M, row by row."""
    for i, (m, t) in enumerate(zip(masks, targets, strict=True)):
        if m.shape != t.shape or m.dtype != torch.bool or t.dtype != torch.bool:
            raise ValueError(f"masks[{i}] and targets[{i}] must be bool of one shape; got "
                             f"{m.dtype} {tuple(m.shape)} and {t.dtype} {tuple(t.shape)}.")
        if bool((t & ~m).any()):
            raise ValueError(f"targets[{i}] scores positions that masks[{i}] leaves "
                             "visible; a target must be masked.")
