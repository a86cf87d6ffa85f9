"""Mask sizes: the one draw of M shared by evaluation, training and model selection.

Proposition 1 of Moreno-Munoz, Recasens & Hauberg (NeurIPS 2023) sums
S(x; M) over M = 1..D; its Monte Carlo estimators differ only in which sizes
they draw: every size (``"cumulative"``), M ~ U{1..D} (``"random-size"``, the
unbiased single-size estimator D * S_hat(x; M)) or one size
``max(1, floor(rate * D))`` (``"fixed-rate"``, BERT's practice; biased).
Re-exported by :mod:`mptlml.masks`.
"""

from __future__ import annotations

import math
import warnings

import torch

from ._validation import check_positive_int, check_rate, check_size, make_generator

__all__ = ["MASK_SIZE_ESTIMATORS", "check_mask_size_args", "draw_mask_sizes",
           "draw_sequence_mask_sizes", "fixed_rate_size"]

#: the estimators whose masks have sizes drawn by :func:`draw_mask_sizes`
MASK_SIZE_ESTIMATORS = ("cumulative", "random-size", "fixed-rate")


def fixed_rate_size(rate: float, num_tokens: int) -> int:
    """Mask size of a fixed masking rate: ``max(1, floor(rate * D))``.

    Floor, as the paper's code: 15% of D = 512 gives M = 76 (NOTES.md, Table 1).
    A tiny tolerance keeps exact products (0.2 * 10) from rounding down.
    """
    return max(1, min(num_tokens, int(math.floor(rate * num_tokens + 1e-9))))


def check_mask_size_args(estimator: str, num_tokens: int, *, rate: float | None = None,
                         mask_size: int | None = None) -> int | None:
    """Refuse ``rate``/``mask_size`` where they do not apply; M of ``"fixed-rate"``.

    The one validation of these arguments, shared by evaluation
    (:func:`mptlml.estimate_lml`) and training (:class:`mptlml.objectives.MPTLoss`).

    Returns
    -------
    int or None
        ``mask_size`` (checked ``1 <= M <= D``, an integer: 2.7 is refused,
        not truncated) or ``max(1, floor(rate * D))`` for ``"fixed-rate"``;
        None for every other estimator, which then must not be given either.
    """
    d = check_positive_int(num_tokens, "num_tokens")
    if estimator != "fixed-rate":
        if rate is not None or mask_size is not None:
            given = [f"{n}={v!r}" for n, v in (("rate", rate), ("mask_size", mask_size))
                     if v is not None]
            raise ValueError(
                f"rate / mask_size only apply to estimator='fixed-rate'; the {estimator!r} "
                f"estimator does not use one mask size (got {', '.join(given)}). Drop them "
                "or pass estimator='fixed-rate'."
            )
        return None
    if mask_size is not None and rate is not None:
        raise ValueError("give either rate or mask_size for 'fixed-rate', not both.")
    if mask_size is not None:
        return check_size(mask_size, d, "mask_size")
    return fixed_rate_size(check_rate(rate), d)


def _uniform_sizes(d: torch.Tensor, generator: torch.Generator | None,
                   stratified: bool = False) -> torch.Tensor:
    """M ~ U{1..D} elementwise as ``floor(U * D) + 1``, U ~ U[0, 1); 0 where D = 0.

    ``stratified``: U = (pi + V) / B over the B elements, pi a uniformly random
    permutation and V ~ U[0, 1): each U is still U[0, 1) (same expectation),
    but the B elements cover the B quantile strata once each.
    """
    u = torch.rand(d.shape, generator=generator, dtype=torch.float64)
    if stratified and d.numel() > 1:
        u = (torch.randperm(d.numel(), generator=generator).double().view(d.shape) + u) / d.numel()
    m = (u * d.double()).floor().long() + 1
    return torch.where(d > 0, torch.minimum(m, d), torch.zeros_like(d))


