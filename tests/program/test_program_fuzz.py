"""Hypothesis fuzz of the program loader: truncated, bit-flipped, oversized and garbage inputs
either load (and then are valid) or raise ProgramLoadError; never another exception."""

from __future__ import annotations

import json
import struct
import zlib

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from program_samples import view_program

from exportir.format.validate import ProgramLoadError
from exportir.program import serialize, validate

GOOD = serialize.serialize_program(view_program())  # every value, storage and instruction kind
_SETTINGS = settings(max_examples=300, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])


def _load(data: bytes, verify_data: bool = True) -> None:
    try:
        program = serialize.deserialize_program(data, verify_data=verify_data)
    except ProgramLoadError as e:
        assert e.reason
        return
    validate.validate_program(program)  # whatever loads is valid


@_SETTINGS
@given(st.integers(0, len(GOOD)))
def test_truncated(n):
    _load(GOOD[:n])


@_SETTINGS
@given(st.lists(st.integers(0, len(GOOD) * 8 - 1), min_size=1, max_size=8), st.booleans())
def test_bit_flips(bits, verify_data):
    data = bytearray(GOOD)
    for b in bits:
        data[b // 8] ^= 1 << (b % 8)
    _load(bytes(data), verify_data)


@_SETTINGS
@given(st.binary(min_size=0, max_size=4096))
def test_garbage_and_oversized(tail):
    _load(GOOD + tail)
    _load(tail)
    _load(serialize.MAGIC + tail)


def _refile(raw: bytes, raw_length: int | None = None) -> bytes:
    """A file with a valid header and checksums around an arbitrary structure."""
    comp = zlib.compress(raw)
    layout = serialize.read_layout(GOOD)
    segment = GOOD[layout.data_offset:]
    data_offset = (80 + len(comp) + 63) // 64 * 64
    head = struct.pack("<8sHHIQQQQQQII", serialize.MAGIC, 1, 0, 0, data_offset + len(segment),
                       80, len(comp), len(raw) if raw_length is None else raw_length,
                       data_offset, len(segment), zlib.crc32(comp), zlib.crc32(segment))
    head += struct.pack("<I", zlib.crc32(head)) + bytes(4)
    return head + comp + bytes(data_offset - 80 - len(comp)) + segment


_STRUCTURE = zlib.decompress(GOOD[80:80 + serialize.read_layout(GOOD).structure_length])
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=6),
    max_leaves=30,
)


@_SETTINGS
@given(st.integers(0, len(_STRUCTURE) - 1), st.integers(0, 255), st.booleans())
def test_structure_mutations_behind_valid_checksums(pos, byte, drop):
    raw = bytearray(_STRUCTURE)
    if drop:
        del raw[pos]
    else:
        raw[pos] = byte
    _load(_refile(bytes(raw)))


@_SETTINGS
@given(st.data())
def test_structure_subtree_replacement(data):
    tree = json.loads(_STRUCTURE)
    node, path = tree, []
    while isinstance(node, (list, dict)) and node and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(node) if isinstance(node, dict)
                                        else range(len(node))))
        path.append((node, key))
        node = node[key]
    if path:
        parent, key = path[-1]
        parent[key] = data.draw(_json)
    else:
        tree = data.draw(_json)
    _load(_refile(json.dumps(tree).encode()))


def test_huge_declared_lengths_do_not_allocate():
    _load(_refile(_STRUCTURE, raw_length=1 << 62))
    huge = json.loads(_STRUCTURE)
    huge["methods"][0]["plan"][0] = [1 << 60]
    _load(_refile(json.dumps(huge).encode()))
    huge = json.loads(_STRUCTURE)
    huge["methods"][0]["values"][3][2] = [1 << 62, 1 << 62]
    _load(_refile(json.dumps(huge).encode()))
