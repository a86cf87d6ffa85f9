"""``DataCollatorForMPT``: masked-LM batches whose weighted loss estimates the MPT sum.

In the place of transformers' ``DataCollatorForLanguageModeling``. Per
sequence i of a batch it counts the D_i maskable tokens (not special, not
padding), draws a mask size M_i, masks exactly M_i of them, uniformly, and
returns the targets ``mpt_labels`` and the per-sequence weight ``mpt_weights``
= D_i / M_i:

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

The targets are ``mpt_labels``, not ``labels``, on purpose: a model given
``labels`` computes its own unweighted mean over masked tokens, and every
architecture's ``forward(**kwargs)`` accepts and ignores ``mpt_weights``, so a
plain ``Trainer`` (or ``model(**batch).loss``) would train another objective
without a word. Without ``labels`` the model computes no loss: a plain
``Trainer`` stops with "The model did not return a loss", and
:class:`~mptlml.hf.MPTTrainer` / :func:`~mptlml.hf.mpt_loss` are the ways to
train.

Randomness. Called directly (a plain loop), the collator draws from its own
generator seeded by ``seed`` (torch's global one without a seed). In a
DataLoader worker the generator is seeded by ``(seed, worker seed)``, where
torch gives every worker of every epoch its own seed (``base_seed +
worker_id``, ``base_seed`` drawn afresh for each epoch's iterator), so workers
and epochs draw distinct masks. Under :class:`~mptlml.hf.MPTTrainer` the
DataLoader only pads (:meth:`DataCollatorForMPT.pad`) and the trainer masks
every micro-batch with :meth:`DataCollatorForMPT.apply_masks` from a generator
seeded by (seed, update step, micro-batch, process): masks that a resumed run
draws again exactly.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..estimators import Estimator, accepted_options, available, create, get
from ..estimators.base import check_size_rule
from ..models.mlm_inputs import CORRUPTIONS, corrupt
from ..models.sequence_input import as_token_ids
from ..models.tokenizer_checks import MAX_UNKNOWN_FRACTION, check_round_trip
from ..seeds import spawn
from .loss import IGNORE_INDEX, LABELS, WEIGHTS

__all__ = ["CORRUPTIONS", "DEFAULT_RATE", "DataCollatorForMPT"]

_HINTS = {"rate": "rate applies to estimator='fixed-rate' only; {estimator} draws M from 1..D_i. "
                  "Drop rate, or pass estimator='fixed-rate'.",
          "stratified": "stratified=True applies to estimator='random-size' only (a fixed rate "
                        "has one size per sequence)."}
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
        Refused when it turns half or more of its own vocabulary into the
        unknown token (:func:`~mptlml.models.tokenizer_checks.check_round_trip`,
        as :class:`mptlml.models.MaskedLM` refuses it).
    estimator : {"random-size", "fixed-rate"}
        How M_i is drawn (module docstring).
    rate : float in (0, 1), optional
        Masking rate of ``"fixed-rate"``; default 0.15 (BERT). Refused with
        ``"random-size"``, which has no rate.
    mlm_probability : float in (0, 1), optional
        transformers' name for the masking rate, accepted for ``"fixed-rate"``
        (the same as ``rate``; pass one of the two). transformers masks each
        token with this probability; here exactly ``max(1, floor(p D_i))``
        tokens are masked, the fixed-rate rule of the package.
    corruption : {"mask", "bert"}
        ``"mask"`` (default): every masked position becomes [MASK].
        ``"bert"``: BERT's 80/10/10 rule (80% [MASK], 10% a uniformly random
        non-special token, 10% unchanged), as :class:`mptlml.models.MaskedLM`
        with ``corruption="bert"``.
    stratified : bool
        Spread the batch's sizes over the strata of U{1..D_i}
        (:class:`mptlml.estimators.RandomSize`); ``"random-size"`` only.
    seed : int, optional
        Seeds the collator's generator (module docstring: in a DataLoader
        worker, seed and the worker's seed; under :class:`~mptlml.hf.MPTTrainer`,
        seed and the update step). Without it torch's global generator is
        used (MPTTrainer: ``args.seed``).
    pad_to_multiple_of : int, optional
        Positive int, passed to ``tokenizer.pad``.
    return_tensors : {"pt"}
        Only PyTorch tensors.
    allow_unknown : bool
        A batch with more than :data:`~mptlml.models.tokenizer_checks.MAX_UNKNOWN_FRACTION`
        unknown tokens among its tokens, and a tokenizer that fails the round
        trip, warn instead of raising.

    Returns
    -------
    dict
        ``input_ids`` (masked), ``attention_mask``, ``mpt_labels`` (the true
        id at masked positions, -100 elsewhere), ``mpt_weights`` (float
        ``(B,)``, D_i / M_i; 0 where D_i = 0), and any other padded field of
        the examples (e.g. ``token_type_ids``). Feed the batch to
        :class:`mptlml.hf.MPTTrainer` or to :func:`mptlml.hf.mpt_batch_loss`;
        the model itself computes no loss from it (module docstring).
    """

    def __init__(self, tokenizer: Any, estimator: str | Estimator = "random-size",
                 rate: float | None = None, corruption: str = "mask", stratified: bool = False,
                 seed: int | None = None, pad_to_multiple_of: int | None = None,
                 return_tensors: str = "pt", *, mlm_probability: float | None = None,
                 allow_unknown: bool = False) -> None:
        choices = available(trainable=True, per_sequence_sizes=True)
        try:
            cls = get(estimator)
        except ValueError:
            raise ValueError(f"estimator must be one of {choices}, got {estimator!r}.") from None
        if not (cls.trainable and cls.per_sequence_sizes):
            raise ValueError(f"estimator must be one of {choices} (an estimator that draws one "
                             f"mask size per sequence), got {cls.name!r}.")
        if corruption not in CORRUPTIONS:
            raise ValueError(f"corruption must be one of {CORRUPTIONS}, got {corruption!r}.")
        takes_rate = "rate" in accepted_options(cls)
        if mlm_probability is not None:
            if rate is not None:
                raise ValueError(f"rate={rate!r} and mlm_probability={mlm_probability!r} name "
                                 "the same masking rate; pass one of the two.")
            if not takes_rate:
                raise ValueError(
                    f"mlm_probability={mlm_probability!r} is a fixed masking rate, but estimator="
                    f"{cls.name!r} has no rate. Pass estimator='fixed-rate' to mask "
                    "max(1, floor(p * D_i)) tokens per sequence, or drop mlm_probability.")
            rate = mlm_probability
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, numbers.Real)
                                 or math.isnan(float(rate)) or not 0.0 < float(rate) < 1.0):
            raise ValueError(f"rate must be a float in (0, 1), got {rate!r}.")
        takes_rate = "rate" in accepted_options(cls)
        self.size_rule = create(estimator, rate=DEFAULT_RATE if rate is None and takes_rate
                                and not isinstance(estimator, Estimator) else rate,
                                stratified=stratified, hints=_HINTS)
        _check_collator_rule(self.size_rule)
        rate = getattr(self.size_rule, "rate", None) or DEFAULT_RATE
        if return_tensors != "pt":
            raise ValueError(f"only return_tensors='pt' is supported, got {return_tensors!r}.")
        if pad_to_multiple_of is not None and (
                isinstance(pad_to_multiple_of, bool)
                or not isinstance(pad_to_multiple_of, numbers.Integral) or pad_to_multiple_of < 1):
            raise ValueError(f"pad_to_multiple_of must be a positive int or None, got "
                             f"{pad_to_multiple_of!r}.")
        if getattr(tokenizer, "mask_token_id", None) is None:
            raise ValueError("the tokenizer has no mask token; pass a masked-LM tokenizer.")
        if getattr(tokenizer, "pad_token_id", None) is None:
            raise ValueError("the tokenizer has no pad token; set tokenizer.pad_token first.")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
            raise TypeError(f"seed must be an int or None, got {seed!r}.")
        if seed is not None and int(seed) < 0:
            raise ValueError(f"seed must be a non-negative int or None, got {seed}.")
        check_round_trip(tokenizer, allow_unknown=bool(allow_unknown))
        self.tokenizer = tokenizer
        self.estimator = self.size_rule.name
        self.rate = float(rate)
        self.corruption = corruption
        self.stratified = bool(stratified)
        self.seed = None if seed is None else int(seed)
        self.pad_to_multiple_of = None if pad_to_multiple_of is None else int(pad_to_multiple_of)
        self.return_tensors = return_tensors
        self.allow_unknown = bool(allow_unknown)
        self.mask_token_id = int(tokenizer.mask_token_id)
        self.unk_token_id = (None if getattr(tokenizer, "unk_token_id", None) is None
                             else int(tokenizer.unk_token_id))
        self.special_ids = torch.tensor(sorted({int(i) for i in tokenizer.all_special_ids}),
                                        dtype=torch.long)
        vocab = len(tokenizer)
        self.replacement_ids = torch.tensor(
            [i for i in range(vocab) if i not in set(self.special_ids.tolist())], dtype=torch.long)
        if corruption == "bert" and self.replacement_ids.numel() == 0:
            raise ValueError("corruption='bert' needs at least one non-special token.")
        self._generator: torch.Generator | None = None
        self._worker_seed: int | None = None
        self._warned_unknown = False

    def __repr__(self) -> str:
        return (f"DataCollatorForMPT(estimator={self.estimator!r}, rate={self.rate}, "
                f"corruption={self.corruption!r}, stratified={self.stratified}, seed={self.seed})")

    # ------------------------------------------------------------------ randomness
    @property
    def generator(self) -> torch.Generator | None:
        """The generator of a direct call (None: torch's global one).

        In the main process, seeded once by ``seed`` and advancing from call to
        call. In a DataLoader worker, seeded by ``(seed, worker seed)``: torch
        draws a fresh worker seed for every worker of every epoch's iterator,
        so workers and epochs never repeat each other's masks (with
        ``persistent_workers`` the worker's stream simply goes on).
        """
        if self.seed is None:
            return None
        info = torch.utils.data.get_worker_info()
        if info is None:
            if self._generator is None or self._worker_seed is not None:
                self._generator = torch.Generator().manual_seed(self.seed)
                self._worker_seed = None
            return self._generator
        if self._generator is None or self._worker_seed != int(info.seed):
            self._generator = torch.Generator().manual_seed(spawn(self.seed, info.seed))
            self._worker_seed = int(info.seed)
        return self._generator

    # ------------------------------------------------------------------ batch
    def pad(self, examples: Sequence[Any]) -> dict[str, torch.Tensor]:
        """The examples padded into one batch, nothing masked (``tokenizer.pad``).

        What :class:`~mptlml.hf.MPTTrainer`'s DataLoader returns;
        :meth:`apply_masks` masks it.
        """
        if isinstance(examples, str | bytes | Mapping):
            raise TypeError(f"pass a list of examples (tokenizer outputs, one per sequence), not "
                            f"a single {type(examples).__name__}.")
        if not examples:
            raise ValueError("empty batch: pass at least one example.")
        how = "pass tokenizer outputs (tokenizer(text)) or lists of integer ids"
        if isinstance(examples[0], Mapping):
            keys = set(examples[0])
            _check_fields(examples[0])
            feats = []
            for i, e in enumerate(examples):
                if not isinstance(e, Mapping) or "input_ids" not in e:
                    raise ValueError(f"example {i} has no 'input_ids'; pass tokenizer outputs.")
                if set(e) != keys:
                    raise ValueError(f"example {i} has fields {sorted(e)} but example 0 has "
                                     f"{sorted(keys)}; give every example the same fields.")
                f = dict(e)
                f["input_ids"] = as_token_ids(e["input_ids"], f"example {i}'s input_ids",
                                              how).tolist()
                feats.append(f)
        else:
            feats = [{"input_ids": as_token_ids(e, f"example {i}", how).tolist()}
                     for i, e in enumerate(examples)]
        batch = self.tokenizer.pad(feats, return_tensors="pt",
                                   pad_to_multiple_of=self.pad_to_multiple_of)
        hit = (batch["input_ids"] == self.mask_token_id).nonzero()
        if hit.numel():
            i, j = (int(v) for v in hit[0])
            raise ValueError(
                f"example {i} already holds the mask token {self.tokenizer.mask_token!r} (input "
                f"position {j}) before masking: it would be visible context that is never "
                "scored. The collator masks positions itself; remove it from the text.")
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

    def _check_unknown(self, batch: Mapping[str, torch.Tensor]) -> None:
        """Refuse a batch whose tokens are mostly [UNK] (they are never masked: D_i = 0)."""
        if self.unk_token_id is None:
            return
        ids = batch["input_ids"]
        real = ~torch.isin(ids, self.special_ids[self.special_ids != self.unk_token_id])
        att = batch.get("attention_mask")
        if att is not None:
            real &= att.bool()
        n_unk, total = int((ids[real] == self.unk_token_id).sum()), int(real.sum())
        if not n_unk or n_unk <= MAX_UNKNOWN_FRACTION * total:
            return
        msg = (f"{n_unk} of the batch's {total} tokens ({100 * n_unk / total:.1f}%) are the "
               f"unknown token {self.tokenizer.unk_token}: [UNK] is never masked, so these "
               "sequences add (almost) nothing to the loss. The tokenizer does not fit the text "
               "(wrong tokenizer, lower-casing, or another alphabet).")
        if not self.allow_unknown:
            raise ValueError(msg + " If this is really meant, pass allow_unknown=True.")
        if not self._warned_unknown:
            self._warned_unknown = True
            warnings.warn(msg + " (allowed: allow_unknown=True)", stacklevel=3)

    def apply_masks(self, batch: Mapping[str, torch.Tensor],
                    generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """Mask a padded batch (:meth:`pad`): sizes, positions, corruption, weights.

        Draws from ``generator`` (None: torch's global generator); the input
        batch is not modified. Returns the collator's batch (class docstring).
        """
        batch = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        self._check_unknown(batch)
        ok = self.maskable(batch)
        batch.pop("special_tokens_mask", None)
        ids = batch["input_ids"]
        g = generator
        d = ok.sum(1)
        m = self.size_rule.sizes(d, generator=g)
        check_size_rule(self.size_rule, m, d)
        # uniform subset of size M_i among the maskable positions: the M_i smallest keys
        keys = torch.rand(ids.shape, generator=g, dtype=torch.float64)
        keys = keys.masked_fill(~ok, 2.0)
        rank = keys.argsort(dim=1).argsort(dim=1)
        masked = rank < m[:, None]
        labels = torch.where(masked, ids, torch.full_like(ids, IGNORE_INDEX))
        batch["input_ids"] = corrupt(ids, masked, corruption=self.corruption,
                                     mask_token_id=self.mask_token_id,
                                     replacement_ids=self.replacement_ids, generator=g)
        batch[LABELS] = labels
        # the estimator weighs S_hat = (1/M) sum_mask log q; per masked token: weight / M
        w = self.size_rule.weights(m, d)
        check_size_rule(self.size_rule, m, d, w)
        weights = torch.where(m > 0, w / m.clamp_min(1).double(), 0.0)
        batch[WEIGHTS] = weights.float()
        return batch

    def __call__(self, examples: Sequence[Any]) -> dict[str, torch.Tensor]:
        _refuse_plain_trainer()
        return self.apply_masks(self.pad(examples), self.generator)


def _check_collator_rule(rule: Estimator) -> None:
    """Refuse the options of an estimator that the collator would not carry out.

    The collator draws ONE size and ONE mask per sequence per batch, from
    :meth:`Estimator.sizes` with a tensor of D_i: ``num_masks`` (P draws per
    datum) and ``share_masks`` (one mask for all data) have no meaning there.
    """
    if rule.num_masks != 1:
        raise ValueError(
            f"the collator draws one mask per sequence per batch, but {rule!r} has "
            f"num_masks={rule.num_masks}, which it would not use; pass an estimator with "
            "num_masks=1 (more draws per sequence: repeat the sequence in the dataset, or "
            "MPTTrainer(eval_num_draws=) for evaluation).")
    if rule.share_masks:
        raise ValueError(
            f"the collator draws each sequence's own mask (sequences differ in length), but "
            f"{rule!r} has share_masks=True, which it would not use; pass share_masks=False.")


def _check_fields(example: Mapping[str, Any]) -> None:
    """Refuse fields ``tokenizer.pad`` cannot pad, or that would change the objective."""
    if "labels" in example:
        raise ValueError(
            "the examples have a 'labels' field: the collator makes its own targets "
            "('mpt_labels', the masked tokens) and a model given 'labels' would compute another "
            "loss. Drop that field (datasets: dataset.remove_columns('labels')).")
    for k, v in example.items():
        if isinstance(v, str | bytes) or (isinstance(v, Sequence) and v
                                          and isinstance(v[0], str | bytes)):
            raise ValueError(
                f"the examples have a text field {k!r}: the collator pads token ids only. "
                f"Tokenize it and drop the text (datasets: dataset.map(tokenize, "
                f"remove_columns=[{k!r}])).")


def _refuse_plain_trainer(depth: int = 40) -> None:
    """Refuse a direct call from a plain ``transformers.Trainer`` (it would find no loss).

    The collator's batches carry their targets as ``mpt_labels``, which no model
    turns into a loss, so ``Trainer`` would stop at its first step with "The model
    did not return a loss". :class:`~mptlml.hf.MPTTrainer` calls :meth:`pad` and
    :meth:`apply_masks` instead of this, so a ``Trainer`` among the callers
    (the DataLoader of the main process) is a plain one when it keeps
    ``Trainer.compute_loss``.
    """
    import sys

    tr = sys.modules.get("transformers")
    trainer = getattr(tr, "Trainer", None) if tr is not None else None
    if trainer is None:
        return
    f = sys._getframe(2)
    for _ in range(depth):
        if f is None:
            return
        obj = f.f_locals.get("self")
        if isinstance(obj, trainer) and type(obj).compute_loss is trainer.compute_loss:
            raise TypeError(
                f"DataCollatorForMPT is used by a plain {type(obj).__name__}: its batches carry "
                "the MPT targets as 'mpt_labels' with per-sequence weights, from which the "
                "model computes no loss. Train with mptlml.hf.MPTTrainer(model, args, "
                "data_collator=collator, ...), which computes the weighted MPT loss.")
        f = f.f_back
