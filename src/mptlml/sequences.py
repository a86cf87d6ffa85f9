"""MPT curves, areas, PLL and LML estimates for masked language models on ragged sequences.

For a sequence x of D non-special tokens and a mask size M,

    S(x; M) = E_mask[(1/M) sum_{j in mask} log p(x_j | x_R)],
    log p(x) = sum_{M=1..D} S(x; M)                     (Proposition 1).

On a grid of masking rates r_1 < ... < r_K (the paper: 1%, ..., 99%), each
sequence gets M_ik = max(1, round(r_k D_i)) masked tokens (half-up rounding),
P uniform masks per rate. This module returns

- per-sequence S_ik (mean over the P masks), the *MPT curve* mean_i S_ik with
  standard errors over sequences;
- the paper's *area under the MPT curve*
  ``area = L * sum_k w_k mean_i S_ik`` with widths w_k = r_k - r_{k-1}
  (r_0 = 0), which on the paper's grid is ``(L/100) * sum_k curve_k`` with L
  the nominal sequence length (512 for BERT in Table 2);
- the per-sequence LML estimate ``D_i * mean_k S_ik`` (the Riemann form of
  sum_M S, since M = r D), and on request the exact cumulative sum
  ``sum_{M=1..D_i} S_hat(x_i; M)``;
- :func:`pll`, the pseudo-log-likelihood sum_j log p(x_j | x_{-j}) that MLM
  scorers report (the M=1 term times D, computed exhaustively).

Scoring is batched: (sequence, mask) pairs are flattened, sequences are
sorted by length and cut into chunks, each chunk's pairs are run in
length-bucketed sub-batches under a token budget. Masks and corruptions come
from a generator seeded by (seed, sequence index), so results do not depend
on batching, chunking, resumption or the number of processes. A run
directory makes the run resumable: each finished chunk is written atomically
to ``<checkpoint_dir>/<tag>/``. Under ``torchrun``/``accelerate launch``
chunks are sharded across processes and the results gathered.

Reference: Moreno-Munoz, Recasens, Hauberg, "On Masked Pre-training and the
Marginal Likelihood", NeurIPS 2023, Proposition 1, Sec. 4, Table 2, Fig. 5.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ._io import atomic_save_npz
from ._validation import check_positive_int, check_rate
from .masks import sample_masks
from .models.masked_lm import MaskedLM

__all__ = [
    "MLMCurveResult",
    "default_rates",
    "distributed_context",
    "shutdown_distributed",
    "mask_sizes",
    "mlm_curve",
    "mlm_estimate_lml",
    "mpt_area",
    "pll",
    "rate_widths",
]


# ---------------------------------------------------------------------- grids and areas
def default_rates() -> np.ndarray:
    """The paper's masking-rate grid 0.01, 0.02, ..., 0.99 (K = 99)."""
    return np.round(np.arange(1, 100) / 100.0, 2)


def _check_rates(rates: Any) -> np.ndarray:
    if rates is None:
        return default_rates()
    r = np.atleast_1d(np.asarray(rates, dtype=np.float64))
    if r.ndim != 1 or r.size == 0:
        raise ValueError("rates must be a non-empty 1-D list of masking rates in (0, 1).")
    for v in r:
        check_rate(float(v), "every masking rate")
    if np.any(np.diff(r) <= 0):
        raise ValueError("rates must be strictly increasing, e.g. [0.05, 0.10, ..., 0.95].")
    return r


def rate_widths(rates: Any) -> np.ndarray:
    """Riemann widths w_k = r_k - r_{k-1} with r_0 = 0 (0.01 each on the paper's grid)."""
    r = _check_rates(rates)
    return np.diff(np.concatenate([[0.0], r]))


def mpt_area(mean_log_prob: Any, rates: Any = None, nominal_length: float = 512) -> float:
    """The paper's area under the MPT curve, ``L * sum_k w_k curve_k``.

    On the paper's grid (rates 0.01..0.99) this is ``(L/100) * sum_k curve_k``
    (Table 2 uses L = 512).

    Parameters
    ----------
    mean_log_prob : array-like of shape (K,)
        Mean log-probability of the masked tokens at each rate.
    rates : array-like of shape (K,), optional
        The rates (default: the paper's grid).
    nominal_length : float
        L, the nominal sequence length.
    """
    c = np.asarray(mean_log_prob, dtype=np.float64)
    w = rate_widths(rates)
    if c.shape != w.shape:
        raise ValueError(f"mean_log_prob has shape {c.shape} but there are {w.size} rates.")
    if not np.all(np.isfinite(c)):
        raise ValueError("mean_log_prob holds NaN/inf; drop the empty rate-0 row first.")
    return float(nominal_length * np.sum(w * c))