def draw_mask_sizes(estimator: str, num_tokens: int | torch.Tensor, num_masks: int = 1, *,
                    num_data: int | None = None, rate: float | None = None,
                    mask_size: int | None = None, stratified: bool = False,
                    generator: torch.Generator | int | None = None) -> torch.Tensor:
    """The mask sizes of one Monte Carlo draw of an MPT estimator (Proposition 1).

    The one mask-size draw of the package: evaluation (:func:`mptlml.estimate_lml`),
    training (:class:`mptlml.objectives.MPTLoss`, the Hugging Face collator
    :class:`mptlml.hf.DataCollatorForMPT`) and model selection draw here, so a
    seed gives the same sizes everywhere.

    Dense data, ``num_tokens`` an int D:

    ``"cumulative"``  every size M = 1..D, ``num_masks`` (P) times each, size-major:
                      ``[1]*P + [2]*P + ... + [D]*P``, shape ``(D * P,)``;
    ``"random-size"`` M ~ U{1..D} i.i.d.: ``(P,)``, or ``(P, N)`` with ``num_data=N``
                      (one size per datum, for masks drawn per datum);
    ``"fixed-rate"``  M = ``mask_size`` or ``max(1, floor(rate * D))``, ``(P,)``.

    Ragged sequences, ``num_tokens`` a LongTensor ``(B,)`` of D_i (0 allowed,
    giving M_i = 0): one size per sequence, ``(B,)``: M_i ~ U{1..D_i}
    (``"random-size"``) or ``max(1, floor(rate * D_i))`` (``"fixed-rate"``).

    Uniform sizes are ``floor(U * D) + 1`` with U ~ U[0, 1). ``stratified``
    (``"random-size"`` only) spreads the U of the draw over their B quantile
    strata, one each: the same expectation, less spread across a batch.
    ``rate`` and ``mask_size`` are checked by :func:`check_mask_size_args`
    (refused unless ``"fixed-rate"``). Only ``"random-size"`` consumes
    ``generator``.

    Returns
    -------
    torch.LongTensor
    """
    if estimator not in MASK_SIZE_ESTIMATORS:
        raise ValueError(f"mask sizes are drawn for the estimators {MASK_SIZE_ESTIMATORS}; "
                         f"got {estimator!r}.")
    if stratified and estimator != "random-size":
        raise ValueError("stratified=True applies to estimator='random-size' only.")
    if isinstance(num_tokens, torch.Tensor):
        return _sequence_sizes(estimator, num_tokens, num_masks, num_data=num_data, rate=rate,
                               mask_size=mask_size, stratified=stratified, generator=generator)
    d = check_positive_int(num_tokens, "num_tokens")
    p = check_positive_int(num_masks, "num_masks")
    size = check_mask_size_args(estimator, d, rate=rate, mask_size=mask_size)
    if estimator == "cumulative":
        return torch.arange(1, d + 1).repeat_interleave(p)
    if estimator == "random-size":
        shape = (p,) if num_data is None else (p, check_positive_int(num_data, "num_data"))
        return _uniform_sizes(torch.full(shape, d), make_generator(generator), stratified)
    return torch.full((p,), size, dtype=torch.long)


def _sequence_sizes(estimator: str, num_tokens: torch.Tensor, num_masks: int, *,
                    num_data: int | None, rate: float | None, mask_size: int | None,
                    stratified: bool, generator: torch.Generator | int | None) -> torch.Tensor:
    """:func:`draw_mask_sizes` for ragged sequences: one size per D_i of ``num_tokens``."""
    if estimator == "cumulative":
        raise ValueError("the cumulative estimator draws every size of each sequence; per-"
                         "sequence sizes are drawn for 'random-size' or 'fixed-rate'.")
    if num_masks != 1 or num_data is not None or mask_size is not None:
        raise ValueError("for per-sequence lengths (a tensor of D_i) draw one size per "
                         "sequence: num_masks=1, and no num_data or mask_size.")
    d = num_tokens.long().flatten()
    if bool((d < 0).any()):
        raise ValueError(f"num_tokens must be >= 0, got {d.tolist()}.")
    if estimator == "fixed-rate":
        if rate is None:
            raise ValueError("estimator='fixed-rate' needs rate= (BERT's practice: 0.15).")
        r = check_rate(rate)
        return torch.tensor([fixed_rate_size(r, int(n)) if int(n) > 0 else 0
                             for n in d.tolist()], dtype=torch.long)
    if rate is not None:
        check_mask_size_args(estimator, 1, rate=rate)  # refuses it with the usual message
    g = None if generator is None else make_generator(generator)
    return _uniform_sizes(d, g, stratified)


def draw_sequence_mask_sizes(num_maskable: torch.Tensor, estimator: str, *,
                             rate: float = 0.15, stratified: bool = False,
                             generator: torch.Generator | None = None) -> torch.Tensor:
    """Deprecated: ``draw_mask_sizes(estimator, num_maskable, ...)`` with a tensor of D_i."""
    warnings.warn("draw_sequence_mask_sizes is deprecated; call draw_mask_sizes(estimator, "
                  "num_tokens=<LongTensor of D_i>, ...).", DeprecationWarning, stacklevel=2)
    if estimator not in ("random-size", "fixed-rate"):
        raise ValueError(f"estimator must be 'random-size' or 'fixed-rate', got {estimator!r}.")
    return draw_mask_sizes(estimator, torch.as_tensor(num_maskable),
                           rate=rate if estimator == "fixed-rate" else None,
                           stratified=stratified, generator=generator)
