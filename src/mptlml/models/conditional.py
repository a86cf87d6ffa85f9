"""A dense model seen through a context: the masked conditionals of x_T given x_C.

Proposition 1 holds conditionally. For the scored dimensions T and the
always-visible context C (T and C partition the D dimensions),

    log p(x_T | x_C) = sum_{M=1..|T|} S_T(x; M),
    S_T(x; M) = E_{mask in T, |mask| = M} [ (1/M) sum_{j in mask} log p(x_j | x_{T - mask}, x_C) ],

the chain rule of p(x_T | x_C) in a uniformly random order of T. So every
estimator of log p(x) estimates log p(x_T | x_C) when its masks are drawn
inside T and C is never masked. :class:`ConditionalView` is that model: its
``num_tokens`` is |T|, its data are the full ``(N, D)`` rows (the context's
values ride along), and a mask ``(..., |T|)`` is placed into the T columns
of a full mask before the wrapped model scores it, so the wrapped model's
fast reductions (PPCA's GEMMs and quadratic forms) serve unchanged. Its
``log_marginal`` is the exact conditional when the wrapped model has one
(:meth:`~mptlml.models.base.MaskedModel.conditional_log_marginal`).

Classifier-free guidance (``cfg_scale``, LLaDA's unsupervised guidance) scores a
masked input with the guided logits

    g = u + (cfg_scale + 1) (c - u),

c the logits of the masked input (context visible), u those of the same input
with the context (the prompt, and a BOS before it) masked too. ``log_softmax(g)``
is a *guided score*: no longer a conditional of the model, so the sums above
with it are no bound on, nor estimate of, log p(x_T | x_C); cfg_scale = 0 is
the unguided conditional exactly. Only a masked LM with a context can be
guided (:func:`with_context` refuses the rest before any work).

Reference: Moreno-Munoz, Recasens, Hauberg, "On Masked Pre-training and the
Marginal Likelihood", NeurIPS 2023, Proposition 1. Guidance: Nie et al.,
"Large Language Diffusion Models" (LLaDA), 2025, Appendix B (its ``cfg``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from .._validation import check_context, check_mask
from .base import MaskedModel

__all__ = ["ConditionalView", "ConditionedSequences", "check_cfg_scale", "guided_logits",
           "with_context"]


def check_cfg_scale(cfg_scale: Any) -> float:
    """A guidance scale: a finite number >= 0 (not a bool); returned as float."""
    if isinstance(cfg_scale, bool) or not isinstance(cfg_scale, int | float):
        raise TypeError(f"cfg_scale must be a number >= 0 (0: no guidance), got "
                        f"{type(cfg_scale).__name__} {cfg_scale!r}.")
    if not math.isfinite(cfg_scale) or cfg_scale < 0:
        raise ValueError(f"cfg_scale must be a finite number >= 0 (0: no guidance; LLaDA's "
                         f"cfg, e.g. 0.5), got {cfg_scale!r}.")
    return float(cfg_scale)


def guided_logits(conditional: torch.Tensor, unconditional: torch.Tensor,
                  cfg_scale: float) -> torch.Tensor:
    """Classifier-free guidance: ``u + (cfg_scale + 1) (c - u)`` (LLaDA's formula).

    ``conditional`` c are the logits of a masked input with its context
    visible, ``unconditional`` u those of the same input with the context
    masked too. cfg_scale = 0 returns c unchanged.
    """
    if cfg_scale == 0:
        return conditional
    return unconditional + (cfg_scale + 1.0) * (conditional - unconditional)


class ConditionalView(MaskedModel):
    """The conditionals of ``model`` on the dimensions outside ``context``, the context visible.

    Parameters
    ----------
    model : MaskedModel
        A dense model over D dimensions.
    context : bool mask ``(D,)`` or indices
        C, the dimensions that are always visible and never scored.

    Attributes
    ----------
    scored : LongTensor ``(|T|,)``
        The dimensions T that masks are drawn from, in order.
    """

    def __init__(self, model: MaskedModel, context: Any) -> None:
        super().__init__()
        if not isinstance(model, MaskedModel):
            raise TypeError(f"ConditionalView wraps a dense MaskedModel, got "
                            f"{type(model).__name__}.")
        self.inner = model
        self.context = check_context(context, model.num_tokens)
        self.scored = (~self.context).nonzero().flatten()
        self.num_tokens = int(self.scored.numel())
        self.stochastic = model.stochastic
        self.name = f"{getattr(model, 'name', type(model).__name__)} | context"

    # ------------------------------------------------------------------ data and masks
    def validate_data(self, x: Any) -> torch.Tensor:
        """Full rows ``(N, D)`` of the wrapped model: the context's values come with the data."""
        return self.inner.validate_data(x)

    def validate_mask(self, mask: Any, num_data: int) -> torch.Tensor:
        """A mask over the scored dimensions, ``(..., |T|)``."""
        return check_mask(mask, self.num_tokens, num_data, device=self.inner.device)

    def expand(self, mask: torch.Tensor) -> torch.Tensor:
        """Place a mask ``(..., |T|)`` into the T columns of a full ``(..., D)`` mask."""
        full = torch.zeros(*mask.shape[:-1], self.inner.num_tokens, dtype=torch.bool,
                           device=mask.device)
        full[..., self.scored.to(mask.device)] = mask
        return full

    @property
    def dtype(self) -> torch.dtype:
        return self.inner.dtype

    @property
    def device(self) -> torch.device:
        return self.inner.device

    # ------------------------------------------------------------------ protocol
    @property
    def has_log_marginal(self) -> bool:
        """Whether the exact conditional log p(x_T | x_C) is known."""
        return self.inner.has_log_marginal and (self.inner.has_marginal
                                                or not bool(self.context.any()))

    def _log_marginal(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner.conditional_log_marginal(x, self.context)

    def _log_conditionals(self, x: torch.Tensor, mask: torch.Tensor,
                          generator: torch.Generator | None) -> torch.Tensor:
        out = self.inner._log_conditionals(x, self.expand(mask), generator)
        return out[..., self.scored.to(out.device)]

    def masked_log_prob(self, x: torch.Tensor, mask: torch.Tensor,
                        generator: torch.Generator | None) -> torch.Tensor:
        return self.inner.masked_log_prob(x, self.expand(mask), generator)

    def masked_log_prob_mean(self, x: torch.Tensor, mask: torch.Tensor,
                             generator: torch.Generator | None) -> torch.Tensor:
        return self.inner.masked_log_prob_mean(x, self.expand(mask), generator)

    def grid_masked_log_prob(self, x: torch.Tensor, mask: torch.Tensor, weight: torch.Tensor,
                             generator: torch.Generator | None, *, data_means: bool = True
                             ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.inner.grid_masked_log_prob(x, self.expand(mask), weight, generator,
                                               data_means=data_means)

    def block_cost(self, num_data: int, shared: bool) -> int:
        return self.inner.block_cost(num_data, shared)

    @contextmanager
    def reuse_data(self) -> Iterator[None]:
        with self.inner.reuse_data():
            yield


class ConditionedSequences:
    """A ragged masked model seen through one context per sequence (p(x_T | x_C) for sequences).

    :meth:`encode` takes the continuations and returns their own tokens (so D_i = |T_i|
    and every size, rate and mask of an estimator refers to the continuation); the
    joined tokenisation is :func:`~mptlml.models.sequence_input.encode_with_context`.
    Scoring prepends each continuation's context, visible and never scored, to its
    ids and masks. Its fingerprint covers the contexts, so a checkpoint never mixes two.

    With ``cfg_scale`` != 0 every masked input is scored with guided logits
    (module docstring): the inner model is passed ``cfg_scale`` and the contexts'
    lengths as ``prompt_lengths``.

    Parameters
    ----------
    model : RaggedMaskedModel
    contexts : list of str or token-id lists, or one str for every continuation
    cfg_scale : float
        Classifier-free guidance scale (0: none); a model that can be guided only
        (``supports_guidance``, a :class:`~mptlml.models.masked_lm.MaskedLM`).
    """

    def __init__(self, model: Any, contexts: Any, cfg_scale: float = 0.0) -> None:
        self.cfg_scale = check_cfg_scale(cfg_scale)
        if self.cfg_scale and not getattr(model, "supports_guidance", False):
            raise TypeError(f"cfg_scale={cfg_scale} needs a model that can be guided (a "
                            f"MaskedLM); {type(model).__name__} takes no guidance. Pass "
                            "cfg_scale=0.")
        self.inner = model
        self.contexts = contexts
        self.name = f"{getattr(model, 'name', type(model).__name__)} | context"
        if self.cfg_scale:
            self.name += f" | cfg {self.cfg_scale:g}"
        self._context_of: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def __getattr__(self, name: str) -> Any:  # device, dtype, settings, ... of the model
        if name in ("inner", "_context_of"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    def encode(self, continuations: Any) -> list[torch.Tensor]:
        """The continuations' own token ids, each ``(T_i,)``; their contexts are remembered."""
        from .sequence_input import encode_with_context

        full, num_context = encode_with_context(self.inner, self.contexts, continuations)
        empty = [i for i, n in enumerate(num_context) if n == 0]
        if self.cfg_scale and empty:
            raise ValueError(
                f"cfg_scale={self.cfg_scale:g} guides a score by its context, and the context "
                f"of continuation {empty[0]} has no token ({len(empty)} of {len(full)} "
                "empty): there is no prompt to mask, so the guided score would be the "
                "unguided one. Give every continuation a context, or pass cfg_scale=0.")
        out = []
        for t, n in zip(full, num_context, strict=True):
            cont = t[n:].clone()
            self._context_of[id(cont)] = (cont, t[:n].clone())
            out.append(cont)
        return out

    def _guidance(self, ids: Sequence[torch.Tensor]) -> dict[str, Any]:
        """The guidance keywords of the inner model's scoring ({} without guidance)."""
        if not self.cfg_scale:
            return {}
        return {"cfg_scale": self.cfg_scale,
                "prompt_lengths": [len(self._context_of[id(t)][1]) for t in ids]}

    def _joined(self, ids: Sequence[torch.Tensor], masks: Sequence[torch.Tensor]
                ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        joined, full = [], []
        for t, m in zip(ids, masks, strict=True):
            hit = self._context_of.get(id(t))
            if hit is None or hit[0] is not t:
                raise RuntimeError("ConditionedSequences scores only the ids its encode() "
                                   "returned (their contexts are remembered by identity).")
            ctx = hit[1]
            joined.append(torch.cat([ctx, t]))
            full.append(torch.cat([torch.zeros(m.shape[0], len(ctx), dtype=m.dtype), m], 1))
        return joined, full

    def ragged_masked_log_prob(self, ids: Sequence[torch.Tensor], masks: Sequence[torch.Tensor],
                               generators: Sequence[torch.Generator | None], **kwargs: Any
                               ) -> list[torch.Tensor]:
        """Sum of log p(x_j | x_{T - mask}, x_C) over each mask ``(Q_i, T_i)``: ``(Q_i,)``."""
        joined, full = self._joined(ids, masks)
        return self.inner.ragged_masked_log_prob(joined, full, generators, **kwargs,
                                                 **self._guidance(ids))

    def ragged_target_log_prob(self, ids: Sequence[torch.Tensor], masks: Sequence[torch.Tensor],
                               targets: Sequence[torch.Tensor],
                               generators: Sequence[torch.Generator | None], **kwargs: Any
                               ) -> list[torch.Tensor]:
        """``sum_{j in targets} log p(x_j | x_{-mask}, x_C)`` per mask (the chain rule)."""
        joined, full = self._joined(ids, masks)
        _, tfull = self._joined(ids, targets)
        return self.inner.ragged_target_log_prob(joined, full, tfull, generators, **kwargs,
                                                 **self._guidance(ids))

    def block_spans(self, ids: Sequence[torch.Tensor]) -> list[list[tuple[int, int]]]:
        """A block model's blocks of each continuation, its context's tokens before it
        (clean, in the first block when the continuation starts inside one)."""
        joined, _ = self._joined(ids, [torch.zeros(0, len(t), dtype=torch.bool) for t in ids])
        ctx = [len(j) - len(t) for j, t in zip(joined, ids, strict=True)]
        spans = self.inner.block_spans(joined, ctx)
        return [[(a - c, e - c) for a, e in sp] for sp, c in zip(spans, ctx, strict=True)]

    def block_position_log_probs(self, ids: Sequence[torch.Tensor],
                                 masks: Sequence[torch.Tensor], **kwargs: Any
                                 ) -> list[torch.Tensor]:
        """A block model's per-position log-probs of each continuation's masked tokens,
        the context clean and visible: ``(Q_i, T_i)`` each."""
        joined, full = self._joined(ids, masks)
        out = self.inner.block_position_log_probs(joined, full, **kwargs)
        return [o[:, len(j) - len(t):] for o, j, t in zip(out, joined, ids, strict=True)]

    def fingerprint(self) -> dict[str, Any]:
        """The model's fingerprint, a digest of the contexts and the guidance scale."""
        import hashlib

        h = hashlib.sha256(repr(self.contexts).encode()).hexdigest()[:16]
        guide = {"cfg_scale": self.cfg_scale} if self.cfg_scale else {}
        return {**self.inner.fingerprint(), "contexts_sha256": h, **guide}


def with_context(model: Any, context: Any, *, cfg_scale: float = 0.0) -> Any:
    """``model`` seen through ``context``: the conditional twin every front door scores.

    A dense :class:`~mptlml.models.base.MaskedModel` gets a :class:`ConditionalView`
    (``context`` names always-visible dimensions: a bool mask or indices); a ragged
    model (a masked LM) gets :class:`ConditionedSequences` (``context`` is one text or
    id list per continuation, or one text for all). ``cfg_scale`` != 0 guides the
    scores by the context (module docstring): it needs a context and a masked LM,
    and is refused otherwise, before any work.
    """
    from .protocols import RaggedMaskedModel

    cfg = check_cfg_scale(cfg_scale)
    if context is None:
        if cfg:
            raise ValueError(f"cfg_scale={cfg_scale} guides a score by its context: pass "
                             "context= (the prompt that guidance masks), or cfg_scale=0.")
        return model
    if isinstance(model, MaskedModel):
        if cfg:
            raise TypeError(f"cfg_scale={cfg_scale} applies to a masked LM scored in context; "
                            f"{type(model).__name__} is a dense model, whose conditionals "
                            "cannot be guided. Pass cfg_scale=0.")
        return ConditionalView(model, context)
    if isinstance(model, RaggedMaskedModel):
        return ConditionedSequences(model, context, cfg_scale=cfg)
    raise TypeError(f"context= needs a MaskedModel or a RaggedMaskedModel, got "
                    f"{type(model).__name__}.")
