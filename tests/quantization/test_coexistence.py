"""exportir's quantized_decomposed ops share a process with torch.ao / torchao in either order.

torch registers the functional ops with a DEF library, so whoever registers second would fail.
transformers imports torchao whenever it is installed (and torchao imports torch.ao's op
definitions), so quantizing with exportir and then building a transformers model is the
ordinary case, checked here in fresh interpreters (a warmed-up process would hide the order).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_SRC = Path(__file__).resolve().parents[2] / "src"

_ORDERS = {
    "exportir first": ("from exportir.program import quantized_ops; quantized_ops.define()",
                       "import torch.ao.quantization.fx._decomposed"),
    "torch.ao first": ("import torch.ao.quantization.fx._decomposed",
                       "from exportir.program import quantized_ops; quantized_ops.define()"),
}


@pytest.mark.parametrize("order", sorted(_ORDERS))
def test_exportir_and_torch_ao_define_the_ops_in_either_order(order: str) -> None:
    first, second = _ORDERS[order]
    code = f"""
    import sys
    sys.path.insert(0, {str(_SRC)!r})
    import torch
    {first}
    {second}
    x = torch.tensor([0.5, -1.0, 2.0])
    q = torch.ops.quantized_decomposed.quantize_per_tensor(x, 0.5, 0, -128, 127, torch.int8)
    out = torch.empty(3, dtype=torch.int8)
    torch.ops.quantized_decomposed.quantize_per_tensor.out(x, 0.5, 0, -128, 127, torch.int8, out=out)
    assert q.tolist() == out.tolist() == [1, -2, 4], (q, out)
    print("OK")
    """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0 and "OK" in done.stdout, done.stderr[-3000:]
