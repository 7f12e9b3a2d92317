"""Seed 003's ``normalize`` example, with ``len`` and ``sqrt`` wrapped at module scope.

Kept in its own module because wrapping a builtin such as ``len`` patches every use of that
name in the registering module's globals while tracing.
"""

from math import sqrt

import torch.fx

import exportir.fx


def normalize(x):
    """
    Normalize `x` by the size of the batch dimension
    """
    return x / sqrt(len(x))


torch.fx.wrap("len")
torch.fx.wrap("sqrt")
exportir.fx.wrap("len")
exportir.fx.wrap("sqrt")
