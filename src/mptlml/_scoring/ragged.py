"""The ragged-sequence runner: masks per sequence, buckets, checkpoints, data parallel.

Scoring many (sequence, mask) pairs of a
:class:`~mptlml.models.protocols.RaggedMaskedModel` is organised here, apart
from the maths of the estimators (:mod:`mptlml.estimators`), which this
module does not know:

- the masks (and input corruptions) of sequence i come from a generator
  seeded by (seed, i), so a result does not depend on batching, chunking,
  resumption or the number of processes;
- a mask is drawn over the sequence's *scoring units*: its tokens, or its
  words (:func:`encode_units`), and :func:`token_masks` expands it to the
  tokens (a word's sub-tokens are masked together), in this one place;
- sequences are sorted by length and cut into chunks of ``chunk_size``; the
  model scores a chunk's pairs in length-bucketed sub-batches under a
  ``token_budget`` of padded tokens per forward pass;
- with a ``checkpoint_dir`` each finished chunk is written atomically to
  ``<checkpoint_dir>/<tag>/chunk_*.npz`` beside a ``meta.json`` fingerprint of
  the run (model, data, settings), and a later run with the same fingerprint
  reuses them after validating each one (:mod:`mptlml._scoring.checkpoints`);
- under ``torchrun``/``accelerate launch`` chunks are sharded across
  processes and the results gathered (:mod:`mptlml._scoring.distributed`,
  on accelerate's ``PartialState``).

Masks with targets (:func:`targeted`) score a subset of the hidden positions:
codes 0 visible, 1 hidden but not scored, 2 hidden and scored.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._progress import progress_bar
from .._validation import check_positive_int
from ..models.protocols import RaggedMaskedModel, WordMaskedModel
from ..models.sequence_input import encode, normalise_sequences
from ..seeds import spawn
from .checkpoints import CheckpointError, check_meta, load_chunk, save_chunk
from .dense import check_masked_inputs
from .distributed import DistContext, barrier, distributed_context, gather, shard

__all__ = ["MAX_SEQUENCE_MASK_BYTES", "RunOutput", "check_run_size", "encode_units", "run_pairs",
           "sequence_seed", "targeted", "token_masks", "unit_counts", "word_model"]


def sequence_seed(seed: int | Sequence[int], i: int) -> int:
    """Sequence i's seed in a run seeded by ``seed``: :func:`mptlml.seeds.spawn` ``(seed, i)``,
    or ``seed[i]`` where the run is given each sequence's own seed (the sequences of several
    calls batched into one, :class:`~mptlml.estimators.sequential.CellDraw`)."""
    if not isinstance(seed, int | np.integer):
        return int(seed[i])
    return spawn(int(seed), int(i))


def _seed_spec(seed: int | Sequence[int]) -> int | list[int]:
    """A run's seed(s) as its checkpoint fingerprint records them."""
    return int(seed) if isinstance(seed, int | np.integer) else [int(s) for s in seed]


# ---------------------------------------------------------------------- scoring units
def word_model(model: Any, what: str) -> WordMaskedModel:
    """``model``, refused unless it knows its tokens' strings and words (``what`` needs them)."""
    if not isinstance(model, WordMaskedModel):
        raise TypeError(f"{what} needs a model implementing mptlml.models.protocols."
                        f"WordMaskedModel (token strings and words, as the masked-LM adapter of "
                        f"mptlml.models has); "
                        f"got {type(model).__name__}.")
    return model


def encode_units(model: RaggedMaskedModel, sequences: Any, *, words: bool,
                 what: str = "whole-word scoring"
                 ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None, list[list[str]] | None]:
    """The content ids of each sequence and, with ``words``, its words: the scoring units.

    Returns ``(ids, units, texts)``: ``units[i][j]`` is the word (0..W_i-1) of
    token j and ``texts`` the words' strings (the model's ``encode_words``),
    or None for both when the units are the tokens themselves.
    """
    if not words:
        return encode(model, sequences), None, None
    ids, units, texts = word_model(model, what).encode_words(normalise_sequences(sequences))
    return ids, units, texts


def unit_counts(ids: Sequence[torch.Tensor], units: Sequence[torch.Tensor] | None) -> np.ndarray:
    """D_i, the scoring units of each sequence: its tokens, or its words (W_i)."""
    if units is None:
        return np.array([len(t) for t in ids], dtype=np.int64)
    return np.array([int(w.max()) + 1 for w in units], dtype=np.int64)


