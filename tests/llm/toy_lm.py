"""A small decoder with its KV cache in registered buffers, written as people write them by hand
(no transformers): the plain-``nn.Module`` road of ``export_llm``."""

from __future__ import annotations

import math

import torch


class ToyLM(torch.nn.Module):
    def __init__(self, vocab: int = 64, dim: int = 16, max_seq: int = 24) -> None:
        super().__init__()
        self.max_seq = max_seq
        self.embed = torch.nn.Embedding(vocab, dim)
        self.q = torch.nn.Linear(dim, dim)
        self.k = torch.nn.Linear(dim, dim)
        self.v = torch.nn.Linear(dim, dim)
        self.norm = torch.nn.LayerNorm(dim)
        self.out = torch.nn.Linear(dim, vocab)
        self.register_buffer("k_cache", torch.zeros(1, max_seq, dim))
        self.register_buffer("v_cache", torch.zeros(1, max_seq, dim))

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        input_pos = input_pos.to(self.k_cache.device)  # a model built on meta keeps its cache there
        self.k_cache.index_copy_(1, input_pos, self.k(x))
        self.v_cache.index_copy_(1, input_pos, self.v(x))
        scores = self.q(x) @ self.k_cache.transpose(1, 2) / math.sqrt(x.shape[-1])
        visible = torch.arange(self.max_seq, device=x.device)[None, :] <= input_pos[:, None]
        scores = scores.masked_fill(~visible, float("-inf"))
        h = self.norm(scores.softmax(-1) @ self.v_cache + x)
        return self.out(h)


def toy_lm(seed: int = 0, **kw: int) -> ToyLM:
    torch.manual_seed(seed)
    return ToyLM(**kw).eval()


def eager_greedy(model: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    """Greedy tokens of ``model`` run eagerly with the program's protocol: prefill, then one
    token per step (the model's cache buffers are written in place)."""
    out: list[int] = []
    with torch.no_grad():
        logits = model(torch.tensor([prompt]), torch.arange(len(prompt)))[:, -1]
        pos = len(prompt)
        for _ in range(n):
            token = int(logits.argmax(-1))
            out.append(token)
            logits = model(torch.tensor([[token]]), torch.tensor([pos]))[:, -1]
            pos += 1
    return out
