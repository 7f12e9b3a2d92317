"""Resource limits (``LoadLimits``): small files that ask for unbounded memory or work get a
typed error naming the limit, before the resource is used.

Reproductions of the issue's "unbounded resources from tiny files": a tiny file whose plan asks
for a 64 GiB arena; runtime-allocated tensors (``full.out([2**33])``); a structure of a few
hundred KiB that inflates to hundreds of MiB; programs that run for minutes (``mm`` on
stride-0 views). (The .pt2 member bound is tested in tests/export/test_serialize_limits.py, the
fused_cpu blob's allocations in tests/backends/test_fused_cpu_limits.py.)
"""

from __future__ import annotations

import json
import os
import zlib

import pytest
import torch
from runtime_programs import F32, MethodBuilder, program_of

import exportir
import exportir.runtime
from exportir.format.validate import LoadLimits, ResourceLimitError
from exportir.program import schema, serialize
from exportir.runtime import Program
from exportir.runtime.errors import ResourceLimitExceeded

GiB = 1 << 30


def _rss() -> int:
    """Resident bytes of this process (Linux), for "nothing was allocated" checks."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


linux_only = pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads /proc")


# ------------------------------------------------------------------------------ arenas


def _arena_program(arena_bytes: int) -> bytes:
    b = MethodBuilder()
    x = b.input("x", (4,))
    out = b.planned((4,))
    b.kernel("aten::add", "out", (x, x, b.add(schema.Int(1)), out))
    b.outputs.append(out)
    method = b.build()
    method = schema.Method(**{**{f: getattr(method, f) for f in method.__slots__},
                              "plan": schema.MethodPlan((arena_bytes,), 16, 16)})
    return serialize.serialize_program(schema.Program(schema.FORMAT_VERSION, (method,)))


def test_a_tiny_file_asking_for_a_64_gib_arena_is_refused_at_load():
    data = _arena_program(64 * GiB)
    assert len(data) < 512
    with pytest.raises(ResourceLimitError) as info:
        Program.load(data)
    assert info.value.limit == "max_arena_bytes"
    assert info.value.field == "methods[0].plan.arenas[0]"
    assert "max_arena_bytes" in str(info.value) and "LoadLimits" in str(info.value)


@linux_only
def test_arenas_are_committed_only_as_they_are_written():
    data = _arena_program(8 * GiB)  # under the default limit: loads, and costs nothing
    before = _rss()
    method = Program.load(data).method()
    x = torch.arange(4.0)
    torch.testing.assert_close(method(x)[0], x + x)
    assert _rss() - before < 256 << 20


def test_the_arena_limit_is_settable():
    data = _arena_program(1 << 20)
    Program.load(data)
    with pytest.raises(ResourceLimitError, match="max_arena_bytes"):
        Program.load(data, limits=LoadLimits(max_arena_bytes=1 << 19))


# ------------------------------------------------------------------------------ runtime allocations


def _full_program(size: int) -> schema.Program:
    """out = full([size], 1.0) into a runtime-allocated (DynamicStorage) tensor."""
    b = MethodBuilder()
    n = b.add(schema.Int(size))
    sizes = b.add(schema.IntList((n,)))
    fill = b.add(schema.Double(1.0))
    out = b.add(schema.Tensor(F32, (0,), (0,), schema.DynamicStorage(), True))
    b.kernel("aten::full", "out", (sizes, fill, out), "full", "model.py:3")
    b.outputs.append(out)
    return program_of(b)


@linux_only
def test_a_runtime_allocated_tensor_beyond_the_cap_fails_before_allocating():
    method = Program.from_schema(_full_program(1 << 33)).method()
    before = _rss()
    with pytest.raises(ResourceLimitExceeded) as info:
        method.execute([])
    assert info.value.limit == "max_dynamic_bytes"
    assert info.value.instruction == 0 and info.value.node == "full"
    assert "max_dynamic_bytes" in str(info.value) and "LoadLimits" in str(info.value)
    assert _rss() - before < 256 << 20
    # the method still works for what fits
    small = Program.from_schema(_full_program(10)).method()
    assert small.execute([])[0].tolist() == [1.0] * 10


def test_runtime_allocated_tensors_are_capped_together():
    """Two runtime-allocated tensors, each under the cap, together over it."""
    b = MethodBuilder()
    sizes = b.add(schema.IntList((b.add(schema.Int(100)),)))
    fill = b.add(schema.Double(2.0))
    first = b.add(schema.Tensor(F32, (0,), (0,), schema.DynamicStorage(), True))
    second = b.add(schema.Tensor(F32, (0,), (0,), schema.DynamicStorage(), True))
    b.kernel("aten::full", "out", (sizes, fill, first), "first")
    b.kernel("aten::full", "out", (sizes, fill, second), "second")
    b.outputs += [first, second]
    program = program_of(b)
    assert len(Program.from_schema(program).method().execute([])) == 2
    method = Program.from_schema(program, limits=LoadLimits(max_dynamic_bytes=600)).method()
    with pytest.raises(ResourceLimitExceeded, match="hold 800 bytes") as info:
        method.execute([])
    assert info.value.instruction == 1
    with pytest.raises(ResourceLimitExceeded):  # every call, not just the first
        method.execute([])


def test_a_delegate_result_beyond_the_cap_is_refused():
    """A delegate output stored into a runtime-allocated tensor goes through the same cap."""

    class Big:
        def init(self, processed, compile_specs):
            return None

        def execute(self, handle, inputs):
            return [torch.zeros(1000)]

    b = MethodBuilder()
    out = b.add(schema.Tensor(F32, (0,), (0,), schema.DynamicStorage(), True))
    b.instruction(lambda d: schema.DelegateCall(0, (), (out,), d), "big")
    b.outputs.append(out)
    program = program_of(b, delegates=[schema.Delegate("big", b"", ())])
    registry = exportir.runtime.DelegateRegistry({"big": Big()})
    ok = Program.from_schema(program, delegates=registry).method()
    assert ok.execute([])[0].shape == (1000,)
    capped = Program.from_schema(program, delegates=registry,
                                 limits=LoadLimits(max_dynamic_bytes=1000)).method()
    with pytest.raises(ResourceLimitExceeded, match="max_dynamic_bytes") as info:
        capped.execute([])
    assert info.value.instruction == 0


# ------------------------------------------------------------------------------ structure


def _with_structure(raw: bytes) -> bytes:
    """A program file whose structure section is ``raw`` (valid checksums)."""
    data = bytearray(_arena_program(1 << 10))
    layout = serialize.read_layout(bytes(data))
    compressed = zlib.compress(raw, 9)
    structure = compressed + bytes(-(80 + len(compressed)) % 64)
    segment = bytes(data[layout.data_offset:])
    fields = [serialize.MAGIC, layout.major, layout.minor, 0, 80 + len(structure) + len(segment),
              80, len(compressed), len(raw), 80 + len(structure), len(segment),
              zlib.crc32(compressed), zlib.crc32(segment), 0]
    head = serialize._HEADER.pack(*fields)
    fields[-1] = zlib.crc32(head[:serialize._HEADER_CRC_SPAN])
    return serialize._HEADER.pack(*fields) + bytes(4) + structure + segment


def test_a_structure_inflating_beyond_the_limit_is_refused_before_inflating():
    raw = b'{"pad":"' + b" " * (200 << 20) + b'"}'
    data = _with_structure(raw)
    assert len(data) < 300 << 10  # a few hundred KiB
    with pytest.raises(ResourceLimitError) as info:
        Program.load(data)
    assert info.value.limit == "max_structure_bytes"
    assert info.value.field == "header.structure_raw_length"


@linux_only
def test_a_structure_of_too_many_items_is_refused_before_parsing():
    raw = b"[" + b"[]," * (6 << 20) + b"[]]"  # 18 MiB, 6M lists: gigabytes once parsed
    data = _with_structure(raw)
    before = _rss()
    with pytest.raises(ResourceLimitError) as info:
        Program.load(data)
    assert info.value.limit == "max_structure_items"
    assert _rss() - before < 200 << 20


def test_a_header_understating_the_structure_stops_inflating_at_its_length():
    raw = json.dumps({"pad": " " * (1 << 20)}).encode()
    data = bytearray(_with_structure(raw))
    layout = serialize.read_layout(bytes(data))
    fields = [serialize.MAGIC, layout.major, layout.minor, 0, layout.file_size, 80,
              layout.structure_length, 100, layout.data_offset, layout.data_length,
              layout.structure_crc, layout.data_crc, 0]
    head = serialize._HEADER.pack(*fields)
    fields[-1] = zlib.crc32(head[:serialize._HEADER_CRC_SPAN])
    data[:76] = serialize._HEADER.pack(*fields)
    with pytest.raises(serialize.ProgramLoadError, match="different length"):
        Program.load(bytes(data))


def test_the_structure_limits_are_settable():
    data = _arena_program(1 << 10)
    with pytest.raises(ResourceLimitError, match="max_structure_items"):
        Program.load(data, limits=LoadLimits(max_structure_items=10))
    with pytest.raises(ResourceLimitError, match="max_structure_bytes"):
        Program.load(data, limits=LoadLimits(max_structure_bytes=100))


# ------------------------------------------------------------------------------ work


def _stride0_mm_program(n: int = 8192, calls: int = 50) -> bytes:
    """``calls`` x ``mm`` of two n x n stride-0 views of one constant element: ~1 KB of file,
    minutes of work."""
    b = MethodBuilder()
    one = b.constant(torch.ones(1))
    view = b.view(one, (n, n), (0, 0))
    out = b.planned((n, n))
    for k in range(calls):
        b.kernel("aten::mm", "out", (view, view, out), f"mm_{k}", "model.py:9")
    b.outputs.append(out)
    return serialize.serialize_program(program_of(b))


def test_a_tiny_program_of_minutes_of_work_is_refused_under_a_work_budget():
    data = _stride0_mm_program()
    assert len(data) < 2048
    with pytest.raises(ResourceLimitError) as info:
        Program.load(data, limits=LoadLimits(max_work=10**12))
    assert info.value.limit == "max_work"
    assert info.value.field == "methods[0].instructions[0]"
    assert "aten::mm.out" in str(info.value) and "2.75e+13" in str(info.value)


def test_the_work_budget_admits_real_programs():
    from exportir.format.work import method_work

    x = torch.randn(4, 16)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    data = exportir.to_edge(exportir.export(model, (x,))).to_program().buffer
    program = serialize.deserialize_program(data)
    total = sum(method_work(program.methods[0]))
    assert 4 * 16 * 32 + 4 * 32 * 8 <= total < 10 * (4 * 16 * 32 + 4 * 32 * 8)
    method = Program.load(data, limits=LoadLimits(max_work=total)).method()
    torch.testing.assert_close(method(x), model(x))
    with pytest.raises(ResourceLimitError, match="max_work"):
        Program.load(data, limits=LoadLimits(max_work=total - 1))
