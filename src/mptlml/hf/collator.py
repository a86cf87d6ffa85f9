"""``DataCollatorForMPT``: masked-LM batches whose weighted loss estimates the MPT sum.

A drop-in replacement for transformers' ``DataCollatorForLanguageModeling``.
Per sequence i of a batch it counts the D_i maskable tokens (not special, not
padding), draws a mask size M_i, masks exactly M_i of them, uniformly, and
returns the per-sequence weight D_i / M_i beside the usual ``labels``:

- ``estimator="random-size"``: M_i ~ U{1, ..., D_i}. Then
  ``mpt_weights_i * sum_{j in mask} -log q(x_j | x_R)`` is an unbiased
  estimate of ``-sum_{M=1..D_i} S(x_i; M)``, the negative MPT sum (see
  :mod:`mptlml.hf`).
- ``estimator="fixed-rate"``: M_i = max(1, floor(rate * D_i)) (the package's
  one fixed-rate rule, BERT's 15% by default). The weight is D_i / M_i too, so
  the weighted loss is ``-D_i * S_hat(x_i; M_i)``: the paper's biased
  fixed-rate objective on the same scale as the random-size one.

A sequence with no maskable token (D_i = 0) gets no mask and weight 0: its
MPT sum is the empty sum, 0.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..masks import draw_mask_sizes, draw_sequence_mask_sizes

__all__ = ["CORRUPTIONS", "DEFAULT_RATE", "ESTIMATORS", "DataCollatorForMPT",
           "draw_sequence_mask_sizes"]

ESTIMATORS = ("random-size", "fixed-rate")
CORRUPTIONS = ("mask", "bert")
#: BERT's masking rate, the default of ``estimator="fixed-rate"``.
DEFAULT_RATE = 0.15


class DataCollatorForMPT:
    """Masked-LM collator for masked pre-training with every mask size.

    Call it on a list of examples: dicts holding ``input_ids`` (tokenizer
    outputs, special tokens included; ``attention_mask`` and
    ``special_tokens_mask`` are used when present) or plain lists of ids.
    Maskable tokens are those that are not special (``special_tokens_mask``
    when given, else membership in ``tokenizer.all_special_ids``, as in
    transformers' collator: [UNK] counts as special) and not padding.

    Parameters
    ----------
    tokenizer : transformers tokenizer
        Needs a mask token and a pad token; ``tokenizer.pad`` pads the batch.
    estimator : {"random-size", "fixed-rate"}
        How M_i is drawn (module docstring).
    rate : float in (0, 1), optional
        Masking rate of ``"fixed-rate"``; default 0.15 (BERT). Refused with
        ``"random-size"``, which has no rate.
    corruption : {"mask", "bert"}
        ``"mask"`` (default): every masked position becomes [MASK].
        ``"bert"``: BERT's 80/10/10 rule (80% [MASK], 10% a uniformly random
        non-special token, 10% unchanged), as :class:`mptlml.models.MaskedLM`
        with ``corruption="bert"``.
    stratified : bool
        Spread the batch's sizes over the strata of U{1..D_i}
        (:func:`mptlml.masks.draw_mask_sizes`); ``"random-size"`` only.
    seed : int, optional
        Seeds the collator's own generator (in a DataLoader worker: seed plus
        the worker id). Without it torch's global generator is used.
    pad_to_multiple_of : int, optional
        Passed to ``tokenizer.pad``.
    return_tensors : {"pt"}
        Only PyTorch tensors.

    Returns
    -------
    dict
        ``input_ids`` (masked), ``attention_mask``, ``labels`` (the true id at
        masked positions, -100 elsewhere), ``mpt_weights`` (float ``(B,)``,
        D_i / M_i; 0 where D_i = 0), and any other padded field of the
        examples (e.g. ``token_type_ids``). Feed the batch to
        :class:`mptlml.hf.MPTTrainer` or to :func:`mptlml.hf.mpt_loss`.
    """

    def __init__(self, tokenizer: Any, estimator: str = "random-size", rate: float | None = None,
                 corruption: str = "mask", stratified: bool = False, seed: int | None = None,
                 pad_to_multiple_of: int | None = None, return_tensors: str = "pt") -> None:
        if estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}.")
        if corruption not in CORRUPTIONS:
            raise ValueError(f"corruption must be one of {CORRUPTIONS}, got {corruption!r}.")
        if rate is not None and estimator == "random-size":
            raise ValueError("rate applies to estimator='fixed-rate' only; random-size draws "
                             "M uniformly from 1..D_i. Drop rate, or pass estimator='fixed-rate'.")
        rate = DEFAULT_RATE if rate is None else rate
        if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or math.isnan(
                float(rate)) or not (0.0 < float(rate) < 1.0):
            raise ValueError(f"rate must be a float in (0, 1), got {rate!r}.")
        if stratified and estimator != "random-size":
            raise ValueError("stratified=True applies to estimator='random-size' only (a fixed "
                             "rate has one size per sequence).")
        if return_tensors != "pt":
            raise ValueError(f"only return_tensors='pt' is supported, got {return_tensors!r}.")
        if getattr(tokenizer, "mask_token_id", None) is None:
            raise ValueError("the tokenizer has no mask token; pass a masked-LM tokenizer.")
        if getattr(tokenizer, "pad_token_id", None) is None:
            raise ValueError("the tokenizer has no pad token; set tokenizer.pad_token first.")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
            raise TypeError(f"seed must be an int or None, got {seed!r}.")
        self.tokenizer = tokenizer
        self.estimator = estimator
        self.rate = float(rate)
        self.corruption = corruption
        self.stratified = bool(stratified)
        self.seed = None if seed is None else int(seed)
        self.pad_to_multiple_of = pad_to_multiple_of
        self.return_tensors = return_tensors
        self.mask_token_id = int(tokenizer.mask_token_id)
        self.special_ids = torch.tensor(sorted({int(i) for i in tokenizer.all_special_ids}),
                                        dtype=torch.long)
        vocab = len(tokenizer)
        self.replacement_ids = torch.tensor(
            [i for i in range(vocab) if i not in set(self.special_ids.tolist())], dtype=torch.long)
        if corruption == "bert" and self.replacement_ids.numel() == 0:
            raise ValueError("corruption='bert' needs at least one non-special token.")
        self._generator: torch.Generator | None = None

    def __repr__(self) -> str:
        return (f"DataCollatorForMPT(estimator={self.estimator!r}, rate={self.rate}, "
                f"corruption={self.corruption!r}, stratified={self.stratified}, seed={self.seed})")

    # ------------------------------------------------------------------ randomness
    @property
    def generator(self) -> torch.Generator | None:
        """The collator's generator (None: torch's global one)."""
        if self.seed is None:
            return None
        if self._generator is None:
            info = torch.utils.data.get_worker_info()
            self._generator = torch.Generator().manual_seed(
                self.seed + (info.id if info is not None else 0))
        return self._generator

    # ------------------------------------------------------------------ batch
    def _pad(self, examples: Sequence[Any]) -> dict[str, torch.Tensor]:
        if not examples:
            raise ValueError("empty batch: pass at least one example.")
        if isinstance(examples[0], Mapping):
            keys = set(examples[0])
            for i, e in enumerate(examples):
                if "input_ids" not in e:
                    raise ValueError(f"example {i} has no 'input_ids'; pass tokenizer outputs.")
                if set(e) != keys:
                    raise ValueError(f"example {i} has fields {sorted(e)} but example 0 has "
                                     f"{sorted(keys)}; give every example the same fields.")
            feats = [dict(e) for e in examples]
        else:
            feats = [{"input_ids": list(e.tolist() if isinstance(e, torch.Tensor) else e)}
                     for e in examples]
        batch = self.tokenizer.pad(feats, return_tensors="pt",
                                   pad_to_multiple_of=self.pad_to_multiple_of)
        return {k: v for k, v in batch.items()}

    def maskable(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Bool ``(B, T)``: positions that may be masked (not special, not padding)."""
        ids = batch["input_ids"]
        stm = batch.get("special_tokens_mask")
        special = (stm.bool() if stm is not None
                   else torch.isin(ids, self.special_ids))
        ok = ~special & (ids != int(self.tokenizer.pad_token_id))
        att = batch.get("attention_mask")
        if att is not None:
            ok &= att.bool()
        return ok

    def __call__(self, examples: Sequence[Any]) -> dict[str, torch.Tensor]:
        batch = self._pad(examples)
        ok = self.maskable(batch)
        batch.pop("special_tokens_mask", None)
        ids = batch["input_ids"]
        g = self.generator
        d = ok.sum(1)
        m = draw_mask_sizes(self.estimator, d, stratified=self.stratified, generator=g,
                            rate=self.rate if self.estimator == "fixed-rate" else None)
        # uniform subset of size M_i among the maskable positions: the M_i smallest keys
        keys = torch.rand(ids.shape, generator=g, dtype=torch.float64)
        keys = keys.masked_fill(~ok, 2.0)
        rank = keys.argsort(dim=1).argsort(dim=1)
        masked = rank < m[:, None]
        labels = torch.where(masked, ids, torch.full_like(ids, -100))
        x = ids.clone()
        if self.corruption == "mask":
            x[masked] = self.mask_token_id
        else:
            u = torch.rand(ids.shape, generator=g)
            rnd = self.replacement_ids[torch.randint(self.replacement_ids.numel(), ids.shape,
                                                     generator=g)]
            x = torch.where(masked & (u < 0.8), self.mask_token_id, x)
            x = torch.where(masked & (u >= 0.8) & (u < 0.9), rnd, x)
        batch["input_ids"] = x
        batch["labels"] = labels
        weights = torch.where(m > 0, d.double() / m.clamp_min(1).double(), 0.0)
        batch["mpt_weights"] = weights.float()
        return batch
