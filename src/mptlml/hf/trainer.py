"""``MPTTrainer``: a transformers ``Trainer`` whose loss is :func:`~mptlml.hf.mpt_loss`.

transformers' ``compute_loss_func`` hook receives ``(outputs, labels,
num_items_in_batch)`` only, so it cannot see the per-sequence
``mpt_weights``; and every architecture's ``forward(**kwargs)`` accepts and
ignores ``mpt_weights``. So the collator hands the targets over as
``mpt_labels`` (no model computes a loss from them; a plain ``Trainer``
stops with "The model did not return a loss") and this subclass computes the
weighted loss itself.

What it guarantees
------------------
- **The objective.** The update of one optimizer step is the gradient of

      L = (1/B) sum_{i=1..B} w_i sum_{j in mask_i} -log q(x_ij | x_i,R),

  the mean over *all* B sequences of the accumulated micro-batches (and, with
  ``average_tokens_across_devices``, of all processes): the item of MPT is a
  sequence, so ``num_items_in_batch`` counts sequences and each micro-batch
  contributes its sum over sequences divided by B. Unequal micro-batches
  (the last one of an epoch) are not a mean of means.
- **The masks.** The DataLoader only pads (:meth:`DataCollatorForMPT.pad`);
  micro-batch k of update step s on process r is masked by
  :meth:`DataCollatorForMPT.apply_masks` with a generator seeded by
  ``(seed, s, k, r)`` (``seed``: the collator's, else ``args.seed``). The
  masks depend neither on the DataLoader workers nor on prefetching nor on
  evaluation, differ from epoch to epoch, and are drawn again identically
  when training resumes from a checkpoint (``resume_from_checkpoint``): with
  the Trainer's seedable sampler the resumed run takes the same steps as the
  uninterrupted one.
- **Evaluation.** ``eval_loss`` is the mean over the evaluation sequences of
  the same weighted loss, ``w_i sum_{j in mask_i} -log q(x_ij | x_i,R)`` in
  nats per sequence: under ``"random-size"`` an unbiased estimate of minus
  the sequence's MPT sum ``sum_{M=1..D_i} S(x_i; M)`` (the negative
  likelihood bound of :mod:`mptlml.hf`; ``"fixed-rate"``: minus
  ``D_i S(x_i; M_i)``), averaged over ``eval_num_draws`` mask draws. The
  evaluation masks are seeded by (seed, batch, draw) only, so every
  evaluation of a run uses the same masks (differences between calls come
  from the model, not from new masks) and evaluating never changes the
  training masks. For an exact number use ``mptlml.estimate_lml(MaskedLM(model,
  tok), texts, "cumulative")``.
- **Refused.** A collator other than :class:`DataCollatorForMPT`, a model
  that is not a masked LM (a causal LM), ``label_smoothing_factor`` (it would
  change the objective away from a likelihood bound),
  ``compute_loss_func`` (it cannot see the weights), training or evaluation
  data without a single maskable token (the loss would be the empty sum, 0)
  and batches longer than the model's position table.
"""

from __future__ import annotations

from typing import Any

import torch

from .._optional import require
from .._validation import check_positive_int
from ..models.hf_loading import check_masked_lm, position_limit
from ..seeds import spawn
from .collator import DataCollatorForMPT
from .loss import LABELS, WEIGHTS, _logits_of, mpt_loss

try:
    from transformers import Trainer
except ImportError:
    require("transformers", "mptlml.hf.MPTTrainer")  # names the extra when it is missing
    raise

__all__ = ["MPTTrainer"]

_TRAIN, _EVAL = 0, 1  # stream tags of the mask generators


def _items_mean(trainer: Trainer, terms: torch.Tensor, num_items_in_batch: Any) -> torch.Tensor:
    """A micro-batch's loss from its items' losses ``terms``: its share of the step's mean.

    ``sum(terms) / num_items_in_batch`` (the items of all accumulated micro-batches, and of
    all processes with ``average_tokens_across_devices``, times the number of processes as
    DDP averages the gradients), else ``mean(terms)``.
    """
    if num_items_in_batch is None:
        return terms.mean()
    loss = terms.sum() / num_items_in_batch.to(terms.device, terms.dtype)
    if trainer.args.average_tokens_across_devices and trainer.args.world_size > 1:
        loss = loss * trainer.accelerator.num_processes  # DDP averages the gradients
    return loss


def _step_batches(epoch_iterator: Any, num_batches: int) -> list:
    """The next ``num_batches`` micro-batches of an epoch (fewer at its end): one step's.

    ``Trainer.get_batch_samples``' loop, kept here because the trainers count their items
    themselves: transformers 4.46-4.5x count label tokens there and call the method without
    the ``device`` that transformers 5 passes.
    """
    batches = []
    for _ in range(num_batches):
        try:
            batches.append(next(epoch_iterator))
        except StopIteration:
            break
    return batches


