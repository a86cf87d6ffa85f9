"""Loading Hugging Face masked LMs: by hub name or directory, AntiBERTy, offline mode.

:class:`~mptlml.models.masked_lm.MaskedLM` scores; this module finds and loads
the weights and the tokenizer it wraps (``MaskedLM.from_pretrained`` and
``MaskedLM.antiberty`` call :func:`load_pretrained` and :func:`load_antiberty`),
and says what the model is: a masked LM (:func:`check_masked_lm`) with a
length limit (:func:`max_input_length`).

Offline behaviour is Hugging Face's own: with ``HF_HUB_OFFLINE=1`` (or
``local_files_only=True``) nothing is downloaded and a hub id loads from the
local cache only. There is no network probe of our own.
"""

from __future__ import annotations

import contextlib
import os
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from .._optional import require
from .._validation import env_flag
from .conventions import convention_of

__all__ = ["DTYPES", "REMOTE_CODE_PIN", "check_masked_lm", "check_model_source",
           "check_remote_code_runs", "dtype_name", "hf_offline_mode", "hub_offline",
           "load_antiberty", "load_pretrained", "max_input_length", "position_limit",
           "resolve_dtype", "space_residues", "tokenizer_files"]

#: the transformers that remote code written before transformers 5 runs under (Dream pins
#: 4.46.2, LLaDA 4.49); the lower bound is the one CI tests
REMOTE_CODE_PIN = "transformers>=4.46.2,<5"

_AMINO_ACIDS = set("ACDEFGHIKLMNPQRSTVWY")

#: dtype names the loaders and the CLI accept.
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float16": torch.float16,
                                  "bfloat16": torch.bfloat16, "float64": torch.float64}
#: Files any transformers tokenizer is saved as (one of them is enough).
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json",
                    "merges.txt", "spiece.model", "sentencepiece.bpe.model",
                    "special_tokens_map.json", "tokenizer.model")
#: Loading options that concern the repository, so they reach the tokenizer too.
_SHARED_KWARGS = ("revision", "trust_remote_code", "local_files_only", "cache_dir", "token",
                  "force_download", "proxies")


def hub_offline() -> bool:
    """Whether Hugging Face's offline switch ``HF_HUB_OFFLINE`` is on.

    Reads the environment now (``huggingface_hub`` reads it once, at import) and
    ``huggingface_hub.constants.is_offline_mode()``.
    """
    if env_flag("HF_HUB_OFFLINE", False):
        return True
    try:
        from huggingface_hub.constants import is_offline_mode
    except ImportError:  # pragma: no cover - old huggingface_hub
        return False
    return bool(is_offline_mode())


@contextlib.contextmanager
def hf_offline_mode() -> Iterator[None]:
    """Hugging Face's offline switch, on for the duration of a block.

    ``HF_HUB_OFFLINE`` is read once, when ``huggingface_hub`` and ``datasets``
    are imported; this sets the constants they read (``huggingface_hub.constants``
    and ``datasets.config``) so that a cache-first lookup makes no network
    request, then restores them.
    """
    require("huggingface_hub", "Hugging Face's offline mode")
    import huggingface_hub.constants as hub_constants

    targets: list[Any] = [hub_constants]
    try:
        import datasets.config as ds_config

        targets.append(ds_config)
    except ImportError:  # pragma: no cover - datasets is a dependency
        pass
    old = [t.HF_HUB_OFFLINE for t in targets]
    try:
        for t in targets:
            t.HF_HUB_OFFLINE = True
        yield
    finally:
        for t, v in zip(targets, old, strict=True):
            t.HF_HUB_OFFLINE = v


def resolve_dtype(dtype: Any = None, torch_dtype: Any = None) -> torch.dtype | str | None:
    """One dtype from ``dtype`` or transformers' older ``torch_dtype`` (not both, unless equal).

    Accepts a ``torch.dtype``, a name of :data:`DTYPES` (``"bfloat16"``,
    ``"torch.float16"``) or ``"auto"`` (the checkpoint's dtype); None: unset.
    """
    if dtype is not None and torch_dtype is not None and dtype != torch_dtype:
        raise ValueError(f"dtype={dtype!r} and torch_dtype={torch_dtype!r} disagree; pass one "
                         "(torch_dtype is transformers' older name for dtype).")
    d = dtype if dtype is not None else torch_dtype
    if d is None or isinstance(d, torch.dtype):
        if isinstance(d, torch.dtype) and d not in DTYPES.values():
            raise ValueError(f"dtype {d} is not a floating dtype for a model; choose one of "
                             f"{sorted(DTYPES)}.")
        return d
    name = str(d).removeprefix("torch.")
    if name == "auto":
        return "auto"
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {d!r}; choose one of {sorted(DTYPES)} or 'auto'.")
    return DTYPES[name]


