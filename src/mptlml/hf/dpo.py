"""``MPTDPOTrainer``: DPO of a masked LM on paired conditional MPT bounds (a transformers Trainer).

Constructed as TRL's ``DPOTrainer``::

    trainer = MPTDPOTrainer(model=model, ref_model=None, args=TrainingArguments(...),
                            train_dataset=pairs, processing_class=tokenizer, beta=0.1,
                            num_masks=8)

with ``pairs`` a ``datasets.Dataset`` (or a list of dicts) of strings ``prompt``,
``chosen``, ``rejected`` (TRL's preference format).

What it guarantees
------------------
- **The objective.** The update of one optimizer step is the gradient of

      L = (1/B) sum_{i=1..B} -log sigmoid(m_i),

  m_i the margin of pair i estimated on its paired conditional bounds
  (:func:`~mptlml.hf.preference.preference_bounds`: policy and reference on the same
  masks, chosen and rejected at the same rates), the mean over *all* B pairs of the
  accumulated micro-batches (and, with ``average_tokens_across_devices``, of all
  processes), as :class:`~mptlml.hf.MPTTrainer` does for sequences.
- **The masks.** Pair j of update step s draws from a generator seeded by ``(seed, s, j)``
  (``seed``: the trainer's, else ``args.seed``), j its place among *all* the step's pairs:
  micro-batch k of process r is the sampler's micro-batch ``k R + r`` of the step (R
  processes, accelerate's sharding), so its pairs follow those of the micro-batches before
  it in that order. The masks depend neither on how the step is cut into micro-batches
  nor on how many processes share it (accumulating 2 x 2 pairs, or 2 processes of 2,
  draw what one batch of 4 draws), differ from step to step, and are drawn again
  identically when training resumes from a checkpoint. Evaluation pair j (its place in
  the evaluation set, likewise global) draws from ``(seed, j)`` of the evaluation stream.
- **The allocation.** With ``allocation="neyman"`` (the default) the rate density of step s
  is set in proportion to the spread of the margin's draws by rate bin over steps 0..s-1
  (Neyman: the learned-rate estimator's :func:`~mptlml.estimators.learned_rate.pair_spread`
  and :func:`~mptlml.estimators.learned_rate.learned_density`, floored), summed over all
  processes
  (one all-reduce per step): no pilot, each step unbiased given the past, and every
  process draws with the same density. It is saved with every checkpoint and read back
  on resume.
- **The reference.** ``ref_model=None`` makes a frozen deep copy of the model as it is at
  construction; the reference runs in eval mode under ``torch.no_grad`` and never has a
  gradient.
- **The logs** (per logging window, averaged over its steps): ``loss``;
  ``rewards/chosen``, ``rewards/rejected`` (beta (B_pi - B_ref) of each response),
  ``rewards/accuracies`` (share of pairs with m > 0), ``rewards/margins`` (mean m),
  ``rewards/margins_sd`` (the margins' spread over the step's pairs), ``margin_mc_se``
  (the Monte Carlo SE of the step's mean margin, ``sqrt(sum_i se_i^2) / B``: when it is
  not well below ``rewards/margins_sd``, the masks per step, not the data, dominate the
  noise of the gradient; raise ``num_masks``), ``logps/chosen``, ``logps/rejected`` (the
  policy's bounds). Evaluation logs the same with ``eval_`` in front, on fixed masks.
- **The data**, checked once at construction, row by row: a bad row is refused naming its
  index in the dataset; TRL's conversational rows (lists of ``{"role", "content"}``
  messages) go through the tokenizer's chat template as TRL's do (refused by name without
  one); rows whose chosen and rejected responses tokenise identically are dropped, with a
  warning that counts them.
- **A loss that is not finite** (NaN logits) stops training with a message before the
  optimizer steps.
- **Refused.** A model that is not a masked LM (without ``mask_token_id=``), a reference
  that is the model itself, data without the three text columns, ``label_smoothing_factor``
  and ``compute_loss_func``.
"""

from __future__ import annotations

import copy
import json
import math
import numbers
import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .._optional import require
from .._validation import ALLOCATIONS, check_positive_int
from ..estimators.learned_rate import learned_density
from ..estimators.sequential import EXACT_LENGTH, NUM_RATE_BINS, RateDensity
from ..seeds import check_seed, spawn
from .preference import (
    MASK_SCHEMES,
    EncodedPairs,
    check_exact_length,
    dpo_loss,
    encode_pairs,
    preference_bounds,
)
from .trainer import _items_mean, _step_batches

