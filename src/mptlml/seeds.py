"""The one derivation of seeds, and the one check of a seed given by a user.

Every stream of random numbers in the package that is named by keys (a sequence of a
run, a round of a question, a training step's micro-batch, a question of an lm-eval run
named by its texts) is seeded by :func:`spawn`: ``numpy.random.SeedSequence([seed,
*keys])``'s first 32-bit word. Distinct keys give independent streams (SeedSequence
hashes its whole entropy: O'Neill's ``seed_seq`` design); the same keys the same stream,
in any process and any split of a run.

A seed given by a user is checked once, by :func:`check_seed`: a non-negative ``int``
(``numpy`` integers included), never a ``bool`` and never a string (``"12"`` is not 12,
and a list of the characters ``"1"``, ``"2"`` is not two seeds).

Reference: numpy, ``numpy.random.SeedSequence``; M. E. O'Neill, "PCG: A Family of Simple
Fast Space-Efficient Statistically Good Algorithms for Random Number Generation" (2014).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["check_seed", "check_seeds", "spawn", "text_key"]


def check_seed(seed: Any, name: str = "seed") -> int:
    """``seed`` as an ``int``, refused unless it is a non-negative integer.

    A ``bool`` (``True`` is not the seed 1) and a string (``"12"``) are refused, naming
    ``name``; so is a float, even a whole one.

    Raises
    ------
    TypeError, ValueError
    """
    if isinstance(seed, bool | np.bool_) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"{name} must be a non-negative int, got {seed!r} "
                        f"({type(seed).__name__}). Pass e.g. {name}=0.")
    if int(seed) < 0:
        raise ValueError(f"{name} must be a non-negative int, got {seed}. Pass e.g. {name}=0.")
    return int(seed)


def check_seeds(seeds: Any, count: int, name: str = "seed") -> list[int]:
    """One seed per item: a list of ``count`` non-negative ints, each :func:`check_seed`'s.

    A string (``"12"``) is refused as a whole, not read as the seeds ``[1, 2]``.
    """
    if isinstance(seeds, str | bytes) or not isinstance(seeds, Sequence | np.ndarray):
        raise TypeError(f"{name} must be an int or a list of {count} ints, got {seeds!r} "
                        f"({type(seeds).__name__}).")
    out = [check_seed(s, f"{name}[{k}]") for k, s in enumerate(seeds)]
    if len(out) != count:
        raise ValueError(f"{name} holds {len(out)} seeds for {count} items: pass one per item, "
                         "or one int.")
    return out


def text_key(text: str) -> int:
    """A key for :func:`spawn` from a text: its UTF-8 bytes as one integer, length first
    (two different texts are two different keys; no hash, SeedSequence mixes them)."""
    b = text.encode("utf-8")
    return int.from_bytes(len(b).to_bytes(8, "little") + b, "little")


def spawn(seed: int, *keys: int) -> int:
    """The seed of the stream named by integer ``keys`` in a run seeded by ``seed``.

    ``numpy.random.SeedSequence([seed, *keys]).generate_state(1)[0]``, a 32-bit word: a
    run's sequence i draws from ``spawn(seed, i)``, a question's round r from
    ``spawn(seed, q, r)``; texts enter as :func:`text_key`. Distinct keys give independent
    streams.

    Parameters
    ----------
    seed : int
        The run's seed (non-negative).
    *keys : int
        Non-negative integers naming the stream.

    Returns
    -------
    int
        A seed for ``torch.Generator().manual_seed``.
    """
    return int(np.random.SeedSequence([int(seed), *(int(k) for k in keys)]
                                      ).generate_state(1)[0])
