"""A tiny block-diffusion LM of BD3-LM's published architecture, for tests and examples.

Written from the BD3-LM paper (Arriola et al., "Block Diffusion", ICLR 2025, Sec. 3) and
the layout its Hugging Face class takes (``model_type="bd3lm"``, ``block_size``,
``model_length``, the mask id the last vocabulary entry): a transformer whose input is the
noised copy x_t followed by the clean copy x_0 (length 2n, n = ``model_length``), under
the block-diffusion attention mask

- x_t's block b attends to x_t's block b (block diagonal) and to x_0's blocks before b
  (offset block-causal);
- x_0's block b attends to x_0's blocks up to b (block-causal);

both copies at positions 0..n-1. Its logits are those of x_t (``(B, n, V)``). Given an
input of another length it runs one sequence under the block-causal mask (the layout of
a clean prefix and a noised last block). Its forward takes ``timesteps`` (the noise level,
unused without time conditioning, as BD3-LM's default).

Its code (:data:`MODELING_CODE`, torch and transformers only) is what
:func:`save_tiny_bd3lm` writes beside the weights as ``modeling_bd3lm.py``, with
``auto_map`` in the config: the hub layout ``trust_remote_code=True`` loads.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from .._optional import require

__all__ = ["MODELING_CODE", "load_modeling", "save_tiny_bd3lm"]

#: the tiny BD3-LM's ``modeling_bd3lm.py``: its config, attention mask and model
MODELING_CODE = '''"""A tiny BD3-LM-shaped block-diffusion LM (mptlml.models.tiny_bd3lm)."""

import math

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import MaskedLMOutput


class TinyBD3LMConfig(PretrainedConfig):
    """BD3-LM's configuration fields that shape a model: blocks, length, width, depth."""

    model_type = "bd3lm"

    def __init__(self, block_size: int = 4, vocab_size: int = 32, model_length: int = 32,
                 hidden_dim: int = 32, n_blocks: int = 2, n_heads: int = 2,
                 cross_attn: bool = True, init_std: float = 0.5, **kwargs) -> None:
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.model_length = model_length
        self.hidden_dim = hidden_dim
        self.n_blocks = n_blocks
        self.n_heads = n_heads
        self.cross_attn = cross_attn
        self.init_std = init_std
        super().__init__(**kwargs)


def block_diffusion_mask(n: int, block_size: int, two_copies: bool = True) -> torch.Tensor:
    """The attention mask (True: may attend), ``(2n, 2n)`` for x_t + x_0, else ``(n, n)``."""
    if not two_copies:
        b = torch.arange(n) // block_size
        return b[:, None] >= b[None, :]
    idx = torch.arange(2 * n)
    clean = idx >= n
    blk = torch.where(clean, idx - n, idx) // block_size
    q_clean, k_clean = clean[:, None], clean[None, :]
    q_blk, k_blk = blk[:, None], blk[None, :]
    diagonal = (q_blk == k_blk) & (q_clean == k_clean)
    offset_causal = (q_blk > k_blk) & k_clean & ~q_clean
    causal = (q_blk >= k_blk) & k_clean & q_clean
    return diagonal | offset_causal | causal


class _Layer(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        att = (q.transpose(1, 2) @ k.transpose(1, 2).transpose(-1, -2)) / math.sqrt(
            d // self.heads)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        h = (att @ v.transpose(1, 2)).transpose(1, 2).reshape(b, t, d)
        x = x + self.out(h)
        return x + self.mlp(self.norm2(x))


class TinyBD3LM(PreTrainedModel):
    """A BD3-LM-shaped transformer (module docstring): ``forward(input_ids, timesteps)``."""

    config_class = TinyBD3LMConfig
    base_model_prefix = "bd3lm"

    def __init__(self, config: TinyBD3LMConfig) -> None:
        super().__init__(config)
        d = config.hidden_dim
        self.embed = nn.Embedding(config.vocab_size, d)
        self.pos = nn.Embedding(config.model_length, d)
        self.layers = nn.ModuleList(_Layer(d, config.n_heads) for _ in range(config.n_blocks))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, config.vocab_size)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, std=self.config.init_std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def forward(self, input_ids: torch.Tensor, timesteps: torch.Tensor | None = None,
                **kwargs) -> MaskedLMOutput:
        n, t = self.config.model_length, input_ids.shape[1]
        two = t == 2 * n
        pos = torch.arange(t, device=input_ids.device) % n if two else torch.arange(
            t, device=input_ids.device)
        mask = block_diffusion_mask(n if two else t, self.config.block_size, two).to(
            input_ids.device)
        x = self.embed(input_ids) + self.pos(pos)
        for layer in self.layers:
            x = layer(x, mask)
        logits = self.head(self.norm(x))
        return MaskedLMOutput(logits=logits[:, :n] if two else logits)
'''


def load_modeling(path: str | Path) -> Any:
    """The module of a saved tiny BD3-LM's ``modeling_bd3lm.py`` (its classes)."""
    require("transformers", "the tiny BD3-LM")
    name = f"mptlml_tiny_bd3lm_{abs(hash(str(Path(path).resolve())))}"
    spec = importlib.util.spec_from_file_location(name, Path(path) / "modeling_bd3lm.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = mod
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def save_tiny_bd3lm(path: str | Path, *, block_size: int = 4, model_length: int = 32,
                    words: list[str] | None = None, seed: int = 0, hidden_dim: int = 32,
                    n_blocks: int = 2, init_std: float = 0.5) -> Path:
    """A tiny BD3-LM in the hub layout: weights, ``config.json`` (``model_type="bd3lm"``,
    ``auto_map`` to this file saved as ``modeling_bd3lm.py``) and a word-level tokenizer
    (``[PAD]``, ``[UNK]``, ``[BOS]``, the words); the mask id is the model's last vocabulary
    entry, one past the tokenizer's. Load it with
    ``MaskedLM.from_pretrained(path, trust_remote_code=True)``."""
    require("transformers", "the tiny BD3-LM")
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "modeling_bd3lm.py").write_text(MODELING_CODE)
    mod = load_modeling(path)
    words = words or ("the cat dog sat on a mat ran far away big small red blue house "
                      "tree").split()
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[BOS]", *words])}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]",
                                  bos_token="[BOS]")
    tok.save_pretrained(path)
    torch.manual_seed(seed)
    config = mod.TinyBD3LMConfig(block_size=block_size, vocab_size=len(vocab) + 1,
                             model_length=model_length, hidden_dim=hidden_dim,
                             n_blocks=n_blocks, init_std=init_std)
    mod.TinyBD3LM(config).save_pretrained(path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "modeling_bd3lm.TinyBD3LMConfig",
                       "AutoModel": "modeling_bd3lm.TinyBD3LM",
                       "AutoModelForMaskedLM": "modeling_bd3lm.TinyBD3LM"}
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    return path