def dtype_name(dtype: Any) -> str | None:
    """``torch.bfloat16`` or ``"torch.bfloat16"`` -> ``"bfloat16"``; None stays None."""
    return None if dtype is None else str(dtype).removeprefix("torch.")


def _mapping_names(mapping: dict[str, Any]) -> set[str]:
    out: set[str] = set()
    for v in mapping.values():
        out.update(v if isinstance(v, list | tuple) else [v])
    return out


def check_masked_lm(model: Any, what: str) -> None:
    """Refuse a model that is not a masked LM (a causal LM, a decoder).

    A causal LM predicts each token from the tokens to its left only; given a
    [MASK] it returns next-token predictions, and its "masked conditionals"
    are not p(x_j | x_R). Refused: a model whose config says ``is_decoder``,
    or whose class transformers lists as a causal LM and not as a masked LM.
    Classes transformers does not list (custom models) are accepted.
    """
    require("transformers", "a Hugging Face masked LM")
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    name = type(model).__name__
    cfg = getattr(model, "config", None)
    causal = name in _mapping_names(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) and name not in (
        _mapping_names(MODEL_FOR_MASKED_LM_MAPPING_NAMES))
    if causal or bool(getattr(cfg, "is_decoder", False)):
        why = ("a causal LM" if causal else "configured as a decoder (config.is_decoder=True)")
        raise TypeError(
            f"{what} needs a masked language model, but {name} is {why}: it predicts each "
            "token from the tokens to its left only, so its outputs at masked positions are not "
            "the conditionals p(x_j | x_R) of a masked LM. Load a masked LM "
            "(transformers.AutoModelForMaskedLM: BERT, RoBERTa, DeBERTa, ModernBERT, ...).")


def position_limit(model: Any) -> int | None:
    """Longest input (special tokens included) the model's position embeddings allow.

    A learned position table ``embeddings.position_embeddings`` gives its size,
    less ``padding_idx + 1`` when positions start after the padding index
    (RoBERTa: 514 rows, 512 tokens); else ``config.max_position_embeddings``;
    None when the model states no limit.
    """
    from torch import nn

    base = getattr(model, getattr(model, "base_model_prefix", ""), model)
    emb = getattr(getattr(base, "embeddings", None), "position_embeddings", None)
    if isinstance(emb, nn.Embedding):
        pad = emb.padding_idx
        return int(emb.num_embeddings) - (0 if pad is None else int(pad) + 1)
    pmax = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if isinstance(pmax, int) and pmax > 0:
        return int(pmax)
    # a module of one's own: a learned position table by its name (pos, position_embedding, wpe)
    tables = [m.num_embeddings for name, m in model.named_modules()
              if isinstance(m, nn.Embedding) and re.search(
                  r"(^|[._])(pos|positions?|pos_emb\w*|position_emb\w*|wpe)$", name)]
    return int(min(tables)) if tables else None