class _PadOnly:
    """The DataLoader's collate function under :class:`MPTTrainer`: pads, masks nothing."""

    def __init__(self, collator: DataCollatorForMPT) -> None:
        self.collator = collator

    def __call__(self, examples: Any) -> dict[str, torch.Tensor]:
        return self.collator.pad(examples)


class MPTTrainer(Trainer):
    """``transformers.Trainer`` that trains by MPT with :class:`~mptlml.hf.DataCollatorForMPT`.

    Use it as ``Trainer`` with ``data_collator=DataCollatorForMPT(tok)``; see
    the module docstring for what the loss, the masks and ``eval_loss`` are.

    Parameters
    ----------
    *args, **kwargs
        Those of ``transformers.Trainer``. ``data_collator`` must be a
        :class:`DataCollatorForMPT`; ``compute_loss_func`` and
        ``args.label_smoothing_factor`` are refused.
    eval_num_draws : int
        Mask draws per evaluation batch (``eval_loss`` is their mean).
    """

    def __init__(self, model: Any = None, args: Any = None, data_collator: Any = None,
                 *rest: Any, eval_num_draws: int = 1, **kwargs: Any) -> None:
        if not isinstance(data_collator, DataCollatorForMPT):
            raise TypeError(
                "MPTTrainer draws its masks with mptlml.hf.DataCollatorForMPT; pass "
                f"data_collator=DataCollatorForMPT(tokenizer), got {type(data_collator).__name__}.")
        if kwargs.get("compute_loss_func") is not None or (len(rest) > 4 and rest[4] is not None):
            raise ValueError(
                "MPTTrainer computes the MPT loss itself (transformers' compute_loss_func cannot "
                "see the per-sequence weights D_i / M_i); drop compute_loss_func, or subclass "
                "MPTTrainer and override compute_loss.")
        if args is not None and float(getattr(args, "label_smoothing_factor", 0.0)) != 0.0:
            raise ValueError(
                f"label_smoothing_factor={args.label_smoothing_factor} would train another "
                "objective: the MPT loss is the weighted log-likelihood of the masked tokens "
                "(a bound on the log-likelihood); set label_smoothing_factor=0.")
        if model is not None:
            check_masked_lm(model, "MPTTrainer")
        self.mpt_collator = data_collator
        self.eval_num_draws = check_positive_int(eval_num_draws, "eval_num_draws")
        self._mpt_scaled = False
        self._eval_batch = 0
        super().__init__(model, args, _PadOnly(data_collator), *rest, **kwargs)

    # ------------------------------------------------------------------ masks
    @property
    def mask_seed(self) -> int:
        """Seed of the masks: the collator's ``seed``, else ``args.seed``."""
        s = self.mpt_collator.seed
        return int(self.args.seed if s is None else s)

    def _mask(self, batch: Any, *keys: int) -> dict[str, Any]:
        limit = None if self.model is None else position_limit(self.model)
        length = int(batch["input_ids"].shape[1])
        if limit is not None and length > limit:
            raise ValueError(
                f"a batch holds inputs of {length} tokens (special tokens and padding included) "
                f"but the model's position table covers {limit}; truncate the examples when "
                f"tokenizing (tokenizer(text, truncation=True, max_length={limit})) or split "
                "long texts into chunks" + (", and keep pad_to_multiple_of within it"
                                           if self.mpt_collator.pad_to_multiple_of else "") + ".")
        g = torch.Generator().manual_seed(spawn(self.mask_seed, *keys,
                                                      self.args.process_index))
        return self.mpt_collator.apply_masks(batch, g)

    def _check_maskable(self, dataset: Any, what: str) -> None:
        """Refuse a dataset without a single maskable token (its MPT loss is the empty sum, 0).

        Scans the examples of a sized dataset until the first that has one
        (usually the first); an iterable dataset is not scanned.
        """
        if dataset is None or not hasattr(dataset, "__len__") \
                or not hasattr(dataset, "__getitem__"):
            return
        coll = self.mpt_collator
        keep = ("input_ids", "special_tokens_mask", "attention_mask")
        for i in range(len(dataset)):
            ex = dataset[i]
            ex = {k: ex[k] for k in keep if k in ex} if isinstance(ex, dict) else ex
            if bool(coll.maskable(coll.pad([ex])).any()):
                return
        raise ValueError(
            f"the {what} dataset ({len(dataset)} examples) has no maskable token: every "
            "sequence is empty or special tokens only, so the MPT loss is the empty sum 0 and "
            f"nothing would be {'trained' if what == 'training' else 'evaluated'}. Check the "
            "tokenization (e.g. a text column that was never tokenized, or empty lines).")

    def train(self, *args: Any, **kwargs: Any) -> Any:
        """``Trainer.train``, refusing training data without a maskable token first."""
        self._check_maskable(self.train_dataset, "training")
        return super().train(*args, **kwargs)

    def evaluate(self, eval_dataset: Any = None, *args: Any, **kwargs: Any) -> Any:
        """``Trainer.evaluate``, refusing evaluation data without a maskable token first."""
        data = self.eval_dataset if eval_dataset is None else eval_dataset
        for part in (data.values() if isinstance(data, dict) else [data]):
            self._check_maskable(part, "evaluation")
        return super().evaluate(eval_dataset, *args, **kwargs)

    def get_batch_samples(self, epoch_iterator: Any, num_batches: int,
                          device: torch.device | None = None) -> tuple[list, Any]:
        """The micro-batches of one update step, masked, and the number of sequences in them.

        ``device`` is passed by transformers 5 (4.46-4.5x pass none: the arguments' device).
        """
        step = int(self.state.global_step)
        batches = [self._mask(b, _TRAIN, step, k)
                   for k, b in enumerate(_step_batches(epoch_iterator, num_batches))]
        return batches, self._get_num_items_in_batch(
            batches, self.args.device if device is None else device)

    def _get_num_items_in_batch(self, batch_samples: list, device: torch.device) -> Any:
        """Sequences in the accumulated micro-batches (summed over processes when averaging)."""
        if not batch_samples:
            return None
        n = torch.tensor(sum(int(b["input_ids"].shape[0]) for b in batch_samples))
        if self.args.average_tokens_across_devices and self.args.world_size > 1:
            n = self.accelerator.gather(n.to(device)).sum()
        return n.to(device)

    # ------------------------------------------------------------------ loss
    @property
    def loss_is_scaled_for_ga(self) -> bool:  # type: ignore[override]
        """Whether the last loss was divided by the accumulated number of sequences."""
        return self._mpt_scaled

    def compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any],
                     return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        """``sum_i w_i nll_i / num_items_in_batch`` (else the batch mean) of a masked batch."""
        inputs = dict(inputs)
        weights = inputs.pop(WEIGHTS, None)
        labels = inputs.pop(LABELS, None)
        if weights is None or labels is None:
            raise ValueError(
                f"MPTTrainer needs batches with {LABELS!r} and {WEIGHTS!r}; pass "
                "data_collator=mptlml.hf.DataCollatorForMPT(tokenizer) to the trainer (and keep "
                "those keys in the batch)."
            )
        if "labels" in inputs:
            raise ValueError("the batch has 'labels': the model would compute its own "
                             "unweighted loss; MPT batches carry their targets as 'mpt_labels'.")
        outputs = model(**inputs)
        terms = mpt_loss(_logits_of(outputs), labels, weights, reduction="none")
        self._mpt_scaled = num_items_in_batch is not None
        loss = _items_mean(self, terms, num_items_in_batch)
        return (loss, outputs) if return_outputs else loss

    # ------------------------------------------------------------------ evaluation
    def evaluation_loop(self, *args: Any, **kwargs: Any) -> Any:
        self._eval_batch = 0  # the same masks at every evaluation
        return super().evaluation_loop(*args, **kwargs)

    def prediction_step(self, model: torch.nn.Module, inputs: dict[str, Any],
                        prediction_loss_only: bool,
                        ignore_keys: list[str] | None = None) -> tuple[Any, Any, Any]:
        """The weighted loss of a padded evaluation batch, mean over ``eval_num_draws`` masks.

        Batch b of an evaluation, draw r, is masked with the generator seeded
        by (seed, b, r): every evaluation sees the same masks. Logits and
        ``mpt_labels`` (for ``compute_metrics``) are those of the first draw.
        """
        b = self._eval_batch
        self._eval_batch += 1
        losses, first = [], None
        model.eval()
        with torch.no_grad():
            for r in range(self.eval_num_draws):
                masked = self._prepare_inputs(self._mask(inputs, _EVAL, b, r))
                labels = masked[LABELS]
                loss, outputs = self.compute_loss(model, masked, return_outputs=True)
                losses.append(loss.detach())
                if first is None:
                    first = (_logits_of(outputs).detach(), labels)
        loss = torch.stack(losses).mean()
        if prediction_loss_only:
            return loss, None, None
        return loss, first[0], first[1]  # type: ignore[index]