def mask_sizes(num_tokens: int, rates: Any) -> np.ndarray:
    """M = max(1, round(r D)) for each rate (half-up rounding, at most D)."""
    d = check_positive_int(num_tokens, "num_tokens")
    r = _check_rates(rates)
    m = np.floor(r * d + 0.5).astype(np.int64)
    return np.clip(m, 1, d)


# ---------------------------------------------------------------------- distributed
@dataclass
class _Dist:
    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def distributed_context() -> _Dist:
    """Rank and world size; initialises ``torch.distributed`` under torchrun/accelerate.

    Uses the ``RANK``/``WORLD_SIZE`` environment both launchers set, the gloo
    backend on CPU and nccl on CUDA.
    """
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return _Dist()
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend=backend)
    return _Dist(dist.get_rank(), dist.get_world_size())


def shutdown_distributed(*, synchronise: bool = True) -> None:
    """Tear down the process group that :func:`distributed_context` opened.

    Every rank waits for the others (``synchronise``) and then destroys the
    group, so that no rank exits while gloo/nccl threads still run (which
    aborts the process with ``terminate called without an active exception``).
    A no-op outside ``torchrun``/``accelerate launch``.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    try:
        if synchronise:
            dist.barrier()
    finally:
        dist.destroy_process_group()


def _seq_seed(seed: int, index: int) -> int:
    return int(np.random.SeedSequence([int(seed), int(index)]).generate_state(1)[0])


# ---------------------------------------------------------------------- the engine
def _fingerprint(model: MaskedLM, ids: list[torch.Tensor], spec: dict) -> dict:
    h = hashlib.sha256()
    for t in ids:
        h.update(t.numpy().astype(np.int64).tobytes())
        h.update(b"|")
    params = sum(p.numel() for p in model.parameters())
    first = next(model.parameters()).detach().flatten()[:64].double().cpu().numpy()
    return {"model": model.name, "num_parameters": int(params),
            "weights_probe": hashlib.sha256(first.tobytes()).hexdigest()[:16],
            "corruption": model.corruption, "data_sha256": h.hexdigest(),
            "num_sequences": len(ids), **spec}


def _run_pairs(model: MaskedLM, ids: list[torch.Tensor],
               make_masks: Callable[[int, int, torch.Generator], torch.Tensor], *, seed: int,
               tag: str, spec: dict, chunk_size: int = 8, token_budget: int = 8192,
               checkpoint_dir: str | os.PathLike | None = None, progress: bool = False,
               desc: str = "scoring") -> list[np.ndarray]:
    """Sum of log p(x_j | x_R) over each mask of each sequence: list of ``(Q_i,)`` arrays.

    ``make_masks(i, D_i, generator)`` gives the ``(Q_i, D_i)`` masks of sequence
    i; the same generator then drives the corruption, so everything is a
    function of (seed, i).
    """
    from tqdm.auto import tqdm

    chunk_size = check_positive_int(chunk_size, "chunk_size")
    token_budget = check_positive_int(token_budget, "token_budget")
    ctx = distributed_context()
    lengths = np.array([len(t) for t in ids])
    order = np.argsort(lengths, kind="stable")
    chunks = [order[c:c + chunk_size] for c in range(0, len(order), chunk_size)]
    mine = [c for c in range(len(chunks)) if c % ctx.world == ctx.rank]

    ckpt: Path | None = None
    done: dict[int, np.ndarray] = {}
    if checkpoint_dir is not None:
        ckpt = Path(checkpoint_dir) / tag
        ckpt.mkdir(parents=True, exist_ok=True)
        meta = _fingerprint(model, ids, {**spec, "seed": int(seed), "chunk_size": chunk_size})
        meta_path = ckpt / "meta.json"
        if meta_path.exists():
            old = json.loads(meta_path.read_text())
            if old != meta:
                diff = sorted(k for k in set(old) | set(meta) if old.get(k) != meta.get(k))
                raise ValueError(
                    f"{ckpt} holds a checkpoint of a different run (differs in {diff}); "
                    "use a new run directory or pass overwrite=True (--overwrite)."
                )
        elif ctx.main:
            tmp = meta_path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(meta, indent=1, sort_keys=True))
            os.replace(tmp, meta_path)
        for c in mine:
            f = ckpt / f"chunk_{c:06d}.npz"
            if f.exists():
                with np.load(f) as z:
                    for k in z.files:
                        done[int(k)] = z[k]

    def masks_of(i: int) -> tuple[torch.Tensor, torch.Generator]:
        g = torch.Generator().manual_seed(_seq_seed(seed, i))
        return make_masks(i, int(lengths[i]), g), g

    total = int(spec.get("total_pairs", 0)) // max(ctx.world, 1) or None
    bar = tqdm(total=total, desc=desc, unit="pair", disable=not progress or not ctx.main,
               dynamic_ncols=True)
    results: dict[int, np.ndarray] = dict(done)
    off = len(model.prefix)
    for c in mine:
        seqs = [int(i) for i in chunks[c]]
        if all(i in done for i in seqs):
            bar.update(sum(len(done[i]) for i in seqs))
            continue
        inputs, pos, tgt, owner = [], [], [], []
        for i in seqs:
            m, g = masks_of(i)
            x = model.corrupt(ids[i], m, g)
            for q in range(m.shape[0]):
                p = m[q].nonzero().flatten()
                inputs.append(x[q])
                pos.append(p + off)
                tgt.append(ids[i][p])
                owner.append(i)
        lp = model.score_positions(inputs, pos, tgt, token_budget=token_budget, progress=bar)
        per: dict[int, list[float]] = {i: [] for i in seqs}
        for i, v in zip(owner, lp, strict=True):
            per[i].append(float(v.sum()))
        arrays = {str(i): np.asarray(v, dtype=np.float64) for i, v in per.items()}
        if ckpt is not None:
            atomic_save_npz(ckpt / f"chunk_{c:06d}.npz", arrays)
        results.update({int(k): v for k, v in arrays.items()})
    bar.close()
    if ctx.world > 1:
        import torch.distributed as dist

        gathered: list[Any] = [None] * ctx.world
        dist.all_gather_object(gathered, results)
        for part in gathered:
            results.update(part)
    return [results[i] for i in range(len(ids))]


# ---------------------------------------------------------------------- results
def _nan_se(a: np.ndarray, axis: int) -> np.ndarray:
    n = a.shape[axis]
    if n < 2:
        return np.full(np.delete(a.shape, axis), np.nan)
    return a.std(axis=axis, ddof=1) / math.sqrt(n)


def _sum_se(values: np.ndarray, se: np.ndarray | None) -> float:
    """Standard error of sum_k v_k: from per-term SEs, else successive differences."""
    if se is not None and np.all(np.isfinite(se)):
        return float(np.sqrt(np.sum(se ** 2)))
    if values.size < 2:
        return float("nan")
    var = float(np.mean(np.diff(values) ** 2) / 2.0)  # one draw per term: local variance
    return math.sqrt(values.size * var)


@dataclass
class MLMCurveResult:
    """MPT curve of a masked LM over ragged sequences.

    Attributes
    ----------
    rates : (K,) masking rates.
    lengths : (N,) D_i, non-special tokens per sequence.
    sizes : (N, K) mask sizes M_ik = max(1, round(r_k D_i)).
    scores, scores_se : (N, K) S(x_i; M_ik) (mean over P masks of the mean
        masked log-prob) and its Monte Carlo standard error (NaN when P = 1).
    curve, curve_se : (K,) mean over sequences and its standard error.
    area, area_se : paper's area ``L * sum_k w_k curve_k`` and its standard
        error over sequences; ``nominal_length`` is L.
    lml, lml_se : (N,) ``D_i * mean_k S_ik`` (Riemann estimate of sum_M S) and
        its mask-sampling standard error (successive differences when P = 1).
    lml_exact, lml_exact_se : (N,) ``sum_{M=1..D_i} S_hat(x_i; M)`` when
        requested, else None.
    """

    rates: np.ndarray
    lengths: np.ndarray
    sizes: np.ndarray
    scores: np.ndarray
    scores_se: np.ndarray
    curve: np.ndarray
    curve_se: np.ndarray
    area: float
    area_se: float
    nominal_length: float
    lml: np.ndarray
    lml_se: np.ndarray
    num_masks: int
    seed: int
    model: str
    corruption: str
    lml_exact: np.ndarray | None = None
    lml_exact_se: np.ndarray | None = None
    ids: list[str] | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (lists, floats; NaN as None)."""
        def conv(v: Any) -> Any:
            if isinstance(v, np.ndarray):
                return [conv(x) for x in v.tolist()] if v.ndim else conv(v.item())
            if isinstance(v, list):
                return [conv(x) for x in v]
            if isinstance(v, float) and not math.isfinite(v):
                return None
            if isinstance(v, np.generic):
                return conv(v.item())
            return v
        return {k: conv(getattr(self, k)) for k in self.__dataclass_fields__}


