"""Loading Hugging Face masked LMs: by hub name or directory, AntiBERTy, offline mode.

:class:`~mptlml.models.masked_lm.MaskedLM` scores; this module finds and loads
the weights and the tokenizer it wraps (``MaskedLM.from_pretrained`` and
``MaskedLM.antiberty`` call :func:`load_pretrained` and :func:`load_antiberty`).

Offline behaviour is Hugging Face's own: with ``HF_HUB_OFFLINE=1`` (or
``local_files_only=True``) nothing is downloaded and a hub id loads from the
local cache only. There is no network probe of our own.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

__all__ = ["DTYPES", "PretrainedLoaders", "hf_offline_mode", "hub_offline",
           "dtype_name", "load_antiberty", "load_pretrained", "resolve_dtype", "space_residues",
           "tokenizer_files"]

_AMINO_ACIDS = set("ACDEFGHIKLMNPQRSTVWY")
_TRUE = ("1", "on", "true", "yes")

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
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE:
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


def load_pretrained(name_or_dir: str | os.PathLike, *, tokenizer: Any = None,
                    random_init: bool = False, init_seed: int = 0, dtype: Any = None,
                    tokenizer_kwargs: dict[str, Any] | None = None,
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
    from transformers import AutoConfig, AutoModelForMaskedLM

    src = str(name_or_dir)
    dt = resolve_dtype(dtype, hf_kwargs.pop("torch_dtype", None))
    offline = hub_offline()
    if offline:
        hf_kwargs.setdefault("local_files_only", True)
    shared = {k: hf_kwargs[k] for k in _SHARED_KWARGS if k in hf_kwargs}
    try:
        tok = _load_tokenizer(src, tokenizer, {**shared, **(tokenizer_kwargs or {})})
        if random_init:
            extra = sorted(set(hf_kwargs) - set(_SHARED_KWARGS) - {"attn_implementation"})
            if extra:
                raise TypeError(f"{extra} do not apply with random_init=True (no weights are "
                                "loaded); pass them without random_init.")
            config = AutoConfig.from_pretrained(src, **shared)
            init_kw = {k: hf_kwargs[k] for k in ("trust_remote_code", "attn_implementation")
                       if k in hf_kwargs}
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(init_seed)
                model = AutoModelForMaskedLM.from_config(config, **init_kw)
            if isinstance(dt, torch.dtype):
                model = model.to(dt)
        else:
            if dt is not None:
                hf_kwargs["dtype"] = dt
            model = AutoModelForMaskedLM.from_pretrained(src, **hf_kwargs)
    except (OSError, ValueError) as exc:
        if str(exc).startswith("no tokenizer files"):
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


class PretrainedLoaders:
    """The constructors of :class:`~mptlml.models.masked_lm.MaskedLM` that load weights.

    A mixin: ``cls`` is ``MaskedLM`` (or a subclass) and gets the loaded
    model and tokenizer; both return it on ``device`` when one is given.
    """

    @classmethod
    def from_pretrained(cls, name_or_dir: str | os.PathLike, *, tokenizer: Any = None,
                        device: str | torch.device | None = None, dtype: Any = None,
                        random_init: bool = False, init_seed: int = 0,
                        corruption: str = "mask", truncate: bool = False,
                        preprocess: Callable[[str], str] | None = None, name: str | None = None,
                        allow_unknown: bool = False, autocast: bool | str | None = None,
                        **hf_kwargs: Any) -> Any:
        """Load a masked LM and its tokenizer by hub name or local directory.

        Parameters
        ----------
        name_or_dir : str or path
            A hub id (the hub, or its cache offline) or a ``save_pretrained`` directory.
        tokenizer : tokenizer, str or path, optional
            A tokenizer object or the name/directory to load one from; required
            for a directory saved without tokenizer files (AntiBERTy's layout).
        device : str or torch.device, optional
            Where to put the model (``"cuda:1"``, ``"cpu"``); not with ``device_map``.
        dtype : torch.dtype or str, optional
            Parameter dtype (``torch_dtype=`` is accepted too; ``"auto"``: the
            checkpoint's). None: transformers' default.
        random_init, init_seed : bool, int
            Random weights of the same config, seeded.
        corruption, truncate, preprocess, name, allow_unknown, autocast
            As for :class:`MaskedLM`.
        **hf_kwargs
            Everything else goes to ``AutoModelForMaskedLM.from_pretrained``
            (``revision``, ``trust_remote_code``, ``device_map``,
            ``attn_implementation``, ``local_files_only``, ``cache_dir``, ...; the
            repository options reach ``AutoTokenizer.from_pretrained`` too); see
            :func:`mptlml.models.hf_loading.load_pretrained`.
        """
        if device is not None and hf_kwargs.get("device_map") is not None:
            raise ValueError("pass device= or device_map=, not both (device_map places the "
                             "model itself).")
        model, tok, label = load_pretrained(name_or_dir, tokenizer=tokenizer, dtype=dtype,
                                            random_init=random_init, init_seed=init_seed,
                                            **hf_kwargs)
        lm = cls(model, tok, corruption=corruption, truncate=truncate, preprocess=preprocess,
                 name=name or label, allow_unknown=allow_unknown, autocast=autocast)
        return lm.to(device) if device is not None else lm

    @classmethod
    def antiberty(cls, *, random_init: bool = False, init_seed: int = 0,
                  device: str | torch.device | None = None, dtype: Any = None,
                  **kwargs: Any) -> Any:
        """AntiBERTy (``antiberty==0.1.3``): an offline, pre-trained antibody BERT.

        8 layers, hidden size 512, vocabulary of 25 (20 residues + 5 specials).
        Inputs are amino-acid strings; residues are spaced automatically
        (unspaced residues would tokenize to a single [UNK]). ``device`` and
        ``dtype`` place the model; ``**kwargs`` go to :class:`MaskedLM`.
        """
        model, tokenizer, label = load_antiberty(random_init=random_init, init_seed=init_seed)
        dt = resolve_dtype(dtype, kwargs.pop("torch_dtype", None))
        if isinstance(dt, torch.dtype):
            model = model.to(dt)
        lm = cls(model, tokenizer, preprocess=space_residues,
                 name=kwargs.pop("name", label), **kwargs)
        return lm.to(device) if device is not None else lm
