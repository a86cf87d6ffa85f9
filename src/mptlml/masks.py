"""Mask samplers: uniform subsets of a given size, exhaustive enumeration, random orders.

A mask is a bool tensor whose last dimension runs over the D tokens of an
observation; True marks a masked token, the set M whose conditionals
log p(x_j | x_R) are scored given the rest R.

Uniform subsets are drawn in one batched operation: each row gets i.i.d.
uniform random keys and the M smallest are masked (equivalently, the first M
positions of a uniformly random permutation, as in the paper's code). The
M-th smallest key of every row comes from one sort of the rows (D <= 128, or
few rows per distinct size) or from a linear-time selection
(``numpy.partition``, one call per distinct size): at D = 512 either is about
ten times cheaper than sorting float noise with torch.
"""

from __future__ import annotations

import atexit
import itertools
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from ._validation import check_positive_int, check_rate, make_generator

__all__ = [
    "all_masks",
    "count_masks",
    "distinct_masks",
    "every_mask",
    "fixed_rate_size",
    "prefix_masks",
    "random_orders",
    "sample_masks",
    "shutdown_mask_pool",
    "sizes_at",
    "uniform_sizes",
    "unit_uniforms",
]


def fixed_rate_size(rate: float, num_tokens: int) -> int:
    """Mask size of a fixed masking rate: ``max(1, floor(rate * D))``.

    Floor, as the paper's code: 15% of D = 512 gives M = 76 (Table 1; see
    ``docs/notes.md``). A tiny tolerance keeps exact products (0.2 * 10) from
    rounding down.
    """
    r = check_rate(rate)
    return max(1, min(num_tokens, int(math.floor(r * num_tokens + 1e-9))))


