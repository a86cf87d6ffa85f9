"""MPT curves, areas, PLL and LML estimates on ragged sequences (masked LMs).

For a sequence x of D non-special tokens and a mask size M,

    S(x; M) = E_mask[(1/M) sum_{j in mask} log p(x_j | x_R)],
    log p(x) = sum_{M=1..D} S(x; M)                     (Proposition 1).

Each sequence has its own D_i. On a grid of masking rates r_1 < ... < r_K
(:mod:`mptlml.estimation.rates`) sequence i gets M_ik = max(1, round(r_k D_i))
masked tokens, P uniform masks per rate; :func:`mlm_curve` returns

- per-sequence S_ik (mean over the P masks) and the *MPT curve* mean_i S_ik
  with standard errors over sequences;
- the paper's *area under the MPT curve* ``L * sum_k w_k mean_i S_ik``;
- the per-sequence LML estimate ``D_i * mean_k S_ik`` (the Riemann form of
  sum_M S, since M = r D), and on request the exact cumulative sum
  ``sum_{M=1..D_i} S_hat(x_i; M)``.

:func:`pll` is the pseudo-log-likelihood sum_j log p(x_j | x_{-j}) that MLM
scorers report (the M = 1 term times D_i, computed exhaustively). The LML
estimators for ragged sequences live in :mod:`mptlml.estimators` (they call
:func:`mlm_curve` and :func:`exact_sum`). Scoring runs through
:func:`mptlml.estimation.runner.run_pairs` (buckets, token budget,
checkpoints, data parallel).

Reference: Moreno-Munoz, Recasens, Hauberg, "On Masked Pre-training and the
Marginal Likelihood", NeurIPS 2023, Proposition 1, Sec. 4, Table 2, Fig. 5.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .._validation import check_positive_int
from ..masks import sample_masks
from ..models.protocols import RaggedMaskedModel
from ..models.sequence_input import encode
from .rates import check_rates, mask_sizes, rate_widths
from .results import MPTCurve, announce_nonfinite, as_float64
from .runner import check_run_size, run_pairs
from .stats import mean_stderr, sum_stderr
from .words import TokenScores, encode_words, pll_scores, word_counts

__all__ = ["exact_sum", "mlm_curve", "pll", "size_cells"]


def pll(model: RaggedMaskedModel, sequences: Sequence[str] | Sequence[Sequence[int]], *,
        per_token: bool = False, whole_word: bool = False, variant: str = "original",
        token_budget: int = 8192, chunk_size: int = 8, batch_size: int | None = None,
        checkpoint_dir: str | os.PathLike | None = None,
        progress: bool = False) -> torch.Tensor | TokenScores:
    """Pseudo-log-likelihood of each sequence, ``sum_j log p(x_j | x_{-j})``.

    Every non-special token is masked alone (D_i masked copies per sequence),
    exactly; this is what MLM scorers (mlm-scoring, minicons with a sum
    reduction) report, and it equals ``D_i * S(x_i; 1)``. The run options
    (``token_budget``, ``batch_size``, ``chunk_size``, ``checkpoint_dir``) are
    those of :func:`mlm_curve`.

    Parameters
    ----------
    per_token : bool
        Return :class:`~mptlml.estimation.words.TokenScores`: one log-prob per
        token (per word with ``whole_word``) and the token strings, as
        minicons' ``token_score`` gives them.
    whole_word : bool
        Mask every word's sub-tokens together (words from a fast tokenizer's
        ``word_ids()``): ``sum_w sum_{t in w} log p(x_t | x_{-w})``.
    variant : {"original", "word_l2r"}
        ``"word_l2r"``: PLL-word-l2r (Kauf & Ivanova 2023), token t scored with
        the later sub-tokens of its word also masked. See
        :mod:`mptlml.estimation.words`.

    Returns
    -------
    torch.Tensor
        float64, shape ``(N,)``; a :class:`~mptlml.estimation.words.TokenScores`
        with ``per_token=True``.
    """
    res = pll_scores(model, sequences, per_token=per_token, whole_word=whole_word,
                     variant=variant, chunk_size=chunk_size, token_budget=token_budget,
                     batch_size=batch_size, checkpoint_dir=checkpoint_dir, progress=progress)
    announce_nonfinite(res.total, "the PLL", "sequences")
    return res if per_token else res.total


def mlm_curve(model: RaggedMaskedModel, sequences: Sequence[str] | Sequence[Sequence[int]], *,
              rates: Any = None, num_masks: int = 1, seed: int = 0,
              nominal_length: float | None = None, exact: bool = False,
              token_budget: int = 8192, chunk_size: int = 8, batch_size: int | None = None,
              checkpoint_dir: str | os.PathLike | None = None, progress: bool = False,
              ids: list[str] | None = None, whole_word: bool = False) -> MPTCurve:
    """MPT curve, area and per-sequence LML estimates on ragged sequences.

    What :func:`mptlml.mpt_curve` computes for a
    :class:`~mptlml.models.protocols.RaggedMaskedModel`.

    Parameters
    ----------
    model : RaggedMaskedModel (a masked language model)
    sequences : list of str or of token-id sequences
        Ragged: each sequence has its own D_i (non-special tokens).
    rates : array-like, optional
        Masking rates in (0, 1), strictly increasing (default 0.01..0.99).
    num_masks : int or sequence of int
        P, uniform masks per (sequence, rate); or one count per rate (an
        allocation, e.g. Neyman's from :func:`mptlml.mpt_curve` with
        ``target_se``). ``num_masks`` of the result is the largest count.
    seed : int
        Masks (and input corruption) of sequence i are drawn from a generator
        seeded by (seed, i).
    nominal_length : float, optional
        L of the area ``L * sum_k w_k curve_k`` (paper: 512); default the
        mean D_i.
    exact : bool
        Also compute ``sum_{M=1..D_i} S_hat(x_i; M)`` (P masks per M).
    token_budget, chunk_size : int
        Padded tokens per forward pass; sequences per checkpointed chunk.
    batch_size : int, optional
        Most inputs per forward pass (besides the token budget). None: the
        budget alone decides.
    checkpoint_dir : path, optional
        Finished chunks are saved atomically under ``checkpoint_dir/curve``
        (``/exact``, ``/pll``) and reused when the same run is started again.
    progress : bool
        Show a progress bar over (sequence, mask) pairs.
    ids : list of str, optional
        Sequence identifiers, kept in the result.
    whole_word : bool
        Units are words (a fast tokenizer's ``word_ids()``), not tokens: D_i
        counts words, M_ik words are masked with all their sub-tokens, and a
        word's log-prob is the sum of its sub-tokens' (the whole-word-masking
        score, :mod:`mptlml.estimation.words`). Recorded as
        ``extra["unit"] = "word"``.

    Returns
    -------
    MPTCurve
        ``per_sample`` (N, K) holds S_ik, ``sizes`` (N, K) M_ik, ``num_tokens``
        (N,) D_i, ``lml`` the Riemann estimates ``D_i * mean_k S_ik``.
    """
    r = check_rates(rates)
    counts = _counts(num_masks, r.size, "rates")
    p = int(counts.max())
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise TypeError(f"seed must be an int, got {seed!r}.")
    if not isinstance(whole_word, bool):
        raise TypeError(f"whole_word must be bool, got {whole_word!r}.")
    words: list[torch.Tensor] | None = None
    if whole_word:
        toks, words, _ = encode_words(model, sequences)
        lengths = word_counts(words)
    else:
        toks = encode(model, sequences)
        lengths = np.array([len(t) for t in toks], dtype=np.int64)
    check_run_size([r.size * p] * len(lengths), lengths, "this MPT curve")
    sizes = np.stack([mask_sizes(int(d), r) for d in lengths])  # (N, K)
    k = r.size
    unit = {"unit": "word"} if whole_word else {}
    suffix = "_whole_word" if whole_word else ""

    def curve_masks(i: int, d: int, g: torch.Generator) -> torch.Tensor:
        m = sample_masks(int(lengths[i]), torch.as_tensor(sizes[i]).repeat_interleave(
            torch.as_tensor(counts)), generator=g)
        return m if words is None else m[:, words[i]]

    run = dict(chunk_size=chunk_size, token_budget=token_budget, batch_size=batch_size,
               checkpoint_dir=checkpoint_dir, progress=progress)
    out = run_pairs(model, toks, curve_masks, seed=int(seed), tag="curve" + suffix,
                    spec={"kind": "curve", "rates": r.tolist(),
                          "num_masks": p if (counts == p).all() else counts.tolist(),
                          "total_pairs": int(len(toks) * counts.sum()), **unit},
                    desc="MPT curve", **run)
    bounds = np.cumsum(counts)[:-1]
    stats = [[mean_stderr(c) for c in np.split(sm, bounds)] for sm in out.sums]
    scores = np.array([[m for m, _ in row] for row in stats]) / sizes  # (N, K)
    scores_se = np.array([[e for _, e in row] for row in stats]) / sizes
    length = float(lengths.mean()) if nominal_length is None else float(nominal_length)
    seq_areas = length * (scores * rate_widths(r)).sum(axis=1)
    lml_se = np.array([lengths[i] / k * float(sum_stderr(scores_se[i] if counts.min() > 1
                                                         else None, scores[i]))
                       for i in range(len(toks))])
    rows = np.full(len(toks), int(counts.sum()), dtype=np.int64)
    curve_mean, curve_se = mean_stderr(scores, axis=0)
    area_mean, area_se = mean_stderr(seq_areas, axis=0)
    res = MPTCurve(
        sizes=torch.from_numpy(sizes), rates=r.tolist(), mean=as_float64(curve_mean),
        stderr=as_float64(curve_se), per_sample=as_float64(scores),
        area=float(area_mean), area_stderr=float(area_se),
        area_is_exact_sum=False, num_tokens=torch.from_numpy(lengths), num_masks=p,
        num_model_calls=out.num_model_calls, seed=int(seed),
        lml_stderr_mean=float(np.sqrt(np.sum(lml_se ** 2))) / len(toks),
        per_sample_stderr=as_float64(scores_se), lml=as_float64(lengths * scores.mean(axis=1)),
        lml_stderr=as_float64(lml_se), nominal_length=length, model=model.name,
        corruption=model.fingerprint().get("corruption"), ids=ids, extra=dict(unit))
    announce_nonfinite(res.per_sample, "the MPT curve", "sequences")
    if exact:
        tot, tse, calls = exact_sum(model, toks, p, int(seed), words=words, **run)
        res.lml_exact, res.lml_exact_stderr = as_float64(tot), as_float64(tse)
        announce_nonfinite(tot, "the cumulative sum over M", "sequences")
        res.num_model_calls += calls
        rows = rows + lengths * p
    res.num_masked_rows, res.num_masked_rows_per_sample = int(rows.sum()), torch.from_numpy(rows)
    return res


def _counts(num_masks: int | Sequence[int] | np.ndarray, num_strata: int, what: str
            ) -> np.ndarray:
    """Masks per stratum: one int for every stratum, or one per stratum (each >= 1)."""
    if isinstance(num_masks, int | np.integer) and not isinstance(num_masks, bool):
        return np.full(num_strata, check_positive_int(num_masks, "num_masks"), dtype=np.int64)
    counts = np.asarray(num_masks)
    if counts.shape != (num_strata,) or counts.dtype.kind not in "iu" or (counts < 1).any():
        raise ValueError(f"num_masks must be a positive int or {num_strata} positive ints (one "
                         f"per entry of {what}); got {num_masks!r}.")
    return counts.astype(np.int64)


def exact_sum(model: RaggedMaskedModel, toks: list[torch.Tensor], p: int, seed: int,
              words: list[torch.Tensor] | None = None,
              **kwargs: Any) -> tuple[np.ndarray, np.ndarray, int]:
    """sum_{M=1..D_i} S_hat(x_i; M) with P masks per M, its standard error, model calls.

    With ``words`` (word of each token) the units are words: M words masked.
    The standard error pools the sizes' spreads, ``sqrt(sum_M s_M^2 / P)``.
    """
    lengths = (np.array([len(t) for t in toks], dtype=np.int64) if words is None
               else word_counts(words))
    check_run_size([int(d) * p for d in lengths], lengths, "the cumulative sum over M")
    cells, calls = size_cells(model, toks, [np.full(int(d), p) for d in lengths], seed,
                              words=words, **kwargs)
    tot, tse = [], []
    for cell in cells:
        stats = [mean_stderr(c) for c in cell]
        mean = np.array([m for m, _ in stats])
        se = np.array([e for _, e in stats])
        tot.append(float(mean.sum()))
        tse.append(float(sum_stderr(se if p > 1 else None, mean)))
    return np.array(tot), np.array(tse), calls


def size_cells(model: RaggedMaskedModel, toks: list[torch.Tensor], counts: list[np.ndarray],
               seed: int, words: list[torch.Tensor] | None = None, tag: str = "exact",
               **kwargs: Any) -> tuple[list[list[np.ndarray]], int]:
    """S_hat(x_i; M) of ``counts[i][M-1]`` uniform masks of every size M = 1..D_i of each sequence.

    Returns, per sequence, the list over M of the per-mask scores
    ``(1/M) sum_{j in mask} log p(x_j | x_R)``, and the model calls.
    """
    lengths = (np.array([len(t) for t in toks], dtype=np.int64) if words is None
               else word_counts(words))
    counts = [np.asarray(c, dtype=np.int64) for c in counts]
    uniform = len({int(v) for c in counts for v in np.unique(c)}) <= 1

    def all_sizes(i: int, d: int, g: torch.Generator) -> torch.Tensor:
        n = int(lengths[i])
        m = sample_masks(n, torch.arange(1, n + 1).repeat_interleave(torch.as_tensor(counts[i])),
                         generator=g)
        return m if words is None else m[:, words[i]]

    unit = {} if words is None else {"unit": "word"}
    total = int(sum(int(c.sum()) for c in counts))
    spec_p: Any = int(counts[0][0]) if uniform and counts and counts[0].size else [
        c.tolist() for c in counts]
    ex = run_pairs(model, toks, all_sizes, seed=seed, tag=tag + ("_whole_word" if unit else ""),
                   spec={"kind": "exact", "num_masks": spec_p, "total_pairs": total, **unit},
                   desc="exact sum over M", **kwargs)
    cells = []
    for s, d, c in zip(ex.sums, lengths, counts, strict=True):
        parts = np.split(np.asarray(s, dtype=np.float64), np.cumsum(c)[:-1])
        cells.append([part / m for m, part in enumerate(parts, start=1)][:int(d)])
    return cells, ex.num_model_calls
