"""Per-token and per-word scores of masked LMs: PLL variants and whole-word masks.

For a sequence of content tokens x_1..x_D grouped into words w(1..D) (from the
fast tokenizer's ``word_ids()``), three pseudo-log-likelihoods:

- ``"original"`` (Salazar et al. 2020): every token masked alone,
  ``PLL = sum_t log p(x_t | x_{-t})``;
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

:func:`mptlml.models.sequence_input.encode` (a ragged model's content tokens)
and :func:`encode_words` (its tokens and words) are the units every ragged estimator starts from.
A whole-word MPT curve (:func:`mptlml.estimation.ragged.mlm_curve` with
``whole_word=True``) counts words: D_i is the number of words, M_ik words are
masked, and S is the mean word score over the masked words.

References: Salazar et al., "Masked Language Model Scoring", ACL 2020; Kauf &
Ivanova, "A Better Way to Do Masked Language Model Scoring", ACL 2023.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._optional import require
from ..models.protocols import WordMaskedModel
from ..models.sequence_input import encode, normalise_sequences
from .runner import run_pairs

__all__ = ["VARIANTS", "TokenScores", "encode_words", "pll_scores", "targeted",
           "word_counts"]

VARIANTS = ("original", "word_l2r")


@dataclass
class TokenScores:
    """Per-unit log-probs of a PLL run (:func:`mptlml.pll` with ``per_token=True``).

    Attributes
    ----------
    total : torch.Tensor, (N,)
        PLL of each sequence (float64): the sum of its ``log_probs``, equal to
        what ``pll(...)`` returns without ``per_token``.
    log_probs : list of float64 ndarray ``(U_i,)``
        One log-prob per unit of each sequence, in order.
    tokens : list of list of str
        The units: vocabulary strings of the content tokens (``unit="token"``)
        or the words' texts (``unit="word"``).
    unit : {"token", "word"}
        Whole-word scoring has word units; the other variants token units.
    variant : {"original", "whole_word", "word_l2r"}
    words : list of LongTensor ``(U_i,)`` or None
        The word (0..W_i-1) of each unit, for word-level runs.
    word_texts : list of list of str or None
        The W_i words of each sequence, for word-level runs.
    model : str or None
        The model's name.
    """

    total: torch.Tensor
    log_probs: list[np.ndarray]
    tokens: list[list[str]]
    unit: str
    variant: str
    words: list[torch.Tensor] | None = None
    word_texts: list[list[str]] | None = None
    model: str | None = None

    def to_pandas(self, ids: Sequence[str] | None = None) -> Any:
        """A tidy ``pandas.DataFrame``: one row per unit (token, or word) of each sequence.

        Columns ``sequence`` (its index), ``position`` (the unit's place among
        the content units, from 0), ``token`` (the unit's string), ``log_prob``,
        ``model``, ``variant``, ``unit``; ``word`` for word-level runs and
        ``id`` when ``ids`` are given. ``log_prob`` summed per sequence is ``total``.
        """
        require("pandas", "TokenScores.to_pandas()")
        import pandas as pd

        if len(self.tokens) != len(self.log_probs):
            raise ValueError("these scores carry no token strings; run pll(..., per_token=True).")
        names = None if ids is None else [str(i) for i in ids]
        if names is not None and len(names) != len(self.log_probs):
            raise ValueError(f"ids has {len(names)} entries for {len(self.log_probs)} sequences.")
        rows = []
        for i, (toks, lp) in enumerate(zip(self.tokens, self.log_probs, strict=True)):
            for j, (t, v) in enumerate(zip(toks, lp, strict=True)):
                row: dict[str, Any] = {"sequence": i, "position": j, "token": t,
                                       "log_prob": float(v), "model": self.model,
                                       "variant": self.variant, "unit": self.unit}
                if self.words is not None:
                    row["word"] = int(self.words[i][j])
                if names is not None:
                    row["id"] = names[i]
                rows.append(row)
        return pd.DataFrame(rows)

    def word_log_probs(self) -> list[np.ndarray]:
        """Per-word scores: the sum of each word's units' log-probs ``(W_i,)``."""
        if self.words is None:
            raise ValueError("these scores carry no word map; run pll(..., whole_word=True) "
                             "or pll(..., variant='word_l2r') for per-word scores.")
        return [np.bincount(w.numpy(), weights=lp, minlength=int(w.max()) + 1)
                for w, lp in zip(self.words, self.log_probs, strict=True)]

    def rows(self, model: str, ids: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Tidy rows (model, id, position, token, log_prob[, word]) for a CSV.

        ``position`` counts content units from 0 (special tokens excluded);
        ``word`` (word-level runs) is the unit's word number.
        """
        names = list(ids) if ids is not None else [str(i) for i in range(len(self.tokens))]
        out = []
        for i, (sid, toks, lp) in enumerate(zip(names, self.tokens, self.log_probs,
                                                strict=True)):
            for j, (t, v) in enumerate(zip(toks, lp, strict=True)):
                row = {"model": model, "id": sid, "position": j, "token": t,
                       "log_prob": float(v)}
                if self.words is not None:
                    row["word"] = int(self.words[i][j])
                out.append(row)
        return out


def _word_model(model: Any, what: str) -> WordMaskedModel:
    if not isinstance(model, WordMaskedModel):
        raise TypeError(f"{what} needs a model implementing mptlml.models.protocols."
                        f"WordMaskedModel (token strings and words, as the masked-LM adapter of "
                        f"mptlml.models has); "
                        f"got {type(model).__name__}.")
    return model


def encode_words(model: Any, sequences: Any,
                 ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[list[str]]]:
    """``model.encode_words(sequences)``: content ids, word of each token, word texts."""
    return _word_model(model, "whole-word scoring").encode_words(normalise_sequences(sequences))


def word_counts(words: Sequence[torch.Tensor]) -> np.ndarray:
    """W_i, the number of words of each sequence, from the word maps."""
    return np.array([int(w.max()) + 1 for w in words], dtype=np.int64)


class _Targeted:
    """The ragged protocol over a :class:`WordMaskedModel`, for masks with targets.

    A mask holds codes: 0 visible, 1 hidden but not scored, 2 hidden and
    scored; the row's sum is ``sum_{code 2} log p(x_j | x_{code 0})``.
    """

    def __init__(self, model: WordMaskedModel) -> None:
        self.model, self.name = model, model.name
        self.device = getattr(model, "device", None)

    def encode(self, sequences: Any) -> list[torch.Tensor]:
        return self.model.encode(sequences)

    def fingerprint(self) -> dict[str, Any]:
        return self.model.fingerprint()

    def ragged_masked_log_prob(self, ids: Sequence[torch.Tensor], masks: Sequence[torch.Tensor],
                               generators: Sequence[torch.Generator | None],
                               **kwargs: Any) -> list[torch.Tensor]:
        return self.model.ragged_target_log_prob(ids, [m > 0 for m in masks],
                                                 [m == 2 for m in masks], generators, **kwargs)


def targeted(model: Any, what: str) -> _Targeted:
    """``model`` as a ragged scorer of coded masks (0 visible, 1 hidden, 2 hidden and scored).

    Needs :meth:`WordMaskedModel.ragged_target_log_prob`; ``what`` names the
    caller in the TypeError a model without it gets.
    """
    return _Targeted(_word_model(model, what))


def _l2r_codes(w: torch.Tensor) -> torch.Tensor:
    """``(D, D)`` codes: row t scores token t with t and its word's later tokens hidden."""
    d = w.numel()
    pos = torch.arange(d)
    hidden = (w[None, :] == w[:, None]) & (pos[None, :] >= pos[:, None])
    return hidden.to(torch.int8) + torch.eye(d, dtype=torch.int8)


def pll_scores(model: Any, sequences: Any, *, per_token: bool, whole_word: bool, variant: str,
               **run: Any) -> TokenScores:
    """The PLL variants of :func:`mptlml.estimation.ragged.pll`, as :class:`TokenScores`.

    ``tokens`` is filled only with ``per_token`` (it needs the vocabulary
    strings); ``run`` holds the runner's options.
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}.")
    if not isinstance(whole_word, bool) or not isinstance(per_token, bool):
        raise TypeError(f"whole_word and per_token must be bool, got {whole_word!r} and "
                        f"{per_token!r}.")
    if whole_word and variant != "original":
        raise ValueError(f"whole_word=True masks each word's sub-tokens together; variant="
                         f"{variant!r} scores them one by one. Pass one of the two.")
    if per_token:
        _word_model(model, "per-token output")  # token strings: refused before the run
    words: list[torch.Tensor] | None = None
    texts: list[list[str]] | None = None
    if whole_word or variant == "word_l2r":
        what = "whole-word scoring" if whole_word else "PLL-word-l2r"
        ids, words, texts = _word_model(model, what).encode_words(normalise_sequences(sequences))
    else:
        ids = encode(model, sequences)
    maps = words or []

    def word_eye(i: int, d: int, g: torch.Generator) -> torch.Tensor:
        return torch.eye(int(maps[i].max()) + 1, dtype=torch.bool)[:, maps[i]]

    def l2r(i: int, d: int, g: torch.Generator) -> torch.Tensor:
        return _l2r_codes(maps[i])

    def token_eye(i: int, d: int, g: torch.Generator) -> torch.Tensor:
        return torch.eye(d, dtype=torch.bool)

    make: Callable[[int, int, torch.Generator], torch.Tensor]
    scorer: Any = model
    total = sum(len(t) for t in ids)
    if whole_word:
        name, tag, unit, make = "whole_word", "pll_whole_word", "word", word_eye
        total = int(word_counts(maps).sum())
    elif variant == "word_l2r":
        name, tag, unit, make, scorer = "word_l2r", "pll_word_l2r", "token", l2r, targeted(
            model, "PLL-word-l2r")
    else:
        name, tag, unit, make = "original", "pll", "token", token_eye
    spec: dict[str, Any] = {"kind": "pll", "total_pairs": total}
    if name != "original":
        spec["variant"] = name
    out = run_pairs(scorer, ids, make, seed=0, tag=tag, spec=spec, desc="PLL", **run)
    tokens: list[list[str]] = []
    if per_token:
        tokens = (texts if whole_word else  # type: ignore[assignment]
                  [_word_model(model, "per-token output").token_strings(t) for t in ids])
    unit_words = (None if words is None else
                  [torch.arange(int(w.max()) + 1) for w in words] if whole_word else words)
    return TokenScores(
        total=torch.tensor([float(v.sum()) for v in out.sums], dtype=torch.float64),
        log_probs=[np.asarray(v, dtype=np.float64) for v in out.sums], tokens=tokens,
        unit=unit, variant=name, words=unit_words, word_texts=texts,
        model=getattr(model, "name", None))
