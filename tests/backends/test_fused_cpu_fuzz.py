"""Malformed fused CPU blobs: every mutation of a valid blob either loads and runs like a blob
or is refused with FusedCpuBlobError -- never another exception, never a crash."""

from __future__ import annotations

import json
import random
import struct

import pytest
import torch
from torch import nn

from exportir.backends.fused_cpu import FusedCpuBackend
from exportir.backends.fused_cpu.runtime import (
    FusedCpuBlobError,
    FusedCpuExecutionError,
    decode,
    run,
)
from exportir.export import export
from exportir.program.manager import to_edge


def _valid() -> bytes:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.LayerNorm(6), nn.Linear(6, 2))
    ep = to_edge(export(model, (torch.randn(3, 4),))).exported_program()
    return FusedCpuBackend.preprocess(ep, []).processed_bytes


def _split(blob: bytes) -> tuple[dict, bytes]:
    _, _, length = struct.unpack_from("<4sII", blob)
    return json.loads(blob[12 : 12 + length]), blob[-(-(12 + length) // 16) * 16 :]


def _join(header: object, data: bytes) -> bytes:
    text = json.dumps(header).encode()
    head = struct.pack("<4sII", b"XFC1", 2, len(text)) + text
    return head + b"\0" * (-len(head) % 16) + data


_ODD = [None, True, -1, 0, 1, 2, 3, 7, 1 << 40, 1.5, float("nan"), "x", "aten.relu.default", [],
        [0], [[0]], {}, {"v": 0}, {"v": 99}, {"dtype": "float32"}, {"v": -1}, [{"v": 1}] * 3]  # fmt: skip


def _mutate(value: object, rng: random.Random) -> object:
    """A copy of a JSON value with one leaf, list or dict entry replaced, dropped or added."""
    if isinstance(value, dict) and value and rng.random() < 0.8:
        key = rng.choice(sorted(value))
        out = dict(value)
        roll = rng.random()
        if roll < 0.1:
            del out[key]
        elif roll < 0.6:
            out[key] = _mutate(value[key], rng)
        else:
            out[key] = rng.choice(_ODD)
        return out
    if isinstance(value, list) and value and rng.random() < 0.8:
        i = rng.randrange(len(value))
        out = list(value)
        roll = rng.random()
        if roll < 0.1:
            del out[i]
        elif roll < 0.2:
            out.insert(i, rng.choice(_ODD))
        elif roll < 0.7:
            out[i] = _mutate(value[i], rng)
        else:
            out[i] = rng.choice(_ODD)
        return out
    return rng.choice(_ODD)


def test_mutated_headers_are_refused_or_run():
    header, data = _split(_valid())
    rng = random.Random(0)
    loaded = refused = 0
    for _ in range(600):
        blob = _join(_mutate(header, rng), data)
        try:
            program = decode(blob)
        except FusedCpuBlobError:
            refused += 1
            continue
        loaded += 1
        try:
            run(program, [torch.randn(3, 4) for _ in program.inputs])
        except FusedCpuExecutionError:
            pass
    assert refused > 300 and loaded > 10


def test_flipped_bytes_are_refused_or_run():
    blob = bytearray(_valid())
    rng = random.Random(1)
    for _ in range(300):
        mutated = bytearray(blob)
        for _ in range(rng.randint(1, 4)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        try:
            decode(bytes(mutated))
        except FusedCpuBlobError:
            pass


def test_deeply_nested_arguments_are_refused():
    header, data = _split(_valid())
    header["ops"][0][1] = ["DEEP"]
    text = json.dumps(header).replace('"DEEP"', "[" * 50_000 + "0" + "]" * 50_000)
    blob = struct.pack("<4sII", b"XFC1", 2, len(text)) + text.encode()
    blob += b"\0" * (-len(blob) % 16) + data
    with pytest.raises(FusedCpuBlobError, match="header"):
        decode(blob)