def unit_uniforms(shape: tuple[int, ...], generator: torch.Generator | None,
                  stratified: bool = False, per_stratum: int = 1) -> torch.Tensor:
    """U ~ U[0, 1) elementwise (float64); ``stratified``: U = (pi + V) / B over the B elements.

    pi is a uniformly random permutation of 0..B-1 and V ~ U[0, 1): every
    element is still U[0, 1), and the B elements fall in the B quantile
    strata once each, each element in a random one. ``per_stratum`` = k
    (dividing B): B / k strata, k elements in each, ``U = (pi // k + V) / (B / k)``
    (pairs, k = 2, give a variance estimate); the stratum of U is ``floor(U B / k)``.
    """
    u = torch.rand(shape, generator=generator, dtype=torch.float64)
    n = u.numel()
    if stratified and n > 1:
        h = n // per_stratum
        u = (torch.randperm(n, generator=generator).view(shape) // per_stratum + u) / h
    return u


def uniform_sizes(num_tokens: torch.Tensor, generator: torch.Generator | None,
                  stratified: bool = False, probs: torch.Tensor | None = None) -> torch.Tensor:
    """M ~ U{1..D} elementwise, ``floor(U * D) + 1`` with U ~ U[0, 1); 0 where D = 0.

    ``stratified``: U = (pi + V) / B over the B elements, pi a uniformly random
    permutation and V ~ U[0, 1): each U is still U[0, 1) (same distribution
    per element), but the B elements cover the B quantile strata once each.
    ``probs`` (one D for every element): draw M ~ q instead, with
    ``q = probs`` over 1..D, by inverting its distribution function at U.
    """
    return sizes_at(unit_uniforms(num_tokens.shape, generator, stratified), num_tokens, probs)


def sizes_at(u: torch.Tensor, num_tokens: torch.Tensor,
             probs: torch.Tensor | None = None) -> torch.Tensor:
    """The sizes M in 1..D at uniforms ``u`` (elementwise): ``floor(U * D) + 1``, 0 where D = 0.

    ``probs`` (one D for every element): the inverse of q's distribution function
    at U instead, q = ``probs`` over 1..D.
    """
    d = num_tokens
    if probs is not None:
        cdf = probs.double().cumsum(0)
        m = torch.searchsorted(cdf / cdf[-1], u.reshape(-1), right=True).view(d.shape) + 1
        return torch.minimum(m, d.clamp_min(1)).where(d > 0, torch.zeros_like(d))
    m = (u * d.double()).floor().long() + 1
    return torch.where(d > 0, torch.minimum(m, d), torch.zeros_like(d))


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
    s = sizes_t if sizes_t.ndim == len(lead) else sizes_t.reshape(-1, *([1] * (len(lead) - 1)))
    s = s.expand(*lead).reshape(-1).numpy()
    return torch.from_numpy(_masks_of_sizes(g, s, d)).reshape(*lead, d)


#: widest D whose keys are 32-bit (at least 20 random bits above the column index)
_KEY32_MAX_TOKENS = 1 << 12
#: up to this D one sort per row is cheaper than one partition per distinct size
_SORT_MAX_TOKENS = 128
#: beyond it, partition only when the distinct sizes have this many rows each on average
#: (each partition call costs ~10 us of overhead)
_MIN_PARTITION_ROWS = 16
#: keys per independently seeded chunk of rows; fixed, so that a seed gives the same
#: masks whatever the number of threads that draw the chunks
_CHUNK_KEYS = 1 << 17


class _MaskPool:
    """The threads that draw sorted chunks of masks: owned, created lazily, closable.

    One executor per thread count, per process: a forked child never waits on
    its parent's threads (they do not exist in the child; the child starts
    its own, see :func:`os.register_at_fork`). :func:`shutdown_mask_pool`
    closes them (also registered with :mod:`atexit`); the next draw that needs
    threads starts a fresh pool.
    """

    def __init__(self) -> None:
        self._forget()

    def _forget(self) -> None:
        """Drop every executor without joining it (fresh state; in a forked child)."""
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._executors: dict[int, ThreadPoolExecutor] = {}

    def get(self, threads: int) -> ThreadPoolExecutor:
        """The executor with ``threads`` workers for this process, started if needed."""
        if self._pid != os.getpid():  # forked without the at-fork hook (belt and braces)
            self._forget()
        with self._lock:
            executor = self._executors.get(threads)
            if executor is None:
                executor = ThreadPoolExecutor(threads, thread_name_prefix="mptlml-masks")
                self._executors[threads] = executor
            return executor

    def shutdown(self, wait: bool = True) -> None:
        """Stop this process's worker threads (a no-op when none were started)."""
        if self._pid != os.getpid():
            self._forget()
        with self._lock:
            executors, self._executors = list(self._executors.values()), {}
        for executor in executors:
            executor.shutdown(wait=wait)


_pool = _MaskPool()


def shutdown_mask_pool(wait: bool = True) -> None:
    """Shut down the thread pool that draws masks (restarted lazily by the next draw).

    The sampler keeps ``torch.get_num_threads()`` worker threads alive between
    draws (starting them costs more than a small draw). Call this to release
    them, e.g. before forking many workers; it also runs at interpreter exit.

    Parameters
    ----------
    wait : bool
        Wait for draws in progress to finish.
    """
    _pool.shutdown(wait=wait)


atexit.register(shutdown_mask_pool)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_pool._forget)


