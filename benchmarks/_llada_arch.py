"""A small model of LLaDA's architecture, shared by ``bench_llada_eval.py`` and
``bench_conditional.py``.

Written from LLaDA's published configuration and description (Nie et al., "Large Language
Diffusion Models", 2025): a LLaMA-style Transformer without the causal mask: pre-norm blocks
of RMSNorm, bidirectional multi-head self-attention with rotary position embeddings (RoPE,
theta 500,000) and a SwiGLU MLP (no biases), a final RMSNorm and an untied output head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["SIZES", "Block", "RMSNorm", "TinyLLaDA", "rope"]

SIZES = {"small": {"d": 64, "layers": 2, "heads": 4, "mlp": 176},
         "large": {"d": 384, "layers": 6, "heads": 6, "mlp": 1056}}


# ---------------------------------------------------------------------- LLaDA's architecture
class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * (
            self.weight)


def rope(x: torch.Tensor, theta: float = 500000.0) -> torch.Tensor:
    """Rotary position embedding of ``x (B, H, T, Dh)`` (half-split rotation, as LLaMA's)."""
    t, dh = x.shape[-2], x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, dh, 2, device=x.device, dtype=torch.float32) / dh)
    ang = torch.arange(t, device=x.device, dtype=torch.float32)[:, None] * inv[None]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    a, b = x[..., : dh // 2], x[..., dh // 2:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class Block(nn.Module):
    """Pre-norm LLaMA block with bidirectional attention (no causal mask)."""

    def __init__(self, d: int, heads: int, mlp: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.out = nn.Linear(d, d, bias=False)
        self.gate = nn.Linear(d, mlp, bias=False)
        self.up = nn.Linear(d, mlp, bias=False)
        self.down = nn.Linear(mlp, d, bias=False)

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        q, k, v = rope(q.transpose(1, 2)), rope(k.transpose(1, 2)), v.transpose(1, 2)
        mask = None if keep is None else keep[:, None, None, :]
        h = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # bidirectional
        x = x + self.out(h.transpose(1, 2).reshape(b, t, d))
        y = self.norm2(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


class TinyLLaDA(nn.Module):
    """``forward(input_ids, attention_mask=None) -> logits``: LLaDA's architecture, small."""

    def __init__(self, vocab: int, d: int, layers: int, heads: int, mlp: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads, mlp) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        for p in self.parameters():
            if p.ndim == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                ) -> torch.Tensor:
        keep = None if attention_mask is None else attention_mask.bool()
        x = self.embed(input_ids)
        for blk in self.blocks:
            x = blk(x, keep)
        return self.head(self.norm(x))
