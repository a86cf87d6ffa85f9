"""Data, tokenizer, models and exact references of ``reproduce mlm-training``.

scikit-learn's 8x8 digits as 64-token sequences over a pixel vocabulary:

- ``levels=2``: binarised exactly as ``load_images("digits")`` (threshold
  0.5 of the [0, 1] intensities), two pixel tokens "0" and "1";
- ``levels=17``: the raw grey levels 0..16 of scikit-learn's digits
  (``load_images("digits", binarized=False)`` times 16), 17 pixel tokens.

Exact references on the same held-out images: independent pixels (a
categorical per pixel, fitted by counting on the training images) and, for
binary pixels, the Bernoulli latent linear model (K <= 2) whose LML is exact
by quadrature (:class:`mptlml.models.BernoulliLVM`), fitted by maximum
likelihood on the same training images.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._optional import require
from ..data.images import load_images
from ..hf.orders import sample_random_order
from ..models import BernoulliLVM, MaskedLM

__all__ = ["LEVELS", "NUM_PIXELS", "collator", "new_model", "pixel_ids", "references",
           "samples", "split", "tokenizer"]

#: pixel values the experiment knows: binarised digits, or scikit-learn's 17 grey levels
LEVELS = (2, 17)
#: D, tokens per sequence (8 x 8 pixels)
NUM_PIXELS = 64
_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_PROB_FLOOR = 1e-3  # smallest probability of a pixel value in the independent-pixel reference


def _pixel_tokens(levels: int) -> list[str]:
    return [str(v) for v in range(levels)]


def tokenizer(levels: int) -> Any:
    """A WordPiece tokenizer over BERT's specials and the ``levels`` pixel values."""
    require("transformers", "reproduce mlm-training")
    from transformers import BertTokenizerFast

    vocab = _SPECIALS + _pixel_tokens(levels)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "vocab.txt"
        path.write_text("\n".join(vocab) + "\n")
        tok = BertTokenizerFast(str(path), do_lower_case=False)
    if len(tok) != len(vocab):
        raise RuntimeError(f"pixel tokenizer has {len(tok)} tokens, expected {len(vocab)}.")
    return tok


def split(levels: int, num_test: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Training and held-out images, ``(N, 64)`` integer pixel values in 0..levels-1."""
    if levels == 2:
        x = load_images("digits")  # (1797, 64) in {0, 1}, threshold 0.5
    elif levels == 17:
        x = (load_images("digits", binarized=False) * 16).round()
    else:
        raise ValueError(f"levels must be one of {LEVELS}, got {levels!r}.")
    perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed))
    x = x.long()
    return x[perm[num_test:]], x[perm[:num_test]]


def pixel_ids(x: torch.Tensor, tok: Any, levels: int) -> torch.Tensor:
    """Pixel values 0..levels-1 -> content token ids of "0", "1", ..."""
    ids = torch.tensor(tok.convert_tokens_to_ids(_pixel_tokens(levels)), dtype=torch.long)
    return ids[x.long()]


def new_model(cfg: Any, seed: int, vocab_size: int) -> Any:
    """A freshly initialised small ``BertForMaskedLM`` (the same for every objective of a seed)."""
    require("transformers", "reproduce mlm-training")
    from transformers import BertConfig, BertForMaskedLM

    conf = BertConfig(vocab_size=vocab_size, hidden_size=cfg.hidden_size,
                      num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
                      intermediate_size=cfg.intermediate_size,
                      max_position_embeddings=NUM_PIXELS + 2, hidden_dropout_prob=cfg.dropout,
                      attention_probs_dropout_prob=cfg.dropout, pad_token_id=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return BertForMaskedLM(conf)


def collator(objective: str, tok: Any, rate: float, seed: int) -> Any:
    """transformers' own collator for ``bert-15``; :class:`mptlml.hf.DataCollatorForMPT` else."""
    require("transformers", "reproduce mlm-training")
    from transformers import DataCollatorForLanguageModeling

    from ..hf import DataCollatorForMPT

    if objective == "bert-15":
        return DataCollatorForLanguageModeling(tok, mlm_probability=rate, seed=seed)
    if objective == "fixed-15":
        return DataCollatorForMPT(tok, estimator="fixed-rate", rate=rate, seed=seed)
    return DataCollatorForMPT(tok, estimator="random-size", seed=seed)


def _independent(train: torch.Tensor, test: torch.Tensor, levels: int) -> np.ndarray:
    """Exact held-out log-likelihood of independent categorical pixels fitted by counting.

    p_jv = max(count_jv / N, 1e-3), renormalised over v: the training
    frequencies kept away from 0 (a held-out pixel value never seen in training).
    """
    counts = torch.nn.functional.one_hot(train, levels).double().mean(0)  # (D, levels)
    p = counts.clamp_min(_PROB_FLOOR)
    logp = (p / p.sum(1, keepdim=True)).log()
    return logp.gather(1, test.T).T.sum(1).numpy()


def references(cfg: Any, train: torch.Tensor, test: torch.Tensor) -> dict[str, np.ndarray]:
    """Per held-out image exact log-likelihoods: ``independent`` and, for binary pixels,
    ``bernoulli_lvm`` (quadrature LML of the Bernoulli latent model fitted by exact LML)."""
    from ..objectives import ExactLML
    from ..training import train as fit

    refs: dict[str, np.ndarray] = {}
    if cfg.levels == 2:
        xb, tb = train.double(), test.double()
        p = xb.mean(0).clamp(_PROB_FLOOR, 1 - _PROB_FLOOR)
        init = BernoulliLVM.random(NUM_PIXELS, cfg.bernoulli_latent_dim, scale=0.1,
                                   seed=cfg.split_seed)
        lvm = BernoulliLVM(init.W.detach().clone(), torch.logit(p), quadrature="grid",
                           num_points=20, bound=5.0)
        fit(lvm, ExactLML(lvm), xb, epochs=cfg.bernoulli_epochs, lr=cfg.bernoulli_lr,
            seed=cfg.split_seed, progress=False)
        with torch.no_grad():
            refs["bernoulli_lvm"] = lvm.log_marginal(tb).double().numpy()
    refs["independent"] = _independent(train, test, cfg.levels)
    return refs


def samples(model: Any, tok: Any, num: int, seed: int, levels: int) -> torch.Tensor:
    """``(num, 64)`` intensities in [0, 1] drawn by random-order unmasking over the pixel tokens."""
    pix = tok.convert_tokens_to_ids(_pixel_tokens(levels))
    ids = sample_random_order(MaskedLM(model, tok), num, NUM_PIXELS, allowed_ids=pix,
                              generator=seed)
    value = torch.full((len(tok),), -1.0, dtype=torch.float64)
    value[torch.tensor(pix)] = torch.arange(levels, dtype=torch.float64) / (levels - 1)
    return value[ids]
