"""A Llama written as plain modules (RMSNorm, rotary embeddings, grouped-query attention with a
KV cache in registered buffers, SwiGLU), for the LLM benchmark rows where both exportir and
ExecuTorch take the same model: torch 2.13's ``run_decompositions`` (which ExecuTorch's
``to_edge`` calls) fails on transformers' static-cache export wrapper."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, max_seq: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        shape = (1, kv_heads, max_seq, self.head_dim)
        self.register_buffer("k_cache", torch.zeros(shape))
        self.register_buffer("v_cache", torch.zeros(shape))

    def forward(self, x: torch.Tensor, pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache.index_copy_(2, pos, v)
        groups = self.heads // self.kv_heads
        keys = self.k_cache.repeat_interleave(groups, dim=1)
        values = self.v_cache.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, dim: int, hidden: int, heads: int, kv_heads: int, max_seq: int) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(dim)
        self.attention = Attention(dim, heads, kv_heads, max_seq)
        self.ffn_norm = RMSNorm(dim)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x, pos, cos, sin, mask):
        x = x + self.attention(self.attention_norm(x), pos, cos, sin, mask)
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class MiniLlama(nn.Module):
    """``forward(tokens int64[1, T], input_pos int64[T]) -> logits of the last token [1, 1, V]``."""

    def __init__(self, vocab: int, dim: int, hidden: int, layers: int, heads: int,
                 kv_heads: int, max_seq: int) -> None:
        super().__init__()
        self.max_seq = max_seq
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, hidden, heads, kv_heads, max_seq)
                                    for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)
        head_dim = dim // heads
        inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        angles = torch.outer(torch.arange(max_seq).float(), inv)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        cos, sin = self.cos[input_pos], self.sin[input_pos]
        mask = torch.arange(self.max_seq)[None, :] <= input_pos[:, None]
        for layer in self.layers:
            x = layer(x, input_pos, cos, sin, mask)
        return self.output(self.norm(x[:, -1:, :]))
