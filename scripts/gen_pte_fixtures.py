"""Regenerate tests/format/data/executorch_*.pte: corpus models compiled by ExecuTorch's own
``to_executorch()`` (torch.export -> to_edge -> to_executorch), the files
tests/format/test_pte_executorch_memory.py reads without importing executorch.

Run with a Python that has executorch installed, from the repository root:
``PYTHONPATH=src .venv/bin/python scripts/gen_pte_fixtures.py``.
"""

from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "format")]

import torch
from pte_helpers import BufferView, executorch_pte, executorch_pte_of

# views of an input and of planned values, split outs; mutated buffers without initial value;
# aten::sort.values (which ExecuTorch's portable runtime does not register); and
# pte_helpers.BufferView (views of a mutated buffer)
NAMES = ("view_ops", "buffer_inplace", "buffer_reassign", "int_and_bool_ops")


def main() -> int:
    from executorch.version import __version__

    out = ROOT / "tests" / "format" / "data"
    out.mkdir(exist_ok=True)
    for name in NAMES:
        data = executorch_pte(name)
        (out / f"executorch_{name}.pte").write_bytes(data)
        print(f"executorch {__version__}: {name}.pte, {len(data)} bytes")
    data = executorch_pte_of(BufferView(), (torch.randn(2, 3),))
    (out / "executorch_buffer_view.pte").write_bytes(data)
    print(f"executorch {__version__}: buffer_view.pte, {len(data)} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
