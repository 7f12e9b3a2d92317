"""Every fused CPU kernel runs in a fresh process: one that has done nothing but import
``exportir.runtime``, load a program file and run it (no eager torch call before).

torch initialises some of its Python-binding state lazily, on the first call that needs it (the
first Python float passed as a ``Scalar``, the first ``full``...), and that first call imports
modules from the calling frame -- the fused executor's generated function. A test process has
run eager torch long before, so only a fresh process shows such failures.

Each sample of ``fused_kernel_samples.SAMPLES`` becomes a program file whose one method feeds
constant tensors to a delegate holding a one-op blob; :func:`fresh_process.run_fresh` runs each
file as the first thing its process runs. Outputs are compared bit for bit with
``torch.ops.aten.<op>`` run here.
"""

from __future__ import annotations

import json
import struct

import pytest
import torch
from fresh_process import Failure, Job, run_fresh
from fused_kernel_samples import REFERENCES, ROUNDING, SAMPLES, assert_same

from exportir.backends.fused_cpu.backend import encode_arg
from exportir.program import schema, serialize
from exportir.runtime.backends.fused_cpu import ALIGNMENT, BACKEND_ID, FORMAT_VERSION, MAGIC
from exportir.runtime.backends.fused_cpu.kernels import KERNELS, op_schema

_SCALAR_TYPES = {
    getattr(torch, name): st for st, name in schema.TORCH_DTYPE_NAME.items()
    if hasattr(torch, name)
}  # fmt: skip


def _aten(name: str):
    namespace, packet, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload)


def _blob(name: str, args: tuple, kwargs: dict, n_outs: int, multi: bool) -> bytes:
    """A one-op blob: the sample's tensors are slots 0.., the delegate inputs; then the
    outputs."""
    tensors = _tensors((args, kwargs))
    slots = {id(t): i for i, t in enumerate(tensors)}
    n_tensors = len(tensors)

    def slot_of(t: torch.Tensor) -> int:
        return slots[id(t)]

    outs = list(range(n_tensors, n_tensors + n_outs))
    header = {
        "values": n_tensors + n_outs,
        "inputs": list(range(n_tensors)),
        "outputs": outs,
        "constants": [],
        "ops": [[name, _encode(list(args), slot_of), {k: _encode(v, slot_of)
                                                      for k, v in kwargs.items()},
                 outs if multi else outs[0], "node"]],
        "inplace": [0],
    }  # fmt: skip
    text = json.dumps(header).encode()
    head = struct.pack("<4sII", MAGIC, FORMAT_VERSION, len(text)) + text
    return head + b"\0" * (-len(head) % ALIGNMENT)


def _encode(x, slot_of):
    if isinstance(x, torch.Tensor):
        return {"v": slot_of(x)}
    if isinstance(x, (list, tuple)):
        return [_encode(v, slot_of) for v in x]
    return encode_arg(x, slot_of)


def _tensors(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensors(v)]
    return []


def _program(blob: bytes, tensors: list[torch.Tensor], expected: list[torch.Tensor]):
    """One method ``forward()``: the sample tensors are program constants, fed to the delegate;
    its outputs are the method's outputs."""
    values: list = []
    buffers: list[schema.ConstantBuffer] = []
    for t in tensors:
        data = t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""
        buffers.append(schema.ConstantBuffer(data))
        values.append(schema.Tensor(_SCALAR_TYPES[t.dtype], tuple(t.shape),
                                    tuple(range(t.dim())), schema.ConstantData(len(buffers) - 1)))
    outs = []
    for e in expected:
        values.append(schema.Tensor(_SCALAR_TYPES[e.dtype], tuple(e.shape),
                                    tuple(range(e.dim())), schema.DynamicStorage(), True))
        outs.append(len(values) - 1)
    call = schema.DelegateCall(0, tuple(range(len(tensors))), tuple(outs), 0)
    method = schema.Method(
        name="forward", values=tuple(values), inputs=(), outputs=tuple(outs), operators=(),
        instructions=(call,), debug=(schema.DebugEntry("executorch_call_delegate"),),
        plan=schema.MethodPlan(),
    )  # fmt: skip
    return schema.Program(
        version=schema.FORMAT_VERSION, methods=(method,), constants=tuple(buffers),
        delegates=(schema.Delegate(BACKEND_ID, blob),),
    )  # fmt: skip


def _cases() -> list[tuple[str, tuple, dict]]:
    return [
        (f"{name}-{k}", args, kwargs)
        for name in sorted(KERNELS)
        for k, (args, kwargs) in enumerate(SAMPLES[name])
    ]


def _expected(name: str, args: tuple, kwargs: dict) -> tuple[list[torch.Tensor], bool]:
    result = (REFERENCES[name] if name in REFERENCES else _aten(name))(*args, **kwargs)
    multi = [str(r.type) for r in op_schema(name).returns] != ["Tensor"]
    return (list(result) if multi else [result]), multi


def _same(got: object, expected: list[torch.Tensor], label: str) -> str | None:
    if isinstance(got, Failure):
        return f"{label}: {got.error}"
    if len(got) != len(expected):
        return f"{label}: {len(got)} outputs, expected {len(expected)}"
    exact = label.rsplit("-", 1)[0] not in ROUNDING
    for g, e in zip(got, expected):
        try:
            assert_same(g, e, exact)
        except AssertionError as err:
            return f"{label}: {str(err).splitlines()[0]}"
    return None


def test_every_fused_kernel_runs_in_a_fresh_process(tmp_path):
    expected: dict[str, list[torch.Tensor]] = {}
    paths = []
    for label, args, kwargs in _cases():
        outs, multi = _expected(label.rsplit("-", 1)[0], args, kwargs)
        blob = _blob(label.rsplit("-", 1)[0], args, kwargs, len(outs), multi)
        path = tmp_path / f"{label}.xpt"
        serialize.save(_program(blob, _tensors((args, kwargs)), outs), path)
        expected[path.name] = outs
        paths.append(path)
    results = run_fresh([Job(p) for p in paths], tmp_path)
    failures = [_same(r, expected[p.name], p.stem) for p, r in zip(paths, results)]
    failures = [f for f in failures if f is not None]
    assert failures == [], "\n".join(failures)


def test_generated_code_imports_only_loaded_modules():
    from exportir.runtime.backends.fused_cpu.executor import _loaded_module

    assert _loaded_module("torch") is torch
    assert _loaded_module("torch.nn", fromlist=["__doc__"]) is torch.nn
    assert _loaded_module("torch.nn") is torch
    with pytest.raises(ImportError, match="'antigravity', which is not loaded"):
        _loaded_module("antigravity")
    with pytest.raises(ImportError, match="not loaded"):
        _loaded_module("torch", level=1)