# ---------------------------------------------------------------------- public API
def _prepare(model: Any, sequences: Any) -> list[torch.Tensor]:
    if not isinstance(model, MaskedLM):
        raise TypeError(f"model must be a mptlml.models.MaskedLM, got {type(model).__name__}; "
                        "wrap a transformers model: MaskedLM(model, tokenizer) or "
                        "MaskedLM.from_pretrained(name_or_dir).")
    return model.encode(sequences)


def pll(model: MaskedLM, sequences: Sequence[str] | Sequence[Sequence[int]], *,
        token_budget: int = 8192, chunk_size: int = 8,
        checkpoint_dir: str | os.PathLike | None = None, progress: bool = False) -> torch.Tensor:
    """Pseudo-log-likelihood of each sequence, ``sum_j log p(x_j | x_{-j})``.

    Every non-special token is masked alone (D_i masked copies per sequence),
    exactly; this is what MLM scorers (mlm-scoring, minicons with a sum
    reduction) report, and it equals ``D_i * S(x_i; 1)``.

    Returns
    -------
    torch.Tensor
        float64, shape ``(N,)``.
    """
    ids = _prepare(model, sequences)
    total = sum(len(t) for t in ids)
    out = _run_pairs(model, ids, lambda i, d, g: torch.eye(d, dtype=torch.bool), seed=0,
                     tag="pll", spec={"kind": "pll", "total_pairs": total},
                     chunk_size=chunk_size, token_budget=token_budget,
                     checkpoint_dir=checkpoint_dir,
                     progress=progress, desc="PLL")
    return torch.tensor([float(v.sum()) for v in out], dtype=torch.float64)


