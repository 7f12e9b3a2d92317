"""Models the torchao differential test builds on both sides (plain torch: the torchao side
runs in an interpreter that may have nothing of exportir)."""

from __future__ import annotations

import torch


class ConvNet(torch.nn.Module):
    """conv-bn-relu, conv + residual add-relu, max pool, linear-relu, linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.pool = torch.nn.MaxPool2d(2)
        self.fc1 = torch.nn.Linear(8 * 4 * 4, 32)
        self.fc2 = torch.nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        y = torch.relu(self.conv2(y) + y)
        y = self.pool(y).flatten(1)
        return self.fc2(torch.relu(self.fc1(y)))


def conv_net() -> ConvNet:
    torch.manual_seed(0)
    m = ConvNet().eval()
    with torch.no_grad():  # non-trivial batch-norm statistics
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 2.0)
        m.bn.weight.uniform_(0.5, 1.5)
    return m
