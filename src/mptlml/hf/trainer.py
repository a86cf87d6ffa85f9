"""``MPTTrainer``: a transformers ``Trainer`` whose loss is :func:`~mptlml.hf.mpt_loss`.

transformers' ``compute_loss_func`` hook receives ``(outputs, labels,
num_items_in_batch)`` only, so it cannot see the per-sequence
``mpt_weights``; and a plain ``Trainer`` would pass ``mpt_weights`` on to the
model, where ``BertForMaskedLM.forward(**kwargs)`` accepts and ignores it and
the model's own unweighted loss would be used silently. This subclass pops
``mpt_weights`` and ``labels`` from the batch, runs the model and returns the
weighted loss (a per-batch mean: the Trainer divides it by the gradient
accumulation steps).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import Trainer

from .loss import _logits_of, mpt_loss

__all__ = ["MPTTrainer"]


class MPTTrainer(Trainer):
    """``transformers.Trainer`` for batches of :class:`~mptlml.hf.DataCollatorForMPT`.

    Use it exactly as ``Trainer`` with ``data_collator=DataCollatorForMPT(tok)``.
    A batch without ``mpt_weights`` is refused (it did not come from the MPT
    collator).
    """

    #: compute_loss returns a per-batch mean; the Trainer scales it for accumulation.
    loss_is_scaled_for_ga = False

    def compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any],
                     return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        inputs = dict(inputs)
        weights = inputs.pop("mpt_weights", None)
        labels = inputs.pop("labels", None)
        if weights is None or labels is None:
            raise ValueError(
                "MPTTrainer needs batches with 'labels' and 'mpt_weights'; pass "
                "data_collator=mptlml.hf.DataCollatorForMPT(tokenizer) to the trainer (and keep "
                "those keys in the batch)."
            )
        outputs = model(**inputs)
        loss = mpt_loss(_logits_of(outputs), labels, weights)
        return (loss, outputs) if return_outputs else loss
