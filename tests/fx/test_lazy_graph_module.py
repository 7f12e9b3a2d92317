"""_LazyGraphModule (torch.fx._lazy_graph_module's): code generated on first use, and then the
same as an eager GraphModule's."""

from __future__ import annotations

import copy
import pickle

import torch

import exportir
from exportir.fx import GraphModule, symbolic_trace
from exportir.fx._lazy_graph_module import _LazyGraphModule


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.lin(x).relu() + 1


def _pair() -> tuple[GraphModule, _LazyGraphModule]:
    torch.manual_seed(0)
    gm = symbolic_trace(_Net())
    return gm, _LazyGraphModule(gm, gm.graph)


def test_no_code_until_used_then_the_eager_code():
    gm, lazy = _pair()
    assert lazy._needs_recompile() and "_code" not in vars(lazy)
    assert lazy.code == gm.code
    assert not lazy._needs_recompile()


def test_call_generates_and_runs():
    gm, lazy = _pair()
    x = torch.randn(2, 3)
    torch.testing.assert_close(lazy(x), gm(x))
    assert not lazy._needs_recompile()


def test_recompile_only_marks_and_str_generates():
    gm, lazy = _pair()
    lazy.real_recompile()
    assert lazy.recompile() is None and lazy._needs_recompile()
    assert gm.code in str(lazy)


def test_pickle_and_deepcopy_of_an_ungenerated_module():
    gm, lazy = _pair()
    x = torch.randn(2, 3)
    torch.testing.assert_close(pickle.loads(pickle.dumps(lazy))(x), gm(x))
    _, lazy2 = _pair()
    copied = copy.deepcopy(lazy2)
    assert isinstance(copied, _LazyGraphModule)
    torch.testing.assert_close(copied(x), gm(x))


def test_exported_program_module_generates_code_when_read():
    net = _Net()
    ep = exportir.export(net, (torch.randn(2, 3),))
    module = ep.graph_module
    assert isinstance(module, _LazyGraphModule) and module._needs_recompile()
    assert "torch.ops.aten.linear.default" in module.code
    x = torch.randn(2, 3)
    torch.testing.assert_close(ep.module()(x), net(x))
