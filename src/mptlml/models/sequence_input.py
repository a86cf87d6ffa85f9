"""Sequence input of the ragged entry points: one normalisation, one tokenisation.

A sequence is what it looks like: a text, or a sequence of integer token ids
of its content (no special tokens). Every ragged entry point goes through
this module: :func:`mptlml.pll`, :func:`mptlml.mpt_curve` and
:func:`mptlml.estimate_lml` on a :class:`~mptlml.models.protocols.RaggedMaskedModel`
(:func:`encode`), :meth:`mptlml.models.MaskedLM.encode` (:func:`tokenize`),
the data collator :class:`mptlml.hf.DataCollatorForMPT` (:func:`as_token_ids`)
and the CLI (which loads texts with :func:`mptlml.data.text.load_texts` and
encodes them with ``MaskedLM.encode``).

:func:`normalise_sequences` accepts

- a list (tuple, or other iterable) of texts;
- a list of token-id sequences: lists/tuples of ints, 1-D integer tensors or
  numpy arrays;
- a 2-D integer tensor or array, one row per sequence;

and refuses, naming the sequence and the value,

- a single text (wrap it: ``[text]``), a ``dict`` or ``BatchEncoding`` (its
  iteration would give its key names): pass the texts, or the content ids
  ``tokenizer(texts, add_special_tokens=False)["input_ids"]``;
- float, complex or bool token ids (never truncated to ints), nested lists,
  ``None``, a list of strings as one sequence (a list-valued JSON field), a
  mix of texts and ids, and an empty input.

:func:`tokenize` turns texts into content ids (the tokenizer without special
tokens) and checks ids of both kinds *the same way*: inside the vocabulary,
and free of special tokens other than the unknown token. A special-token
string inside a text (``"the [MASK] sat"``, ``"[CLS] [SEP]"``) becomes a
special id and is refused exactly as the id would be: it is not content, and
scoring it would score the model's control symbols. The unknown token is
content the tokenizer could not represent, accepted on both paths and
counted by :func:`~mptlml.models.tokenizer_checks.check_unknown_tokens`.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .protocols import RaggedMaskedModel
from .tokenizer_checks import check_unknown_tokens

__all__ = ["ContextBoundaryWarning", "as_token_ids", "check_content", "content_limit",
           "context_bos", "encode", "encode_with_context", "fit_contexts", "normalise_sequences",
           "rolling_windows", "tokenize", "tokenize_groups", "window_pairs"]

_HOW = ("pass the texts themselves, or content token ids "
        "(tokenizer(texts, add_special_tokens=False)['input_ids'])")


def _show(value: Any, limit: int = 60) -> str:
    r = repr(value)
    return r if len(r) <= limit else r[:limit - 3] + "..."


def as_token_ids(value: Any, where: str, how: str = _HOW) -> torch.Tensor:
    """One sequence of token ids as a 1-D LongTensor, or an error naming ``where``.

    Accepts a list/tuple of ints (Python or numpy), a 1-D integer tensor or
    numpy array. Float, complex and bool ids are refused, never truncated.
    ``how`` says what to pass instead.
    """
    if isinstance(value, torch.Tensor):
        if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise TypeError(f"{where} holds {value.dtype} token ids; ids are integers (floats "
                            "are never truncated): pass an integer tensor.")
        if value.ndim != 1:
            raise ValueError(f"{where} is a tensor of shape {tuple(value.shape)}; one sequence "
                             "is 1-D.")
        return value.detach().cpu().long()
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "iu":
            raise TypeError(f"{where} holds {value.dtype} token ids; ids are integers (floats "
                            "are never truncated): pass an integer array.")
        if value.ndim != 1:
            raise ValueError(f"{where} is an array of shape {value.shape}; one sequence is 1-D.")
        return torch.from_numpy(value.astype(np.int64))
    if type(value) is list and all(type(v) is int for v in value):  # the common case, fast
        return torch.tensor(value, dtype=torch.long)
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence):
        raise TypeError(f"{where} is a {type(value).__name__} ({_show(value)}), not a sequence "
                        f"of token ids; {how}.")
    for j, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            if isinstance(v, torch.Tensor | np.ndarray) and v.ndim == 0 and not (
                    v.dtype.is_floating_point if isinstance(v, torch.Tensor)
                    else v.dtype.kind not in "iu"):
                continue
            what = ("a nested sequence" if isinstance(v, Sequence | torch.Tensor | np.ndarray)
                    and not isinstance(v, str) else f"{_show(v)} ({type(v).__name__})")
            raise TypeError(f"{where}, position {j}: {what} is not a token id; ids are integers "
                            f"(floats are never truncated); {how}.")
    return torch.tensor([int(v) for v in value], dtype=torch.long)


def normalise_sequences(sequences: Any) -> list[str] | list[torch.Tensor]:
    """The user's sequences as a list of texts or a list of 1-D LongTensors of ids.

    See the module docstring for what is accepted and refused.

    Raises
    ------
    TypeError, ValueError
        Naming the offending sequence and its value, and what to pass instead.
    """
    if isinstance(sequences, str | bytes):
        raise TypeError("pass a list of texts (or token-id lists), not a single string; "
                        "wrap it: [text].")
    if isinstance(sequences, Mapping):
        keys = ", ".join(repr(k) for k in list(sequences)[:4])
        raise TypeError(f"got a {type(sequences).__name__} (keys {keys}): its sequences would be "
                        f"its key names. {_HOW[0].upper()}{_HOW[1:]}; tokenizer outputs carry "
                        "special tokens ([CLS], [SEP]) that are not content.")
    if isinstance(sequences, torch.Tensor | np.ndarray):
        if sequences.ndim != 2:
            raise ValueError(f"a tensor of sequences must be 2-D (one row per sequence), got "
                             f"shape {tuple(sequences.shape)}.")
        return [as_token_ids(row, f"sequence {i}") for i, row in enumerate(sequences)]
    if sequences is None or not isinstance(sequences, Iterable):
        raise TypeError(f"sequences must be a list of texts or of token-id sequences, got "
                        f"{type(sequences).__name__}.")
    seqs = list(sequences)
    if not seqs:
        raise ValueError("no sequences given; pass at least one text.")
    texts = [isinstance(s, str) for s in seqs]
    if all(texts):
        return seqs
    if any(texts):
        i = texts.index(False)
        raise TypeError(f"sequences mix texts and token ids (sequence {i} is "
                        f"{_show(seqs[i])}); pass one kind.")
    out = []
    for i, s in enumerate(seqs):
        if isinstance(s, Sequence | np.ndarray) and len(s) and all(
                isinstance(v, str) for v in s):
            raise TypeError(f"sequence {i} is a list of {len(s)} strings ({_show(s)}), not one "
                            "text; join them into one string per sequence.")
        out.append(as_token_ids(s, f"sequence {i}"))
    return out


def tokenize(sequences: Any, tokenizer: Any, *, vocab_size: int,
             preprocess: Callable[[str], str] | None = None,
             forbidden_ids: Sequence[int] = ()) -> list[torch.Tensor]:
    """Content token ids of each sequence, checked the same way for texts and ids.

    Texts (after ``preprocess``) are tokenized without special tokens; ids are
    taken as they are. Then, on both paths: every id lies in
    ``[0, vocab_size)``, and no id is a special token other than the unknown
    token, nor one of ``forbidden_ids`` (a mask id that is a plain vocabulary
    entry, as in masked-diffusion LMs). :func:`tokenize_groups` of one group.

    Raises
    ------
    ValueError
        On an id outside the vocabulary or a special token, naming the
        sequence, the token and what to do.
    """
    return tokenize_groups([sequences], tokenizer, vocab_size=vocab_size, preprocess=preprocess,
                           forbidden_ids=forbidden_ids)[0]


def tokenize_groups(groups: Sequence[Any], tokenizer: Any, *, vocab_size: int,
                    preprocess: Callable[[str], str] | None = None,
                    forbidden_ids: Sequence[int] = ()) -> list[list[torch.Tensor]]:
    """:func:`tokenize` of each group of sequences, the tokenizer called once for all of them.

    The texts of every group go through one tokenizer call (a request's context
    and its joined text are tokenized in one pass); each group is then checked
    on its own, its sequences named by their index in the group.
    """
    seqs = [normalise_sequences(g) for g in groups]
    texts = [preprocess(s) if preprocess else s for g in seqs for s in g
             if isinstance(s, str)]
    it = iter([torch.as_tensor(i, dtype=torch.long)
               for i in tokenizer(texts, add_special_tokens=False)["input_ids"]]
              if texts else [])
    unk = getattr(tokenizer, "unk_token_id", None)
    special = {int(i) for i in tokenizer.all_special_ids}
    forbidden = torch.tensor(sorted((special - (set() if unk is None else {int(unk)}))
                                    | {int(i) for i in forbidden_ids}), dtype=torch.long)
    out = []
    for g in seqs:
        from_text = bool(g) and isinstance(g[0], str)
        ids = [next(it) for _ in g] if from_text else list(g)
        for i, t in enumerate(ids):
            _check_ids(t, f"sequence {i} ({_show(g[i])})" if from_text else f"sequence {i}",
                       from_text, tokenizer, vocab_size, forbidden, special, forbidden_ids)
        out.append(ids)
    return out


def _check_ids(t: torch.Tensor, where: str, from_text: bool, tokenizer: Any, vocab_size: int,
               forbidden: torch.Tensor, special: set[int], forbidden_ids: Sequence[int]) -> None:
    """Refuse ids outside the vocabulary, special tokens and the mask id (:func:`tokenize`)."""
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= vocab_size):
        raise ValueError(f"{where.split(' (')[0]} has token ids outside [0, {vocab_size}); pass "
                         "ids of this model's vocabulary.")
    hit = torch.isin(t, forbidden)
    if not bool(hit.any()):
        return
    j = int(hit.nonzero()[0, 0])
    name = tokenizer.convert_ids_to_tokens(int(t[j]))
    if int(t[j]) in {int(f) for f in forbidden_ids} and int(t[j]) not in special:
        raise ValueError(
            f"{where} contains {name!r} (id {int(t[j])}) at content position {j}, the "
            f"id given as mask_token_id={int(t[j])}: the model reads it as masked, so "
            "no text may contain it. If it is a word of your texts, mask_token_id is "
            "wrong: pass the id the model was trained to read as masked (a special "
            "token, e.g. tokenizer.mask_token_id; LLaDA's 126336).")
    raise ValueError(
        f"{where} contains the special token {name!r} (id {int(t[j])}) at content "
        f"position {j}: special tokens are not content and are never scored. Remove it "
        + ("from the text" if from_text else "from the ids")
        + " (the model adds its own [CLS]/[SEP]-like frame, and masks are placed by the "
        "estimator).")


def encode(model: Any, sequences: Any) -> list[torch.Tensor]:
    """Content token ids of a ragged model: :func:`normalise_sequences`, then ``model.encode``.

    What every ragged estimator calls first (the model's ``encode`` may
    tokenize; :class:`~mptlml.models.MaskedLM` uses :func:`tokenize`).
    """
    if not isinstance(model, RaggedMaskedModel):
        raise TypeError(
            f"model must implement mptlml.models.protocols.RaggedMaskedModel (a masked "
            f"language model), got {type(model).__name__}; wrap a transformers model in the "
            "masked-LM adapter of mptlml.models (its from_pretrained loads one by name or path)."
        )
    return model.encode(normalise_sequences(sequences))


class ContextBoundaryWarning(UserWarning):
    """A context's last token and its continuation's first merge into one token when joined."""


def encode_with_context(model: Any, contexts: Any, continuations: Any, *,
                        check_length: bool = True,
                        names: Sequence[str] | None = None, word_warnings: bool = True
                        ) -> tuple[list[torch.Tensor], list[int]]:
    """Content ids of each context + continuation, and how many of them are the context's.

    The one tokenisation of (context, continuation) pairs: every door that scores
    a continuation given a context (:func:`mptlml.compare`, ``estimate_lml`` and
    ``pll`` with ``context=``, LLaDA's scheme, the lm-eval backend) calls it.
    The tokenisation is the model's own, of the joined text: the continuation's
    tokens are those of ``context + continuation`` after the first
    ``len(encode(context))`` tokens (the convention of lm-evaluation-harness;
    trailing whitespace of a context moves to its continuation first). Where a
    sub-word token spans the boundary (the joined text does not start with the
    context's own tokens), the joined tokens are kept: the first
    ``len(encode(context))`` are the visible context, the rest are scored, and a
    :class:`ContextBoundaryWarning` names the pair. Token ids are joined as
    given. An empty context (``""`` or ``[]``) makes the score unconditional.

    A model with ``encode_groups`` (:class:`~mptlml.models.MaskedLM`) tokenizes
    the distinct contexts and the joined texts in one tokenizer call; any other
    model's ``encode`` is called per group.

    Parameters
    ----------
    model : RaggedMaskedModel
    contexts : str, or list of str or token-id sequences
    continuations : list of str or token-id sequences
    check_length : bool
        Refuse (or cut, with ``truncate``) sequences longer than the model's
        maximum. False: the caller cuts each context to fit (the lm-eval backend);
        needs ``encode_groups``.
    names : list of str, optional
        A name per pair: each continuation's unknown tokens are then checked on
        their own, naming it (:func:`~mptlml.models.tokenizer_checks.check_unknown_each`),
        before the pooled checks of the contexts and the joined sequences.
    word_warnings : bool
        Warn where a continuation's first token completes the context's last word
        (texts; a model with ``encode_words``).

    Returns
    -------
    ids : list of LongTensor
        ``(C_i + T_i,)`` content ids of the joined sequence.
    num_context : list of int
        C_i, the always-visible leading tokens of each.

    Raises
    ------
    ValueError
        On a count mismatch, mixed texts and ids, or a continuation left with no
        token of its own.
    """
    conts = normalise_sequences(continuations)
    if isinstance(contexts, str | bytes):
        contexts = [contexts] * len(conts)
    if not isinstance(contexts, Sequence) and not isinstance(contexts, torch.Tensor):
        raise TypeError(f"context must be a text (one context for every continuation) or a "
                        f"list with one context (text or token ids) per continuation; got "
                        f"{type(contexts).__name__} {_show(contexts)}.")
    ctxs = list(contexts)
    if len(ctxs) != len(conts):
        raise ValueError(f"{len(ctxs)} contexts for {len(conts)} continuations: pass one "
                         "context per continuation (or one string for all).")
    from_text = isinstance(conts[0], str)
    if any(isinstance(c, str) != from_text for c in ctxs):
        raise TypeError("contexts and continuations must be the same kind: texts with texts, "
                        "token ids with token ids.")
    grouped = hasattr(model, "encode_groups")
    if not grouped and (not check_length or names is not None):
        raise TypeError(f"check_length=False and names= need a model with encode_groups (a "
                        f"MaskedLM); got {type(model).__name__}.")
    if from_text:
        moved = [len(c) - len(c.rstrip()) for c in ctxs]
        ctxs = [c[:len(c) - k] for c, k in zip(ctxs, moved, strict=True)]
        conts = [c0[len(c0) - k:] + x if k else x
                 for c0, k, x in zip(contexts, moved, conts, strict=True)]
        nonempty = [i for i, c in enumerate(ctxs) if c.strip()]
        joined = [c + x for c, x in zip(ctxs, conts, strict=True)]
        distinct = list(dict.fromkeys(ctxs[i] for i in nonempty))  # one tokenisation each
        try:
            if grouped:
                *got, full = model.encode_groups([distinct, joined] if distinct else [joined],
                                                 check_length=check_length, check_unknown=False)
                got = got[0] if got else []
            else:
                got = model.encode(distinct) if distinct else []
                full = model.encode(joined)
        except ValueError:
            _blame_the_join(model, ctxs, conts)  # the parts alone encode: the join is at fault
            raise
        of_text = dict(zip(distinct, got, strict=True))
        ctx_ids = {i: of_text[ctxs[i]] for i in nonempty}
    else:
        nonempty = [i for i, c in enumerate(ctxs) if len(c)]
        raw = [as_token_ids(ctxs[i], f"context {i}") for i in nonempty]
        if grouped:  # the contexts, the continuations and the joined ids in one pass
            at = dict(zip(nonempty, raw, strict=True))
            joined_ids = [torch.cat([at[i], t]) if i in at else t for i, t in enumerate(conts)]
            *got, cont_ids, full = model.encode_groups(
                [raw, conts, joined_ids] if raw else [conts, joined_ids],
                check_length=check_length, check_unknown=False)
            got = got[0] if got else []
            ctx_ids = dict(zip(nonempty, got, strict=True))
        else:
            ctx_ids = dict(zip(nonempty, model.encode(raw) if raw else [], strict=True))
            cont_ids = model.encode(conts)
            full = model.encode([torch.cat([ctx_ids[i], t]) if i in ctx_ids else t
                                 for i, t in enumerate(cont_ids)])  # the joined length
    if grouped:  # the unknown tokens: each named continuation, the contexts, the joined
        try:
            if names is not None:
                model.check_unknown([t[len(ctx_ids.get(i, ())):] for i, t in enumerate(full)],
                                    names=names)
            model.check_unknown(list(ctx_ids.values()))
            if not from_text:
                model.check_unknown(cont_ids)
            model.check_unknown(full)
        except ValueError:
            if from_text and names is None:  # the named texts keep their own refusal
                _blame_the_join(model, ctxs, conts)
            raise
    num_context = []
    for i, t in enumerate(full):
        c = ctx_ids.get(i, torch.zeros(0, dtype=torch.long))
        n = len(c)
        if len(t) <= n:
            raise ValueError(f"continuation {i} ({_show(conts[i])}) has no token of its own "
                             f"after its context's {n} tokens; pass a non-empty continuation.")
        if not torch.equal(t[:n], c):
            warnings.warn(f"pair {i}: the context's last token and the continuation's first "
                          "merge when joined; the joined tokenisation is kept (its first "
                          f"{n} tokens visible, the other {len(t) - n} scored).",
                          ContextBoundaryWarning, stacklevel=3)
        num_context.append(n)
    if from_text and word_warnings:
        _warn_completed_words(model, joined, full, num_context)
    return full, num_context


def context_bos(model: Any, add_bos: bool) -> list[int]:
    """The BOS id to put before every context (Dream's ``add_bos_token``), or ``[]``.

    ``[]`` when not asked, or when the model's frame leads with that BOS already
    (the Dream family's ``bos_eos`` frame, :mod:`~mptlml.models.conventions`). The id
    joins the model's frame (:meth:`~mptlml.models.MaskedLM.with_prefix`), never the
    content ids, whose check refuses special tokens.

    Raises
    ------
    ValueError
        When asked and the tokenizer has no BOS token.
    """
    if not add_bos:
        return []
    bos_id = getattr(model.tokenizer, "bos_token_id", None)
    if bos_id is None:
        raise ValueError("model_args add_bos_token=true: this tokenizer has no BOS token "
                         "(bos_token_id is None); leave add_bos_token out.")
    return [] if list(model.prefix[:1]) == [int(bos_id)] else [int(bos_id)]


def content_limit(model: Any, max_length: int | None) -> int:
    """Content tokens one scored input of ``model`` may hold.

    ``max_length`` (LLaDA's and Dream's) counts every token of the input, the model's
    special tokens (its frame) included; the model's own length bounds it too.
    """
    frame = len(model.prefix) + len(model.suffix)
    limit = int(model.max_content_length)
    if max_length is not None:
        if max_length <= frame:
            raise ValueError(f"max_length={max_length} leaves no room for a token beside the "
                             f"model's {frame} special tokens; pass more.")
        limit = min(limit, int(max_length) - frame)
    return limit


def fit_contexts(model: Any, contexts: Sequence[str], continuations: Sequence[str],
                 groups: Sequence[Sequence[int]], limit: int, *, names: Sequence[str],
                 group_names: Sequence[str]
                 ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[int]]:
    """The pairs' context and continuation ids, each context cut on the left to fit beside
    its group's longest continuation; and the context tokens cut.

    The pairs are encoded in one pass of :func:`encode_with_context` (each continuation's
    unknown tokens checked on its own, naming ``names[i]``; no length check, no word
    warnings). The continuations of a group (one question's candidates, sharing a context)
    keep the same context tokens: the last ``limit - longest`` of it (the chain rule with
    a truncated context, as lm-eval does for causal models). A continuation longer than
    ``limit`` alone is refused, naming ``group_names[g]``.
    """
    ids, nctx = encode_with_context(model, list(contexts), list(continuations),
                                    check_length=False, word_warnings=False, names=names)
    full = [t[:n] for t, n in zip(ids, nctx, strict=True)]
    continuations = [t[n:] for t, n in zip(ids, nctx, strict=True)]
    kept: list[torch.Tensor] = list(full)
    for g, members in enumerate(groups):
        longest = max(len(continuations[i]) for i in members)
        if longest > limit:
            raise ValueError(
                f"{group_names[g]}: a continuation of {longest} tokens is longer than the model's "
                f"{limit} content tokens; it cannot be scored given its context (a perplexity "
                "task's loglikelihood_rolling windows long texts).")
        room = limit - longest
        for i in members:
            c = full[i]
            kept[i] = c[len(c) - room:] if len(c) > room else c
    return kept, continuations, [len(c) - len(k) for c, k in zip(full, kept, strict=True)]


def rolling_windows(n: int, limit: int) -> list[tuple[int, int, int]]:
    """(context start, start, end) of the windows of a text of n tokens, at most ``limit`` each.

    One window when the text fits; else the first ``limit`` tokens, then windows of
    ``limit - limit // 2`` tokens, each given the ``limit - its length`` tokens before it
    (the chain rule with a truncated context, as lm-eval's rolling log-likelihood
    does for causal models). An empty text has no window.
    """
    if n <= limit:
        return [(0, 0, n)] if n else []
    out = [(0, 0, limit)]
    step = limit - limit // 2
    start = limit
    while start < n:
        end = min(start + step, n)
        out.append((max(0, start - (limit - (end - start))), start, end))
        start = end
    return out


def window_pairs(ids: torch.Tensor, limit: int) -> list[tuple[list[int], list[int]]]:
    """The (context, target) ids of each of a text's :func:`rolling_windows`.

    The text's log-likelihood is the sum of the windows' (their variances add:
    :func:`~mptlml.estimators.stats.sum_stderr`).
    """
    return [(ids[c:s].tolist(), ids[s:e].tolist())
            for c, s, e in rolling_windows(len(ids), limit)]


def _blame_the_join(model: Any, contexts: list[str], continuations: list[str]) -> None:
    """Raise naming the first pair whose joined text fails to encode though its parts do."""
    for i, (c, x) in enumerate(zip(contexts, continuations, strict=True)):
        if not c.strip():
            continue
        try:
            model.encode([c + x])
        except ValueError:
            try:
                model.encode([c])
                model.encode([x])
            except ValueError:
                return  # a part fails alone: the error is the part's, not the join's
            space = (" Start the continuation with a space (" + repr(" " + x) + ") or end the "
                     "context with one, where a new word begins."
                     if c[-1:].isalnum() and x[:1].isalnum() else "")
            raise ValueError(
                f"pair {i}: the context {_show(c)} and the continuation {_show(x)} are joined "
                f"as written, {_show(c + x)}, and that joined text is refused although each "
                f"part alone is not (the join makes a word the tokenizer does not know).{space}"
            ) from None


def _warn_completed_words(model: Any, joined: list[str], full: list[torch.Tensor],
                          num_context: list[int]) -> None:
    """ContextBoundaryWarning where a continuation's first token continues the context's
    last word (one word across the join), read from the model's words when it has them."""
    if not hasattr(model, "encode_words"):
        return
    try:
        ids, words, texts = model.encode_words(joined)
    except (TypeError, ValueError):  # no word boundaries (a slow tokenizer): nothing to say
        return
    for i, (t, n) in enumerate(zip(full, num_context, strict=True)):
        if 0 < n < len(t) and len(words[i]) == len(t) and int(words[i][n]) == int(words[i][n - 1]):
            word = texts[i][int(words[i][n])]
            warnings.warn(f"pair {i}: the continuation's first token continues the context's "
                          f"last word ({word!r} spans the join): the continuation completes a "
                          "word the context began. If a new word was meant, start the "
                          "continuation with a space.", ContextBoundaryWarning, stacklevel=4)


def check_content(ids: list[torch.Tensor], *, max_length: int, frame: int, truncate: bool,
                  unk_id: int | None, unk_token: str, allow_unknown: bool) -> list[torch.Tensor]:
    """Lengths and unknown tokens of encoded sequences (empty, too long, [UNK] floods).

    ``max_length`` is the most content tokens a sequence may have (``frame``
    special tokens come on top); longer sequences are cut when ``truncate``.
    """
    out = list(ids)
    for i, t in enumerate(out):
        if t.numel() == 0:
            raise ValueError(f"sequence {i} is empty (no tokens); remove it from the data.")
        if t.numel() > max_length:
            if not truncate:
                raise ValueError(
                    f"sequence {i} has {t.numel()} tokens, more than the model's maximum of "
                    f"{max_length} (+{frame} special tokens). Shorten it, or load the model "
                    "with truncate=True to cut it (MaskedLM.from_pretrained(..., "
                    "truncate=True) or MaskedLM(..., truncate=True); --truncate on the "
                    "command line)."
                )
            out[i] = t[:max_length]
    check_unknown_tokens(out, unk_id, unk_token, allow_unknown=allow_unknown)
    return out