try:
    from transformers import Trainer
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
except ImportError:
    require("transformers", "mptlml.hf.MPTDPOTrainer")  # names the extra when it is missing
    raise

__all__ = ["COLUMNS", "DataCollatorForPreference", "MPTDPOTrainer"]

#: the columns of a preference dataset (TRL's DPO format)
COLUMNS = ("prompt", "chosen", "rejected")
#: the file of a checkpoint holding the learned allocation's evidence
STATE_FILE = "mpt_dpo_allocation.json"
#: the batch key of a micro-batch's first pair's place among its step's pairs
OFFSET = "pair_offset"
_TRAIN, _EVAL = 0, 1  # stream tags of the mask generators


class DataCollatorForPreference:
    """Tokenise preference pairs with the policy's own tokenisation (one list per field).

    Called on a list of examples (dicts with ``prompt``, ``chosen``, ``rejected``
    strings), returns ``chosen_ids`` / ``rejected_ids`` (lists of LongTensor: the content
    ids of prompt + response, :func:`~mptlml.hf.preference.encode_pairs`) and
    ``chosen_context`` / ``rejected_context`` (LongTensor ``(B,)``: how many of them are
    the prompt's). No masks: :class:`MPTDPOTrainer` draws them.

    Parameters
    ----------
    lm : MaskedLM
        The policy as a :class:`~mptlml.models.MaskedLM` (its tokenizer and frame).
    """

    def __init__(self, lm: Any) -> None:
        self.lm = lm

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        if not examples:
            raise ValueError("empty batch: pass at least one preference pair.")
        for i, e in enumerate(examples):
            if not isinstance(e, Mapping) or any(c not in e for c in COLUMNS):
                got = sorted(e) if isinstance(e, Mapping) else type(e).__name__
                raise ValueError(f"example {i} must hold the strings {list(COLUMNS)} (TRL's "
                                 f"preference format), got {got}.")
        enc = encode_pairs(self.lm, *[[e[c] for e in examples] for c in COLUMNS])
        return {"chosen_ids": enc.chosen, "rejected_ids": enc.rejected,
                "chosen_context": torch.tensor(enc.chosen_context),
                "rejected_context": torch.tensor(enc.rejected_context)}


def _pairs_of(inputs: Mapping[str, Any]) -> EncodedPairs:
    return EncodedPairs([t.cpu() for t in inputs["chosen_ids"]],
                        [int(n) for n in inputs["chosen_context"]],
                        [t.cpu() for t in inputs["rejected_ids"]],
                        [int(n) for n in inputs["rejected_context"]])


def _check_dataset(data: Any, what: str) -> None:
    """Refuse a dataset without the three text columns, before any work."""
    if data is None:
        return
    cols = getattr(data, "column_names", None)
    if cols is None and hasattr(data, "__getitem__") and hasattr(data, "__len__") and len(data):
        first = data[0]
        cols = list(first) if isinstance(first, Mapping) else None
    if cols is not None and not all(c in cols for c in COLUMNS):
        raise ValueError(f"the {what} dataset must have the text columns {list(COLUMNS)} (TRL's "
                         f"preference format); it has {list(cols)}.")


def _is_conversation(value: Any) -> bool:
    """TRL's conversational format: a list of ``{"role", "content"}`` messages."""
    return (isinstance(value, list | tuple) and len(value) > 0
            and all(isinstance(m, Mapping) and "role" in m and "content" in m for m in value))


