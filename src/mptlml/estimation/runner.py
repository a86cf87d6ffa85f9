"""The ragged-sequence runner: masks per sequence, buckets, checkpoints, data parallel.

Scoring many (sequence, mask) pairs of a
:class:`~mptlml.models.protocols.RaggedMaskedModel` is organised here, apart
from the maths of the estimators (:mod:`mptlml.estimation.ragged`):

- the masks (and input corruptions) of sequence i come from a generator
  seeded by (seed, i), so a result does not depend on batching, chunking,
  resumption or the number of processes;
- sequences are sorted by length and cut into chunks of ``chunk_size``; the
  model scores a chunk's pairs in length-bucketed sub-batches under a
  ``token_budget`` of padded tokens per forward pass;
- with a ``checkpoint_dir`` each finished chunk is written atomically to
  ``<checkpoint_dir>/<tag>/chunk_*.npz`` beside a ``meta.json`` fingerprint of
  the run (model, data, settings), and a later run with the same fingerprint
  reuses them after validating each one (:mod:`mptlml.estimation.checkpoints`);
- under ``torchrun``/``accelerate launch`` chunks are sharded across
  processes and the results gathered (:mod:`mptlml.estimation.distributed`,
  on accelerate's ``PartialState``).
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

from .. import settings
from .._progress import progress_bar
from .._validation import check_positive_int
from ..models.protocols import RaggedMaskedModel
from .checkpoints import CheckpointError, check_meta, load_chunk, save_chunk
from .distributed import DistContext, barrier, distributed_context, gather, shard

__all__ = ["MAX_SEQUENCE_MASK_BYTES", "RunOutput", "check_run_size", "run_pairs", "seq_seed"]


def seq_seed(seed: int, index: int) -> int:
    return int(np.random.SeedSequence([int(seed), int(index)]).generate_state(1)[0])


def _fingerprint(model: RaggedMaskedModel, ids: list[torch.Tensor], spec: dict) -> dict:
    h = hashlib.sha256()
    for t in ids:
        h.update(t.numpy().astype(np.int64).tobytes())
        h.update(b"|")
    return {**model.fingerprint(), "data_sha256": h.hexdigest(), "num_sequences": len(ids),
            **spec}


def _num_masks(make_masks: Callable[[int, int, torch.Generator], torch.Tensor], i: int,
               length: int, seed: int) -> int:
    """How many masks sequence i gets: the length a reused checkpoint array must have."""
    return int(make_masks(int(i), length, torch.Generator().manual_seed(seq_seed(seed, i)))
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
    """Sums of log p(x_j | x_R) per mask of each sequence, and the forward passes made."""

    sums: list[np.ndarray]
    num_model_calls: int


#: most bytes of bool masks one sequence may need (its rows x its tokens) before a run starts
MAX_SEQUENCE_MASK_BYTES = 1 << 30


def check_run_size(rows_per_sequence: Sequence[int], lengths: Sequence[int], what: str) -> None:
    """Refuse, before anything runs, a run whose masks for one sequence would not fit in memory.

    ``rows_per_sequence[i]`` masked inputs of ``lengths[i]`` tokens each are drawn for
    sequence i at once; past :data:`MAX_SEQUENCE_MASK_BYTES` of masks for one sequence the
    run would grow memory until the machine fails, so it is refused with its cost.
    """
    if not len(lengths):
        return
    need = [int(r) * max(int(d), 1) for r, d in zip(rows_per_sequence, lengths, strict=True)]
    i = max(range(len(need)), key=need.__getitem__)
    total = sum(int(r) for r in rows_per_sequence)
    cap = settings.max_masked_inputs.value()
    if total > cap:
        raise ValueError(
            f"{what} would score {total:,} masked inputs (up to {max(rows_per_sequence):,} "
            f"per sequence), more than mptlml.settings.max_masked_inputs = {cap:,}; lower "
            "num_masks (or the number of rates), or raise that setting if you mean it.")
    if need[i] > MAX_SEQUENCE_MASK_BYTES:
        raise ValueError(
            f"{what} would draw {int(rows_per_sequence[i]):,} masked copies of sequence {i} "
            f"({int(lengths[i])} tokens: {need[i] / 2**30:.1f} GiB of masks at once) and score "
            f"{total:,} masked inputs in all; lower num_masks (or the number of rates), or "
            "score shorter sequences.")


def run_pairs(model: RaggedMaskedModel, ids: list[torch.Tensor],
              make_masks: Callable[[int, int, torch.Generator], torch.Tensor], *, seed: int,
              tag: str, spec: dict, chunk_size: int = 8, token_budget: int = 8192,
              batch_size: int | None = None, checkpoint_dir: str | os.PathLike | None = None,
              progress: bool = False,
              desc: str = "scoring") -> RunOutput:
    """Sum of log p(x_j | x_R) over each mask of each sequence: ``(Q_i,)`` arrays.

    ``make_masks(i, D_i, generator)`` gives the ``(Q_i, D_i)`` masks of sequence
    i; the same generator then drives the model's input corruption, so
    everything is a function of (seed, i). ``token_budget`` bounds the padded
    tokens and ``batch_size`` (optional) the inputs of one forward pass.
    """
    chunk_size = check_positive_int(chunk_size, "chunk_size")
    token_budget = check_positive_int(token_budget, "token_budget")
    extra = {}  # batch_size is an optional keyword of the protocol: passed only when set
    if batch_size is not None:
        extra["batch_size"] = check_positive_int(batch_size, "batch_size")
    device = getattr(model, "device", None)
    ctx = distributed_context(cpu=None if device is None else torch.device(device).type == "cpu")
    lengths = np.array([len(t) for t in ids])
    order = np.argsort(lengths, kind="stable")
    chunks = [order[c:c + chunk_size] for c in range(0, len(order), chunk_size)]
    mine = shard(list(range(len(chunks))), ctx)

    ckpt: Path | None = None
    done: dict[int, np.ndarray] = {}
    if checkpoint_dir is not None:
        ckpt = Path(checkpoint_dir) / tag
        ckpt.mkdir(parents=True, exist_ok=True)
        meta = _fingerprint(model, ids, {**spec, "seed": int(seed), "chunk_size": chunk_size})
        _check_meta_on_every_rank(ckpt, meta, ctx)
        for c in mine:
            f = ckpt / f"chunk_{c:06d}.npz"
            if f.exists():
                done.update(load_chunk(f, {int(i): _num_masks(make_masks, i, int(lengths[i]),
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
        gens = [torch.Generator().manual_seed(seq_seed(seed, i)) for i in seqs]
        masks = [make_masks(i, int(lengths[i]), g) for i, g in zip(seqs, gens, strict=True)]
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
    return RunOutput([results[i] for i in range(len(ids))], num_calls)
