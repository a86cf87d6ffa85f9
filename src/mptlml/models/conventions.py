"""Model families as conventions: what a masked LM's own evaluation does around its logits.

Masked-diffusion LMs and masked LMs differ in a few conventions, not in what is scored.
Each is data here, read by :class:`~mptlml.models.masked_lm.MaskedLM`:

- **the mask id**: the tokenizer's mask token, or a plain vocabulary entry (LLaDA's
  126336, SMDM's 32000), or the last id of the vocabulary (MDLM's);
- **shifted logits**: a head adapted from an autoregressive model (Dream) predicts token i
  from the hidden state at i - 1; its evaluation moves the logits one place right
  (``logits = cat([logits[:, :1], logits[:, :-1]], dim=1)``), so the log-probability of a
  masked position i is read at i - 1 (which must exist: a BOS or a context before it);
- **the frame**: the special tokens around the content, never masked and never scored:
  the tokenizer's own (``"tokenizer"``: [CLS] ... [SEP] for BERT, LLaDA's BOS), or a BOS
  prepended and an EOS appended to the continuation (``"bos_eos"``: Dream's evaluation
  adapter does both, and never masks either). Classifier-free guidance masks the frame's
  leading tokens with the prompt (LLaDA's and Dream's prompts include their BOS).
- **the blocks** (block-diffusion LMs: BD3-LM, SDAR, LLaDA2.x, Fast-dLLM v2): a block size
  B and an input layout. The model factorises left to right over blocks of B input
  positions (counted from the input's first position, the BOS included) and is a masked
  diffusion model within each; its attention is block-causal. ``"xt_x0"`` (BD3-LM's
  training layout): the input is the noised copy x_t followed by the clean copy x_0, each
  padded to the same length, and one forward of length 2L scores every block's noised copy
  against the clean earlier blocks; ``"prefix"``: the input is the clean earlier blocks
  and the noised block, cut at the block's end (one forward per block).

A family is found from ``config.model_type`` (:func:`convention_of`) or named
(``MaskedLM(..., family="dream")``); the user's own ``mask_token_id=`` and
``shift_logits=`` win over the family's. An unknown model type is BERT-style.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["CONVENTIONS", "FRAMES", "LAYOUTS", "Convention", "block_conventions_table",
           "convention_of", "conventions_table", "family_conflict", "get_convention",
           "ordinary_token"]

#: how the special tokens around the content are chosen
FRAMES = ("tokenizer", "bos_eos", "bos")
#: how a block-diffusion LM takes a masked input (module docstring)
LAYOUTS = ("xt_x0", "prefix")


@dataclass(frozen=True)
class Convention:
    """What one family's evaluation does around its logits.

    Attributes
    ----------
    name : str
        The family, as the table shows it.
    model_types : tuple of str
        ``config.model_type`` values that select it.
    mask_token : int, "tokenizer", "last" or None
        The mask id: a vocabulary entry; the tokenizer's mask token read as a plain id
        (a model without a masked-LM class); the vocabulary's last id; None: a Hugging
        Face masked LM with its tokenizer's mask token (checked as a masked LM).
    shift_logits : bool
        The head predicts position i from the hidden state at i - 1.
    frame : {"tokenizer", "bos_eos", "bos"}
        The special tokens around the content (module docstring); ``"bos"``: the
        tokenizer's BOS prepended, never masked, nothing appended (a block model's EOS
        after the content would sit in its last block, visible to it).
    source : str
        Where the convention is taken from.
    block_size : int, "config" or None
        A block-diffusion LM's block size B: a number, or ``"config"`` (read from the
        config's ``block_size``, as BD3-LM's checkpoints state it); None: full attention.
    layout : {"xt_x0", "prefix"} or None
        A block model's input layout (module docstring).
    subs : bool
        The mask token gets probability 0: its logit is -inf before the softmax (BD3-LM's
        SUBS parameterisation).
    """

    name: str
    model_types: tuple[str, ...]
    mask_token: int | str | None
    shift_logits: bool
    frame: str
    source: str
    block_size: int | str | None = None
    layout: str | None = None
    subs: bool = False

    @property
    def is_block(self) -> bool:
        """Whether the family is block-causal (a block-diffusion LM)."""
        return self.block_size is not None

    def block_size_of(self, config: Any) -> int | None:
        """The block size B of a model of this family (None: full attention)."""
        if self.block_size is None:
            return None
        if self.block_size == "config":
            b = getattr(config, "block_size", None)
            if not isinstance(b, int) or b < 1:
                raise ValueError(f"{self.name} states its block size in its config "
                                 f"(block_size), but this model's config has {b!r}; pass "
                                 "block_size=.")
            return int(b)
        return int(self.block_size)

    def mask_id(self, vocab_size: int | None) -> int | None:
        """The mask id this family sets (None: the tokenizer's, as for any masked LM)."""
        if self.mask_token is None or self.mask_token == "tokenizer":
            return None
        if self.mask_token == "last":
            if vocab_size is None:
                raise ValueError(f"{self.name}'s mask id is the last vocabulary id, but the "
                                 "model states no vocab_size; pass mask_token_id=.")
            return int(vocab_size) - 1
        return int(self.mask_token)

    @property
    def any_module(self) -> bool:
        """Whether the family is scored as a plain module (not a Hugging Face masked LM)."""
        return self.mask_token is not None


#: the known families, by the key ``MaskedLM(..., family=)`` takes
CONVENTIONS: dict[str, Convention] = {
    "llada": Convention("LLaDA", ("llada",), 126336, False, "tokenizer",
                        "LLaDA's evaluation (eval_llada.py): the prompt's tokens, BOS "
                        "included, are never masked"),
    "dream": Convention("Dream", ("Dream", "dream"), "tokenizer", True, "bos_eos",
                        "Dream's evaluation adapter: BOS before the context, EOS after the "
                        "continuation, neither masked; logits shifted one place right"),
    "mdlm": Convention("MDLM-style", ("mdlm",), "last", False, "bos_eos",
                       "MDLM: the mask is the vocabulary's last id; texts wrapped in "
                       "BOS/EOS"),
    "smdm": Convention("SMDM-style", (), 32000, False, "tokenizer",
                       "SMDM: mask id 32000 after the TinyLlama vocabulary"),
    "bert": Convention("BERT-style", (), None, False, "tokenizer",
                       "any AutoModelForMaskedLM: the tokenizer's [MASK] and frame"),
    "bd3lm": Convention("BD3-LM", ("bd3lm",), "last", False, "bos",
                        "kuleshov-group/bd3lms (models/hf/modeling_bd3lm.py, diffusion.py): "
                        "mask id the last vocabulary entry, BOS never masked, blocks of "
                        "config.block_size, x_t + x_0 in one forward of 2 * model_length "
                        "with the block-diffusion attention mask, SUBS (mask logit -inf)",
                        block_size="config", layout="xt_x0", subs=True),
    "sdar": Convention("SDAR", ("sdar",), 151669, False, "tokenizer",
                       "JetAstra SDAR / TraDo: blocks of 4, mask id 151669 (<|MASK|>), "
                       "block-causal attention over the clean prefix",
                       block_size=4, layout="prefix"),
    "llada2": Convention("LLaDA2.x", ("llada2_moe", "llada2"), 156895, False, "tokenizer",
                         "inclusionAI LLaDA2.0-2.2 (MoE): blocks of 32, mask id 156895, "
                         "block-causal attention over the clean prefix",
                         block_size=32, layout="prefix"),
    "fast_dllm_v2": Convention("Fast-dLLM v2", ("Fast_dLLM_Qwen", "fast_dllm_v2"), "tokenizer",
                               False, "tokenizer",
                               "NVlabs Fast-dLLM v2 (Qwen2.5 adapted to blocks): blocks of "
                               "32 (bd_size), the tokenizer's mask token, block-causal "
                               "attention over the clean prefix",
                               block_size=32, layout="prefix"),
}


def get_convention(family: str) -> Convention:
    """The convention of a family by its key (``"llada"``, ``"dream"``, ...)."""
    if not isinstance(family, str) or family.lower() not in CONVENTIONS:
        raise ValueError(f"unknown family {family!r}; known: {sorted(CONVENTIONS)} (or leave "
                         "family=None to read it from config.model_type).")
    return CONVENTIONS[family.lower()]


def block_conventions_table() -> str:
    """The table of block-diffusion families as Markdown (the block-model guide shows it)."""
    rows = ["| family | `family=` | `config.model_type` | block size | mask id | layout | "
            "SUBS |", "|---|---|---|---|---|---|---|"]
    for key, c in CONVENTIONS.items():
        if not c.is_block:
            continue
        mask = {"tokenizer": "the tokenizer's mask token",
                "last": "the last vocabulary id"}.get(c.mask_token,  # type: ignore[arg-type]
                                                      str(c.mask_token))
        size = "`config.block_size`" if c.block_size == "config" else str(c.block_size)
        layout = ("x_t + x_0, one forward of 2L for every block" if c.layout == "xt_x0"
                  else "clean prefix + noised block, one forward per block")
        types = ", ".join(f"`{t}`" for t in c.model_types)
        rows.append(f"| {c.name} | `{key}` | {types} | {size} | {mask} | {layout} | "
                    f"{'yes' if c.subs else 'no'} |")
    return "\n".join(rows)


def convention_of(config: Any) -> Convention | None:
    """The family of a model's config by its ``model_type``; None when not a known one."""
    mt = getattr(config, "model_type", None)
    if not isinstance(mt, str):
        return None
    return next((c for c in CONVENTIONS.values() if mt in c.model_types), None)


def family_conflict(conv: Convention, config: Any, *, masked_lm: bool) -> str | None:
    """What a model's config says that contradicts a named family (None: nothing).

    Generic over the rows of :data:`CONVENTIONS`: the config's ``model_type`` selects
    another family; or it is not among the family's own ``model_types`` (a family that
    lists some); or it is a transformers masked LM (``masked_lm``: it has its own mask
    token and head) while the family is scored as a plain module with its own mask id.
    A config without a ``model_type`` (a plain module) contradicts nothing.

    Parameters
    ----------
    conv : Convention
        The family the user named.
    config : object or None
        The model's config.
    masked_lm : bool
        Whether the config has a masked-LM class in transformers.
    """
    mt = getattr(config, "model_type", None)
    if not isinstance(mt, str) or not mt:
        return None
    found = convention_of(config)
    if found is not None and found is not conv:
        return f"config.model_type is {mt!r}, the {found.name} family's"
    if found is None and conv.model_types:
        return (f"config.model_type is {mt!r}, not the {conv.name} family's "
                f"({', '.join(repr(t) for t in conv.model_types)})")
    if found is None and masked_lm and conv.any_module:
        return (f"config.model_type is {mt!r}, a transformers masked LM with its own mask "
                "token, which the family's mask id replaces")
    return None


def ordinary_token(tokenizer: Any, token_id: int) -> str | None:
    """The token a tokenizer reads ``token_id`` as, when it is an ordinary one (else None).

    Ordinary: inside the tokenizer's vocabulary and neither one of its special ids nor an
    added token marked special (LLaDA's ``<|mdm_mask|>``). An id past the tokenizer (a
    masked-diffusion LM's extra logits) is not a token of it.
    """
    if tokenizer is None:
        return None
    try:
        size = len(tokenizer)
    except TypeError:
        return None
    if not 0 <= token_id < size or token_id in set(getattr(tokenizer, "all_special_ids", [])):
        return None
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    if token_id in added and getattr(added[token_id], "special", False):
        return None
    convert = getattr(tokenizer, "convert_ids_to_tokens", None)
    token = convert(token_id) if callable(convert) else None
    return str(token) if token is not None else f"id {token_id}"


def conventions_table() -> str:
    """The table of known families as Markdown (the masked-LM guide shows it)."""
    rows = ["| family | `family=` | found from `config.model_type` | mask id | "
            "shifted logits | BOS | EOS after the continuation |",
            "|---|---|---|---|---|---|---|"]
    for key, c in CONVENTIONS.items():
        if c.is_block:  # block_conventions_table
            continue
        mask = {None: "the tokenizer's [MASK]", "tokenizer": "the tokenizer's mask token",
                "last": "the last vocabulary id"}.get(c.mask_token,  # type: ignore[arg-type]
                                                      str(c.mask_token))
        types = ", ".join(f"`{t}`" for t in c.model_types) or "-"
        bos = ("prepended, never masked" if c.frame == "bos_eos"
               else "the tokenizer's frame, never masked")
        eos = "appended, never masked" if c.frame == "bos_eos" else "the tokenizer's frame"
        rows.append(f"| {c.name} | `{key}` | {types} | {mask} | "
                    f"{'yes' if c.shift_logits else 'no'} | {bos} | {eos} |")
    return "\n".join(rows)