def _from_conversation(row: Mapping[str, Any], tokenizer: Any, where: str) -> dict[str, Any]:
    """A conversational pair as texts through the tokenizer's chat template, as TRL does:
    the prompt with the generation prompt, each response as the templated prompt + response
    past the templated prompt."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError(
            f"{where} is in TRL's conversational format (lists of {{'role', 'content'}} "
            f"messages) and the tokenizer ({type(tokenizer).__name__}) has no chat template "
            "to turn it into text. Set tokenizer.chat_template, or pass the pairs as strings "
            f"{list(COLUMNS)}.")
    for c in COLUMNS:
        if not _is_conversation(row[c]):
            raise ValueError(f"{where}: {c!r} is not a list of {{'role', 'content'}} messages "
                             "while the others are; pass all three as messages, or all as "
                             "strings.")
    prompt = list(row["prompt"])
    text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    out = {"prompt": text}
    for c in ("chosen", "rejected"):
        full = tokenizer.apply_chat_template(prompt + list(row[c]), tokenize=False)
        if not full.startswith(text):
            raise ValueError(f"{where}: the chat template of prompt + {c} does not begin with "
                             "the template of the prompt, so the response cannot be cut from "
                             "it; pass the pairs as strings.")
        out[c] = full[len(text):]
    return out


def _prepare_dataset(data: Any, what: str, lm: Any) -> Any:
    """Check every row of a preference dataset once, before training; the rows as trained.

    Each row is named by its index in the dataset: a row that is not a mapping of the three
    columns, or whose fields the policy cannot tokenise, is refused. Conversational rows
    (TRL's lists of messages) are taken through the tokenizer's chat template (or refused
    by name without one). Rows whose chosen and rejected responses tokenise identically
    (no preference) are dropped, with a warning that counts them. A dataset that cannot be
    indexed (streaming) is left to the collator, batch by batch.
    """
    import warnings

    if data is None or not (hasattr(data, "__getitem__") and hasattr(data, "__len__")):
        return data
    rows, changed, ties = [], False, []
    for i in range(len(data)):
        row = data[i]
        where = f"row {i} of the {what} dataset"
        if not isinstance(row, Mapping) or any(c not in row for c in COLUMNS):
            got = sorted(row) if isinstance(row, Mapping) else type(row).__name__
            raise ValueError(f"{where} must hold {list(COLUMNS)} (TRL's preference format), "
                             f"got {got}.")
        if any(_is_conversation(row[c]) for c in COLUMNS):
            row, changed = _from_conversation(row, lm.tokenizer, where), True
        else:
            row = {c: row[c] for c in COLUMNS}
            for c in COLUMNS:
                value = row[c]
                if not (isinstance(value, str) or (isinstance(value, list | tuple) and all(
                        isinstance(t, numbers.Integral) and not isinstance(t, bool)
                        for t in value))):
                    raise ValueError(
                        f"{where}: {c!r} is a {type(value).__name__} ({value!r:.60}); each field "
                        "is a string (or a list of token ids), or all three are TRL's "
                        "conversational lists of {'role', 'content'} messages.")
        try:
            enc = encode_pairs(lm, [row["prompt"]], [row["chosen"]], [row["rejected"]])
        except (ValueError, TypeError) as exc:
            raise type(exc)(f"{where}: {exc}") from None
        if enc.chosen_context == enc.rejected_context and torch.equal(enc.chosen[0],
                                                                        enc.rejected[0]):
            ties.append(i)
            continue
        rows.append(row)
    if ties:
        warnings.warn(f"{len(ties)} of {len(data)} rows of the {what} dataset have identical "
                      f"chosen and rejected responses (rows {ties[:10]}"
                      f"{' ...' if len(ties) > 10 else ''}): no preference to learn, dropped.",
                      UserWarning, stacklevel=3)
        if len(ties) == len(data):
            raise ValueError(f"every row of the {what} dataset has identical chosen and "
                             "rejected responses: nothing to train on.")
    return rows if changed or ties else data


def _disable_dropout(model: torch.nn.Module) -> None:
    """Dropout 0 everywhere in ``model``: dropout modules' ``p`` and every float attribute
    (of a module or of its config) named as a dropout rate (``dropout``, ``dropout_prob``,
    ``attention_dropout``, ``attention_probs_dropout_prob``, ...), which some attention
    implementations read instead of a module (transformers 4.x's BERT SDPA, LLaDA's config).
    """
    for mod in model.modules():
        if isinstance(mod, torch.nn.modules.dropout._DropoutNd):
            mod.p = 0.0
        holders = [mod.__dict__]
        config = getattr(mod, "config", None)
        if config is not None and hasattr(config, "__dict__"):
            holders.append(config.__dict__)
        for d in holders:
            for name, value in list(d.items()):
                if "dropout" in name and isinstance(value, float) and not isinstance(value, bool):
                    d[name] = 0.0

class MPTDPOTrainer(Trainer):
    """``transformers.Trainer`` that trains a masked LM by DPO on paired MPT bounds.

    Parameters
    ----------
    model : transformers masked LM, or a module with ``mask_token_id``
        The policy, trained.
    ref_model : same kind, optional
        The frozen reference; None: a deep copy of ``model`` at construction.
    args : TrainingArguments
    train_dataset, eval_dataset : Dataset or list of dicts
        Strings ``prompt``, ``chosen``, ``rejected`` per pair.
    processing_class : tokenizer
        The model's tokenizer (prompt and responses are tokenised as one joined text).
    beta : float
        DPO's inverse temperature.
    num_masks : int
        Draws per response and step (even; plus the one mask of the whole response):
        each pair costs ``2 (num_masks + 1)`` masked inputs through the policy (with
        gradients) and as many through the reference.
    masks : {"common", "independent", "vrpo"}
        How the four bounds of a pair draw their masks (:mod:`mptlml.hf.preference`).
    allocation : {"neyman", "uniform"}
        ``"neyman"``: learn the rate density across steps from the margin's spread by rate
        (``masks="common"`` only); ``"uniform"``: keep it uniform
        (``mptlml._validation.ALLOCATIONS``, as every target's).
    exact_length : int
        Responses of at most this many tokens are scored on every mask (exact).
    seed : int, optional
        Seed of the masks (default ``args.seed``).
    mask_token_id, family, force_family : optional
        As for :class:`~mptlml.models.MaskedLM` (a masked-diffusion LM's plain mask id).
    disable_dropout : bool
        Set the policy's dropout to 0 (TRL's default): its dropout modules, and every
        float dropout rate held by a module or its config (``torch.nn.MultiheadAttention``'s
        ``dropout``, BERT's SDPA attention's ``dropout_prob`` under transformers 4.x,
        ``config.attention_dropout``, ...). The policy and reference then differ by their
        weights only, which common masks need to cancel noise.
    **kwargs
        The rest of ``transformers.Trainer``'s arguments (``callbacks``, ``optimizers``, ...).
    """

    def __init__(self, model: Any = None, ref_model: Any = None, args: Any = None,
                 data_collator: Any = None, train_dataset: Any = None, eval_dataset: Any = None,
                 processing_class: Any = None, *, beta: float = 0.1, num_masks: int = 8,
                 masks: str = "common", allocation: str = "neyman",
                 exact_length: int = EXACT_LENGTH, seed: int | None = None,
                 mask_token_id: int | None = None, family: str | None = None,
                 force_family: bool = False, disable_dropout: bool = True,
                 **kwargs: Any) -> None:
        from ..models.masked_lm import MaskedLM

        if model is None or processing_class is None:
            raise TypeError("MPTDPOTrainer needs model= (the policy, a masked LM) and "
                            "processing_class= (its tokenizer).")
        if kwargs.get("compute_loss_func") is not None:
            raise ValueError("MPTDPOTrainer computes the DPO loss on MPT bounds itself; drop "
                             "compute_loss_func.")
        if args is not None and float(getattr(args, "label_smoothing_factor", 0.0)) != 0.0:
            raise ValueError(f"label_smoothing_factor={args.label_smoothing_factor} has no "
                             "meaning for a DPO loss on bounds; set label_smoothing_factor=0.")
        if ref_model is model:
            raise ValueError("ref_model is the model itself: its bounds would move with the "
                             "policy. Pass ref_model=None (a frozen copy is made) or another "
                             "copy of the starting point.")
        if masks not in MASK_SCHEMES:
            raise ValueError(f"masks must be one of {MASK_SCHEMES}, got {masks!r}.")
        if allocation not in ALLOCATIONS:
            raise ValueError(f"allocation must be one of {ALLOCATIONS}, got {allocation!r}.")
        if allocation == "neyman" and masks != "common":
            raise ValueError(f"allocation='neyman' learns from the paired draws of "
                             f"masks='common'; with masks={masks!r} pass allocation='uniform'.")
        if data_collator is not None and not isinstance(data_collator,
                                                        DataCollatorForPreference):
            raise TypeError("MPTDPOTrainer tokenises pairs with its own "
                            "DataCollatorForPreference; drop data_collator.")
        if seed is not None:
            seed = check_seed(seed)
        exact_length = check_exact_length(exact_length)  # every exact path under one cap
        for what, data in (("training", train_dataset), ("evaluation", eval_dataset)):
            for part in (data.values() if isinstance(data, dict) else [data]):
                _check_dataset(part, what)
        if disable_dropout:
            _disable_dropout(model)
        if ref_model is None:
            ref_model = copy.deepcopy(model)
        ref_model.eval().requires_grad_(False)
        conv = {"mask_token_id": mask_token_id, "family": family, "force_family": force_family}
        self.policy_lm = MaskedLM(model, processing_class, **conv)
        self.ref_lm = MaskedLM(ref_model, processing_class, **conv)
        train_dataset = _prepare_dataset(train_dataset, "training", self.policy_lm)
        eval_dataset = ({k: _prepare_dataset(v, f"evaluation {k!r}", self.policy_lm)
                         for k, v in eval_dataset.items()} if isinstance(eval_dataset, dict)
                        else _prepare_dataset(eval_dataset, "evaluation", self.policy_lm))
        self.beta = float(beta)
        self.num_masks = check_positive_int(num_masks, "num_masks")
        self.masks = masks
        self.allocation = allocation
        self.exact_length = exact_length
        self.dpo_seed = seed
        self.spread_sum = np.zeros(NUM_RATE_BINS)
        self.spread_count = np.zeros(NUM_RATE_BINS)
        self.density = RateDensity(np.ones(NUM_RATE_BINS))
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._records: dict[str, list[dict[str, np.ndarray]]] = defaultdict(list)
        self._eval_seen = 0  # evaluation pairs (of all processes) before the next batch
        super().__init__(model=model, args=args, data_collator=DataCollatorForPreference(
            self.policy_lm), train_dataset=train_dataset, eval_dataset=eval_dataset,
            processing_class=processing_class, **kwargs)
        if self.num_masks % 2 and masks != "vrpo":
            raise ValueError(f"num_masks must be even (two draws per rate stratum), got "
                             f"{self.num_masks}.")
        self.ref_lm.model.to(self.args.device)

    # ------------------------------------------------------------------ data
    def _remove_unused_columns(self, dataset: Any, description: str | None = None) -> Any:
        return dataset  # the text columns are the data; the model's forward never sees them

    def _get_collator_with_removed_columns(self, data_collator: Any,
                                           description: str | None = None) -> Any:
        return data_collator

    @property
    def mask_seed(self) -> int:
        """Seed of the masks: the trainer's ``seed``, else ``args.seed``."""
        return int(self.args.seed if self.dpo_seed is None else self.dpo_seed)

    def _global_sizes(self, sizes: list[int], slots: int) -> torch.Tensor:
        """``(R, slots)`` pair counts of every process's micro-batches (one gather; 0: none)."""
        local = torch.zeros(1, slots, dtype=torch.long)
        local[0, :len(sizes)] = torch.tensor(sizes, dtype=torch.long)
        if self.args.world_size == 1:
            return local
        return self.accelerator.gather(local.to(self.args.device)).cpu()

    def _offsets(self, sizes: torch.Tensor) -> torch.Tensor:
        """Where this process's micro-batches start among all pairs, ``(slots,)``.

        Micro-batch k of process r is the sampler's ``k R + r``-th (accelerate's sharding of
        the batches): its pairs follow those of every earlier one in that order.
        """
        flat = sizes.T.reshape(-1)  # the sampler's order: k major, process minor
        start = (flat.cumsum(0) - flat).reshape(sizes.shape[1], sizes.shape[0])
        return start[:, self.args.process_index]

    def get_batch_samples(self, epoch_iterator: Any, num_batches: int,
                          device: torch.device | None = None) -> tuple[list, Any]:
        """The micro-batches of one update step, each told where its pairs start in the step.

        Returns them with the number of pairs in the step (of all processes with
        ``average_tokens_across_devices``; ``device`` is transformers 5's, the arguments'
        device under 4.46-4.5x). The allocation learned from the steps so far
        (of all processes) is set here, once per step.
        """
        batches = _step_batches(epoch_iterator, num_batches)
        self._learn()
        sizes = self._global_sizes([len(b["chosen_ids"]) for b in batches], num_batches)
        for b, off in zip(batches, self._offsets(sizes), strict=False):
            b[OFFSET] = off.clone()
        if not batches:
            return batches, None
        spread = self.args.average_tokens_across_devices and self.args.world_size > 1
        n = sizes.sum() if spread else sizes[self.args.process_index].sum()
        return batches, n.to(self.args.device if device is None else device)

    def train(self, *args: Any, **kwargs: Any) -> Any:
        """``Trainer.train``; the last step's draws are folded into the allocation after it."""
        out = super().train(*args, **kwargs)
        self._learn()
        return out

    def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """``Trainer.training_step``, stopped with a message when the loss is not finite.

        A NaN or infinite loss (NaN logits, an overflow) is raised on, every process
        agreeing, before the optimizer steps: its gradient would make the weights NaN,
        while transformers' ``logging_nan_inf_filter`` would log the step's loss as the
        mean of the earlier ones.
        """
        loss = super().training_step(*args, **kwargs)
        bad = torch.tensor(float(not bool(torch.isfinite(loss.detach()).all())),
                           device=self.args.device)
        if self.args.world_size > 1:
            bad = self.accelerator.reduce(bad, "sum")
        if float(bad) > 0:
            raise FloatingPointError(
                f"MPTDPOTrainer: the loss of step {self.state.global_step} is not finite "
                f"({float(loss.detach().float().mean())}) on {int(float(bad))} process(es); "
                "training stopped before the optimizer step, so the weights are those of the "
                "last finite step. NaN or infinite logits of the policy or the reference (a "
                "learning rate too high, float16 overflow, NaN weights) give NaN bounds; "
                "lower the learning rate, use bfloat16 or float32, or check the models.")
        return loss

    # ------------------------------------------------------------------ allocation
    def _learn(self) -> None:
        """Fold the finished steps' spread, summed over processes, into the allocation.

        Called by every process at the same points (before a step's masks, at a checkpoint,
        after training): the sum is one all-reduce.
        """
        new = np.zeros((2, NUM_RATE_BINS))
        for s, n in self._pending:
            new += np.stack([s, n])
        self._pending = []
        if self.args.world_size > 1:
            t = self.accelerator.reduce(torch.from_numpy(new).to(self.args.device), "sum")
            new = t.cpu().double().numpy()
        self.spread_sum += new[0]
        self.spread_count += new[1]
        self._set_density()

    def _set_density(self) -> None:
        if self.allocation == "neyman":
            self.density = learned_density(self.spread_sum, self.spread_count)

    def _save_checkpoint(self, model: Any, trial: Any, *args: Any, **kwargs: Any) -> None:
        super()._save_checkpoint(model, trial, *args, **kwargs)  # 4.x also passes metrics
        out = os.path.join(self._get_output_dir(trial=trial),
                           f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        self._learn()  # the step just taken belongs to the saved state (every process)
        if self.args.should_save and os.path.isdir(out):
            with open(os.path.join(out, STATE_FILE), "w") as f:
                json.dump({"spread_sum": self.spread_sum.tolist(),
                           "spread_count": self.spread_count.tolist()}, f)

    def _load_rng_state(self, checkpoint: str | None) -> None:
        super()._load_rng_state(checkpoint)
        path = None if checkpoint is None else os.path.join(checkpoint, STATE_FILE)
        if path is None or not os.path.isfile(path):
            return
        with open(path) as f:
            state = json.load(f)
        self.spread_sum = np.asarray(state["spread_sum"], dtype=np.float64)
        self.spread_count = np.asarray(state["spread_count"], dtype=np.float64)
        self._pending = []
        self._set_density()

    # ------------------------------------------------------------------ loss
    @property
    def loss_is_scaled_for_ga(self) -> bool:  # type: ignore[override]
        """The loss is divided by the accumulated number of pairs (not by the steps)."""
        return self._dpo_scaled

    _dpo_scaled = False

    def _bounds(self, model: Any, inputs: Mapping[str, Any], keys: Sequence[int],
                offset: int) -> Any:
        """The bounds of a micro-batch; its pair i draws from ``(seed, *keys, offset + i)``."""
        pairs = _pairs_of(inputs)
        gens = [torch.Generator().manual_seed(spawn(self.mask_seed, *keys, offset + i))
                for i in range(len(pairs))]
        return preference_bounds(self.policy_lm, self.ref_lm, pairs, beta=self.beta,
                                 num_masks=self.num_masks, masks=self.masks,
                                 density=self.density, seed=gens,
                                 exact_length=self.exact_length, policy_module=model)

    def compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any],
                     return_outputs: bool = False, num_items_in_batch: Any = None) -> Any:
        """``sum_i -log sigmoid(m_i) / num_items_in_batch`` (else the batch mean)."""
        offset = int(inputs.get(OFFSET, 0))
        b = self._bounds(model, inputs, (_TRAIN, int(self.state.global_step)), offset)
        self._dpo_scaled = num_items_in_batch is not None
        loss = _items_mean(self, dpo_loss(b.margin, "none"), num_items_in_batch)
        self._pending.append((b.spread_sum, b.spread_count))
        self._record("train", b, int(self.state.global_step))
        return (loss, {"margin": b.margin.detach()}) if return_outputs else loss

    # ------------------------------------------------------------------ metrics
    def _record(self, split: str, b: Any, step: int) -> None:
        """Keep the pairs' rewards, margins and margin SEs (gathered over processes).

        An evaluation drops the pairs that accelerate repeats to even out the processes'
        last batches (``gather_for_metrics``); a training step keeps them (they are trained on).
        """
        vals = torch.stack([b.policy_chosen.detach() - b.ref_chosen,
                            b.policy_rejected.detach() - b.ref_rejected,
                            b.policy_chosen.detach(), b.policy_rejected.detach(),
                            torch.as_tensor(b.margin_se).to(b.margin)], 1).double()
        gather = self.accelerator.gather if split == "train" else (
            self.accelerator.gather_for_metrics)
        vals = gather(vals.to(self.args.device)).cpu().numpy()
        self._records[split].append({"step": np.full(len(vals), step), "vals": vals})

    def _summary(self, split: str) -> dict[str, float]:
        """Per step (or evaluation) the metrics of its pairs, averaged over the steps."""
        recs = self._records.pop(split, [])
        if not recs:
            return {}
        steps = np.concatenate([r["step"] for r in recs])
        vals = np.concatenate([r["vals"] for r in recs])
        rows = defaultdict(list)
        for s in np.unique(steps):
            v = vals[steps == s]
            cw, cl = self.beta * v[:, 0], self.beta * v[:, 1]
            m = cw - cl
            rows["rewards/chosen"].append(cw.mean())
            rows["rewards/rejected"].append(cl.mean())
            rows["rewards/accuracies"].append(float((m > 0).mean()))
            rows["rewards/margins"].append(m.mean())
            rows["rewards/margins_sd"].append(m.std(ddof=1) if len(m) > 1 else math.nan)
            rows["margin_mc_se"].append(math.sqrt(float((v[:, 4] ** 2).sum())) / len(m))
            rows["logps/chosen"].append(v[:, 2].mean())
            rows["logps/rejected"].append(v[:, 3].mean())
        return {k: float(np.mean(x)) for k, x in rows.items()}

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        """transformers' log, with the DPO metrics of the steps (evaluation) since the last."""
        extra = {} if any(k.endswith("_loss") and k != "loss" for k in logs) else (
            self._summary("train"))  # an evaluation's come with its metrics
        super().log({**logs, **extra}, *args, **kwargs)

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, eval_dataset: Any = None, *args: Any, **kwargs: Any) -> dict[str, float]:
        """``Trainer.evaluate``; an ``eval_dataset`` given here is checked as at construction."""
        if eval_dataset is not None and not isinstance(eval_dataset, str):
            eval_dataset = _prepare_dataset(eval_dataset, "evaluation", self.policy_lm)
        return super().evaluate(eval_dataset, *args, **kwargs)

    def evaluation_loop(self, dataloader: Any, description: str,
                        prediction_loss_only: bool | None = None,
                        ignore_keys: list[str] | None = None,
                        metric_key_prefix: str = "eval") -> Any:
        """transformers' loop on fixed masks; its metrics get the DPO ones of the pairs."""
        self._eval_seen = 0  # the same masks at every evaluation
        self._records.pop("eval", None)
        out = super().evaluation_loop(dataloader, description, prediction_loss_only,
                                      ignore_keys, metric_key_prefix)
        out.metrics.update({f"{metric_key_prefix}_{k}": v
                            for k, v in self._summary("eval").items()})
        return out

    def prediction_step(self, model: torch.nn.Module, inputs: dict[str, Any],
                        prediction_loss_only: bool,
                        ignore_keys: list[str] | None = None) -> tuple[Any, Any, Any]:
        """The DPO loss of an evaluation batch; pair j of the evaluation draws from (seed, j)."""
        sizes = self._global_sizes([len(inputs["chosen_ids"])], 1)
        offset = self._eval_seen + int(self._offsets(sizes)[0])
        self._eval_seen += int(sizes.sum())
        model.eval()
        with torch.no_grad():
            b = self._bounds(model, inputs, (_EVAL,), offset)
        self._record("eval", b, 0)
        return dpo_loss(b.margin.detach()), None, None
