"""Delegates run through an explicit, test-local registry: init once at load, execute per call."""

from __future__ import annotations

import types

import pytest
import torch
from runtime_programs import MethodBuilder, program_of

from exportir.program import schema, serialize
from exportir.runtime import (
    DelegateRegistry,
    MethodInputError,
    MissingBackendError,
    Program,
    RuntimeFailure,
    default_delegate_registry,
)


class AffineBackend:
    """Test backend: processed bytes ``b"scale=<float>"``; computes ``a * scale + b``."""

    def __init__(self, outputs: int = 1) -> None:
        self.inits: list[tuple[bytes, tuple]] = []
        self.calls = 0
        self.outputs = outputs

    def init(self, processed, compile_specs):
        self.inits.append((bytes(processed), tuple(compile_specs)))
        key, _, value = bytes(processed).decode().partition("=")
        if key != "scale":
            raise ValueError(f"bad blob {bytes(processed)!r}")
        return float(value)

    def execute(self, handle, inputs):
        self.calls += 1
        a, b = inputs
        return [a * handle + b] * self.outputs


def _delegating_program(blob: bytes = b"scale=3", backend_id: str = "affine") -> schema.Program:
    b = MethodBuilder()
    x, y = b.input("x", (2, 2)), b.input("y", (2, 2))
    delegated = b.planned((2, 2))
    out = b.planned((2, 2))
    b.instruction(lambda d: schema.DelegateCall(0, (x, y), (delegated,), d),
                  "executorch_call_delegate", "model.py:20")
    b.kernel("aten::relu", "out", (delegated, out), "relu", "model.py:21")
    b.outputs += [out, delegated]
    spec = schema.CompileSpec("precision", b"fp32")
    return program_of(b, delegates=[schema.Delegate(backend_id, blob, (spec,))])


def _registry(backend) -> DelegateRegistry:
    registry = DelegateRegistry()
    registry.register("affine", backend)
    return registry


def test_delegate_runs_and_writes_its_planned_outputs():
    backend = AffineBackend()
    program = Program.load(serialize.serialize_program(_delegating_program()),
                           delegates=_registry(backend))
    x, y = torch.randn(2, 2), torch.randn(2, 2)
    out, delegated = program.method()(x, y)
    torch.testing.assert_close(delegated, x * 3 + y)
    torch.testing.assert_close(out, (x * 3 + y).relu())


def test_init_runs_once_at_load_with_blob_and_compile_specs():
    backend = AffineBackend()
    program = Program.from_schema(_delegating_program(), delegates=_registry(backend))
    assert backend.inits == [(b"scale=3", (schema.CompileSpec("precision", b"fp32"),))]
    method = program.method()
    for _ in range(3):
        method(torch.ones(2, 2), torch.ones(2, 2))
    assert len(backend.inits) == 1 and backend.calls == 3


def test_missing_backend_fails_at_load_naming_the_call_site():
    with pytest.raises(MissingBackendError) as info:
        Program.from_schema(_delegating_program(backend_id="npu"), delegates=DelegateRegistry())
    err = info.value
    assert (err.instruction, err.node, err.source) == (0, "executorch_call_delegate",
                                                      "model.py:20")
    assert "backend 'npu'" in str(err) and "registry.register(backend_id, backend)" in str(err)


def test_default_registry_ships_the_fused_cpu_executor():
    from exportir.runtime.backends.fused_cpu import BACKEND_ID, FusedCpuRuntime

    registry = default_delegate_registry()
    assert BACKEND_ID in registry and list(registry) == [BACKEND_ID]  # named before imported
    assert isinstance(registry.get(BACKEND_ID), FusedCpuRuntime)
    assert registry.get(BACKEND_ID) is registry.get(BACKEND_ID)  # made once per registry
    assert isinstance(registry.copy().get(BACKEND_ID), FusedCpuRuntime)


def test_missing_builtin_backend_hint_names_the_default_registry():
    with pytest.raises(MissingBackendError, match=r"FusedCpuBackend ships with the runtime: "
                       r"load with the default registry"):
        Program.from_schema(_delegating_program(backend_id="FusedCpuBackend"),
                            delegates=DelegateRegistry())


def test_backend_init_failure_is_a_runtime_failure():
    with pytest.raises(RuntimeFailure, match="failed to initialise delegate 0: ValueError"):
        Program.from_schema(_delegating_program(blob=b"bogus"),
                            delegates=_registry(AffineBackend()))


def test_wrong_number_of_delegate_outputs():
    program = Program.from_schema(_delegating_program(), delegates=_registry(AffineBackend(2)))
    with pytest.raises(RuntimeFailure, match="delegate returned 2 outputs; the program expects 1"
                       ) as info:
        program.method()(torch.ones(2, 2), torch.ones(2, 2))
    assert info.value.op == "delegate affine"


def test_registry_checks_the_backend_interface():
    with pytest.raises(TypeError, match="lacks init"):
        DelegateRegistry().register("x", object())


def test_default_registry_is_a_fresh_object():
    first, second = default_delegate_registry(), default_delegate_registry()
    assert first is not second
    first.register("affine", AffineBackend())
    assert "affine" in first and "affine" not in second


def _output_only_program() -> schema.Program:
    """A delegate whose one result is the method's one output and read by nothing else."""
    b = MethodBuilder()
    x, y = b.input("x", (2, 2)), b.input("y", (2, 2))
    delegated = b.planned((2, 2))
    b.instruction(lambda d: schema.DelegateCall(0, (x, y), (delegated,), d),
                  "executorch_call_delegate", "model.py:30")
    b.outputs += [delegated]
    return program_of(b, delegates=[schema.Delegate("affine", b"scale=2", ())])


