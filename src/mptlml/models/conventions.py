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

A family is found from ``config.model_type`` (:func:`convention_of`) or named
(``MaskedLM(..., family="dream")``); the user's own ``mask_token_id=`` and
``shift_logits=`` win over the family's. An unknown model type is BERT-style.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["CONVENTIONS", "FRAMES", "Convention", "convention_of", "conventions_table",
           "family_conflict", "get_convention", "ordinary_token"]

#: how the special tokens around the content are chosen
FRAMES = ("tokenizer", "bos_eos")


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
    frame : {"tokenizer", "bos_eos"}
        The special tokens around the content (module docstring).
    source : str
        Where the convention is taken from.
    """

    name: str
    model_types: tuple[str, ...]
    mask_token: int | str | None
    shift_logits: bool
    frame: str
    source: str

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
}


def get_convention(family: str) -> Convention:
    """The convention of a family by its key (``"llada"``, ``"dream"``, ...)."""
    if not isinstance(family, str) or family.lower() not in CONVENTIONS:
        raise ValueError(f"unknown family {family!r}; known: {sorted(CONVENTIONS)} (or leave "
                         "family=None to read it from config.model_type).")
    return CONVENTIONS[family.lower()]


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
