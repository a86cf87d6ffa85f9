"""The ragged-sequence protocol: masked conditionals of sequences of different lengths.

:class:`~mptlml.models.base.MaskedModel` is the protocol of dense data, ``(N, D)``
with one D for every datum. Text and protein sequences have their own length
D_i, so a masked language model exposes a sibling protocol instead: it turns
the user's sequences into token ids and sums the masked conditionals

    sum_{j in mask} log p(x_j | x_R),   mask a subset of the D_i tokens of x,

for many (sequence, mask) pairs at once. The estimators
(:func:`mptlml.estimate_lml`, :func:`mptlml.mpt_curve`, :func:`mptlml.pll`) use
nothing else, and dispatch on which protocol a model implements; they name no
model family. It promises no ``num_tokens``: D_i is a property of each sequence.

Reference: Moreno-Munoz, Recasens, Hauberg, "On Masked Pre-training and the
Marginal Likelihood", NeurIPS 2023, Proposition 1 and Sec. 4.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch

__all__ = ["RaggedMaskedModel", "WordMaskedModel"]


@runtime_checkable
class RaggedMaskedModel(Protocol):
    """A model of ragged token sequences with masked conditionals (e.g. a masked LM).

    Attributes
    ----------
    name : str
        Label used in results and checkpoints.
    """

    name: str

    def encode(self, sequences: Sequence[Any]) -> list[torch.Tensor]:
        """Validated content token ids of each sequence: one ``(D_i,)`` LongTensor each.

        Raises ValueError on an empty or over-long sequence or a foreign id.
        """
        ...

    def ragged_masked_log_prob(self, ids: Sequence[torch.Tensor], masks: Sequence[torch.Tensor],
                               generators: Sequence[torch.Generator | None], *,
                               token_budget: int = 8192, batch_size: int | None = None,
                               progress: Any = None) -> list[torch.Tensor]:
        """Sum of log p(x_j | x_R) over each mask of each sequence.

        Parameters
        ----------
        ids : list of LongTensor ``(D_i,)``
            Sequences from :meth:`encode`.
        masks : list of bool tensors ``(Q_i, D_i)``
            Q_i masks of sequence i; True = masked.
        generators : list of torch.Generator or None
            Randomness of sequence i's input corruption (if any), so that a
            result depends only on (seed, i), not on batching.
        token_budget : int
            Bound on padded tokens per forward pass.
        batch_size : int, optional
            Bound on the inputs of one forward pass. Optional in an
            implementation: callers pass it only when the user set it.
        progress : tqdm-like, optional
            ``progress.update(n)`` after each forward pass of n pairs.

        Returns
        -------
        list of float64 tensors ``(Q_i,)``
        """
        ...

    def fingerprint(self) -> dict[str, Any]:
        """JSON-ready description of the model (name, size, a weights probe, options).

        A checkpoint records it and refuses to resume under another model.
        """
        ...


@runtime_checkable
class WordMaskedModel(RaggedMaskedModel, Protocol):
    """A ragged masked model that also knows its tokens' strings and words.

    Needed by per-token output and word-level scoring (whole-word masking,
    PLL-word-l2r) in :mod:`mptlml.estimators.pseudo_likelihood`; implemented by
    :class:`~mptlml.models.masked_lm.MaskedLM` (:mod:`mptlml.models.word_units`).
    """

    def token_strings(self, ids: torch.Tensor) -> list[str]:
        """The vocabulary strings of content ids ``(D,)``."""
        ...

    def encode_words(self, sequences: Sequence[str],
                     ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[list[str]]]:
        """Content ids ``(D_i,)``, the word (0..W_i-1) of each token, and the words' texts."""
        ...

    def ragged_target_log_prob(self, ids: Sequence[torch.Tensor], masks: Sequence[torch.Tensor],
                               targets: Sequence[torch.Tensor],
                               generators: Sequence[torch.Generator | None], *,
                               token_budget: int = 8192, batch_size: int | None = None,
                               progress: Any = None) -> list[torch.Tensor]:
        """``sum_{j in T} log p(x_j | x_{-M})`` per mask M, targets T a subset of M: ``(Q_i,)``."""
        ...