def token_masks(masks: torch.Tensor, units: torch.Tensor | None) -> torch.Tensor:
    """Masks over a sequence's scoring units ``(Q, D)`` as masks over its tokens ``(Q, T)``.

    ``units[t]`` is the unit of token t (None: the units are the tokens); a
    masked unit hides all its tokens. Every run of :func:`run_pairs` expands
    its masks here, and only here.
    """
    return masks if units is None else masks[:, units]


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
    return _Targeted(word_model(model, what))


def _fingerprint(model: RaggedMaskedModel, ids: list[torch.Tensor], spec: dict) -> dict:
    h = hashlib.sha256()
    for t in ids:
        h.update(t.numpy().astype(np.int64).tobytes())
        h.update(b"|")
    return {**model.fingerprint(), "data_sha256": h.hexdigest(), "num_sequences": len(ids),
            **spec}


def _num_masks(make_masks: Callable[[int, int, torch.Generator], torch.Tensor], i: int,
               length: int, seed: int | Sequence[int]) -> int:
    """How many masks sequence i gets: the length a reused checkpoint array must have."""
    return int(make_masks(int(i), length, torch.Generator().manual_seed(sequence_seed(seed, i)))
               .shape[0])


def _check_meta_on_every_rank(ckpt: Path, meta: dict, ctx: DistContext) -> None:
    """The main rank checks (or writes) ``meta.json`` before any rank may write a chunk.

    Without the barrier a fast worker could save its first chunk before the
    main rank had written the fingerprint, and the main rank would then find
    chunks without a meta.json and refuse the run. After it, every worker
    compares the fingerprint itself, so a mismatch stops every rank alike.
    """
    error: CheckpointError | None = None
    if ctx.main:
        try:
            check_meta(ckpt, meta, write=True)
        except CheckpointError as exc:
            error = exc
    barrier(ctx)
    if error is not None:
        raise error
    if not ctx.main:
        check_meta(ckpt, meta, write=False)


class _Calls:
    """A progress bar that also counts the forward passes reported to it."""

    def __init__(self, bar: Any) -> None:
        self.bar, self.calls = bar, 0

    def update(self, n: int) -> None:
        self.calls += 1
        self.bar.update(n)


@dataclass
class RunOutput:
    """Sums of log p(x_j | x_R) per mask of each sequence, the forward passes made, and D_i.

    ``lengths`` are the scoring units of each sequence (tokens, or words).
    """

    sums: list[np.ndarray]
    num_model_calls: int
    lengths: np.ndarray


#: most bytes of bool masks one sequence may need (its rows x its tokens) before a run starts
MAX_SEQUENCE_MASK_BYTES = 1 << 30


def check_run_size(rows_per_sequence: Sequence[int], lengths: Sequence[int], what: str,
                   remedy: str | None) -> None:
    """Refuse, before anything runs, a run too large for ``max_masked_inputs`` or memory.

    ``rows_per_sequence[i]`` masked inputs of ``lengths[i]`` tokens each are drawn for
    sequence i at once; past ``settings.max_masked_inputs`` in all, or past
    :data:`MAX_SEQUENCE_MASK_BYTES` of masks for one sequence (the run would grow memory
    until the machine fails), it is refused with its cost. ``remedy`` is what the caller
    can lower for these counts (``"lower num_masks"``; for a target's draws, the package's,
    :func:`~mptlml.estimators.allocation.plan_remedy`), or None where nothing but the
    data can (one draw of an estimator that scores every size).
    """
    if not len(lengths):
        return
    need = [int(r) * max(int(d), 1) for r, d in zip(rows_per_sequence, lengths, strict=True)]
    i = max(range(len(need)), key=need.__getitem__)
    total = sum(int(r) for r in rows_per_sequence)
    first = "" if remedy is None else f"{remedy}, or "
    check_masked_inputs(total, f"{what} (up to {max(rows_per_sequence):,} per sequence)",
                        f"{first}score fewer sequences")
    if need[i] > MAX_SEQUENCE_MASK_BYTES:
        raise ValueError(
            f"{what} would draw {int(rows_per_sequence[i]):,} masked copies of sequence {i} "
            f"({int(lengths[i])} tokens: {need[i] / 2**30:.1f} GiB of masks at once) and score "
            f"{total:,} masked inputs in all; {first}score shorter sequences.")


