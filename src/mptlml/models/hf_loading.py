"""Loading Hugging Face masked LMs: by hub name or directory, AntiBERTy, hub probing.

:class:`~mptlml.models.masked_lm.MaskedLM` scores; this module finds and loads
the weights and the tokenizer it wraps (``MaskedLM.from_pretrained`` and
``MaskedLM.antiberty`` call :func:`load_pretrained` and :func:`load_antiberty`).
Nothing here downloads unless the hub is reachable and the model is not cached.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Any

import torch

__all__ = ["hub_reachable", "load_antiberty", "load_pretrained", "space_residues"]

_AMINO_ACIDS = set("ACDEFGHIKLMNPQRSTVWY")


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers (False when ``HF_HUB_OFFLINE`` is set)."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    host = os.environ.get("HF_ENDPOINT", "https://huggingface.co").split("://")[-1].split("/")[0]
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


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


def load_pretrained(name_or_dir: str | os.PathLike, *, random_init: bool = False,
                    init_seed: int = 0) -> tuple[Any, Any, str]:
    """A masked LM, its tokenizer and a label, by hub name or local directory.

    Parameters
    ----------
    name_or_dir : str or path
        A Hugging Face model id (needs the hub or its local cache) or a
        directory holding ``config.json``, weights and tokenizer files.
    random_init : bool
        Keep the architecture and tokenizer but initialise the weights at
        random (``AutoModelForMaskedLM.from_config``), seeded by ``init_seed``.

    Returns
    -------
    (model, tokenizer, label)
    """
    from transformers import AutoConfig, AutoModelForMaskedLM, AutoTokenizer

    src = str(name_or_dir)
    local = Path(src).is_dir()
    offline = not local and not hub_reachable()
    load_kw = {"local_files_only": True} if offline else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(src, **load_kw)
        if random_init:
            config = AutoConfig.from_pretrained(src, **load_kw)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(init_seed)
                model = AutoModelForMaskedLM.from_config(config)
        else:
            model = AutoModelForMaskedLM.from_pretrained(src, **load_kw)
    except (OSError, ValueError) as exc:
        where = ("the Hugging Face hub is not reachable and it is not in the local cache"
                 if offline else "it is neither a local directory nor a loadable hub model")
        raise ValueError(
            f"could not load masked LM {src!r}: {where} ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}). To use a local model, pass "
            "the path of a directory saved with model.save_pretrained(DIR) and "
            "tokenizer.save_pretrained(DIR) (config.json, weights, tokenizer files)."
        ) from exc
    return model, tokenizer, src + (" (random init)" if random_init else "")


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
