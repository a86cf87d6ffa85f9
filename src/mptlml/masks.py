"""Mask samplers: uniform subsets of a given size, exhaustive enumeration, random orders.

A mask is a bool tensor whose last dimension runs over the D tokens of an
observation; True marks a masked token, the set M whose conditionals
log p(x_j | x_R) are scored given the rest R.

Uniform subsets are drawn in one batched operation: each row gets i.i.d.
uniform noise and the M smallest entries are masked (equivalently, the first
M positions of a uniformly random permutation, as in the paper's code), so a
whole block of masks of mixed sizes costs one sort.
"""

from __future__ import annotations

import itertools
import math

import torch

from ._validation import check_positive_int, make_generator

__all__ = [
    "all_masks",
    "count_masks",
    "random_orders",
    "sample_masks",
]


def sample_masks(num_tokens: int, sizes: int | torch.Tensor, *, num_masks: int | None = None,
                 num_data: int | None = None,
                 generator: torch.Generator | int | None = None) -> torch.Tensor:
    """Draw masks uniformly among the subsets of the given sizes.

    Parameters
    ----------
    num_tokens : int
        D, the number of tokens per observation.
    sizes : int or LongTensor of shape (B,) or (B, N)
        Mask size M of each row (``1 <= M <= D``). An int needs ``num_masks``.
    num_masks : int, optional
        Number of rows B when ``sizes`` is an int.
    num_data : int, optional
        If given, every datum gets its own masks and the result has shape
        ``(B, N, D)``; otherwise the masks are shared across data, ``(B, D)``.
    generator : torch.Generator, int or None
        Source of randomness (a seed makes the draw reproducible).

    Returns
    -------
    torch.Tensor
        Bool masks, True = masked, each row holding exactly its M Trues.
    """
    d = check_positive_int(num_tokens, "num_tokens")
    g = make_generator(generator)
    if isinstance(sizes, int):
        b = check_positive_int(num_masks, "num_masks")
        sizes_t = torch.full((b,), sizes, dtype=torch.long)
    else:
        sizes_t = torch.as_tensor(sizes, dtype=torch.long).cpu()
    if sizes_t.numel() and (int(sizes_t.min()) < 1 or int(sizes_t.max()) > d):
        raise ValueError(
            f"mask sizes must satisfy 1 <= M <= D={d}; got sizes in "
            f"[{int(sizes_t.min())}, {int(sizes_t.max())}]."
        )
    lead = (sizes_t.shape[0],) if num_data is None else (sizes_t.shape[0], int(num_data))
    if sizes_t.ndim == 2 and num_data is None:
        raise ValueError("sizes of shape (B, N) need num_data=N (one mask per datum).")
    # float64 noise: ties have probability ~D^2 / 2^53, negligible.
    noise = torch.rand(*lead, d, generator=g, dtype=torch.float64)
    kth = noise.sort(dim=-1).values
    s = sizes_t if sizes_t.ndim == len(lead) else sizes_t.reshape(-1, *([1] * (len(lead) - 1)))
    s = s.expand(*lead)
    threshold = kth.gather(-1, (s - 1).unsqueeze(-1))
    return noise <= threshold


def all_masks(num_tokens: int, size: int) -> torch.Tensor:
    """Every mask of the given size: a ``(C(D, M), D)`` bool tensor, in lexicographic order."""
    d = check_positive_int(num_tokens, "num_tokens")
    m = check_positive_int(size, "size")
    if m > d:
        raise ValueError(f"size M={m} exceeds D={d}.")
    combos = torch.tensor(list(itertools.combinations(range(d), m)), dtype=torch.long)
    out = torch.zeros(combos.shape[0], d, dtype=torch.bool)
    out.scatter_(1, combos, True)
    return out


def count_masks(num_tokens: int, sizes: list[int] | range | None = None) -> int:
    """Number of distinct masks over the given sizes (all sizes 1..D by default: 2^D - 1)."""
    sizes = range(1, num_tokens + 1) if sizes is None else sizes
    return sum(math.comb(num_tokens, m) for m in sizes)


def random_orders(num_tokens: int, num_orders: int, *, num_data: int | None = None,
                  generator: torch.Generator | int | None = None) -> torch.Tensor:
    """Uniformly random permutations of ``range(D)``: ``(P, D)`` or ``(P, N, D)`` long tensor."""
    d = check_positive_int(num_tokens, "num_tokens")
    p = check_positive_int(num_orders, "num_orders")
    g = make_generator(generator)
    lead = (p,) if num_data is None else (p, int(num_data))
    return torch.rand(*lead, d, generator=g, dtype=torch.float64).argsort(dim=-1)
