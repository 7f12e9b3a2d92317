"""The small model the debugging tools' tests (profiles, ``exportir.debug.compare``) run: two
nested modules, so profiles group by module path, and marked lines, so a test can say which
source line a node must point at."""

from __future__ import annotations

from pathlib import Path

import torch


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 8)
        self.ln = torch.nn.LayerNorm(8)

    def forward(self, x):
        return torch.relu(self.ln(self.lin(x)))  # BLOCK_LINE


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.block(x)) * 2  # NET_LINE


def source_line(marker: str) -> str:
    """``debug_models.py:<line>`` of the line ending with ``marker`` (``# BLOCK_LINE``)."""
    text = Path(__file__).read_text().splitlines()
    return f"debug_models.py:{next(i for i, t in enumerate(text, 1) if t.endswith(marker))}"
