"""Corrupted files never crash the runtime: Program.load raises ProgramLoadError or (for flips
the format cannot see, e.g. in padding) loads a program that still runs."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from runtime_programs import add_mul_program, view_program

from exportir.format import serialize
from exportir.runtime import Program, ProgramLoadError

DATA = serialize.serialize_program(add_mul_program())
VIEWS = serialize.serialize_program(view_program())


def _load_and_run(data: bytes) -> None:
    try:
        program = Program.load(data)
    except ProgramLoadError:
        return
    method = program.method()
    method(*(torch.ones(2, 3) for _ in method.input_names))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(DATA) - 1), st.integers(0, 7)), min_size=1,
                max_size=4))
def test_bit_flips(flips):
    data = bytearray(DATA)
    for offset, bit in flips:
        data[offset] ^= 1 << bit
    _load_and_run(bytes(data))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(VIEWS) - 1), st.integers(0, 7)), min_size=1,
                max_size=4))
def test_bit_flips_in_a_program_with_views(flips):
    data = bytearray(VIEWS)
    for offset, bit in flips:
        data[offset] ^= 1 << bit
    _load_and_run(bytes(data))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, len(DATA) - 1))
def test_truncation(cut):
    with pytest.raises(ProgramLoadError):
        Program.load(DATA[:cut])


@settings(max_examples=20, deadline=None)
@given(st.binary(min_size=1, max_size=4096))
def test_trailing_garbage(extra):
    with pytest.raises(ProgramLoadError):
        Program.load(DATA + extra)


def test_unverified_data_segment_corruption_still_runs_safely():
    # with the checksum skipped, flipped weight bits change numbers, never memory safety
    data = bytearray(DATA)
    data[-1] ^= 0xFF
    program = Program.load(bytes(data), verify_data=False)
    (out,) = program.method()(torch.ones(2, 3), torch.ones(2, 3))
    assert out.shape == (2, 3)
