"""Adapter from any Hugging Face masked language model to the model protocol.

A sequence's *tokens* are its non-special tokens x_1..x_D (never [CLS], [SEP]
or [PAD]). For a mask M (a set of content positions) the adapter builds the
model input by replacing exactly the positions in M by the mask token (pure
[MASK]; BERT's 80/10/10 corruption as an option) and returns

    log p(x_j | x_R) = log_softmax(head(h_j))[x_j],   j in M,

with h the encoder's last hidden states. The LM head runs only at the masked
positions (encoder, gather, head), not over every position.

Sequences have different lengths D_i, so the adapter implements the ragged
protocol :class:`~mptlml.models.protocols.RaggedMaskedModel` (no fixed D):
:meth:`MaskedLM.encode` turns texts into lists of content token ids and
:meth:`MaskedLM.ragged_masked_log_prob` scores many (sequence, mask) pairs in
padded, length-bucketed sub-batches (:meth:`MaskedLM.score_positions`). For
equal-length id tensors :meth:`MaskedLM.log_conditionals` also takes the
``(N, D)`` shapes of :class:`~mptlml.models.base.MaskedModel`. Loading
(``from_pretrained``, ``antiberty``) lives in :mod:`mptlml.models.hf_loading`.

Reference: Moreno-Munoz, Recasens, Hauberg, "On Masked Pre-training and the
Marginal Likelihood", NeurIPS 2023, Sec. 4 (Table 2, Fig. 5 right).
"""

from __future__ import annotations

import contextlib
import hashlib
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from .._validation import make_generator
from .hf_loading import (
    DTYPES,
    PretrainedLoaders,
    check_masked_lm,
    dtype_name,
    hub_reachable,
    position_limit,
)
from .sequence_input import check_content, tokenize
from .tokenizer_checks import check_tokenizer
from .word_units import WordUnits

__all__ = ["CORRUPTIONS", "MaskedLM", "hub_reachable"]

CORRUPTIONS = ("mask", "bert")
_HEAD_NAMES = ("cls", "lm_head", "predictions")
_AUTOCAST = ("bfloat16", "float16")


def _max_length(model: nn.Module, tokenizer: Any) -> int:
    """Longest model input: the tokenizer's ``model_max_length``, at most the model's positions.

    A tokenizer that claims more than the model's position table
    (:func:`~mptlml.models.hf_loading.position_limit`) would crash inside the
    model on long inputs; the model's limit is used instead, with a warning.
    A tokenizer without a limit (transformers' 1e30 placeholder) takes the
    model's; 512 when neither states one.
    """
    tmax = getattr(tokenizer, "model_max_length", None)
    tmax = int(tmax) if isinstance(tmax, int | float) and 0 < tmax < 1_000_000 else None
    pmax = position_limit(model)
    if tmax is not None and pmax is not None and tmax > pmax:
        warnings.warn(f"the tokenizer's model_max_length ({tmax}) exceeds the model's position "
                      f"table ({pmax} positions); inputs are limited to {pmax} tokens, special "
                      "tokens included (truncate=True cuts longer sequences there).",
                      stacklevel=3)
        return pmax
    return tmax if tmax is not None else (pmax if pmax is not None else 512)