def _masks_of_sizes(g: torch.Generator, sizes: np.ndarray, d: int) -> np.ndarray:
    """``(R, D)`` bool: each row r masks its ``sizes[r]`` smallest random keys.

    The rows are split into chunks of about ``_CHUNK_KEYS`` keys (four times
    that when they are selected by partitions), each seeded from ``g`` in turn;
    sorted chunks are drawn on ``torch.get_num_threads()`` threads (numpy
    releases the GIL while it sorts). The chunks depend only on the sizes and
    D, so a seed gives the same masks whatever the number of threads.
    """
    rows = sizes.shape[0]
    out = np.empty((rows, d), dtype=bool)
    sorts = _sorts(sizes, d)
    chunk_keys = _CHUNK_KEYS if sorts else 4 * _CHUNK_KEYS  # partitions run in this thread
    chunks = max(1, min(rows, -(-rows * d // chunk_keys)))
    bounds = np.linspace(0, rows, chunks + 1).round().astype(np.int64)
    seeds = torch.randint(0, 2**62, (chunks,), generator=g).tolist()
    jobs = [(np.random.default_rng(seed), slice(int(lo), int(hi)))
            for seed, lo, hi in zip(seeds, bounds[:-1], bounds[1:], strict=True)]

    def draw(job: tuple[np.random.Generator, slice]) -> None:
        rng, rows_ = job
        _draw_rows(rng, sizes[rows_], out[rows_], sorts)

    threads = torch.get_num_threads()
    if chunks == 1 or threads == 1 or not sorts:  # partitions: thread handoffs cost more
        for job in jobs:
            draw(job)
    else:
        list(_pool.get(threads).map(draw, jobs))  # a forked child gets a pool of its own
    return out


def _draw_rows(rng: np.random.Generator, sizes: np.ndarray, out: np.ndarray,
               sorts: bool) -> None:
    """Fill ``out`` (R, D) with masks of the given sizes: the M smallest keys of each row.

    Keys carry the column index in their low bits, so they are distinct and a
    threshold at the M-th smallest masks exactly M tokens. Where the M-th and
    (M+1)-th smallest share their random bits (a tie, broken by the column
    index), the row is drawn again. That event depends only on the multiset
    of random values, so the accepted rows stay exactly uniform among the
    subsets of size M. ``sorts`` picks one sort per row over one partition per
    distinct size (:func:`_sorts`, decided once per draw); both give the same keys.
    """
    keys, shift = _random_keys(rng, sizes.shape[0], out.shape[1])
    thr, nxt = _thresholds(keys, sizes, sorts)
    np.less_equal(keys, thr[:, None], out=out)
    tie = np.nonzero((sizes < out.shape[1]) & ((thr >> shift) == (nxt >> shift)))[0]
    if tie.size:
        redrawn = np.empty((tie.size, out.shape[1]), dtype=bool)
        _draw_rows(rng, sizes[tie], redrawn, sorts)
        out[tie] = redrawn


def _sorts(sizes: np.ndarray, d: int) -> bool:
    """Whether rows of these sizes are selected by one sort per row (else by partitions)."""
    return d <= _SORT_MAX_TOKENS or np.unique(sizes).size * _MIN_PARTITION_ROWS > sizes.shape[0]


def _thresholds(keys: np.ndarray, sizes: np.ndarray, sorts: bool
                ) -> tuple[np.ndarray, np.ndarray]:
    """The M-th and (M+1)-th smallest key of each row (the second unused where M = D)."""
    d = keys.shape[1]
    if sorts:
        srt = np.sort(keys, axis=-1)
        thr = np.take_along_axis(srt, (sizes - 1)[:, None], 1)[:, 0]
        nxt = np.take_along_axis(srt, np.minimum(sizes, d - 1)[:, None], 1)[:, 0]
        return thr, nxt
    thr = np.empty(sizes.shape[0], dtype=keys.dtype)
    nxt = np.zeros(sizes.shape[0], dtype=keys.dtype)
    for rows, m in _size_groups(sizes):  # linear-time selection per distinct size
        part = np.partition(keys[rows], m - 1, axis=-1)
        thr[rows] = part[:, m - 1]
        if m < d:
            nxt[rows] = part[:, m:].min(axis=1)
    return thr, nxt


def _random_keys(rng: np.random.Generator, rows: int, d: int) -> tuple[np.ndarray, int]:
    """Distinct keys per row, random high bits and the column index below: ``(keys, shift)``.

    ``key_j = (u_j >> b) << b | j`` with ``b = shift`` bits for j and u_j
    uniform: 32-bit keys for D <= 4096 (half the random numbers of 64-bit
    ones and a faster sort), 64-bit beyond.
    """
    bit_gen = rng.bit_generator
    shift = max(1, (d - 1).bit_length())
    if d <= _KEY32_MAX_TOKENS:
        raw = bit_gen.random_raw((rows * d + 1) // 2).view(np.uint32)[: rows * d].reshape(rows, d)
        low = np.uint32((1 << shift) - 1)
    else:
        raw = bit_gen.random_raw((rows, d))
        low = np.uint64((1 << shift) - 1)
    raw &= ~low  # clear the low bits (in place), then put the column index there
    raw |= np.arange(d, dtype=raw.dtype)
    return raw, shift


def _size_groups(s: np.ndarray) -> list[tuple[slice | np.ndarray, int]]:
    """Rows of each distinct mask size: a slice where they are contiguous, else indices."""
    if s.size and (s == s[0]).all():
        return [(slice(None), int(s[0]))]
    order = np.argsort(s, kind="stable")
    vals, starts = np.unique(s[order], return_index=True)
    ends = np.append(starts[1:], s.size)
    out: list[tuple[slice | np.ndarray, int]] = []
    for v, a, b in zip(vals, starts, ends, strict=True):
        idx = order[a:b]
        contiguous = idx[-1] - idx[0] + 1 == idx.size
        out.append((slice(int(idx[0]), int(idx[-1]) + 1) if contiguous else idx, int(v)))
    return out


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


def every_mask(num_tokens: int) -> torch.Tensor:
    """Every non-empty mask of ``num_tokens`` positions, the whole one last: ``(2^D - 1, D)``.

    Row ``c - 1`` is the mask whose bits are those of ``c`` (position j masked when bit j
    of c is set), c = 1..2^D - 1.
    """
    d = check_positive_int(num_tokens, "num_tokens")
    codes = torch.arange(1, 2 ** d)
    return ((codes[:, None] >> torch.arange(d)) & 1).bool()


def distinct_masks(num_tokens: int, size: int, count: int,
                   generator: torch.Generator | None = None,
                   drawn: torch.Tensor | None = None) -> torch.Tensor:
    """``count`` uniform masks of ``size`` of ``num_tokens`` positions, distinct where the
    C(D, M) masks are enough: a simple random sample without replacement (a mask that
    repeats an earlier one is drawn again from ``generator``; the masks that repeat none
    are those of :func:`sample_masks`, or ``drawn``, the ``(count, D)`` masks already drawn
    i.i.d. by it). Where ``count`` exceeds C(D, M), the i.i.d. masks. ``(count, D)`` bool."""
    out = (sample_masks(num_tokens, torch.full((count,), size, dtype=torch.long),
                        generator=generator) if drawn is None else drawn.clone())
    if count > math.comb(num_tokens, size):
        return out
    seen: set[bytes] = set()
    for k in range(count):
        key = out[k].numpy().tobytes()
        while key in seen:
            out[k] = sample_masks(num_tokens, size, num_masks=1, generator=generator)[0]
            key = out[k].numpy().tobytes()
        seen.add(key)
    return out


def count_masks(num_tokens: int, sizes: list[int] | range | None = None) -> int:
    """Number of distinct masks over the given sizes (all sizes 1..D by default: 2^D - 1)."""
    sizes = range(1, num_tokens + 1) if sizes is None else sizes
    return sum(math.comb(num_tokens, m) for m in sizes)


def prefix_masks(orders: torch.Tensor) -> torch.Tensor:
    """Nested masks: the first M positions of each order, for M = 1..D.

    ``orders`` is ``(P, D)`` or ``(P, N, D)`` (permutations of ``range(D)``);
    the result is ``(P, D, D)`` or ``(P, D, N, D)`` bool, ``[p, M-1, ..., j]``
    True when token j is among the first M of order p.
    """
    d = orders.shape[-1]
    rank = orders.argsort(dim=-1)  # rank[..., j]: position of token j in the order
    sizes = torch.arange(1, d + 1, device=orders.device)
    return rank[:, None] < sizes.reshape(1, d, *([1] * (orders.ndim - 1)))


def random_orders(num_tokens: int, num_orders: int, *, num_data: int | None = None,
                  generator: torch.Generator | int | None = None) -> torch.Tensor:
    """Uniformly random permutations of ``range(D)``: ``(P, D)`` or ``(P, N, D)`` long tensor."""
    d = check_positive_int(num_tokens, "num_tokens")
    p = check_positive_int(num_orders, "num_orders")
    g = make_generator(generator)
    lead = (p,) if num_data is None else (p, int(num_data))
    return torch.rand(*lead, d, generator=g, dtype=torch.float64).argsort(dim=-1)