def run_pairs(model: RaggedMaskedModel, ids: list[torch.Tensor],
              make_masks: Callable[[int, int, torch.Generator], torch.Tensor], *,
              seed: int | Sequence[int],
              tag: str, spec: dict, units: list[torch.Tensor] | None = None,
              chunk_size: int = 8, token_budget: int = 8192,
              batch_size: int | None = None, checkpoint_dir: str | os.PathLike | None = None,
              progress: bool = False,
              desc: str = "scoring") -> RunOutput:
    """Sum of log p(x_j | x_R) over each mask of each sequence: ``(Q_i,)`` arrays.

    ``make_masks(i, D_i, generator)`` gives the ``(Q_i, D_i)`` masks of sequence
    i over its D_i scoring units (its tokens; with ``units``, the words of
    :func:`encode_units`, expanded to tokens by :func:`token_masks`); the same
    generator then drives the model's input corruption, so everything is a
    function of (seed, i) (:func:`mptlml.seeds.spawn`; a list ``seed`` gives each sequence's own).
    ``token_budget`` bounds the padded tokens and ``batch_size`` (optional) the inputs of
    one forward pass.
    """
    chunk_size = check_positive_int(chunk_size, "chunk_size")
    token_budget = check_positive_int(token_budget, "token_budget")
    extra = {}  # batch_size is an optional keyword of the protocol: passed only when set
    if batch_size is not None:
        extra["batch_size"] = check_positive_int(batch_size, "batch_size")
    device = getattr(model, "device", None)
    ctx = distributed_context(cpu=None if device is None else torch.device(device).type == "cpu")
    lengths = np.array([len(t) for t in ids])
    counts = unit_counts(ids, units)

    def unit_masks(i: int, g: torch.Generator) -> torch.Tensor:
        return token_masks(make_masks(i, int(counts[i]), g), None if units is None else units[i])

    order = np.argsort(lengths, kind="stable")
    chunks = [order[c:c + chunk_size] for c in range(0, len(order), chunk_size)]
    mine = shard(list(range(len(chunks))), ctx)

    ckpt: Path | None = None
    done: dict[int, np.ndarray] = {}
    if checkpoint_dir is not None:
        ckpt = Path(checkpoint_dir) / tag
        ckpt.mkdir(parents=True, exist_ok=True)
        meta = _fingerprint(model, ids, {**spec, "seed": _seed_spec(seed),
                                          "chunk_size": chunk_size})
        _check_meta_on_every_rank(ckpt, meta, ctx)
        for c in mine:
            f = ckpt / f"chunk_{c:06d}.npz"
            if f.exists():
                done.update(load_chunk(f, {int(i): _num_masks(make_masks, i, int(counts[i]),
                                                              seed) for i in chunks[c]}))

    total = int(spec.get("total_pairs", 0)) // max(ctx.world, 1) or None
    bar = progress_bar(total=total, enabled=progress and ctx.main, desc=desc, unit="pair",
                       leave=True, dynamic_ncols=True)
    calls = _Calls(bar)
    results: dict[int, np.ndarray] = dict(done)
    for c in mine:
        seqs = [int(i) for i in chunks[c]]
        if all(i in done for i in seqs):
            bar.update(sum(len(done[i]) for i in seqs))
            continue
        gens = [torch.Generator().manual_seed(sequence_seed(seed, i)) for i in seqs]
        masks = [unit_masks(i, g) for i, g in zip(seqs, gens, strict=True)]
        sums = model.ragged_masked_log_prob([ids[i] for i in seqs], masks, gens,
                                            token_budget=token_budget, progress=calls, **extra)
        arrays = {str(i): v.numpy().astype(np.float64) for i, v in zip(seqs, sums, strict=True)}
        if ckpt is not None:
            save_chunk(ckpt / f"chunk_{c:06d}.npz", arrays)
        results.update({int(k): v for k, v in arrays.items()})
    bar.close()
    num_calls = calls.calls
    if ctx.world > 1:
        num_calls = 0
        for part, part_calls in gather((results, num_calls), ctx):
            results.update(part)
            num_calls += part_calls
    return RunOutput([results[i] for i in range(len(ids))], num_calls, counts)
