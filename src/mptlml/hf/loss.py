"""The MPT loss of a batch from :class:`~mptlml.hf.DataCollatorForMPT`.

    loss = (1/B) sum_i w_i * sum_{j : labels_ij != -100} -log softmax(logits_ij)[labels_ij]

with ``labels`` = the batch's ``mpt_labels`` and w_i = ``mpt_weights`` =
D_i / M_i. Under random-size masking each term is an unbiased estimate of
``-sum_{M=1..D_i} S(x_i; M)``, the negative MPT sum of sequence i (a lower
bound on its log-likelihood under the order mixture; see :mod:`mptlml.hf`),
so the loss is an unbiased estimate of the batch's mean negative bound, in
nats per sequence.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["IGNORE_INDEX", "LABELS", "WEIGHTS", "mpt_batch_loss", "mpt_loss"]

#: label of positions that are not scored (transformers' convention).
IGNORE_INDEX = -100
#: the batch key of the targets: not ``labels``, so that no model computes its own
#: (unweighted) loss from an MPT batch (:mod:`mptlml.hf.collator`).
LABELS = "mpt_labels"
#: the batch key of the per-sequence weights D_i / M_i.
WEIGHTS = "mpt_weights"


def mpt_loss(logits: torch.Tensor, labels: torch.Tensor, mpt_weights: torch.Tensor, *,
             reduction: str = "mean") -> torch.Tensor:
    """Weighted masked-token negative log-likelihood, summed per sequence.

    Parameters
    ----------
    logits : FloatTensor ``(B, T, V)``
        The masked LM's output (``model(...).logits``).
    labels : LongTensor ``(B, T)``
        True ids at masked positions, -100 elsewhere.
    mpt_weights : FloatTensor ``(B,)``
        D_i / M_i per sequence (the collator's ``mpt_weights``).
    reduction : {"mean", "sum", "none"}
        Mean over sequences (default), sum, or the ``(B,)`` per-sequence terms.

    Returns
    -------
    torch.Tensor
        A scalar (or ``(B,)``), float32 (float64 if the logits are float64).
        Each per-sequence term ``w_i * sum_j -log q(x_ij | x_R)`` is an
        unbiased estimate of the sequence's negative MPT sum under
        random-size masking (Moreno-Munoz et al. 2023, Prop. 1; the 1/t
        weighting of Sahoo et al. 2024, MDLM).
    """
    if logits.ndim != 3:
        raise ValueError(f"logits must have shape (B, T, V), got {tuple(logits.shape)}.")
    b, t, _ = logits.shape
    if labels.shape != (b, t):
        raise ValueError(f"labels must have shape (B, T) = ({b}, {t}), got {tuple(labels.shape)}.")
    w = torch.as_tensor(mpt_weights, device=logits.device).flatten()
    if w.shape != (b,):
        raise ValueError(f"mpt_weights must have shape (B,) = ({b},), got {tuple(w.shape)}; "
                         "pass the collator's batch['mpt_weights'].")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}.")
    labels = labels.to(logits.device)
    scored = labels != IGNORE_INDEX
    rows = scored.nonzero()[:, 0]
    dt = torch.float64 if logits.dtype == torch.float64 else torch.float32
    nll = F.cross_entropy(logits[scored].to(dt), labels[scored], reduction="none")
    per_seq = torch.zeros(b, dtype=dt, device=logits.device).index_add(0, rows, nll)
    terms = w.to(dt) * per_seq
    if reduction == "none":
        return terms
    return terms.sum() if reduction == "sum" else terms.mean()


def _logits_of(outputs: Any) -> torch.Tensor:
    """``outputs.logits`` of a transformers model output (dict-like or tuple)."""
    if isinstance(outputs, dict) or hasattr(outputs, "keys"):
        if "logits" not in outputs:
            raise ValueError(f"the model output has no 'logits' (keys: {list(outputs.keys())}).")
        return outputs["logits"]
    if isinstance(outputs, tuple | list):
        return outputs[0]
    return outputs


def mpt_batch_loss(model: torch.nn.Module, batch: dict[str, Any], *,
                   reduction: str = "mean") -> torch.Tensor:
    """Run ``model`` on a collator batch and return its :func:`mpt_loss`.

    ``mpt_labels`` and ``mpt_weights`` are taken out of the batch (the model
    never sees them); every other field is passed to the model. For a plain loop::

        loss = mpt_batch_loss(model, collator(examples))
        loss.backward()
    """
    inputs = dict(batch)
    try:
        labels, weights = inputs.pop(LABELS), inputs.pop(WEIGHTS)
    except KeyError as exc:
        raise ValueError(f"the batch has no {exc.args[0]!r}; build it with "
                         "mptlml.hf.DataCollatorForMPT.") from None
    if "labels" in inputs:
        raise ValueError("the batch has 'labels' besides 'mpt_labels': the model would compute "
                         "its own unweighted loss from them; pass the collator's batch as it is.")
    dev = next(model.parameters()).device
    inputs = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    return mpt_loss(_logits_of(model(**inputs)), labels, weights, reduction=reduction)
