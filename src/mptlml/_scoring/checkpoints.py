"""Checkpoints of the ragged-sequence runner: written atomically, validated before reuse.

A checkpoint directory holds ``meta.json``, the fingerprint of the run (model,
data, settings), and one ``chunk_NNNNNN.npz`` per finished chunk of sequences:
one float64 array per sequence (key: the sequence's index, value: the sum of
log p(x_j | x_R) of each of its masks) and ``__sha256__``, the SHA-256 of the
keys and array bytes. Every chunk a run reuses is checked first:

- it must open as a plain ``.npz`` (``allow_pickle=False``; never an object array);
- its keys must be exactly the sequences of that chunk, each a float64 vector
  of the length the run expects (the number of masks of that sequence);
- its stored hash must match its content;

and ``meta.json`` must be a JSON object equal to the run's fingerprint. A
failed check raises :class:`CheckpointError` naming the file and saying what
to do: start afresh in an empty checkpoint directory, or delete the file.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .._io import atomic_save_npz, atomic_write_text

__all__ = ["CheckpointError", "check_meta", "load_chunk", "save_chunk"]

_HASH_KEY = "__sha256__"


class CheckpointError(ValueError):
    """A checkpoint that a resumed run would reuse is corrupt or from another run."""


def _remedy(path: Path) -> str:
    return (f"start afresh with an empty checkpoint_dir, or "
            f"delete {path} to recompute only that part")


def _digest(arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    h = hashlib.sha256()
    for k in sorted(arrays):
        a = np.ascontiguousarray(arrays[k])
        h.update(k.encode())
        h.update(str(a.dtype).encode() + str(a.shape).encode())
        h.update(a.tobytes())
    return np.frombuffer(h.digest(), dtype=np.uint8)


def check_meta(ckpt: Path, meta: dict, *, write: bool) -> None:
    """Compare ``ckpt/meta.json`` with the run's fingerprint ``meta`` (write it when absent).

    Raises
    ------
    CheckpointError
        If meta.json is unreadable, not a JSON object, or another run's.
    """
    path = ckpt / "meta.json"
    if not path.exists():
        if any(ckpt.glob("chunk_*.npz")):
            raise CheckpointError(f"{ckpt} holds checkpoint chunks but no meta.json, so "
                                  f"their run cannot be checked; {_remedy(ckpt)}.")
        if write:
            atomic_write_text(path, json.dumps(meta, indent=1, sort_keys=True))
        return
    try:
        old = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"checkpoint fingerprint {path} is unreadable ({exc}); "
                              f"{_remedy(ckpt)}.") from None
    if not isinstance(old, dict):
        raise CheckpointError(f"checkpoint fingerprint {path} is not a JSON object; "
                              f"{_remedy(ckpt)}.")
    old = json.loads(json.dumps(old, sort_keys=True))
    new = json.loads(json.dumps(meta, sort_keys=True))  # same JSON types on both sides
    if old != new:
        diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        raise CheckpointError(
            f"{ckpt} holds a checkpoint of a different run (its {path.name} differs in "
            f"{diff}); {_remedy(ckpt)}, or use a new run directory.")


def save_chunk(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Atomically write one chunk (float64 arrays keyed by sequence index) with its hash."""
    arrays = {k: np.asarray(v, dtype=np.float64) for k, v in arrays.items()}
    atomic_save_npz(path, {**arrays, _HASH_KEY: _digest(arrays)})


def load_chunk(path: Path, expected: Mapping[int, int]) -> dict[int, np.ndarray]:
    """Read and validate one chunk; ``expected`` maps sequence index -> number of masks.

    Raises
    ------
    CheckpointError
        If the file is truncated or not an ``.npz``, holds other sequences,
        arrays of the wrong dtype or length, or a hash that does not match.
    """
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise CheckpointError(
            f"checkpoint {path} is corrupt or truncated ({type(exc).__name__}); "
            f"{_remedy(path)}.") from None
    stored = arrays.pop(_HASH_KEY, None)
    want = {str(i) for i in expected}
    if set(arrays) != want:
        raise CheckpointError(
            f"checkpoint {path} holds sequences {sorted(arrays)[:5]}... but this run expects "
            f"{sorted(want)[:5]}...; it belongs to another run; {_remedy(path)}.")
    for i, q in expected.items():
        a = arrays[str(i)]
        if a.dtype != np.float64 or a.shape != (q,):
            raise CheckpointError(
                f"checkpoint {path}: sequence {i} has an array of dtype {a.dtype} and shape "
                f"{a.shape}, but this run expects float64 of shape ({q},); {_remedy(path)}.")
    if stored is None or stored.dtype != np.uint8 or not np.array_equal(stored, _digest(arrays)):
        raise CheckpointError(
            f"checkpoint {path} fails its content hash (missing or different); "
            f"{_remedy(path)}.")
    return {int(k): v for k, v in arrays.items()}