class MaskedLM(PretrainedLoaders, WordUnits, nn.Module):
    """A Hugging Face masked LM plus its tokenizer, scored on masked content tokens.

    Implements :class:`~mptlml.models.protocols.RaggedMaskedModel` (sequences of
    their own lengths D_i; no fixed ``num_tokens``).

    Parameters
    ----------
    model : transformers.PreTrainedModel
        An ``AutoModelForMaskedLM`` model (e.g. ``BertForMaskedLM``).
    tokenizer : transformers tokenizer
        Its tokenizer, checked by :func:`~mptlml.models.tokenizer_checks.check_tokenizer`
        (vocabulary size, mask token, special ids against the config, a round
        trip of vocabulary tokens).
    corruption : {"mask", "bert"}
        ``"mask"`` replaces every masked position by [MASK]; ``"bert"`` uses
        BERT's 80/10/10 rule (80% [MASK], 10% a random non-special token, 10%
        unchanged), as a data collator does in pre-training.
    truncate : bool
        Cut sequences longer than the model's maximum length instead of raising.
    preprocess : callable, optional
        Applied to each text before tokenisation (AntiBERTy: space residues).
    name : str, optional
        Label used in results (defaults to the model's ``name_or_path``).
    allow_unknown : bool
        Unknown-token floods (:mod:`~mptlml.models.tokenizer_checks`) warn instead of raising.
    autocast : None, bool or {"bfloat16", "float16"}
        Mixed-precision forward (``torch.autocast``). None/False: off; True:
        bfloat16 (float16 on a CUDA device without it). Recorded in results.
    """

    def __init__(self, model: nn.Module, tokenizer: Any, *, corruption: str = "mask",
                 truncate: bool = False, preprocess: Callable[[str], str] | None = None,
                 name: str | None = None, allow_unknown: bool = False,
                 autocast: bool | str | None = None) -> None:
        super().__init__()
        if not isinstance(model, nn.Module) or not hasattr(model, "config"):
            raise TypeError(
                f"model must be a transformers masked-LM model, got {type(model).__name__}; "
                "load one with transformers.AutoModelForMaskedLM.from_pretrained(...)."
            )
        if corruption not in CORRUPTIONS:
            raise ValueError(f"corruption must be one of {CORRUPTIONS}, got {corruption!r}.")
        check_masked_lm(model, "MaskedLM")
        check_tokenizer(model, tokenizer, allow_unknown=allow_unknown)
        if autocast not in (None, True, False) and dtype_name(autocast) not in _AUTOCAST:
            raise ValueError(f"autocast must be None, True, False, 'bfloat16' or 'float16'; "
                             f"got {autocast!r}.")
        self.allow_unknown = bool(allow_unknown)
        self.autocast = autocast
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.corruption = corruption
        self.truncate = bool(truncate)
        self.preprocess = preprocess
        self.name = name or str(getattr(model.config, "name_or_path", "") or type(model).__name__)
        self.vocab_size = int(model.config.vocab_size)
        self.mask_token_id = int(tokenizer.mask_token_id)
        self.pad_token_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None
                                else 0)
        self.special_ids = sorted({int(i) for i in tokenizer.all_special_ids})
        self.prefix, self.suffix = self._special_frame()
        self.max_length = _max_length(model, tokenizer)
        base = getattr(model, getattr(model, "base_model_prefix", ""), None)
        head = next((getattr(model, n) for n in _HEAD_NAMES
                     if isinstance(getattr(model, n, None), nn.Module)), None)
        self._split = base is not None and head is not None and base is not model
        self._base, self._head = (base, head) if self._split else (None, None)

    def fingerprint(self) -> dict[str, Any]:
        """Name, size, a probe of the first weights, corruption, dtype and autocast."""
        params = sum(p.numel() for p in self.parameters())
        first = next(self.parameters()).detach().flatten()[:64].double().cpu().numpy()
        return {"model": self.name, "num_parameters": int(params),
                "weights_probe": hashlib.sha256(first.tobytes()).hexdigest()[:16],
                "corruption": self.corruption, "dtype": dtype_name(self.dtype),
                "autocast": dtype_name(self.autocast_dtype)}

    @property
    def device(self) -> torch.device:
        """Device of the model's parameters (move it with ``MaskedLM.to(device)``)."""
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """dtype of the model's (first floating) parameters."""
        return next(p.dtype for p in self.parameters() if p.is_floating_point())

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """dtype of the forward pass under autocast, None when autocast is off."""
        a = self.autocast
        if a is None or a is False:
            return None
        if a is not True:
            return DTYPES[str(a).removeprefix("torch.")]
        cuda_fp16 = self.device.type == "cuda" and not torch.cuda.is_bf16_supported()
        return torch.float16 if cuda_fp16 else torch.bfloat16

    def settings(self) -> dict[str, Any]:
        """Device, dtype and autocast in use, as written into results."""
        return {"device": str(self.device), "dtype": dtype_name(self.dtype),
                "autocast": dtype_name(self.autocast_dtype)}

    # ------------------------------------------------------------------ tokens
    def _special_frame(self) -> tuple[list[int], list[int]]:
        """Special tokens the tokenizer puts before/after the content tokens."""
        tok = self.tokenizer
        for probe in ("a", "A", "the", "1"):
            content = tok(probe, add_special_tokens=False)["input_ids"]
            full = tok(probe, add_special_tokens=True)["input_ids"]
            if not content or self.mask_token_id in content or (
                    tok.unk_token_id is not None and tok.unk_token_id in content):
                continue
            for i in range(len(full) - len(content) + 1):
                if full[i:i + len(content)] == content:
                    return list(full[:i]), list(full[i + len(content):])
        pre = [tok.cls_token_id] if tok.cls_token_id is not None else (
            [tok.bos_token_id] if tok.bos_token_id is not None else [])
        suf = [tok.sep_token_id] if tok.sep_token_id is not None else (
            [tok.eos_token_id] if tok.eos_token_id is not None else [])
        return pre, suf

    @property
    def max_content_length(self) -> int:
        """Largest D a sequence may have (model maximum minus special tokens)."""
        return self.max_length - len(self.prefix) - len(self.suffix)

    def encode(self, sequences: Any) -> list[torch.Tensor]:
        """Content token ids (no special tokens) of each sequence.

        Parameters
        ----------
        sequences : list of str, or list of token-id sequences
            Texts are tokenized without special tokens; token-id sequences are
            taken as content ids. Normalised and checked by
            :mod:`mptlml.models.sequence_input` (the same checks for both
            kinds: a special-token string in a text is refused like its id).

        Returns
        -------
        list of LongTensor
            One ``(D_i,)`` tensor per sequence.

        Raises
        ------
        TypeError, ValueError
            On input that is not a list of texts or of integer ids (a single
            string, a dict/BatchEncoding, float ids, ...), an empty sequence,
            a sequence longer than the model's maximum (unless
            ``truncate=True``), out-of-vocabulary ids, special tokens, or a
            flood of unknown tokens.
        """
        ids = tokenize(sequences, self.tokenizer, vocab_size=self.vocab_size,
                       preprocess=self.preprocess)
        return check_content(ids, max_length=self.max_content_length,
                             frame=len(self.prefix) + len(self.suffix), truncate=self.truncate,
                             unk_id=self.tokenizer.unk_token_id,
                             unk_token=str(self.tokenizer.unk_token),
                             allow_unknown=self.allow_unknown)

    def corrupt(self, ids: torch.Tensor, masks: torch.Tensor,
                generator: torch.Generator | None = None) -> torch.Tensor:
        """Model inputs ``(Q, T)`` for content ids ``(D,)`` and masks ``(Q, D)``.

        Masked positions become [MASK] (``corruption="mask"``) or follow the
        80/10/10 rule (``"bert"``, drawn from ``generator``); special tokens
        frame every row.
        """
        q = masks.shape[0]
        x = ids.unsqueeze(0).expand(q, -1).clone()
        if self.corruption == "mask":
            x[masks] = self.mask_token_id
        else:
            g = make_generator(generator)
            u = torch.rand(masks.shape, generator=g)
            specials = set(self.special_ids)
            allowed = torch.tensor([i for i in range(self.vocab_size) if i not in specials],
                                   dtype=torch.long)
            rnd = allowed[torch.randint(len(allowed), masks.shape, generator=g)]
            x = torch.where(masks & (u < 0.8), self.mask_token_id, x)
            x = torch.where(masks & (u >= 0.8) & (u < 0.9), rnd, x)
        pre = torch.tensor(self.prefix, dtype=torch.long).expand(q, -1)
        suf = torch.tensor(self.suffix, dtype=torch.long).expand(q, -1)
        return torch.cat([pre, x, suf], dim=1)

    # ------------------------------------------------------------------ forward
    def _autocast(self) -> contextlib.AbstractContextManager:
        dt = self.autocast_dtype
        if dt is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=dt)

    def masked_log_probs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         rows: torch.Tensor, cols: torch.Tensor,
                         targets: torch.Tensor) -> torch.Tensor:
        """log p(targets | input) at positions ``(rows, cols)`` of a padded batch.

        Runs the encoder, gathers the hidden states at the given positions and
        applies the LM head there only; log-softmax in float32 (float64 for a
        float64 model). Returns ``(n,)``.
        """
        dev = self.device
        input_ids = input_ids.to(dev)
        attention_mask = attention_mask.to(dev)
        rows, cols, targets = rows.to(dev), cols.to(dev), targets.to(dev)
        with torch.inference_mode(), self._autocast():
            if self._split:
                hidden = self._base(input_ids=input_ids, attention_mask=attention_mask)[0]
                logits = self._head(hidden[rows, cols])
            else:
                logits = self.model(input_ids=input_ids,
                                    attention_mask=attention_mask).logits[rows, cols]
            if logits.dtype != torch.float64:
                logits = logits.float()
            logp = torch.log_softmax(logits, dim=-1)
            return logp.gather(1, targets[:, None]).squeeze(1)

    def score_positions(self, inputs: Sequence[torch.Tensor], positions: Sequence[torch.Tensor],
                        targets: Sequence[torch.Tensor], *, token_budget: int = 8192,
                        batch_size: int | None = None,
                        progress: Any = None) -> list[torch.Tensor]:
        """Score many ragged model inputs in length-bucketed, token-budgeted sub-batches.

        Parameters
        ----------
        inputs : list of LongTensor ``(T_k,)``
            Full model inputs (special tokens included, masks applied).
        positions, targets : list of LongTensor ``(m_k,)``
            Input positions to score and the true token ids there.
        token_budget : int
            Upper bound on ``batch_size * padded_length`` of one forward pass.
        batch_size : int, optional
            Upper bound on the inputs of one forward pass (besides the budget).
        progress : tqdm-like, optional
            ``progress.update(n)`` is called with the pairs finished.

        Returns
        -------
        list of float64 tensors ``(m_k,)``: log p(target | input) per position.
        """
        n = len(inputs)
        lengths = torch.tensor([len(t) for t in inputs])
        order = torch.argsort(lengths, stable=True).tolist()
        out: list[torch.Tensor | None] = [None] * n
        i = 0
        while i < n:
            j = i + 1
            while j < n and (j - i + 1) * int(lengths[order[j]]) <= token_budget and (
                    batch_size is None or j - i < batch_size):
                j += 1
            tmax = int(lengths[order[j - 1]])  # ascending order: the last is the longest
            idx = order[i:j]
            b = len(idx)
            ids = torch.full((b, tmax), self.pad_token_id, dtype=torch.long)
            att = torch.zeros((b, tmax), dtype=torch.long)
            rs, cs, ts = [], [], []
            for r, k in enumerate(idx):
                t = inputs[k]
                ids[r, :len(t)] = t
                att[r, :len(t)] = 1
                rs.append(torch.full((len(positions[k]),), r, dtype=torch.long))
                cs.append(positions[k])
                ts.append(targets[k])
            lp = self.masked_log_probs(ids, att, torch.cat(rs), torch.cat(cs), torch.cat(ts))
            lp = lp.double().cpu().split([len(positions[k]) for k in idx])
            for k, v in zip(idx, lp, strict=True):
                out[k] = v
            if progress is not None:
                progress.update(b)
            i = j
        return out  # type: ignore[return-value]

    # ------------------------------------------------------------------ protocol
    def log_conditionals(self, x: Any, mask: Any, *,
                         generator: torch.Generator | None = None,
                         token_budget: int = 8192) -> Any:
        """log p(x_j | x_R) at masked content positions, 0 elsewhere.

        Two forms:

        - ``x`` a LongTensor ``(N, D)`` of content ids (equal lengths) and
          ``mask`` bool ``(D,)``, ``(B, D)`` or ``(B, N, D)``, as in
          :class:`~mptlml.models.base.MaskedModel`; returns ``(N, D)`` or ``(B, N, D)``.
        - ``x`` a list of texts / id sequences (ragged) and ``mask`` a list of
          bool tensors ``(D_i,)`` or ``(Q_i, D_i)``; returns a list of float64
          tensors of the same shapes.
        """
        if isinstance(x, torch.Tensor) and x.ndim == 2:
            if x.dtype.is_floating_point:
                raise TypeError("x must hold integer token ids (a LongTensor), not floats.")
            n, d = x.shape
            m = mask if isinstance(mask, torch.Tensor) else torch.as_tensor(mask)
            if m.dtype != torch.bool or m.ndim not in (1, 2, 3) or m.shape[-1] != d:
                raise ValueError(f"mask must be bool of shape (D,), (B, D) or (B, N, D) with "
                                 f"D={d}; got {m.dtype} {tuple(m.shape)}.")
            squeeze = m.ndim == 1
            m3 = (m[None] if squeeze else m)
            if m3.ndim == 2:
                m3 = m3[:, None, :].expand(-1, n, -1)
            if m3.shape[1] != n:
                raise ValueError(f"a (B, N, D) mask needs N={n}; got {tuple(m3.shape)}.")
            ids = self.encode(x)
            res = self._ragged(ids, [m3[:, i, :] for i in range(n)], generator, token_budget)
            out = torch.stack(res, dim=1)  # (B, N, D)
            return out[0] if squeeze else out
        ids = self.encode(x)
        if not isinstance(mask, list | tuple) or len(mask) != len(ids):
            raise ValueError(f"for ragged sequences pass a list of {len(ids)} bool masks, one per "
                             "sequence, each of shape (D_i,) or (Q_i, D_i).")
        masks, flat = [], []
        for i, (t, m) in enumerate(zip(ids, mask, strict=True)):
            m = torch.as_tensor(m)
            if m.dtype != torch.bool or m.shape[-1] != len(t) or m.ndim not in (1, 2):
                raise ValueError(f"mask {i} must be bool of shape (D_i,) or (Q_i, D_i) with "
                                 f"D_i={len(t)}; got {m.dtype} {tuple(m.shape)}.")
            flat.append(m.ndim == 1)
            masks.append(m[None] if m.ndim == 1 else m)
        res = self._ragged(ids, masks, generator, token_budget)
        return [r[0] if f else r for r, f in zip(res, flat, strict=True)]

    def _ragged(self, ids: list[torch.Tensor], masks: list[torch.Tensor],
                generator: torch.Generator | None, token_budget: int) -> list[torch.Tensor]:
        owner, lp = self._score_pairs(ids, masks, [generator] * len(ids), token_budget, None)
        out = [torch.zeros(m.shape, dtype=torch.float64) for m in masks]
        for (i, q, p), v in zip(owner, lp, strict=True):
            out[i][q, p] = v
        return out

    def ragged_masked_log_prob(self, ids: Sequence[torch.Tensor], masks: Sequence[torch.Tensor],
                               generators: Sequence[torch.Generator | None], *,
                               token_budget: int = 8192, batch_size: int | None = None,
                               progress: Any = None) -> list[torch.Tensor]:
        """Sum of log p(x_j | x_R) over each mask ``(Q_i, D_i)`` of each sequence: ``(Q_i,)``.

        The ragged protocol (:class:`~mptlml.models.protocols.RaggedMaskedModel`):
        sequence i is corrupted with ``generators[i]``, then all pairs are scored
        together by :meth:`score_positions`.
        """
        owner, lp = self._score_pairs(list(ids), list(masks), list(generators), token_budget,
                                      progress, batch_size)
        out = [torch.zeros(m.shape[0], dtype=torch.float64) for m in masks]
        for (i, q, _), v in zip(owner, lp, strict=True):
            out[i][q] = v.sum()
        return out

    def _score_pairs(self, ids: list[torch.Tensor], masks: list[torch.Tensor],
                     generators: list[torch.Generator | None], token_budget: int,
                     progress: Any, batch_size: int | None = None, targets: Any = None,
                     ) -> tuple[list[tuple[int, int, torch.Tensor]], list[torch.Tensor]]:
        """Per-position log-probs of each (sequence, mask) pair, at ``targets`` (default: M)."""
        inputs, pos, tgt, owner = [], [], [], []
        off = len(self.prefix)
        for i, (t, m, g) in enumerate(zip(ids, masks, generators, strict=True)):
            x = self.corrupt(t, m, g)
            for q in range(m.shape[0]):
                p = (m[q] if targets is None else targets[i][q]).nonzero().flatten()
                inputs.append(x[q])
                pos.append(p + off)
                tgt.append(t[p])
                owner.append((i, q, p))
        return owner, self.score_positions(inputs, pos, tgt, token_budget=token_budget,
                                           batch_size=batch_size, progress=progress)

    def forward(self, x: Any, mask: Any) -> Any:  # pragma: no cover - alias
        return self.log_conditionals(x, mask)
