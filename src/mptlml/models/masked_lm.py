"""Adapter from any masked language model (or masked-diffusion LM) to the model protocol.

Two kinds of model are accepted: a Hugging Face ``AutoModelForMaskedLM``
with a tokenizer that has a mask token, and any ``nn.Module`` whose forward
takes ``input_ids`` (and, if it can, ``attention_mask``) and returns logits
(a tensor or an object with ``.logits``), with the mask id given as
``mask_token_id=`` (a plain vocabulary entry, e.g. LLaDA's 126336).

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
(``from_pretrained``, ``antiberty``) calls :mod:`mptlml.models.hf_loading`;
words and token strings are functions of :mod:`mptlml.models.word_units`.

Reference: Moreno-Munoz, Recasens, Hauberg, "On Masked Pre-training and the
Marginal Likelihood", NeurIPS 2023, Sec. 4 (Table 2, Fig. 5 right).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from .._validation import check_device, make_generator
from . import word_units
from .blocks import block_inputs, block_spans, check_block_family
from .conditional import check_cfg_scale, guided_logits
from .conventions import Convention, convention_of, family_conflict, get_convention, ordinary_token
from .hf_loading import (
    DTYPES,
    _has_masked_lm_class,
    check_masked_lm,
    check_remote_code_runs,
    dtype_name,
    load_antiberty,
    load_pretrained,
    max_input_length,
    resolve_dtype,
    space_residues,
)
from .mlm_inputs import (
    CORRUPTIONS,
    accepts_keyword,
    corrupt,
    dense_mask_rows,
    evaluation_mode,
    logits_of,
    ragged_mask_list,
    score_in_buckets,
)
from .sequence_input import check_content, tokenize_groups
from .tokenizer_checks import (
    check_module_vocab,
    check_tokenizer,
    check_unknown_each,
    check_unknown_tokens,
    special_frame,
)

__all__ = ["CORRUPTIONS", "MaskedLM"]

_HEAD_NAMES = ("cls", "lm_head", "predictions")
_AUTOCAST = ("bfloat16", "float16")


def _bos_eos(tokenizer: Any, family: str) -> tuple[list[int], list[int]]:
    """A BOS before the content and an EOS after it (Dream's evaluation adapter)."""
    bos, eos = getattr(tokenizer, "bos_token_id", None), getattr(tokenizer, "eos_token_id", None)
    if bos is None or eos is None:
        raise ValueError(f"{family}'s convention frames the content with the tokenizer's BOS "
                         f"and EOS, but this tokenizer has bos_token_id={bos}, eos_token_id="
                         f"{eos}; pass its own tokenizer, or add_special_tokens=False.")
    return [int(bos)], [int(eos)]


def check_force_family(family: str | None, force_family: Any) -> None:
    """Refuse a ``force_family`` that is not a bool, or True with no ``family`` named."""
    if not isinstance(force_family, bool):
        raise TypeError(f"force_family must be bool, got {force_family!r}.")
    if force_family and family is None:
        raise ValueError("force_family=True applies a family=, and none is named (the "
                         "family read from config.model_type is the checkpoint's own): "
                         "name the family, or drop force_family.")


def check_family_fits(conv: Convention, family: str, config: Any) -> None:
    """Refuse a named family that the checkpoint's config contradicts, naming both.

    :func:`~mptlml.models.conventions.family_conflict` says what contradicts it;
    ``force_family=True`` skips this check.
    """
    problem = family_conflict(conv, config, masked_lm=config is not None and (
        _has_masked_lm_class(config)))
    if problem is not None:
        raise ValueError(
            f"family={family!r} contradicts the checkpoint: {problem}. Its conventions (mask "
            f"id, shifted logits, frame) would be applied to a model that does not follow "
            "them, and its scores would be wrong without a word. Leave family=None (the "
            "family is read from config.model_type), name the checkpoint's family, or pass "
            "force_family=True if you mean it.")


def _bos(tokenizer: Any, family: str) -> list[int]:
    """A BOS before the content, nothing after it (a block model's frame)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        raise ValueError(f"{family}'s convention puts the tokenizer's BOS before the content "
                         "(never masked), but this tokenizer has bos_token_id=None; pass its "
                         "own tokenizer, or add_special_tokens=False.")
    return [int(bos)]


class MaskedLM(nn.Module):
    """A Hugging Face masked LM plus its tokenizer, scored on masked content tokens.

    Implements :class:`~mptlml.models.protocols.WordMaskedModel` (the ragged
    protocol, sequences of their own lengths D_i and no fixed ``num_tokens``,
    plus token strings and words from :mod:`~mptlml.models.word_units`).

    Parameters
    ----------
    model : torch.nn.Module
        An ``AutoModelForMaskedLM`` model (e.g. ``BertForMaskedLM``), or, with
        ``mask_token_id``, any module whose forward takes ``input_ids`` (and
        ``attention_mask`` if it accepts one; without it only inputs of one
        length share a forward pass) and returns logits ``(B, T, V)`` as a
        tensor or ``.logits`` (a masked-diffusion LM: LLaDA, MDLM, Dream).
    tokenizer : transformers tokenizer
        Its tokenizer, checked by :func:`~mptlml.models.tokenizer_checks.check_tokenizer`
        (vocabulary size, mask token, special ids against the config, a round
        trip of vocabulary tokens); with ``mask_token_id`` only its size is
        checked against the model's vocabulary.
    mask_token_id : int, optional
        The id the model reads as masked, when it is not the tokenizer's mask
        token (a plain vocabulary entry, e.g. LLaDA's 126336). It is never
        accepted as a content token.
    add_special_tokens : bool
        Frame every input with the tokenizer's special tokens (default); False
        for models trained on bare ids.
    vocab_size : int, optional
        Width of the logits, for a module without ``config.vocab_size`` (else
        read off a one-token forward pass).
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
    shift_logits : bool, optional
        The head predicts position i from the hidden state at i - 1 (Dream's, and any
        masked-diffusion LM adapted from an autoregressive one): the log-probability
        of a masked position i is read from the logits at i - 1 (the head still runs
        only there). None: the family's (False for an unknown family).
    family : str, optional
        A family of :data:`~mptlml.models.conventions.CONVENTIONS` (``"llada"``,
        ``"dream"``, ``"mdlm"``, ``"smdm"``, ``"bert"``): its mask id, shifted logits
        and frame (BOS/EOS), unless given here. None: read from ``config.model_type``
        (:func:`~mptlml.models.conventions.convention_of`); unknown types are BERT-style.
        A named family that contradicts the checkpoint (its ``config.model_type`` is
        another family's, or not this family's; a transformers masked LM given a plain
        module's mask id) is refused, and so is a family's mask id that the tokenizer
        reads as an ordinary token (MDLM's last id on a BERT vocabulary), unless
        ``force_family=True``.
    force_family : bool
        Apply ``family``'s conventions even where the checkpoint contradicts them, or its
        mask id is an ordinary token of the tokenizer (you mean it).
        A block-diffusion family (``"bd3lm"``, ``"sdar"``, ``"llada2"``,
        ``"fast_dllm_v2"``) makes this a block model (:attr:`block_size`); a full-attention
        family given to a block model, or a block family to a full-attention one, is
        refused by name.
    block_size : int, optional
        A block model's block size B (default: its family's, or its config's
        ``block_size``); only with a block family.
    """

    def __init__(self, model: nn.Module, tokenizer: Any, *, mask_token_id: int | None = None,
                 add_special_tokens: bool = True, vocab_size: int | None = None,
                 corruption: str = "mask", truncate: bool = False,
                 preprocess: Callable[[str], str] | None = None, name: str | None = None,
                 allow_unknown: bool = False, autocast: bool | str | None = None,
                 shift_logits: bool | None = None, family: str | None = None,
                 force_family: bool = False, block_size: int | None = None) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(
                f"model must be a torch.nn.Module (a transformers masked LM, or any module whose "
                f"forward takes input_ids and returns logits), got {type(model).__name__}.")
        if corruption not in CORRUPTIONS:
            raise ValueError(f"corruption must be one of {CORRUPTIONS}, got {corruption!r}.")
        if not isinstance(add_special_tokens, bool):
            raise TypeError(f"add_special_tokens must be bool, got {add_special_tokens!r}.")
        if autocast not in (None, True, False) and dtype_name(autocast) not in _AUTOCAST:
            raise ValueError(f"autocast must be None, True, False, 'bfloat16' or 'float16'; "
                             f"got {autocast!r}.")
        if tokenizer is None:
            raise TypeError("tokenizer is None: MaskedLM needs the model's tokenizer (its "
                            "special tokens, padding and unknown token; texts are tokenized by "
                            "it); pass it, or load both with MaskedLM.from_pretrained(DIR).")
        if shift_logits is not None and not isinstance(shift_logits, bool):
            raise TypeError(f"shift_logits must be bool or None, got {shift_logits!r}.")
        check_force_family(family, force_family)
        config = getattr(model, "config", None)
        conv = get_convention(family) if family is not None else convention_of(config)
        #: a block-diffusion LM's block size B (None: full attention), its input layout and
        #: whether the mask token's logit is -inf (SUBS); a block family on a full-attention
        #: model or the reverse is refused here first, by name
        self.block_size, self.layout, self.subs = check_block_family(
            conv, config, block_size, corruption)
        if family is not None and not force_family:
            check_family_fits(conv, family, config)
        #: the family's conventions (:mod:`mptlml.models.conventions`), None: BERT-style
        self.convention = conv
        #: logits of position i read at i - 1 (Dream's head)
        self.shift_logits = bool(conv is not None and conv.shift_logits) if (
            shift_logits is None) else shift_logits
        mask_source = "mask_token_id"
        if mask_token_id is None and conv is not None:
            mask_token_id = conv.mask_id(vocab_size if vocab_size is not None
                                         else getattr(config, "vocab_size", None))
            if mask_token_id is not None:
                mask_source = (f"the mask id of family={family!r}" if family is not None else
                               f"the {conv.name} family's mask id (config.model_type "
                               f"{getattr(config, 'model_type', None)!r})")
                word = ordinary_token(tokenizer, mask_token_id)
                if word is not None and not force_family:
                    raise ValueError(
                        f"{mask_source} {mask_token_id} is an ordinary token of the "
                        f"tokenizer ({word!r}): every masked position would read as that "
                        "token. Pass the id the model was trained to read as masked "
                        "(mask_token_id=), another family=, or force_family=True if you mean "
                        "it.")
        #: an HF masked LM with its own tokenizer's mask token, or a plain module + mask id
        self.generic = (mask_token_id is not None or config is None
                        or (conv is not None and conv.any_module))
        if config is not None:
            check_masked_lm(model, "MaskedLM")
        if self.generic:
            self.vocab_size, self.mask_token_id = check_module_vocab(
                model, tokenizer, mask_token_id=mask_token_id, vocab_size=vocab_size,
                mask_source=mask_source)
        else:
            if vocab_size is not None:
                raise ValueError("vocab_size= applies to a module without a config (pass it "
                                 "with mask_token_id=); this model's config gives it.")
            check_tokenizer(model, tokenizer, allow_unknown=allow_unknown)
            self.vocab_size = int(config.vocab_size)
            self.mask_token_id = int(tokenizer.mask_token_id)
        self.allow_unknown = bool(allow_unknown)
        self.autocast = autocast
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.corruption = corruption
        self.truncate = bool(truncate)
        self.preprocess = preprocess
        self.add_special_tokens = add_special_tokens
        self.name = name or str(getattr(config, "name_or_path", "") or type(model).__name__)
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_token_id = int(pad if pad is not None else 0)
        self.special_ids = sorted({int(i) for i in getattr(tokenizer, "all_special_ids", [])}
                                  | {self.mask_token_id})
        specials = set(self.special_ids)
        self._replacements = torch.tensor([i for i in range(self.vocab_size)
                                           if i not in specials], dtype=torch.long)
        self.prefix, self.suffix = (([], []) if not add_special_tokens else
                                    _bos_eos(tokenizer, conv.name) if conv is not None
                                    and conv.frame == "bos_eos" else
                                    (_bos(tokenizer, conv.name), []) if conv is not None
                                    and conv.frame == "bos" else special_frame(tokenizer))
        if self.block_size is not None:  # a frame after the content would sit in its last
            self.suffix = []              # block, visible to it: block models append none
        self.max_length = max_input_length(model, tokenizer)
        #: whether padding can be hidden from the model (else only equal lengths share a batch)
        self._takes_attention_mask = accepts_keyword(model, "attention_mask")
        self._takes_timesteps = self.block_size is not None and accepts_keyword(model,
                                                                                "timesteps")
        base = getattr(model, getattr(model, "base_model_prefix", ""), None)
        head = next((getattr(model, n) for n in _HEAD_NAMES
                     if isinstance(getattr(model, n, None), nn.Module)), None)
        self._split = (not self.generic and base is not None and head is not None
                       and base is not model)
        self._base, self._head = (base, head) if self._split else (None, None)

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(cls, name_or_dir: str | os.PathLike, *, tokenizer: Any = None,
                        device: str | torch.device | None = None, dtype: Any = None,
                        random_init: bool = False, init_seed: int = 0,
                        mask_token_id: int | None = None, add_special_tokens: bool = True,
                        corruption: str = "mask", truncate: bool = False,
                        preprocess: Callable[[str], str] | None = None, name: str | None = None,
                        allow_unknown: bool = False, autocast: bool | str | None = None,
                        shift_logits: bool | None = None, family: str | None = None,
                        force_family: bool = False, **hf_kwargs: Any) -> MaskedLM:
        """Load a masked LM and its tokenizer by hub name or local directory.

        Parameters
        ----------
        name_or_dir : str or path
            A hub id (the hub, or its cache offline) or a ``save_pretrained`` directory.
        tokenizer : tokenizer, str or path, optional
            A tokenizer object or the name/directory to load one from; required
            for a directory saved without tokenizer files (AntiBERTy's layout).
        device : str or torch.device, optional
            Where to put the model (``"cuda:1"``, ``"cpu"``; checked first by
            :func:`mptlml._validation.check_device`); not with ``device_map``.
        dtype : torch.dtype or str, optional
            Parameter dtype (``torch_dtype=`` is accepted too; ``"auto"``: the
            checkpoint's). None: transformers' default.
        random_init : bool
            Random weights of the same config.
        init_seed : int
            The seed of those random weights.
        mask_token_id : int, optional
            The id the model reads as masked, for a masked-diffusion LM whose
            tokenizer has no mask token (LLaDA: 126336). With it, a checkpoint
            without a masked-LM class is loaded through ``AutoModel`` (pass
            ``trust_remote_code=True`` for a model that ships its own code); its
            forward must return logits.
        add_special_tokens : bool
            Frame every input with the tokenizer's special tokens ([CLS] ...
            [SEP]); False for models trained on bare token ids.
        corruption : str
            As for :class:`MaskedLM`.
        truncate : bool
            As for :class:`MaskedLM`.
        preprocess : callable, optional
            As for :class:`MaskedLM`.
        name : str, optional
            As for :class:`MaskedLM`.
        allow_unknown : bool
            As for :class:`MaskedLM`.
        autocast : bool or str, optional
            As for :class:`MaskedLM`.
        shift_logits : bool, optional
            As for :class:`MaskedLM`.
        family : str, optional
            As for :class:`MaskedLM`. A checkpoint of a known family (``config.model_type``
            LLaDA's, Dream's, MDLM's; or ``family=``) is loaded through ``AutoModel`` as
            with ``mask_token_id``, and scored by its conventions. A family that
            contradicts the checkpoint's config is refused before the weights are loaded.
        force_family : bool
            As for :class:`MaskedLM`.
        **hf_kwargs
            Everything else goes to ``AutoModelForMaskedLM.from_pretrained``
            (``AutoModel`` with ``mask_token_id`` for a model without a masked-LM
            class): ``revision``, ``trust_remote_code``, ``device_map``, ...; the
            repository options reach ``AutoTokenizer.from_pretrained`` too; see
            :func:`mptlml.models.hf_loading.load_pretrained`.
        """
        if device is not None and hf_kwargs.get("device_map") is not None:
            raise ValueError("pass device= or device_map=, not both (device_map places the "
                             "model itself).")
        dev = None if device is None else check_device(device)  # before loading anything
        conv = None if family is None else get_convention(family)  # before loading anything
        check_force_family(family, force_family)
        fits = (None if conv is None or force_family else
                lambda config: check_family_fits(conv, str(family), config))
        model, tok, label = load_pretrained(
            name_or_dir, tokenizer=tokenizer, dtype=dtype, random_init=random_init,
            init_seed=init_seed, any_module=mask_token_id is not None or bool(
                conv and conv.any_module), check_config=fits, **hf_kwargs)
        lm = cls(model, tok, mask_token_id=mask_token_id, add_special_tokens=add_special_tokens,
                 corruption=corruption, truncate=truncate, preprocess=preprocess,
                 name=name or label, allow_unknown=allow_unknown, autocast=autocast,
                 shift_logits=shift_logits, family=family, force_family=force_family)
        lm = lm.to(dev) if dev is not None else lm
        check_remote_code_runs(lm.model, str(name_or_dir))  # old remote code: fails here, named
        return lm

    @classmethod
    def antiberty(cls, *, random_init: bool = False, init_seed: int = 0,
                  device: str | torch.device | None = None, dtype: Any = None,
                  **kwargs: Any) -> MaskedLM:
        """AntiBERTy (``antiberty==0.1.3``): an offline, pre-trained antibody BERT.

        8 layers, hidden size 512, vocabulary of 25 (20 residues + 5 specials).
        Inputs are amino-acid strings; residues are spaced automatically
        (unspaced residues would tokenize to a single [UNK]). ``device`` and
        ``dtype`` place the model; ``**kwargs`` go to :class:`MaskedLM`.
        """
        dev = None if device is None else check_device(device)
        model, tokenizer, label = load_antiberty(random_init=random_init, init_seed=init_seed)
        dt = resolve_dtype(dtype, kwargs.pop("torch_dtype", None))
        if isinstance(dt, torch.dtype):
            model = model.to(dt)
        lm = cls(model, tokenizer, preprocess=space_residues,
                 name=kwargs.pop("name", label), **kwargs)
        return lm.to(dev) if dev is not None else lm

    def fingerprint(self) -> dict[str, Any]:
        """Name, size, a probe of the first weights, corruption, dtype, autocast (and shift)."""
        params = sum(p.numel() for p in self.parameters())
        first = next(self.parameters()).detach().flatten()[:64].double().cpu().numpy()
        return {"model": self.name, "num_parameters": int(params),
                "weights_probe": hashlib.sha256(first.tobytes()).hexdigest()[:16],
                "corruption": self.corruption, "dtype": dtype_name(self.dtype),
                "autocast": dtype_name(self.autocast_dtype),
                **({"shift_logits": True} if self.shift_logits else {})}

    def with_prefix(self, ids: Sequence[int]) -> MaskedLM:
        """This model with ``ids`` after its frame's leading tokens: ``prefix + ids``.

        The added ids belong to the frame: in every input, never masked, never scored,
        never cut to fit, and not content, so the special-token check of the ids still
        refuses them inside a text (Dream's ``add_bos_token`` where the frame does not
        lead with that BOS: :func:`~mptlml.models.sequence_input.context_bos`). A view:
        the module and tokenizer are shared, this model is unchanged;
        ``max_content_length`` is ``len(ids)`` shorter.
        """
        view = copy.copy(self)
        view.prefix = [*self.prefix, *(int(i) for i in ids)]
        return view

    def _check_shifted(self, scores_position_zero: bool) -> None:
        """Refuse input position 0 with shifted logits (no hidden state before it), before work."""
        if self.shift_logits and scores_position_zero:
            raise ValueError(
                "shift_logits=True reads position i's logits at i - 1, and position 0 has "
                "nothing before it: give the model a BOS (add_special_tokens=True with a "
                "family that prepends one, e.g. family='dream') or a context before the "
                "scored tokens.")

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

    def placement(self) -> dict[str, Any]:
        """Where and how the model runs: device, dtype and autocast in use, as results record."""
        return {"device": str(self.device), "dtype": dtype_name(self.dtype),
                "autocast": dtype_name(self.autocast_dtype)}

    # ------------------------------------------------------------------ tokens
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
        return self.encode_groups([sequences])[0]

    def encode_groups(self, groups: Sequence[Any], *, check_length: bool = True,
                      check_unknown: bool = True) -> list[list[torch.Tensor]]:
        """:meth:`encode` of each group of sequences, the tokenizer called once for all.

        Each group is checked as :meth:`encode` checks it (its unknown tokens pooled
        over the group). ``check_length=False`` skips the content checks (empty,
        too long, unknown tokens): the caller cuts the sequences to fit and checks
        their unknown tokens (:meth:`check_unknown`); ``check_unknown=False`` skips
        the unknown tokens only.
        """
        out = tokenize_groups(groups, self.tokenizer, vocab_size=self.vocab_size,
                              preprocess=self.preprocess, forbidden_ids=[self.mask_token_id])
        if not check_length:
            return out
        return [check_content(ids, max_length=self.max_content_length,
                              frame=len(self.prefix) + len(self.suffix), truncate=self.truncate,
                              unk_id=self.tokenizer.unk_token_id if check_unknown else None,
                              unk_token=str(self.tokenizer.unk_token),
                              allow_unknown=self.allow_unknown) for ids in out]

    def check_unknown(self, ids: Sequence[torch.Tensor], names: Sequence[str] | None = None
                      ) -> None:
        """The unknown-token check of content ids: pooled, or each sequence on its own.

        Without ``names`` :func:`~mptlml.models.tokenizer_checks.check_unknown_tokens`
        (the fraction pooled over ``ids``); with a name per sequence
        :func:`~mptlml.models.tokenizer_checks.check_unknown_each` (each its own
        fraction, the refusal naming it). Nothing with ``allow_unknown`` for names.
        """
        tok = self.tokenizer
        if names is None:
            check_unknown_tokens(ids, tok.unk_token_id, str(tok.unk_token),
                                 allow_unknown=self.allow_unknown)
        elif not self.allow_unknown:
            check_unknown_each(ids, names, getattr(tok, "unk_token_id", None),
                               str(tok.unk_token))

    def corrupt(self, ids: torch.Tensor, masks: torch.Tensor,
                generator: torch.Generator | None = None) -> torch.Tensor:
        """Model inputs ``(Q, T)`` for content ids ``(D,)`` and masks ``(Q, D)``.

        Masked positions become [MASK] (``corruption="mask"``) or follow the
        80/10/10 rule (``"bert"``, drawn from ``generator``); special tokens
        frame every row.
        """
        q = masks.shape[0]
        g = None if self.corruption == "mask" else make_generator(generator)
        x = corrupt(ids.unsqueeze(0).expand(q, -1), masks, corruption=self.corruption,
                    mask_token_id=self.mask_token_id, replacement_ids=self._replacements,
                    generator=g)
        pre = torch.tensor(self.prefix, dtype=torch.long).expand(q, -1)
        suf = torch.tensor(self.suffix, dtype=torch.long).expand(q, -1)
        return torch.cat([pre, x, suf], dim=1)

    # ------------------------------------------------------------------ forward
    def _autocast(self) -> contextlib.AbstractContextManager:
        dt = self.autocast_dtype
        if dt is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=dt)

    def masked_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      rows: torch.Tensor, cols: torch.Tensor, *,
                      unconditional: torch.Tensor | None = None,
                      cfg_scale: float = 0.0) -> torch.Tensor:
        """Logits ``(n, V)`` at positions ``(rows, cols)`` of a padded batch.

        Runs the encoder, gathers the hidden states at the given positions and
        applies the LM head there only (a module without a separable head: its
        logits at those positions); float32 (float64 for a float64 model). The
        model runs in eval mode whatever mode it is in (no dropout: a model left
        in train mode by training is put back after), under ``torch.inference_mode``.
        With ``shift_logits`` the hidden states (logits) are those at ``cols - 1``.

        With ``unconditional`` (the same batch with its prompt masked too, ``(B, T)``)
        both run in one forward pass and the result is the guided logits
        :func:`~mptlml.models.conditional.guided_logits`,
        ``u + (cfg_scale + 1) (c - u)``, c from ``input_ids`` and u from ``unconditional``.
        """
        dev = self.device
        b = input_ids.shape[0]
        if unconditional is not None:  # one forward: the conditional rows, then the others
            input_ids = torch.cat([input_ids, unconditional])
            attention_mask = torch.cat([attention_mask, attention_mask])
            rows, cols = torch.cat([rows, rows + b]), torch.cat([cols, cols])
        if self.shift_logits:  # position i is predicted from the hidden state at i - 1
            cols = cols - 1
        input_ids = input_ids.to(dev)
        attention_mask = attention_mask.to(dev)
        rows, cols = rows.to(dev), cols.to(dev)
        with torch.inference_mode(), self._autocast(), evaluation_mode(self.model):
            if self._split:
                hidden = self._base(input_ids=input_ids, attention_mask=attention_mask)[0]
                logits = self._head(hidden[rows, cols])
            else:
                extra = {"attention_mask": attention_mask} if self._takes_attention_mask else {}
                if self._takes_timesteps:  # BD3-LM's forward: sigma, zero without time
                    extra["timesteps"] = torch.zeros(input_ids.shape[0], device=dev)
                try:
                    out = self.model(input_ids=input_ids, **extra)
                except IndexError as exc:  # e.g. a position table shorter than the input
                    raise ValueError(
                        f"{self.name} failed on input_ids of shape {tuple(input_ids.shape)} "
                        f"(IndexError: {exc}): a table of the model (its positions?) is shorter "
                        f"than these inputs of {input_ids.shape[1]} tokens. Pass shorter texts, "
                        "or truncate=True with a model that states its length.") from exc
                shape = input_ids.shape
                if self.layout == "xt_x0":  # the logits of x_t, the input's first half
                    shape = (shape[0], shape[1] // 2)
                    out = logits_of(out, self.name)
                    out = out[:, : shape[1]] if out.shape[1] == input_ids.shape[1] else out
                logits = logits_of(out, self.name, shape)[rows, cols]
            logits = logits if logits.dtype == torch.float64 else logits.float()
            if self.subs and self.mask_token_id < logits.shape[-1]:  # SUBS: p(mask) = 0
                logits[:, self.mask_token_id] = -torch.inf
            if unconditional is None:
                return logits
            c, u = logits.chunk(2)
            return guided_logits(c, u, cfg_scale)

    def masked_log_probs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         rows: torch.Tensor, cols: torch.Tensor,
                         targets: torch.Tensor, *, unconditional: torch.Tensor | None = None,
                         cfg_scale: float = 0.0) -> torch.Tensor:
        """log p(targets | input) at positions ``(rows, cols)`` of a padded batch.

        The log-softmax of :meth:`masked_logits` (float32; float64 for a
        float64 model) at the targets (guided with ``unconditional``). Returns ``(n,)``.
        """
        logits = self.masked_logits(input_ids, attention_mask, rows, cols,
                                    unconditional=unconditional, cfg_scale=cfg_scale)
        with torch.inference_mode():
            logp = torch.log_softmax(logits, dim=-1)
            return logp.gather(1, targets.to(logp.device)[:, None]).squeeze(1)

    def top_predictions(self, inputs: Sequence[torch.Tensor], positions: Sequence[torch.Tensor],
                        *, token_budget: int = 8192, batch_size: int | None = None,
                        unconditional: Sequence[torch.Tensor] | None = None,
                        cfg_scale: float = 0.0) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The most probable token at given positions of many ragged inputs, and its log-prob.

        ``inputs`` are full model inputs ``(T_k,)`` (special tokens included, masks
        applied) and ``positions`` ``(m_k,)`` the input positions to predict. For
        each input returns ``(log_prob, token_id)``, float64 and int64 ``(m_k,)``:
        ``max_v log p(v | input)`` and its argmax (the first on a tie), in the
        length-bucketed, token-budgeted sub-batches of :meth:`score_positions`
        (of the guided logits with ``unconditional`` inputs and ``cfg_scale``, as there).
        """

        def forward(ids: torch.Tensor, att: torch.Tensor, rows: torch.Tensor,
                    cols: torch.Tensor, targets: torch.Tensor,
                    unconditional: torch.Tensor | None = None) -> torch.Tensor:
            logits = self.masked_logits(ids, att, rows, cols, unconditional=unconditional,
                                        cfg_scale=cfg_scale)
            with torch.inference_mode():
                top, arg = torch.log_softmax(logits, dim=-1).max(dim=-1)
                return torch.stack([top.double(), arg.double()], dim=1)  # ids < 2^53: exact

        cfg_scale = check_cfg_scale(cfg_scale)
        if self.block_size is not None:  # each input's positions in one block, laid out
            inputs, positions = self._block_laid_out(inputs, positions, unconditional)
        self._check_shifted(any(bool((p == 0).any()) for p in positions))
        out = score_in_buckets(forward, self.pad_token_id, inputs, positions, positions,
                               token_budget=token_budget, batch_size=batch_size,
                               equal_lengths=not self._takes_attention_mask
                               or self.layout == "xt_x0", unconditional=unconditional)
        return [(v[:, 0].clone(), v[:, 1].long()) for v in out]

    def score_positions(self, inputs: Sequence[torch.Tensor], positions: Sequence[torch.Tensor],
                        targets: Sequence[torch.Tensor], *, token_budget: int = 8192,
                        batch_size: int | None = None, progress: Any = None,
                        unconditional: Sequence[torch.Tensor] | None = None,
                        cfg_scale: float = 0.0) -> list[torch.Tensor]:
        """Score many ragged model inputs in length-bucketed, token-budgeted sub-batches.

        ``inputs`` are full model inputs ``(T_k,)`` (special tokens included,
        masks applied); ``positions`` and ``targets`` ``(m_k,)`` the input
        positions to score and the true ids there. Returns float64 ``(m_k,)``
        tensors of log p(target | input): :func:`~mptlml.models.mlm_inputs.score_in_buckets`
        over :meth:`masked_log_probs`, whose parameters these are. With
        ``unconditional`` (one input per input, its prompt masked too) the
        log-softmax is that of the guided logits (:meth:`masked_logits`).
        """
        cfg_scale = check_cfg_scale(cfg_scale)

        def forward(*args: torch.Tensor, **kwargs: Any) -> torch.Tensor:
            return self.masked_log_probs(*args, cfg_scale=cfg_scale, **kwargs)

        return score_in_buckets(forward, self.pad_token_id, inputs, positions,
                                targets, token_budget=token_budget, batch_size=batch_size,
                                progress=progress,
                                equal_lengths=not self._takes_attention_mask
                                or self.layout == "xt_x0",
                                unconditional=unconditional)

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
            rows, squeeze = dense_mask_rows(mask, *x.shape)
            res = self._ragged(self.encode(x), rows, generator, token_budget)
            out = torch.stack(res, dim=1)  # (B, N, D)
            return out[0] if squeeze else out
        ids = self.encode(x)
        masks, flat = ragged_mask_list(mask, ids)
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
                               progress: Any = None, cfg_scale: float = 0.0,
                               prompt_lengths: Sequence[int] | None = None
                               ) -> list[torch.Tensor]:
        """Sum of log p(x_j | x_R) over each mask ``(Q_i, D_i)`` of each sequence: ``(Q_i,)``.

        The ragged protocol (:class:`~mptlml.models.protocols.RaggedMaskedModel`):
        sequence i is corrupted with ``generators[i]``, then all pairs are scored
        together by :meth:`score_positions`.

        With ``cfg_scale`` != 0 (classifier-free guidance) the first
        ``prompt_lengths[i]`` content ids of sequence i are its prompt: each masked
        input is scored with the guided logits ``u + (cfg_scale + 1) (c - u)``, u from
        the same input with the prompt (and the special tokens before it, the BOS)
        masked too. A guided score, not a log-probability of the model
        (:func:`~mptlml.models.conditional.guided_logits`).
        """
        return self._sums(list(ids), list(masks), None, list(generators), token_budget,
                          progress, batch_size, guide=self._guide(cfg_scale, prompt_lengths, ids))

    #: classifier-free guidance (``cfg_scale``, ``prompt_lengths``) is supported
    supports_guidance = True

    def _guide(self, cfg_scale: float, prompt_lengths: Sequence[int] | None,
               ids: Sequence[torch.Tensor]) -> tuple[float, list[int]] | None:
        """``(cfg_scale, prompt lengths)``, checked, when guiding (cfg_scale != 0); else None."""
        cfg_scale = check_cfg_scale(cfg_scale)
        if cfg_scale == 0:
            return None
        if prompt_lengths is None or len(prompt_lengths) != len(ids):
            raise ValueError(f"cfg_scale={cfg_scale} guides by a prompt: pass prompt_lengths, "
                             f"one per sequence ({len(ids)}).")
        out = [int(n) for n in prompt_lengths]
        if any(not 0 <= n <= len(t) for n, t in zip(out, ids, strict=True)):
            raise ValueError("each prompt length must lie in [0, len(ids[i])].")
        return cfg_scale, out

    # ------------------------------------------------------------------ blocks
    @property
    def _fixed_length(self) -> int | None:
        """The x_t and x_0 halves' fixed length (BD3-LM's ``config.model_length``)."""
        n = getattr(getattr(self.model, "config", None), "model_length", None)
        return int(n) if self.layout == "xt_x0" and isinstance(n, int) else None

    def _block_laid_out(self, inputs: Sequence[torch.Tensor], positions: Sequence[torch.Tensor],
                        unconditional: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Whole inputs whose positions lie in one block each (greedy decoding block by
        block: the blocks before it clean), in the model's layout."""
        if unconditional is not None:
            raise ValueError(f"{self.name} is a block-diffusion LM: classifier-free guidance "
                             "is not defined for it here; pass cfg_scale=0.")
        out_i, out_p = [], []
        for inp, pos in zip(inputs, positions, strict=True):
            if len(pos) and int(pos.min()) // self.block_size != int(pos.max()) // self.block_size:
                raise ValueError(f"{self.name} is a block-diffusion LM: the positions of one "
                                 "input must lie in one block (it decodes block by block).")
            ((x, p),) = block_inputs(inp, inp, pos, self.block_size, str(self.layout),
                                     self.mask_token_id, self._fixed_length)
            out_i.append(x)
            out_p.append(p)
        return out_i, out_p

    def refuse_full_attention(self, what: str) -> None:
        """Refuse ``what`` (an estimator, a door) that scores masks across a block model's
        blocks as if its attention were full (dllm #93's failure), naming the block bound."""
        raise ValueError(
            f"{self.name} is a block-diffusion LM ({self.convention.name}, block size "
            f"{self.block_size}): its conditionals are block-causal, so {what}, which draws "
            "masks over the whole sequence as for a full-attention model, does not give its "
            "bound. Use the block bound: estimate_lml(model, texts, 'learned-rate') (masks "
            "drawn inside each block), compare(...), or the lm-eval backend.")

    def block_spans(self, ids: Sequence[torch.Tensor], context_lengths: Sequence[int] | None
                    = None) -> list[list[tuple[int, int]]]:
        """Each sequence's blocks in content coordinates
        (:func:`~mptlml.models.blocks.block_spans`): the content starts after the frame's
        leading tokens and, with ``context_lengths``, after as many context tokens of its
        own ids (spans then count from the context's start)."""
        if self.block_size is None:
            raise ValueError(f"{self.name} is not a block-diffusion LM (no block size).")
        ctx = [0] * len(ids) if context_lengths is None else [int(c) for c in context_lengths]
        return [[(a + c, e + c) for a, e in block_spans(len(t) - c, len(self.prefix) + c,
                                                          self.block_size)]
                for t, c in zip(ids, ctx, strict=True)]

    def block_position_log_probs(self, ids: Sequence[torch.Tensor],
                                 masks: Sequence[torch.Tensor], *, token_budget: int = 8192,
                                 batch_size: int | None = None, progress: Any = None
                                 ) -> list[torch.Tensor]:
        """A block model's ``log p(x_j | x_{b - mask}, x_<b)`` at each masked position j of
        each row, 0 elsewhere: float64 ``(Q_i, D_i)`` per sequence.

        Each row's masked positions of block b are scored against block b's visible tokens
        and the clean earlier blocks, whatever the row masks elsewhere (block-causal
        attention: later blocks are never visible); with the ``"xt_x0"`` layout one forward
        of length 2L scores every block of a row (:func:`~mptlml.models.blocks.block_inputs`).
        """
        ms = [torch.as_tensor(m, dtype=torch.bool) for m in masks]
        owner, lp = self._score_pairs(list(ids), ms, [None] * len(ms), token_budget, progress,
                                      batch_size, blockwise=True)
        out = [torch.zeros(m.shape, dtype=torch.float64) for m in ms]
        for (i, q, p), v in zip(owner, lp, strict=True):
            out[i][q, p] = v
        return out

    # ------------------------------------------------------------------ words
    def token_strings(self, ids: torch.Tensor) -> list[str]:
        """The vocabulary strings of content ids ``(D,)`` (e.g. ``["un", "##happy"]``)."""
        return word_units.token_strings(self.tokenizer, ids)

    #: content ids, the word of each token, and the words' texts: the one definition,
    #: :func:`mptlml.models.word_units.encode_words`, as this model's method
    encode_words = word_units.encode_words

    def ragged_target_log_prob(self, ids: Sequence[torch.Tensor], masks: Sequence[torch.Tensor],
                               targets: Sequence[torch.Tensor],
                               generators: Sequence[torch.Generator | None], *,
                               token_budget: int = 8192, batch_size: int | None = None,
                               progress: Any = None, cfg_scale: float = 0.0,
                               prompt_lengths: Sequence[int] | None = None
                               ) -> list[torch.Tensor]:
        """``sum_{j in T} log p(x_j | x_{-M})`` for each mask M ``(Q_i, D_i)`` and targets T.

        Every row of ``targets`` must be a subset of the same row of ``masks``;
        the input hides all of M (corrupted as the model corrupts masks), and
        only the positions in T are scored. Returns float64 ``(Q_i,)`` each.
        ``cfg_scale`` and ``prompt_lengths``: guidance, as in :meth:`ragged_masked_log_prob`.
        """
        ms, ts = list(masks), list(targets)
        word_units.check_targets(ms, ts)
        return self._sums(list(ids), ms, ts, list(generators), token_budget, progress,
                          batch_size, guide=self._guide(cfg_scale, prompt_lengths, ids))

    def _sums(self, ids: list[torch.Tensor], masks: list[torch.Tensor], targets: Any,
              generators: list[torch.Generator | None], token_budget: int, progress: Any,
              batch_size: int | None, guide: tuple[float, list[int]] | None = None
              ) -> list[torch.Tensor]:
        """Per (sequence, mask) pair the sum of its scored positions' log-probs: ``(Q_i,)``."""
        owner, lp = self._score_pairs(ids, masks, generators, token_budget, progress,
                                      batch_size, targets=targets, guide=guide)
        out = [torch.zeros(m.shape[0], dtype=torch.float64) for m in masks]
        for (i, q, _), v in zip(owner, lp, strict=True):
            out[i][q] = v.sum()
        return out

    def _score_pairs(self, ids: list[torch.Tensor], masks: list[torch.Tensor],
                     generators: list[torch.Generator | None], token_budget: int,
                     progress: Any, batch_size: int | None = None, targets: Any = None,
                     guide: tuple[float, list[int]] | None = None, blockwise: bool = False,
                     ) -> tuple[list[tuple[int, int, torch.Tensor]], list[torch.Tensor]]:
        """Per-position log-probs of each (sequence, mask) pair, at ``targets`` (default: M).

        ``guide``: ``(cfg_scale, prompt length of each sequence)`` (guided scoring): each
        input's unconditional twin masks its first ``len(prefix) + length`` positions too.
        A block model is scored only ``blockwise`` (:meth:`block_position_log_probs`): each
        row's masked positions against their own block and the clean earlier blocks
        (:func:`~mptlml.models.blocks.block_inputs`).
        """
        if self.block_size is not None and not blockwise:
            self.refuse_full_attention("scoring masks over the whole sequence (pll, "
                                       "mpt_curve, a full-attention estimator)")
        inputs, pos, tgt, owner, uncond = [], [], [], [], []
        off = len(self.prefix)
        if self.block_size is not None and guide is not None:
            raise ValueError(f"{self.name} is a block-diffusion LM: classifier-free guidance "
                             "is not defined for its block bound here; pass cfg_scale=0.")
        self._check_shifted(off == 0 and any(bool((m if targets is None else targets[i])[:, 0]
                                                  .any()) for i, m in enumerate(masks)))
        for i, (t, m, g) in enumerate(zip(ids, masks, generators, strict=True)):
            x = self.corrupt(t, m, g)
            if guide is not None:
                xu = x.clone()
                xu[:, :off + guide[1][i]] = self.mask_token_id
            if self.block_size is not None:
                clean = self.corrupt(t, torch.zeros(1, len(t), dtype=torch.bool))[0]
                for q in range(m.shape[0]):
                    p = m[q].nonzero().flatten()
                    for inp, pp in block_inputs(clean, x[q], p + off, self.block_size,
                                                str(self.layout), self.mask_token_id,
                                                self._fixed_length):
                        inputs.append(inp)
                        pos.append(pp)
                        tgt.append(t[pp - off])
                        owner.append((i, q, pp - off))
                continue
            for q in range(m.shape[0]):
                p = (m[q] if targets is None else targets[i][q]).nonzero().flatten()
                inputs.append(x[q])
                pos.append(p + off)
                tgt.append(t[p])
                owner.append((i, q, p))
                if guide is not None:
                    uncond.append(xu[q])
        return owner, self.score_positions(inputs, pos, tgt, token_budget=token_budget,
                                           batch_size=batch_size, progress=progress,
                                           unconditional=uncond if guide is not None else None,
                                           cfg_scale=0.0 if guide is None else guide[0])
