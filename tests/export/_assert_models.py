"""Modules whose ``forward`` asserts on tensor data (tests/export/test_data_dependent_asserts.py).

Kept out of the test module: pytest rewrites the ``assert`` statements of test modules into
other bytecode, and the export recognizes the statement by its bytecode, as torch does."""

import torch


class Asserted(torch.nn.Module):
    def forward(self, x):
        assert x.max().item() <= 8
        return x * 2


class AssertedWithMessage(torch.nn.Module):
    def forward(self, x):
        assert x.max().item() <= 8, "values above 8"
        return x * 2


class Branched(torch.nn.Module):
    def forward(self, x):
        if x.max().item() <= 8:
            return x * 2
        return x
