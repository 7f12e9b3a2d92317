"""Programs that read values from tensor data (``Tensor.item()``), and the checks they keep.

``.item()`` becomes ``aten._local_scalar_dense``, a runtime primitive (ExecuTorch's prim ops have
it too). What the model asserts about such a value (``torch._check``) and the value's range
facts are kept as ``aten._assert_scalar`` checks through ``run_decompositions`` (as torch does)
and ``to_edge`` (which drops the other assertions: input binding checks those), and the runtime
evaluates them: an input breaking one fails naming the node, never returns a wrong shape.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.export

import exportir
from exportir.runtime import Program, RuntimeFailure

SRC = Path(__file__).resolve().parents[2] / "src"
aten = torch.ops.aten


class Prefix(torch.nn.Module):
    """An int read from a tensor used as a slice end, with the model's own checks."""

    def forward(self, x, n):
        k = n.item()
        torch._check(k >= 0)
        torch._check(k <= x.shape[0])
        return x[:k] * 2


class Scale(torch.nn.Module):
    """A float read from a tensor used in arithmetic and as a fill value."""

    def forward(self, x):
        peak = x.abs().max().item()
        return x / (peak + 1.0) + torch.full((1, x.shape[1]), x.mean().item())


def _method(model, args):
    return Program.load(exportir.to_edge(exportir.export(model, args)).to_program().buffer
                        ).method("forward")


def _count(gm, target) -> int:
    return len(gm.graph.find_nodes(op="call_function", target=target))


def test_float_items_run_like_eager():
    model = Scale()
    method = _method(model, (torch.randn(4, 5),))
    for x in (torch.randn(4, 5), torch.randn(4, 5) * 100):
        torch.testing.assert_close(method(x), model(x))


@pytest.mark.parametrize("n", [4, 0, 6, 2])
def test_an_item_used_as_a_size_runs_like_eager(n):
    model = Prefix()
    method = _method(model, (torch.randn(6, 3), torch.tensor(4)))
    x = torch.randn(6, 3)
    torch.testing.assert_close(method(x, torch.tensor(n)), model(x, torch.tensor(n)))


@pytest.mark.parametrize(("n", "expr"), [(7, "u0 <= 6"), (-1, "u0 >= 0")])
def test_a_broken_check_on_an_item_fails_naming_the_check(n, expr):
    method = _method(Prefix(), (torch.randn(6, 3), torch.tensor(4)))
    with pytest.raises(RuntimeFailure, match=expr) as info:
        method(torch.randn(6, 3), torch.tensor(n))
    assert info.value.op == "aten::_assert_scalar.default"
    assert "test_item_programs.py" in (info.value.source or "")


def test_run_decompositions_keeps_the_checks_as_torch_does():
    args = (torch.randn(6, 3), torch.tensor(4))
    ours = exportir.export(Prefix(), args).run_decompositions()
    theirs = torch.export.export(Prefix(), args).run_decompositions()
    for target in (aten._assert_scalar.default, aten._local_scalar_dense.default):
        assert _count(ours.graph_module, target) == _count(theirs.graph_module, target) > 0
    edge = exportir.to_edge(exportir.export(Prefix(), args)).exported_program()
    assert _count(edge.graph_module, aten._assert_scalar.default) == 2


def test_checks_on_input_sizes_are_still_left_to_input_binding():
    class Sized(torch.nn.Module):
        def forward(self, x):
            torch._check(x.shape[0] >= 2)
            return x * 2

    batch = exportir.Dim("batch", min=2, max=64)
    ep = exportir.export(Sized(), (torch.randn(4, 3),), dynamic_shapes={"x": {0: batch}})
    edge = exportir.to_edge(ep).exported_program()
    assert _count(edge.graph_module, aten._assert_scalar.default) == 0


def test_an_item_program_runs_in_a_fresh_process(tmp_path):
    path = tmp_path / "prefix.xpt"
    exportir.to_edge(exportir.export(Prefix(), (torch.randn(6, 3), torch.tensor(4)))
                     ).to_program().save(path)
    code = textwrap.dedent(f"""
        import torch
        from exportir.runtime import Program, RuntimeFailure
        method = Program.load({str(path)!r}).method("forward")
        x = torch.arange(18.0).reshape(6, 3)
        assert torch.equal(method(x, torch.tensor(3)), x[:3] * 2)
        try:
            method(x, torch.tensor(9))
        except RuntimeFailure as e:
            assert "u0 <= 6" in str(e), str(e)
        else:
            raise SystemExit("no failure")
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True,
                          text=True, timeout=300, env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "ok"
