"""The fused CPU backend ahead of time: ``preprocess`` turns an Edge program into a blob.

The blob (format in :mod:`exportir.runtime.backends.fused_cpu`) is a JSON op list over value
slots plus the raw bytes of the constant tensors the program owns: no pickle, nothing executable.
While encoding, ``preprocess`` plans two savings the executor applies: each intermediate is
released after its last reader, and a unary op whose input is a dead intermediate of the same
shape and dtype runs in place (``relu`` after ``addmm`` reuses the matmul's result).

Compile specs: ``inplace`` (``b"1"`` default, ``b"0"`` to disable the in-place reuse).
"""

from __future__ import annotations

import json
import math
import operator
import struct
from collections.abc import Sequence
from typing import Any

import torch

from exportir.dialects.backend import BackendDetails, CompileSpec, PreprocessResult
from exportir.dialects.edge.verifier import user_source_line
from exportir.export.signature import InputKind, OutputKind
from exportir.fx.node import Node
from exportir.runtime.backends.fused_cpu import (
    ALIGNMENT,
    BACKEND_ID,
    DTYPES,
    FORMAT_VERSION,
    INPLACE,
    MAGIC,
    OPS,
    FusedCpuRuntime,
)

__all__ = ["FusedCpuBackend", "FusedCpuLoweringError", "encode_arg", "op_name"]

_DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
_SPECS = {"inplace": (b"0", b"1")}


class FusedCpuLoweringError(ValueError):
    """The program holds something the fused CPU backend cannot run."""


class Unencodable(ValueError):
    """An argument the blob cannot express."""


def op_name(target: Any) -> str | None:
    """``aten.add.Tensor`` for an edge or ATen op overload, else None."""
    op = getattr(target, "aten_op", target)
    if isinstance(op, torch._ops.OpOverload):
        return str(op)
    return None


def encode_arg(x: Any, slot_of: Any) -> Any:
    """JSON form of one op argument; ``slot_of(node)`` gives a node's value slot."""
    if isinstance(x, Node):
        return {"v": slot_of(x)}
    if x is None or isinstance(x, (bool, int, str)):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else {"float": str(x)}
    if isinstance(x, (list, tuple)):
        return [encode_arg(v, slot_of) for v in x]
    if isinstance(x, torch.dtype) and x in _DTYPE_NAMES:
        return {"dtype": _DTYPE_NAMES[x]}
    if isinstance(x, torch.device) and x.type == "cpu":
        return {"device": "cpu"}
    if x is torch.strided:
        return {"layout": "strided"}
    if isinstance(x, torch.memory_format):
        name = str(x).removeprefix("torch.")
        if name in ("contiguous_format", "preserve_format", "channels_last"):
            return {"memory_format": name}
    raise Unencodable(f"{type(x).__name__} {x!r}")


def _tensor_bytes(t: torch.Tensor) -> bytes:
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def _fail(node: Node, what: str, way_out: str) -> FusedCpuLoweringError:
    return FusedCpuLoweringError(
        f"fused_cpu cannot lower node {node.name} (op {node.target}), from "
        f"{user_source_line(node)}: {what}. Way out: {way_out}"
    )


_PARTITION_HINT = "delegate with FusedCpuPartitioner(), which leaves such nodes to the runtime"