class BufferBackend(AffineBackend):
    """Writes every result into one buffer it keeps: its outputs are NOT fresh."""

    def __init__(self, fresh: bool = False) -> None:
        super().__init__()
        self.buffer = torch.empty(2, 2)
        self.fresh_outputs = fresh
        self.shape = (2, 2)

    def execute(self, handle, inputs):
        self.calls += 1
        a, b = inputs
        if self.shape != (2, 2):
            return [torch.zeros(self.shape)]
        return [torch.mul(a, handle, out=self.buffer).add_(b)]


def test_results_of_a_backend_reusing_its_buffers_are_copies():
    backend = BufferBackend()
    method = Program.from_schema(_output_only_program(), delegates=_registry(backend)).method()
    x = torch.randn(2, 2)
    results = [method(x, torch.full((2, 2), float(k)))[0] for k in range(3)]  # checked + trusted
    for k, got in enumerate(results):
        torch.testing.assert_close(got, x * 2 + k)
        assert got.data_ptr() != backend.buffer.data_ptr()


def test_fresh_outputs_are_handed_to_the_caller_without_a_copy():
    class Fresh(AffineBackend):
        fresh_outputs = True

        def execute(self, handle, inputs):
            self.last = super().execute(handle, inputs)[0]
            return [self.last]

    backend = Fresh()
    method = Program.from_schema(_output_only_program(), delegates=_registry(backend)).method()
    x, y = torch.randn(2, 2), torch.randn(2, 2)
    first = method(x, y)[0]  # checked run: stored in the plan, cloned
    assert first is not backend.last
    second = method(x, y)[0]  # trusted run: the backend's own new tensor
    assert second is backend.last
    third = method(x, 2 * y)[0]
    torch.testing.assert_close(second, x * 2 + y)  # unchanged by the later call
    torch.testing.assert_close(third, x * 2 + 2 * y)


def test_a_fresh_backend_returning_the_wrong_shape_later_fails_naming_the_call():
    backend = BufferBackend(fresh=True)
    method = Program.from_schema(_output_only_program(), delegates=_registry(backend)).method()
    x = torch.randn(2, 2)
    method(x, x)
    method(x, x)
    backend.shape = (3, 2)
    with pytest.raises(RuntimeFailure, match=r"instruction 0.*\n.*model.py:30(.|\n)*planned shape"):
        method(x, x)
    backend.shape = (2, 2)
    torch.testing.assert_close(method(x, x)[0], x * 3)  # checked again, then fine


def test_a_fresh_backend_returning_too_many_results_later_fails_naming_the_call():
    backend = BufferBackend(fresh=True)
    method = Program.from_schema(_output_only_program(), delegates=_registry(backend)).method()
    x = torch.randn(2, 2)
    method(x, x)
    method(x, x)  # trusted from here on
    backend.outputs = 2
    original = BufferBackend.execute

    def twice(self, handle, inputs):
        return original(self, handle, inputs) * self.outputs

    backend.execute = types.MethodType(twice, backend)
    with pytest.raises(RuntimeFailure, match="delegate returned 2 outputs; the program expects 1"):
        method(x, x)


class SharedFresh(BufferBackend):
    """A fresh, thread-safe backend: a method that is only its call runs it directly."""

    thread_safe = True

    def __init__(self) -> None:
        super().__init__(fresh=True)

    def execute(self, handle, inputs):
        self.calls += 1
        a, b = inputs
        if self.shape != (2, 2):
            return [torch.zeros(self.shape)] * self.outputs
        return [a * handle + b] * self.outputs


def _direct_method(backend):
    method = Program.from_schema(_output_only_program(), delegates=_registry(backend)).method()
    assert method._state._direct is not None  # a lone delegate call: the direct path
    return method


def test_a_lone_fresh_delegate_keeps_its_input_checks_on_the_direct_path():
    backend = SharedFresh()
    method = _direct_method(backend)
    x, y = torch.randn(2, 2), torch.randn(2, 2)
    method(x, y)
    torch.testing.assert_close(method(x, y)[0], x * 2 + y)  # trusted: direct
    with pytest.raises(MethodInputError, match=r"input 1 \(y\).*\[2, 2\]"):
        method(x, torch.randn(3, 2))
    with pytest.raises(MethodInputError, match=r"input 0 \(x\).*float32"):
        method(x.double(), y)
    with pytest.raises(MethodInputError, match="takes 2 input"):
        method.execute((x,))
    strided = torch.randn(2, 4)[:, ::2]  # not contiguous: copied by the general path
    torch.testing.assert_close(method(strided, y)[0], strided * 2 + y)
    torch.testing.assert_close(method(x, 3 * y)[0], x * 2 + 3 * y)


def test_a_lone_fresh_delegate_returning_the_wrong_results_fails_naming_the_call():
    backend = SharedFresh()
    method = _direct_method(backend)
    x = torch.randn(2, 2)
    method(x, x)
    method(x, x)
    backend.shape = (3, 2)
    with pytest.raises(RuntimeFailure, match=r"instruction 0.*\n.*model.py:30(.|\n)*planned shape"):
        method(x, x)
    backend.shape = (2, 2)
    torch.testing.assert_close(method(x, x)[0], x * 3)
    method(x, x)
    backend.outputs = 2
    with pytest.raises(RuntimeFailure, match="delegate returned 2 outputs; the program expects 1"):
        method(x, x)
    backend.outputs = 1
    method(x, x)
    backend.execute = types.MethodType(lambda self, h, i: 1 / 0, backend)
    with pytest.raises(RuntimeFailure, match="ZeroDivisionError"):
        method(x, x)
