"""Tiny local masked LMs for the masked-LM tests (no downloads)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

WORDS = ("the cat dog sat on a mat ran far away big small red blue house tree "
         "and or but with under over is was").split()
SENTENCES = [
    "the cat sat on a mat",
    "a big dog ran far away",
    "the small red house",
    "blue tree",
    "the dog was under the big tree and the cat sat on the red mat",
]


def _draw_weights(model: torch.nn.Module, *, seed: int, std: float) -> None:
    """Draw every parameter of ``model`` ourselves, whatever transformers drew.

    transformers 4.46.2 and 5.x draw ``cls.predictions.transform.dense.weight`` differently from
    one global seed (5.x's decoder ``Linear`` has its own bias: one more draw at construction),
    so the draws are made here, from a ``torch.Generator`` seeded with ``seed``, in the stream
    transformers 5 uses, so that the tiny BERT the tests were written for keeps its weights.
    For each top-level part (the encoder ``bert``, then the head ``cls``): what constructing
    its modules draws (for each ``Embedding`` a standard normal, for each ``Linear`` a uniform
    of the weight's shape then one of the bias's, in module order), then BERT's own scheme in
    module order: ``N(0, std^2)`` for every ``Linear`` and ``Embedding`` weight (the padding
    row zero; a tied weight keeps its first draw), zeros for biases, ones for LayerNorm weights.
    """
    from torch import nn

    gen = torch.Generator().manual_seed(seed)
    drawn: set[int] = set()
    with torch.no_grad():
        for part in model.children():
            modules = list(part.modules())
            for mod in modules:  # what constructing the modules draws (the values are replaced)
                if isinstance(mod, nn.Embedding):
                    torch.empty(mod.weight.shape).normal_(generator=gen)
                elif isinstance(mod, nn.Linear):
                    torch.empty(mod.weight.shape).uniform_(generator=gen)
                    torch.empty(mod.out_features).uniform_(generator=gen)
            for mod in modules:
                if isinstance(mod, (nn.Linear, nn.Embedding)) and id(mod.weight) not in drawn:
                    drawn.add(id(mod.weight))
                    mod.weight.copy_(torch.empty(mod.weight.shape).normal_(0.0, std,
                                                                           generator=gen))
                    if isinstance(mod, nn.Embedding) and mod.padding_idx is not None:
                        mod.weight[mod.padding_idx] = 0.0
                elif isinstance(mod, nn.LayerNorm):
                    mod.weight.fill_(1.0)
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.zero_()


def make_tiny_bert(path: Path, *, seed: int = 0, max_position_embeddings: int = 64,
                   words: Sequence[str] = WORDS) -> Path:
    """Save a random 2-layer BERT masked LM and its WordPiece tokenizer to ``path``.

    ``words`` is the vocabulary after the special tokens (``##`` marks a
    word-continuing piece).
    """
    from transformers import BertConfig, BertForMaskedLM, BertTokenizer

    path.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = BertTokenizer(str(path / "vocab.txt"), do_lower_case=True)
    assert len(tok) == len(vocab)
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=2, intermediate_size=64,
                     max_position_embeddings=max_position_embeddings,
                     initializer_range=0.5)
    torch.manual_seed(seed)  # only keeps the global generator's state after this call repeatable
    model = BertForMaskedLM(cfg)
    _draw_weights(model, seed=seed, std=cfg.initializer_range)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def transformers_pll(model_dir: Path | str, texts: Sequence[str]) -> list[float]:
    """PLL of each text by transformers directly: every content token masked alone.

    ``PLL(x) = sum_j log p(x_j | x_{-j})`` (Salazar et al. 2020; minicons'
    ``sequence_score`` with a sum reduction): one masked copy of the text per
    token between [CLS] and [SEP], each run through ``BertForMaskedLM`` itself
    with its own tokenizer (never through mptlml): the independent reference of
    :func:`mptlml.pll`.
    """
    from transformers import BertForMaskedLM, BertTokenizer

    tok = BertTokenizer.from_pretrained(model_dir)
    net = BertForMaskedLM.from_pretrained(model_dir).eval()
    out = []
    for text in texts:
        ids = torch.tensor(tok(text)["input_ids"])
        pos = torch.arange(1, len(ids) - 1)  # between [CLS] and [SEP]
        x = ids.repeat(len(pos), 1)
        x[torch.arange(len(pos)), pos] = tok.mask_token_id
        with torch.no_grad():
            lp = net(input_ids=x).logits.double().log_softmax(-1)
        out.append(float(lp[torch.arange(len(pos)), pos, ids[pos]].sum()))
    return out


def exact_size_scores(model_dir: Path | str, texts: Sequence[str]) -> list[np.ndarray]:
    """S(x; M) for M = 1..D of each text, over EVERY mask of each size, by transformers directly.

    ``S(x; M) = mean over the C(D, M) masks of (1/M) sum_{j in mask} log p(x_j | x_R)``,
    with each masked input run through ``BertForMaskedLM`` itself (never through
    mptlml's scoring): the independent reference of the masked-LM estimators. The
    exact MPT sum of a text is ``scores.sum()``.
    """
    from transformers import BertForMaskedLM, BertTokenizer

    tok = BertTokenizer.from_pretrained(model_dir)
    net = BertForMaskedLM.from_pretrained(model_dir).eval()
    out = []
    for text in texts:
        ids = torch.tensor(tok(text)["input_ids"])
        pos = list(range(1, len(ids) - 1))  # between [CLS] and [SEP]
        scores = []
        for m in range(1, len(pos) + 1):
            vals = []
            for subset in itertools.combinations(pos, m):
                inp = ids.clone()
                inp[list(subset)] = tok.mask_token_id
                with torch.no_grad():
                    lp = net(inp[None]).logits[0].double().log_softmax(-1)
                vals.append(sum(float(lp[j, ids[j]]) for j in subset) / m)
            scores.append(float(np.mean(vals)))
        out.append(np.array(scores))
    return out


def masked_size_scores(ids: torch.Tensor, scored: Sequence[int], mask_id: int,
                       log_probs) -> np.ndarray:
    """S(x; M) for M = 1..len(scored): the mean over every mask of size M inside ``scored`` of
    (1/M) sum_j log p(x_j | rest).

    Every masked copy of ``ids`` (1-D, the model's whole input) scored by
    ``log_probs(x) -> (B, T, V)`` log-probabilities, called once per size; the positions
    outside ``scored`` stay visible (a context).
    """
    out = []
    for m in range(1, len(scored) + 1):
        subsets = list(itertools.combinations(scored, m))
        x = ids.repeat(len(subsets), 1)
        for r, sub in enumerate(subsets):
            x[r, list(sub)] = mask_id
        with torch.no_grad():
            lp = log_probs(x)
        out.append(float(np.mean([sum(float(lp[r, j, ids[j]]) for j in sub) / m
                                  for r, sub in enumerate(subsets)])))
    return np.array(out)


def exhaustive_masked_sum(ids: torch.Tensor, scored: Sequence[int], mask_id: int,
                          log_probs) -> float:
    """sum_M mean over masks of size M inside ``scored`` of (1/M) sum_j log p(x_j | rest).

    The exhaustive (conditional) MPT sum of the positions ``scored``, the others visible:
    :func:`masked_size_scores` summed.
    """
    return float(masked_size_scores(ids, scored, mask_id, log_probs).sum())
