"""A static-int8 fused program loads without torch's quantization stack.

The fused CPU backend reads the arguments of ``quantized_decomposed`` ops from their schemas and
runs exportir's own Python functions for them; registering the ops with torch would import
``torch.ao.quantization.fx`` (~15 ms and ~10 MiB of a load that is otherwise ~10 ms).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import torch

import exportir
from exportir.backends.fused_cpu import FusedCpuPartitioner
from exportir.format import quantized_ops
from exportir.program.transform_and_lower import to_edge_transform_and_lower
from exportir.quantization import (
    XNNPACKQuantizer,
    convert_pt2e,
    get_symmetric_quantization_config,
    prepare_pt2e,
)


def test_parsed_schemas_are_the_registered_ones() -> None:
    """The table's schemas, parsed, are those torch has registered (torch's own definitions of
    the functional ops where it has them), so the backend binds arguments exactly as before."""
    quantized_ops.define()
    for op in quantized_ops.OPS:
        packet, overload = quantized_ops._name(op.schema)
        registered = getattr(getattr(torch.ops.quantized_decomposed, packet), overload)._schema
        assert str(quantized_ops.parsed_schema(packet, overload)) == str(registered), op.schema
    assert quantized_ops.parsed_schema("no_such_op", "default") is None


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(32, 64), torch.nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


_CHILD = textwrap.dedent("""
    import sys, torch
    from exportir.runtime import Program
    x = torch.load(sys.argv[2])
    out = Program.load(sys.argv[1]).method("forward")(x)
    torch.save(out, sys.argv[3])
    print(sorted(m for m in sys.modules if m.startswith("torch.ao.quantization.fx")))
""")


def test_a_static_int8_fused_program_loads_without_torchs_quantization_stack(tmp_path) -> None:
    torch.manual_seed(0)
    model, x = _Mlp().eval(), torch.randn(1, 32)
    prepared = prepare_pt2e(exportir.export(model, (x,)).module(), XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True)))
    for _ in range(3):
        prepared(torch.randn(1, 32))
    quantized = convert_pt2e(prepared)
    program = to_edge_transform_and_lower(exportir.export(quantized, (x,)),
                                          partitioner=[FusedCpuPartitioner()]).to_program()
    path = tmp_path / "mlp_int8.xpt"
    program.save(path)
    torch.save(x, tmp_path / "x.pt")
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(tmp_path / "x.pt"),
                           str(tmp_path / "out.pt")], capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]", proc.stdout
    got = torch.load(tmp_path / "out.pt")  # the method's one output
    torch.testing.assert_close(got, quantized(x), rtol=0, atol=1e-5)