def mlm_curve(model: MaskedLM, sequences: Sequence[str] | Sequence[Sequence[int]], *,
              rates: Any = None, num_masks: int = 1, seed: int = 0,
              nominal_length: float | None = None, exact: bool = False,
              token_budget: int = 8192, chunk_size: int = 8,
              checkpoint_dir: str | os.PathLike | None = None, progress: bool = False,
              ids: list[str] | None = None) -> MLMCurveResult:
    """MPT curve, area and per-sequence LML estimates of a masked LM.

    Parameters
    ----------
    model : MaskedLM
    sequences : list of str or of token-id sequences
        Ragged: each sequence has its own D_i (non-special tokens).
    rates : array-like, optional
        Masking rates in (0, 1), strictly increasing (default 0.01..0.99).
    num_masks : int
        P, uniform masks per (sequence, rate).
    seed : int
        Masks (and 80/10/10 corruption) of sequence i are drawn from a
        generator seeded by (seed, i).
    nominal_length : float, optional
        L of the area ``L * sum_k w_k curve_k`` (paper: 512); default the
        mean D_i.
    exact : bool
        Also compute ``sum_{M=1..D_i} S_hat(x_i; M)`` (P masks per M).
    token_budget, chunk_size : int
        Padded tokens per forward pass; sequences per checkpointed chunk.
    checkpoint_dir : path, optional
        Finished chunks are saved atomically under ``checkpoint_dir/curve``
        (``/exact``, ``/pll``) and reused when the same run is started again.
    progress : bool
        Show a progress bar over (sequence, mask) pairs.

    Returns
    -------
    MLMCurveResult
    """
    r = _check_rates(rates)
    p = check_positive_int(num_masks, "num_masks")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise TypeError(f"seed must be an int, got {seed!r}.")
    toks = _prepare(model, sequences)
    lengths = np.array([len(t) for t in toks], dtype=np.int64)
    sizes = np.stack([mask_sizes(int(d), r) for d in lengths])  # (N, K)
    k = r.size

    def curve_masks(i: int, d: int, g: torch.Generator) -> torch.Tensor:
        return sample_masks(d, torch.as_tensor(sizes[i]).repeat_interleave(p), generator=g)

    sums = _run_pairs(model, toks, curve_masks, seed=int(seed), tag="curve",
                      spec={"kind": "curve", "rates": r.tolist(), "num_masks": p,
                            "total_pairs": int(len(toks) * k * p)},
                      chunk_size=chunk_size, token_budget=token_budget,
                     checkpoint_dir=checkpoint_dir,
                      progress=progress, desc="MPT curve")
    per_mask = np.stack([s.reshape(k, p) for s in sums]) / sizes[:, :, None]  # (N, K, P)
    scores = per_mask.mean(axis=2)
    scores_se = _nan_se(per_mask, axis=2)
    curve = scores.mean(axis=0)
    curve_se = _nan_se(scores, axis=0)
    w = rate_widths(r)
    length = float(lengths.mean()) if nominal_length is None else float(nominal_length)
    seq_areas = length * (scores * w).sum(axis=1)
    area = float(seq_areas.mean())
    area_se = float(_nan_se(seq_areas, axis=0))
    lml = lengths * scores.mean(axis=1)
    lml_se = np.array([lengths[i] / k * _sum_se(scores[i], scores_se[i] if p > 1 else None)
                       for i in range(len(toks))])
    res = MLMCurveResult(rates=r, lengths=lengths, sizes=sizes, scores=scores,
                         scores_se=scores_se, curve=curve, curve_se=curve_se, area=area,
                         area_se=area_se, nominal_length=length, lml=lml, lml_se=lml_se,
                         num_masks=p, seed=int(seed), model=model.name,
                         corruption=model.corruption, ids=ids)
    if exact:
        res.lml_exact, res.lml_exact_se = _exact_sum(
            model, toks, p, int(seed), chunk_size=chunk_size, token_budget=token_budget,
            checkpoint_dir=checkpoint_dir, progress=progress)
    return res