def max_input_length(model: Any, tokenizer: Any) -> int:
    """Longest model input: the tokenizer's ``model_max_length``, at most the model's positions.

    A tokenizer that claims more than the model's position table
    (:func:`position_limit`) would crash inside the model on long inputs; the
    model's limit is used instead, with a warning. A tokenizer without a
    limit (transformers' 1e30 placeholder) takes the model's; 512 when
    neither states one.
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


def check_model_source(src: str, what: str = "model") -> None:
    """Refuse a path that names no directory, before any hub lookup blames the cache.

    ``src`` is taken for a path (not a hub id) when it exists, is absolute,
    starts with ``.`` or ``~``, or has more than one ``/``. A path must be a
    directory; a missing one is "no such directory", a file "not a directory".
    """
    p = Path(src).expanduser()
    looks_like_path = (p.is_absolute() or src.startswith((".", "~")) or src.count("/") > 1
                       or "\\" in src)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{what} {src!r} is a file, not a directory; pass the directory that "
                         "save_pretrained wrote (config.json, weights, tokenizer files).")
    if looks_like_path and not p.exists():
        parent = next((q for q in p.parents if q.exists()), None)
        raise ValueError(f"{what} {src!r}: no such directory"
                         + (f" ({parent} exists, {p.relative_to(parent)} does not)"
                            if parent is not None and parent != Path("/") else "")
                         + ". Pass the directory that save_pretrained wrote, or a hub id "
                         "such as 'bert-base-uncased'.")


def tokenizer_files(directory: str | os.PathLike) -> list[str]:
    """Tokenizer files present in a model directory (empty: the model was saved alone)."""
    return sorted(f for f in _TOKENIZER_FILES if (Path(directory) / f).is_file())


def space_residues(seq: str) -> str:
    """AntiBERTy input: upper-case residues separated by single spaces."""
    s = re.sub(r"\s+", "", str(seq)).upper()
    bad = sorted(set(s) - _AMINO_ACIDS)
    if bad:
        raise ValueError(
            f"antibody sequence contains non-amino-acid characters {bad}; pass sequences "
            "of the 20 standard one-letter residues (e.g. 'EVQLVESGG...')."
        )
    return " ".join(s)


def _load_tokenizer(src: str, tokenizer: Any, shared: dict[str, Any]) -> Any:
    require("transformers", "a Hugging Face masked LM")
    from transformers import AutoTokenizer

    if tokenizer is not None and not isinstance(tokenizer, str | os.PathLike):
        return tokenizer  # a tokenizer object
    if tokenizer is None and Path(src).is_dir() and not tokenizer_files(src):
        raise ValueError(
            f"no tokenizer files in {src} (it holds a model saved without its tokenizer); pass "
            "tokenizer=... (a tokenizer object, or the name/directory of the tokenizer it was "
            "trained with; CLI: --tokenizer)."
        )
    return AutoTokenizer.from_pretrained(str(tokenizer if tokenizer is not None else src),
                                         **shared)


def _major(version: Any) -> int | None:
    """The major number of a version string ("4.46.2" -> 4), None when there is none."""
    m = re.match(r"\s*(\d+)\.", str(version)) if version is not None else None
    return int(m.group(1)) if m else None


def _predates_installed(model_or_config: Any) -> tuple[bool, str]:
    """Whether a checkpoint's own code was written for a transformers major below the one here.

    True for remote code (``auto_map``, or a class from ``transformers_modules``) saved with
    transformers < 5 (or with no version stated) while transformers >= 5 is installed.
    Returns it and the version the checkpoint was saved with.
    """
    require("transformers", "a Hugging Face masked LM")
    import transformers

    cfg = getattr(model_or_config, "config", model_or_config)
    remote = bool(getattr(cfg, "auto_map", None)) or type(model_or_config).__module__.startswith(
        "transformers_modules")
    saved = getattr(cfg, "transformers_version", None)
    here = _major(transformers.__version__)
    old = _major(saved)
    return (remote and here is not None and here >= 5 and (old is None or old < 5),
            str(saved or "an unstated version"))


def _old_remote_code_error(src: str, saved: str, exc: BaseException) -> RuntimeError:
    require("transformers", "a Hugging Face masked LM")
    import transformers

    first = str(exc).splitlines()[0] if str(exc) else ""
    return RuntimeError(
        f"{src!r}: this checkpoint's remote code was written for transformers < 5 (saved with "
        f"{saved}; LLaDA pins 4.49, Dream 4.46.2) and fails under transformers "
        f"{transformers.__version__} ({type(exc).__name__}: {first}). Install the "
        f"transformers it was written for beside mptlml: pip install '{REMOTE_CODE_PIN}'.")


def check_remote_code_runs(model: Any, src: str) -> None:
    """A one-forward probe of remote code older than the transformers installed.

    Code written before transformers 5 may load under it and fail only when called
    (LLaDA's config loses ``use_cache``): a two-token forward pass here turns that into
    the message naming the pin (:data:`REMOTE_CODE_PIN`) before any scoring. Nothing is
    run for other models.
    """
    old, saved = _predates_installed(model)
    if not old:
        return
    param = next(iter(model.parameters()), None)
    dev = param.device if param is not None else torch.device("cpu")
    try:
        with torch.inference_mode():
            model(input_ids=torch.zeros(1, 2, dtype=torch.long, device=dev))
    except Exception as exc:  # noqa: BLE001 - any failure of its code is the old code's
        raise _old_remote_code_error(src, saved, exc) from exc


class _Refused(ValueError):
    """A loadable checkpoint refused by a check (re-raised as it is, not as a cache miss)."""


class _NotMaskedLM(_Refused):
    """A loadable checkpoint that is no masked LM."""


def _has_masked_lm_class(config: Any) -> bool:
    require("transformers", "a Hugging Face masked LM")
    from transformers import MODEL_FOR_MASKED_LM_MAPPING

    return type(config) in MODEL_FOR_MASKED_LM_MAPPING or "AutoModelForMaskedLM" in (
        getattr(config, "auto_map", None) or {})


def _check_masked_lm_config(config: Any, src: str) -> None:
    """Refuse a checkpoint whose config has no masked-LM class, naming its architecture."""
    if _has_masked_lm_class(config):
        return
    arch = ", ".join(getattr(config, "architectures", None) or []) or type(config).__name__
    raise _NotMaskedLM(
        f"{src!r} is not a masked language model: its checkpoint is {arch} (model type "
        f"{config.model_type!r}), which has no masked-LM head in transformers "
        "(AutoModelForMaskedLM). MPT scores and trains masked LMs (BERT, RoBERTa, DeBERTa, "
        "ModernBERT, ...); a causal LM predicts tokens from their left context only. A "
        "masked-diffusion LM loaded through AutoModel (LLaDA, Dream, ...) needs "
        "mask_token_id= (and usually trust_remote_code=True).")


def _old_code_guard(src: str, config: Any, build: Any) -> Any:
    """``build()``, its failure re-raised with the pin when the checkpoint's code is older."""
    try:
        return build()
    except OSError:  # a missing file: the caller's message
        raise
    except Exception as exc:  # noqa: BLE001 - transformers' internals, named for the user
        old, saved = _predates_installed(config)
        if old:
            raise _old_remote_code_error(src, saved, exc) from exc
        raise


def load_pretrained(name_or_dir: str | os.PathLike, *, tokenizer: Any = None,
                    random_init: bool = False, init_seed: int = 0, dtype: Any = None,
                    tokenizer_kwargs: dict[str, Any] | None = None,
                    any_module: bool = False, check_config: Any = None,
                    **hf_kwargs: Any) -> tuple[Any, Any, str]:
    """A masked LM, its tokenizer and a label, by hub name or local directory.

    Parameters
    ----------
    name_or_dir : str or path
        A Hugging Face model id (the hub, or its local cache offline) or a
        directory holding ``config.json`` and weights (and usually tokenizer files).
    tokenizer : tokenizer, str or path, optional
        A tokenizer object, or a name/directory for ``AutoTokenizer``; needed
        when ``name_or_dir`` is a directory without tokenizer files.
    random_init : bool
        Keep the architecture and tokenizer but initialise the weights at
        random (``AutoModelForMaskedLM.from_config``), seeded by ``init_seed``.
    dtype : torch.dtype or str, optional
        Parameter dtype (``torch_dtype=`` is accepted too); None: transformers'
        default (on transformers 5 the checkpoint's own dtype, ``"auto"``).
    tokenizer_kwargs : dict, optional
        Extra keyword arguments of ``AutoTokenizer.from_pretrained`` only.
    any_module : bool
        Accept a checkpoint without a masked-LM class (a masked-diffusion LM such
        as LLaDA): it is loaded with ``AutoModel`` (its own code with
        ``trust_remote_code=True``) and must return logits. The caller then
        names the mask id.
    check_config : callable, optional
        Called with the checkpoint's config before any weights are loaded (a family named
        by the caller checked against it); raises to refuse.
    **hf_kwargs
        Everything ``AutoModelForMaskedLM.from_pretrained`` accepts (``revision``,
        ``trust_remote_code``, ``device_map``, ``attn_implementation``,
        ``local_files_only``, ``cache_dir``, ``token``, ...). The repository
        options among them (revision, trust_remote_code, local_files_only,
        cache_dir, token, ...) reach ``AutoTokenizer.from_pretrained`` too.
        With ``HF_HUB_OFFLINE=1`` ``local_files_only=True`` is implied.

    Returns
    -------
    (model, tokenizer, label)
    """
    require("transformers", "a Hugging Face masked LM")
    from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM

    src = str(name_or_dir)
    check_model_source(src, "masked LM")
    if isinstance(tokenizer, str | os.PathLike):
        check_model_source(str(tokenizer), "tokenizer")
    dt = resolve_dtype(dtype, hf_kwargs.pop("torch_dtype", None))
    offline = hub_offline()
    if offline:
        hf_kwargs.setdefault("local_files_only", True)
    shared = {k: hf_kwargs[k] for k in _SHARED_KWARGS if k in hf_kwargs}
    try:
        tok = _load_tokenizer(src, tokenizer, {**shared, **(tokenizer_kwargs or {})})
        config = AutoConfig.from_pretrained(src, **shared)
        if check_config is not None:
            try:
                check_config(config)
            except ValueError as exc:  # the caller's refusal, re-raised as it is
                raise _Refused(str(exc)) from exc
        auto = AutoModelForMaskedLM
        conv = convention_of(config)  # a known masked-diffusion family loads as any module
        if not any_module and not (conv is not None and conv.any_module):
            _check_masked_lm_config(config, src)
        elif not _has_masked_lm_class(config):
            auto = AutoModel
        if random_init:
            extra = sorted(set(hf_kwargs) - set(_SHARED_KWARGS) - {"attn_implementation"})
            if extra:
                raise TypeError(f"{extra} do not apply with random_init=True (no weights are "
                                "loaded); pass them without random_init.")
            init_kw = {k: hf_kwargs[k] for k in ("trust_remote_code", "attn_implementation")
                       if k in hf_kwargs}
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(init_seed)
                model = _old_code_guard(src, config, lambda: auto.from_config(config,
                                                                               **init_kw))
            if isinstance(dt, torch.dtype):
                model = model.to(dt)
        else:
            if dt is not None:
                hf_kwargs["dtype"] = dt
            model = _old_code_guard(src, config, lambda: auto.from_pretrained(src, **hf_kwargs))
    except (OSError, ValueError) as exc:
        if str(exc).startswith("no tokenizer files") or isinstance(exc, _Refused):
            raise
        where = ("offline (HF_HUB_OFFLINE or local_files_only) and it is not in the local "
                 "Hugging Face cache" if offline or hf_kwargs.get("local_files_only") else
                 "it is neither a local directory nor a loadable hub model (or the hub is not "
                 "reachable; offline, set HF_HUB_OFFLINE=1)")
        raise ValueError(
            f"could not load masked LM {src!r}: {where} ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}). To use a local model, pass "
            "the path of a directory saved with model.save_pretrained(DIR) and "
            "tokenizer.save_pretrained(DIR) (config.json, weights, tokenizer files)."
        ) from exc
    return model, tok, src + (" (random init)" if random_init else "")


def load_antiberty(*, random_init: bool = False, init_seed: int = 0) -> tuple[Any, Any, str]:
    """AntiBERTy (``antiberty==0.1.3``): model, tokenizer and label, offline.

    8 layers, hidden size 512, vocabulary of 25 (20 residues + 5 specials).
    Its inputs are spaced residues (:func:`space_residues`).
    """
    try:
        import antiberty
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "MaskedLM.antiberty() needs the antiberty package: "
            "pip install 'mptlml[antibody]' (antiberty==0.1.3)."
        ) from exc
    require("transformers", "MaskedLM.antiberty()")
    from transformers import BertConfig, BertForMaskedLM, BertTokenizer
    from transformers.utils import logging as hf_logging

    root = Path(antiberty.__file__).parent / "trained_models"
    tokenizer = BertTokenizer(str(root / "vocab.txt"), do_lower_case=False)
    if len(tokenizer) != 25:
        raise RuntimeError(
            f"AntiBERTy tokenizer has {len(tokenizer)} tokens, expected 25; the vocabulary "
            f"file {root / 'vocab.txt'} was not read."
        )
    mdir = root / "AntiBERTy_md_smooth"
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        if random_init:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(init_seed)
                model = BertForMaskedLM(BertConfig.from_pretrained(mdir))
        else:
            model, info = BertForMaskedLM.from_pretrained(mdir, output_loading_info=True)
            if info.get("missing_keys"):
                raise RuntimeError(f"AntiBERTy weights miss keys {info['missing_keys']}.")
    finally:
        hf_logging.set_verbosity(verbosity)
    return model, tokenizer, "AntiBERTy" + (" (random init)" if random_init else "")