class _Encoder:
    """Walks one Edge program and builds the blob header and data segment."""

    def __init__(self, program: Any, inplace: bool) -> None:
        self.program = program
        self.inplace_enabled = inplace
        self.slot: dict[Node, int] = {}
        self.items: dict[Node, list[int]] = {}
        self.count = 0
        self.data = bytearray()
        self.constants: list[list[Any]] = []
        self.inputs: list[int] = []
        self.ops: list[list[Any]] = []
        self.op_nodes: list[Node] = []
        self.produced: dict[int, Node] = {}

    def new_slot(self) -> int:
        self.count += 1
        return self.count - 1

    def slot_of(self, node: Node) -> int:
        if node not in self.slot:
            raise Unencodable(f"value {node.name} is not a tensor the backend computed")
        return self.slot[node]

    def placeholders(self) -> None:
        specs = self.program.graph_signature.input_specs
        nodes = self.program.graph.find_nodes(op="placeholder")
        for spec, node in zip(specs, nodes):
            self.slot[node] = slot = self.new_slot()
            if spec.kind == InputKind.USER_INPUT:
                if not isinstance(node.meta.get("val"), torch.Tensor):
                    raise _fail(node, "a non-tensor input", _PARTITION_HINT)
                self.inputs.append(slot)
            elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                self.constant(slot, self._state(spec.target), node)
            else:
                raise _fail(node, f"a {spec.kind.name} input", _PARTITION_HINT)

    def _state(self, target: str) -> torch.Tensor:
        if target in self.program.state_dict:
            return self.program.state_dict[target]
        return self.program.constants[target]

    def constant(self, slot: int, tensor: torch.Tensor, node: Node) -> None:
        if tensor.dtype not in _DTYPE_NAMES:
            raise _fail(node, f"a constant of dtype {tensor.dtype}", _PARTITION_HINT)
        pad = -len(self.data) % ALIGNMENT
        self.data += b"\0" * pad
        raw = _tensor_bytes(tensor)
        self.constants.append(
            [slot, _DTYPE_NAMES[tensor.dtype], list(tensor.shape), len(self.data), len(raw)]
        )
        self.data += raw

    def call(self, node: Node) -> None:
        if node.target is operator.getitem:
            src, index = node.args
            self.slot[node] = self.items[src][index]
            return
        name = op_name(node.target)
        if name not in OPS:
            raise _fail(
                node, f"{name or node.target} is not an op the backend runs", _PARTITION_HINT
            )
        try:
            args = encode_arg(list(node.args), self.slot_of)
            kwargs = {k: encode_arg(v, self.slot_of) for k, v in node.kwargs.items()}
        except Unencodable as e:
            raise _fail(node, f"argument {e} cannot be stored", _PARTITION_HINT) from None
        val = node.meta.get("val")
        if isinstance(val, (tuple, list)):
            outs: Any = [self.new_slot() for _ in val]
            self.items[node] = outs
            for s in outs:
                self.produced[s] = node
        else:
            outs = self.slot[node] = self.new_slot()
            self.produced[outs] = node
        self.ops.append([name, args, kwargs, outs, node.name])
        self.op_nodes.append(node)

    def outputs(self) -> list[int]:
        for spec in self.program.graph_signature.output_specs:
            if spec.kind != OutputKind.USER_OUTPUT:
                raise FusedCpuLoweringError(
                    f"fused_cpu runs functional programs; output {spec.arg} is a "
                    f"{spec.kind.name}. Way out: {_PARTITION_HINT}"
                )
        output = self.program.graph.output_node()
        result = []
        for value in output.args[0]:
            if not isinstance(value, Node):
                raise _fail(output, f"the literal output {value!r}", _PARTITION_HINT)
            result.append(self.slot_of(value))
        return result

    def plan(self, outputs: list[int]) -> tuple[list[list[int]], list[int]]:
        """Per op: slots released after it, and whether it may run in place."""
        keep = set(outputs) | {c[0] for c in self.constants}
        last: dict[int, int] = {}
        for i, row in enumerate(self.ops):
            for s in _refs(row[1]) + _refs(list(row[2].values())):
                last[s] = i
        free: list[list[int]] = [[] for _ in self.ops]
        for s, i in last.items():
            if s not in keep:
                free[i].append(s)
        inplace = [int(self._can_run_inplace(i, row, last, keep)) for i, row in enumerate(self.ops)]
        return [sorted(f) for f in free], inplace

    def _can_run_inplace(
        self, i: int, row: list[Any], last: dict[int, int], keep: set[int]
    ) -> bool:
        if not self.inplace_enabled or row[0] not in INPLACE or not row[1]:
            return False
        first = row[1][0]
        if not (isinstance(first, dict) and "v" in first):
            return False
        s = first["v"]
        producer = self.produced.get(s)
        if producer is None or s in keep or last.get(s) != i or _refs(row[1][1:]).count(s):
            return False
        src_val = producer.meta.get("val")
        if isinstance(src_val, (tuple, list)):
            return False
        out_val = self.op_nodes[i].meta.get("val")
        return (
            isinstance(src_val, torch.Tensor)
            and isinstance(out_val, torch.Tensor)
            and src_val.dtype == out_val.dtype
            and src_val.shape == out_val.shape
        )

    def blob(self) -> bytes:
        for node in self.program.graph.nodes:
            if node.op == "call_function":
                self.call(node)
            elif node.op == "get_attr":
                raise _fail(node, "a get_attr", _PARTITION_HINT)
        outputs = self.outputs()
        free, inplace = self.plan(outputs)
        header = {
            "values": self.count,
            "inputs": self.inputs,
            "outputs": outputs,
            "constants": self.constants,
            "ops": self.ops,
            "free": free,
            "inplace": inplace,
        }
        text = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
        head = struct.pack("<4sII", MAGIC, FORMAT_VERSION, len(text)) + text
        head += b"\0" * (-len(head) % ALIGNMENT)
        return head + bytes(self.data)


def _refs(x: Any) -> list[int]:
    if isinstance(x, dict):
        return [x["v"]] if "v" in x else []
    if isinstance(x, list):
        return [s for v in x for s in _refs(v)]
    return []


def _parse_specs(compile_specs: Sequence[CompileSpec]) -> dict[str, bytes]:
    found: dict[str, bytes] = {}
    for spec in compile_specs:
        allowed = _SPECS.get(spec.key)
        if allowed is None:
            raise ValueError(
                f"fused_cpu: unknown compile spec {spec.key!r}; known: {sorted(_SPECS)}"
            )
        if spec.value not in allowed:
            raise ValueError(
                f"fused_cpu: compile spec {spec.key!r} takes one of {allowed}; got {spec.value!r}"
            )
        found[spec.key] = spec.value
    return found


class FusedCpuBackend(BackendDetails):
    """The shipped CPU backend: runs fused ATen subgraphs from a JSON op-list blob."""

    backend_id = BACKEND_ID

    @classmethod
    def preprocess(
        cls, edge_program: Any, compile_specs: Sequence[CompileSpec]
    ) -> PreprocessResult:
        specs = _parse_specs(compile_specs)
        encoder = _Encoder(edge_program, inplace=specs.get("inplace", b"1") == b"1")
        encoder.placeholders()
        data = encoder.blob()
        handles = {i: (node.name,) for i, node in enumerate(encoder.op_nodes)}
        return PreprocessResult(data, handles)

    @classmethod
    def runtime(cls) -> FusedCpuRuntime:
        return FusedCpuRuntime()
