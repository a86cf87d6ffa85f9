"""Checks that a tokenizer belongs to a masked LM, by what it does, not only by its size.

A foreign tokenizer does not crash a masked LM: it feeds it ids that mean other
tokens, and the scores come out wrong but plausible. :class:`MaskedLM` runs,
at construction (:func:`check_tokenizer`):

- vocabulary size: ``len(tokenizer) == model.config.vocab_size``;
- the mask token exists;
- special-token ids agree with the model config wherever the config has one
  (``pad``/``bos``/``eos``/``sep``/``cls``/``mask`` ``_token_id``);
- round trip: a few ordinary vocabulary tokens, spread over the vocabulary,
  are encoded from their own text; when half or more come back as the
  unknown token the tokenizer normalises the text away from its vocabulary
  (a lower-casing tokenizer on an upper-case vocabulary such as AntiBERTy's);

and, on the data (:func:`check_unknown_tokens`), a flood of unknown tokens:
more than :data:`MAX_UNKNOWN_FRACTION` of the encoded tokens is an error.
``allow_unknown=True`` turns both unknown-token checks into warnings.

What cannot be caught: a tokenizer with the same vocabulary size, the same
special ids and the same token strings but another id order (two vocab
files with the tokens permuted) encodes every text without an unknown token
and without any size mismatch. Load the tokenizer saved with the model
(``tokenizer.save_pretrained`` beside ``model.save_pretrained``) to avoid it.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["MAX_UNKNOWN_FRACTION", "check_module_vocab", "check_round_trip", "check_tokenizer",
           "check_unknown_each", "check_unknown_tokens", "special_frame"]

#: Largest fraction of unknown tokens in the encoded data accepted without allow_unknown=True.
MAX_UNKNOWN_FRACTION = 0.05
_SPECIAL_NAMES = ("pad", "bos", "eos", "sep", "cls", "mask")
_NUM_PROBES = 8


def _opt_out(message: str, allow_unknown: bool) -> None:
    if allow_unknown:
        warnings.warn(message + " (allowed: allow_unknown=True)", stacklevel=3)
    else:
        raise ValueError(message + " If this is really meant, pass allow_unknown=True "
                         "(CLI: --allow-unknown).")


def _probe_tokens(tokenizer: Any, special: set[int]) -> list[tuple[int, str]]:
    """Up to eight ordinary tokens spread evenly over the vocabulary, with their ids."""
    vocab = tokenizer.get_vocab()
    ordinary = sorted(
        (i, t) for t, i in vocab.items()
        if i not in special and not t.startswith(("##", "[unused", "<unused", "<extra_id"))
        and t.strip()
    )
    if not ordinary:
        return []
    step = max(1, len(ordinary) // _NUM_PROBES)
    return ordinary[::step][:_NUM_PROBES]


def check_tokenizer(model: Any, tokenizer: Any, *, allow_unknown: bool = False) -> None:
    """Refuse a tokenizer that does not belong to ``model`` (see the module docstring).

    Raises
    ------
    ValueError
        On a vocabulary-size mismatch, a missing mask token, a special-token id
        that differs from the model config's, or (unless ``allow_unknown``) a
        round trip in which half or more of the probed tokens become unknown.
    """
    vocab = int(model.config.vocab_size)
    n_tok = len(tokenizer)
    if n_tok != vocab:
        raise ValueError(
            f"tokenizer/model vocabulary mismatch: the tokenizer has {n_tok} tokens but the "
            f"model's vocabulary has {vocab}. Pass the tokenizer saved with this model. "
            "(On transformers 5, BertTokenizer(vocab_file=PATH) ignores the file; pass the "
            "path positionally, BertTokenizer(PATH, do_lower_case=False).)"
        )
    if tokenizer.mask_token_id is None:
        raise ValueError("the tokenizer has no mask token; pass a masked-LM tokenizer.")
    bad = []
    for name in _SPECIAL_NAMES:
        want = getattr(model.config, f"{name}_token_id", None)
        have = getattr(tokenizer, f"{name}_token_id", None)
        if isinstance(want, int) and have is not None and int(have) != want:
            bad.append(f"{name}: tokenizer {int(have)} ({getattr(tokenizer, f'{name}_token')!r})"
                       f" vs model config {want}")
    if bad:
        raise ValueError(
            "tokenizer/model special-token mismatch (" + "; ".join(bad) + "). Pass the "
            "tokenizer saved with this model; if the config is what is wrong, set "
            "model.config.<name>_token_id to the tokenizer's id."
        )
    check_round_trip(tokenizer, allow_unknown=allow_unknown)


def check_round_trip(tokenizer: Any, *, allow_unknown: bool = False) -> None:
    """Refuse a tokenizer that turns its own vocabulary tokens into the unknown token.

    Up to eight ordinary vocabulary tokens, spread over the vocabulary, are
    encoded from their own text; when half or more come back as the unknown
    token the tokenizer normalises text away from its vocabulary. Used by
    :func:`check_tokenizer` and by :class:`mptlml.hf.DataCollatorForMPT`
    (which has no model to compare with).

    Raises
    ------
    ValueError
        Unless ``allow_unknown`` (then a warning).
    """
    unk = tokenizer.unk_token_id
    if unk is None:
        return
    probes = _probe_tokens(tokenizer, {int(i) for i in tokenizer.all_special_ids})
    lost = []
    for _, t in probes:
        text = tokenizer.convert_tokens_to_string([t])
        if unk in tokenizer(text, add_special_tokens=False)["input_ids"]:
            lost.append(t)
    if probes and 2 * len(lost) >= len(probes):
        _opt_out(
            f"the tokenizer turns {len(lost)} of {len(probes)} of its own vocabulary tokens "
            f"({', '.join(repr(t) for t in lost[:5])}) into the unknown token "
            f"{tokenizer.unk_token!r}: it normalises text away from its vocabulary (e.g. "
            "lower-cases an upper-case vocabulary: BertTokenizer(PATH, do_lower_case=False)).",
            allow_unknown)


def check_unknown_tokens(ids: Sequence[torch.Tensor], unk_id: int | None, unk_token: str,
                         *, allow_unknown: bool = False) -> None:
    """Error on more than :data:`MAX_UNKNOWN_FRACTION` unknown tokens; warn on fewer.

    ``ids`` are the encoded content tokens of every sequence.
    """
    if unk_id is None:
        return
    counts = [int((t == unk_id).sum()) for t in ids]
    n_unk, total = sum(counts), sum(len(t) for t in ids)
    if not n_unk:
        return
    frac = n_unk / max(total, 1)
    worst = max(range(len(counts)), key=counts.__getitem__)
    what = (f"{n_unk} of {total} tokens ({100 * frac:.1f}%) map to the unknown token "
            f"{unk_token} (sequence {worst} has {counts[worst]})")
    if frac > MAX_UNKNOWN_FRACTION:
        _opt_out(f"{what}: more than {100 * MAX_UNKNOWN_FRACTION:g}% unknown tokens means the "
                 "tokenizer does not fit the text (wrong tokenizer, lower-casing, or another "
                 "alphabet).", allow_unknown)
    else:
        warnings.warn(f"{what}; they are scored as such.", stacklevel=3)


def check_unknown_each(ids: Sequence[torch.Tensor], names: Sequence[str], unk_id: int | None,
                       unk_token: str) -> None:
    """Refuse any one sequence with more than :data:`MAX_UNKNOWN_FRACTION` unknown tokens.

    Each sequence's own fraction, not pooled: one all-unknown text (an lm-eval
    choice, a document) among many good ones is refused, naming it by ``names``.
    """
    if unk_id is None:
        return
    for t, name in zip(ids, names, strict=True):
        n = int((t == unk_id).sum())
        if n and n / len(t) > MAX_UNKNOWN_FRACTION:
            raise ValueError(
                f"{name}: {n} of its {len(t)} tokens map to the unknown token {unk_token} "
                f"(more than {100 * MAX_UNKNOWN_FRACTION:g}%): it would be scored as unknown "
                "tokens, not as its text. Check the task's data and the tokenizer, or pass "
                "allow_unknown=true (model_args in lm-eval) to score it anyway.")


def check_module_vocab(model: Any, tokenizer: Any, *, mask_token_id: int | None,
                       vocab_size: int | None,
                       mask_source: str = "mask_token_id") -> tuple[int, int]:
    """Vocabulary size and mask id of a module scored with an explicit mask id.

    For a masked-diffusion LM (LLaDA, MDLM, Dream, ...) or any module whose
    forward returns logits, the mask id is a plain vocabulary entry that the
    tokenizer need not know as a special token, and the logits may cover more
    ids than the tokenizer has (LLaDA: 126,464 logits, mask id 126,336). The
    vocabulary size is ``vocab_size=``, else ``model.config.vocab_size``, else
    the width of the logits of a one-token forward pass.

    ``mask_source`` names where the mask id came from in the messages (the user's
    ``mask_token_id``, or a family's convention).

    Raises
    ------
    ValueError
        When no mask id is known, it lies outside the vocabulary, or the
        tokenizer has ids the model cannot score.
    """
    if isinstance(model, torch.nn.Module) and next(model.parameters(), None) is None:
        raise TypeError(
            f"model {type(model).__name__} has no parameters: MaskedLM places its inputs on the "
            "device of the module's parameters and reads their dtype. Register the weights as "
            "parameters (nn.Parameter, or a submodule that holds them).")
    if mask_token_id is None:
        mask_token_id = getattr(tokenizer, "mask_token_id", None)
        if mask_token_id is None:
            raise ValueError(
                "no mask token id: the tokenizer has no mask token. Pass mask_token_id= (the "
                "id the model was trained to read as masked, e.g. 126336 for LLaDA).")
    if isinstance(mask_token_id, bool) or not isinstance(mask_token_id, int):
        raise TypeError(f"mask_token_id must be an int, got {mask_token_id!r}.")
    vocab = vocab_size if vocab_size is not None else getattr(
        getattr(model, "config", None), "vocab_size", None)
    if vocab is None:
        vocab = _probe_vocab(model)
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 2:
        raise ValueError(f"vocab_size must be an int >= 2, got {vocab!r}.")
    if not 0 <= mask_token_id < vocab:
        fix = ("pass the id the model reads as masked" if mask_source == "mask_token_id" else
               "the model does not follow that family; pass the id it reads as masked "
               "(mask_token_id=) or its own family=")
        who = (f"mask_token_id={mask_token_id}" if mask_source == "mask_token_id" else
               f"{mask_source} {mask_token_id}")
        raise ValueError(f"{who} is outside the model's vocabulary "
                         f"(0..{vocab - 1}); {fix}.")
    if tokenizer is not None and len(tokenizer) > vocab:
        raise ValueError(
            f"tokenizer/model vocabulary mismatch: the tokenizer has {len(tokenizer)} tokens "
            f"but the model scores only {vocab}; pass the tokenizer saved with this model.")
    return int(vocab), int(mask_token_id)


def _probe_vocab(model: Any) -> int:
    """The logits' width of a one-token forward pass (a module without a config)."""
    from .mlm_inputs import evaluation_mode, logits_of

    dev = next((p.device for p in model.parameters()), torch.device("cpu"))
    with torch.inference_mode(), evaluation_mode(model):
        out = model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=dev))
    return int(logits_of(out, type(model).__name__).shape[-1])


def special_frame(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The special tokens a tokenizer puts before and after the content tokens.

    Read from the tokenizer itself: a short probe text is encoded with and
    without special tokens and the content located in the full encoding
    ([CLS] ... [SEP] for BERT, <s> ... </s> for RoBERTa). Falls back to
    cls/bos before and sep/eos after when no probe encodes cleanly.
    """
    mask, unk = getattr(tokenizer, "mask_token_id", None), tokenizer.unk_token_id
    for probe in ("a", "A", "the", "1"):
        content = tokenizer(probe, add_special_tokens=False)["input_ids"]
        full = tokenizer(probe, add_special_tokens=True)["input_ids"]
        if not content or mask in content or (unk is not None and unk in content):
            continue
        for i in range(len(full) - len(content) + 1):
            if full[i:i + len(content)] == content:
                return list(full[:i]), list(full[i + len(content):])
    pre = [tokenizer.cls_token_id] if tokenizer.cls_token_id is not None else (
        [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else [])
    suf = [tokenizer.sep_token_id] if tokenizer.sep_token_id is not None else (
        [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])
    return pre, suf
