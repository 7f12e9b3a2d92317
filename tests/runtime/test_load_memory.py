"""What loading costs in memory and time: fused_cpu constants view the program's bytes (no copy
next to the packed weight), and the garbage collector is paused while loading and restored
after, also when the load fails."""

from __future__ import annotations

import gc
import json
import os

import pytest
import torch
from test_delegate_blobs import delegated_file, fused_blob

from exportir.runtime import Program, ProgramLoadError
from exportir.runtime.backends.fused_cpu import format as blob_format
from exportir.runtime.backends.fused_cpu import run
from exportir.runtime.program import collector_paused

_ADD = [["aten.add.Tensor", [{"v": 0}, {"v": 1}], {}, 2, "add"]]


def _address_range(buffer: bytes) -> tuple[int, int]:
    start = torch.frombuffer(buffer, dtype=torch.uint8).data_ptr()
    return start, start + len(buffer)


def test_fused_constants_view_the_blob_without_copying():
    weight = torch.arange(6.0).reshape(2, 3)
    blob = fused_blob(_ADD, weight)
    ((slot, tensor),) = blob_format.decode_blob(blob).constants
    start, end = _address_range(blob)
    assert slot == 1 and start <= tensor.data_ptr() < end  # inside the blob: not a copy
    torch.testing.assert_close(tensor, weight)


def test_misaligned_fused_constant_is_copied_and_still_right():
    weight = torch.arange(6.0).reshape(2, 3)
    data = b"\0" + weight.numpy().tobytes()  # the weight 1 byte past an aligned start
    header = json.dumps({
        "values": 3, "inputs": [0], "outputs": [2],
        "constants": [[1, "float32", [2, 3], 1, len(data) - 1]], "ops": _ADD, "inplace": [0],
    }).encode()
    prelude = blob_format._PRELUDE.pack(blob_format.MAGIC, blob_format.FORMAT_VERSION, len(header))
    pad = -(len(prelude) + len(header)) % blob_format.ALIGNMENT
    ((_, tensor),) = blob_format.decode_blob(prelude + header + bytes(pad) + data).constants
    assert tensor.data_ptr() % 4 == 0  # its own aligned copy
    torch.testing.assert_close(tensor, weight)


def test_loaded_fused_program_runs_on_its_viewed_constants():
    weight = torch.randn(2, 3)
    program = Program.load(delegated_file(fused_blob(_ADD, weight), (2, 3), (2, 3)))
    x = torch.randn(2, 3)
    torch.testing.assert_close(program.method()(x)[0], x + weight)
    torch.testing.assert_close(program.method()(x)[0], x + weight)  # the constant unchanged
    assert run  # the executor module is the one the program used


@pytest.mark.parametrize("enabled", [True, False])
def test_collector_is_restored_after_a_load_and_a_failed_load(enabled):
    data = delegated_file(fused_blob(_ADD, torch.ones(2, 3)), (2, 3), (2, 3))
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        Program.load(data).method()
        assert gc.isenabled() is enabled
        with pytest.raises(ProgramLoadError):
            Program.load(data[:-8])
        assert gc.isenabled() is enabled
        with collector_paused():
            with collector_paused():  # nested: still off until the outer one ends
                assert not gc.isenabled()
            assert not gc.isenabled()
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def _resident_bytes_of(path: str) -> int:
    """Resident bytes of this process's mappings of ``path`` (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and not head[0].endswith(":"):  # a mapping's first line
                inside = len(head) >= 6 and head[5] == path
            elif inside and head[0] == "Rss:":
                total += int(head[1]) * 1024
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux's /proc/self/smaps")
def test_a_file_load_leaves_only_what_the_program_reads_resident(tmp_path):
    # loading reads the whole mapped file (checksum, validation): its pages then leave this
    # process's resident memory (they stay cached); a call maps back only what it reads
    weight = torch.randn(1024, 1024)  # 4 MiB
    path = tmp_path / "add.xpt"
    path.write_bytes(delegated_file(fused_blob(_ADD, weight), (1024, 1024), (1024, 1024)))
    program = Program.load(path)
    assert _resident_bytes_of(str(path)) < 1 << 20
    x = torch.randn(1024, 1024)
    torch.testing.assert_close(program.method()(x)[0], x + weight)  # read back from the file
    assert _resident_bytes_of(str(path)) >= 4 << 20