def _exact_sum(model: MaskedLM, toks: list[torch.Tensor], p: int, seed: int,
               **kwargs: Any) -> tuple[np.ndarray, np.ndarray]:
    """sum_{M=1..D_i} S_hat(x_i; M) with P masks per M, and its standard error."""
    lengths = np.array([len(t) for t in toks], dtype=np.int64)

    def all_sizes(i: int, d: int, g: torch.Generator) -> torch.Tensor:
        return sample_masks(d, torch.arange(1, d + 1).repeat_interleave(p), generator=g)

    ex = _run_pairs(model, toks, all_sizes, seed=seed, tag="exact",
                    spec={"kind": "exact", "num_masks": p,
                          "total_pairs": int(lengths.sum() * p)},
                    desc="exact sum over M", **kwargs)
    tot, tse = [], []
    for s, d in zip(ex, lengths, strict=True):
        sm = s.reshape(int(d), p) / np.arange(1, d + 1)[:, None]  # S_hat per mask
        mean = sm.mean(axis=1)
        tot.append(float(mean.sum()))
        tse.append(_sum_se(mean, _nan_se(sm, axis=1) if p > 1 else None))
    return np.array(tot), np.array(tse)


@dataclass
class MLMLMLResult:
    """Per-sequence LML estimates ``(N,)`` with standard errors."""

    lml: np.ndarray
    lml_se: np.ndarray
    estimator: str
    num_masks: int
    seed: int
    model: str

    def to_dict(self) -> dict[str, Any]:
        return {"lml": self.lml.tolist(), "lml_se": self.lml_se.tolist(),
                "estimator": self.estimator, "num_masks": self.num_masks, "seed": self.seed,
                "model": self.model}


def mlm_estimate_lml(model: MaskedLM, sequences: Any, *, estimator: str = "cumulative",
                     rates: Any = None, num_masks: int = 1, seed: int = 0,
                     **kwargs: Any) -> MLMLMLResult:
    """Per-sequence log-marginal-likelihood estimates of a masked LM.

    ``estimator="cumulative"``: ``sum_{M=1..D_i} S_hat(x_i; M)`` (Proposition 1,
    P masks per M); ``"riemann"``: ``D_i * mean_k S(x_i; M_ik)`` over the rate grid.
    """
    if estimator not in ("cumulative", "riemann"):
        raise ValueError(f"estimator must be 'cumulative' or 'riemann', got {estimator!r}.")
    if estimator == "riemann":
        res = mlm_curve(model, sequences, rates=rates, num_masks=num_masks, seed=seed, **kwargs)
        return MLMLMLResult(res.lml, res.lml_se, estimator, res.num_masks, res.seed, res.model)
    p = check_positive_int(num_masks, "num_masks")
    toks = _prepare(model, sequences)
    allowed = {"token_budget", "chunk_size", "checkpoint_dir", "progress"}
    bad = sorted(set(kwargs) - allowed)
    if bad:
        raise TypeError(f"unexpected arguments {bad} for estimator='cumulative'.")
    lml, se = _exact_sum(model, toks, p, int(seed), **kwargs)
    return MLMLMLResult(lml, se, estimator, p, int(seed), model.name)
