"""Program files: round trip, determinism, layout (alignment, zero-copy), printer."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from program_samples import sample_program, view_program

from exportir.program import printer, schema, serialize, validate

SRC = Path(__file__).resolve().parents[2] / "src"


def test_round_trip_every_value_and_instruction_kind():
    p = sample_program()
    data = serialize.serialize_program(p)
    q = serialize.deserialize_program(data)
    assert q == p
    kinds = {type(v) for m in q.methods for v in m.values}
    assert kinds == set(schema.EVALUE_TYPES)
    assert {type(i) for i in q.methods[0].instructions} == set(schema.INSTRUCTION_TYPES)
    v = view_program()
    assert serialize.deserialize_program(serialize.serialize_program(v)) == v


def test_same_program_same_bytes():
    assert serialize.serialize_program(sample_program()) == serialize.serialize_program(
        sample_program()
    )


def test_reserialize_loaded_program_gives_same_bytes():
    data = serialize.serialize_program(sample_program())
    assert serialize.serialize_program(serialize.deserialize_program(data)) == data


def test_layout_alignment_and_zero_copy():
    data = serialize.serialize_program(sample_program())
    layout = serialize.read_layout(data)
    assert data[:8] == serialize.MAGIC
    assert layout.major == schema.FORMAT_VERSION
    assert layout.file_size == len(data)
    assert layout.data_offset % 64 == 0
    q = serialize.deserialize_program(data)
    base = layout.data_offset
    for c in q.constants:
        assert isinstance(c.data, memoryview)  # a view of the file, not a copy
        assert c.data.obj is data
    raw = zlib.decompress(data[layout.structure_offset:layout.structure_offset
                               + layout.structure_length])
    tree = json.loads(raw)
    for offset, _ in tree["constants"]:
        assert (base + offset) % 16 == 0
    assert raw == json.dumps(tree, sort_keys=True, separators=(",", ":")).encode()  # canonical


def test_buffer_alignment_64():
    data = serialize.serialize_program(sample_program(), buffer_alignment=64)
    layout = serialize.read_layout(data)
    q = serialize.deserialize_program(data)
    raw = zlib.decompress(data[layout.structure_offset:layout.structure_offset
                               + layout.structure_length])
    assert all(off % 64 == 0 for off, _ in json.loads(raw)["constants"])
    assert q == sample_program()


def test_save_and_load_with_mmap(tmp_path):
    path = tmp_path / "model.xpt"
    serialize.save(sample_program(), path)
    assert path.read_bytes() == serialize.serialize_program(sample_program())
    q = serialize.load(path)
    assert q == sample_program()
    assert serialize.load(path, use_mmap=False) == sample_program()
    assert serialize.load(path.read_bytes()) == sample_program()


def test_empty_file_and_missing_file(tmp_path):
    path = tmp_path / "empty.xpt"
    path.write_bytes(b"")
    with pytest.raises(validate.ProgramLoadError, match="empty"):
        serialize.load(path)
    with pytest.raises(FileNotFoundError):
        serialize.load(tmp_path / "missing.xpt")


def test_file_overhead_is_small_for_weight_heavy_programs():
    weights = bytes(range(256)) * 4096 * 4  # 4 MiB
    p = dataclasses.replace(sample_program(), constants=(schema.ConstantBuffer(weights[:24]),
                                                         schema.ConstantBuffer(weights[:12])))
    big = schema.ConstantBuffer(weights)
    p = dataclasses.replace(p, constants=p.constants + (big,))
    data = serialize.serialize_program(p)
    assert len(data) / sum(c.nbytes for c in p.constants) <= 1.002


def test_format_modules_import_without_torch():
    code = ("import sys; import exportir.format.serialize, exportir.format.validate, "
            "exportir.program.printer; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={"PYTHONPATH": str(SRC)})
    assert out.stdout.strip() == "False"


def test_printer_shows_methods_ops_plan_and_sizes():
    data = serialize.serialize_program(sample_program())
    text = printer.format_program(serialize.deserialize_program(data), serialize.read_layout(data))
    for expected in ("Method 'forward'", "Method 'other'", "aten::add.out", "model.py:3",
                     "memory plan: 1 arena(s)", "lower bound 72 B", "delegate#0[fused_cpu]",
                     "move %16 -> %14", "jump_false %6 -> @4", "free %15", "Size breakdown",
                     "state init=const#1", "f32[2, 3] input", "compile specs: mode"):
        assert expected in text, expected


def test_format_1_0_file_still_loads():
    """A committed file written by format 1.0: later readers must keep loading it."""
    path = Path(__file__).resolve().parent / "data" / "program_v1_0.xpt"
    assert serialize.load(path) == dataclasses.replace(sample_program(), version=1)


def test_format_2_0_file_with_views_still_loads():
    """A committed file written by format 2.0 (views: ``ViewOf`` storage)."""
    path = Path(__file__).resolve().parent / "data" / "program_v2_0.xpt"
    assert serialize.load(path) == view_program()


def test_printer_shows_views():
    text = printer.format_program(view_program())
    assert "%19: f32[4, 2, 3] dim_order=(1, 2, 0) view of %3 (offset 0, strides (0, 3, 1))" in text
    assert "%18: f32[3] view of %1 (offset 3, strides (1,))" in text
