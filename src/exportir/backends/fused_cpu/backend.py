"""The fused CPU backend ahead of time: ``preprocess`` turns an Edge program into a blob.

The blob (format in :mod:`exportir.runtime.backends.fused_cpu.format`) is a JSON op list over
value slots plus the raw bytes of the constant tensors the program owns: no pickle, nothing
executable. ``preprocess``:

1. reads the Edge program into a small graph (:mod:`.ir`): delegate inputs, the constants it
   owns (their contents known), one op per Edge node;
2. rewrites it (:mod:`.rewrites`): ``linear``/``matmul`` from their decompositions, batch norm
   folded into the convolution before it, layout no-ops dropped, constants folded;
3. lets unary and binary elementwise ops run in place on a dead intermediate of the same shape
   and dtype when nothing sharing its memory is read later (the rule the executor checks too,
   :func:`exportir.runtime.backends.fused_cpu.plan.inplace_hazard`);
4. writes the blob.

Compile specs: ``inplace`` (``b"1"`` default, ``b"0"`` to disable the in-place reuse) and
``optimize`` (``b"1"`` default, ``b"0"`` to write the Edge ops as they are).
"""

from __future__ import annotations

import json
import math
import operator
import struct
from collections.abc import Sequence
from typing import Any

import torch

from exportir.backends.fused_cpu.ir import Graph, Op, Value, same_shape, values_in
from exportir.backends.fused_cpu.rewrites import optimize
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
from exportir.runtime.backends.fused_cpu.format import OpRow
from exportir.runtime.backends.fused_cpu.kernels import Ref
from exportir.runtime.backends.fused_cpu.plan import inplace_hazard, plan

__all__ = ["FusedCpuBackend", "FusedCpuLoweringError", "encode_arg", "op_name"]

_DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
_SPECS = {"inplace": (b"0", b"1"), "optimize": (b"0", b"1")}
_STATE = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


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
    """JSON form of one op argument; ``slot_of(v)`` gives a node's / value's slot."""
    if isinstance(x, (Node, Value)):
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


# ------------------------------------------------------------------------------ Edge -> graph


class _Reader:
    """Reads one Edge program into a :class:`Graph`."""

    def __init__(self, program: Any) -> None:
        self.program = program
        self.value: dict[Node, Value] = {}
        self.items: dict[Node, list[Value]] = {}
        self.graph = Graph([], [], [])

    def placeholders(self) -> None:
        specs = self.program.graph_signature.input_specs
        nodes = self.program.graph.find_nodes(op="placeholder")
        for spec, node in zip(specs, nodes):
            value = self.value[node] = Value(node.meta.get("val"), name=node.name)
            if spec.kind == InputKind.USER_INPUT:
                if not isinstance(value.meta, torch.Tensor):
                    raise _fail(node, "a non-tensor input", _PARTITION_HINT)
                self.graph.inputs.append(value)
            elif spec.kind in _STATE:
                value.const = self._state(spec.target)
                if value.const.dtype not in _DTYPE_NAMES:
                    raise _fail(node, f"a constant of dtype {value.const.dtype}", _PARTITION_HINT)
            else:
                raise _fail(node, f"a {spec.kind.name} input", _PARTITION_HINT)

    def _state(self, target: str) -> torch.Tensor:
        if target in self.program.state_dict:
            return self.program.state_dict[target].detach()
        return self.program.constants[target]

    def arg(self, x: Any) -> Any:
        if isinstance(x, Node):
            if x not in self.value:
                raise Unencodable(f"value {x.name} is not a tensor the backend computed")
            return self.value[x]
        if isinstance(x, (list, tuple)):
            return [self.arg(v) for v in x]
        encode_arg(x, lambda _: 0)  # raises Unencodable for what the blob cannot hold
        return x

    def call(self, node: Node) -> None:
        if node.target is operator.getitem:
            src, index = node.args
            self.value[node] = self.items[src][index]
            return
        name = op_name(node.target)
        if name not in OPS:
            raise _fail(
                node, f"{name or node.target} is not an op the backend runs", _PARTITION_HINT
            )
        try:
            args = [self.arg(a) for a in node.args]
            kwargs = {k: self.arg(v) for k, v in node.kwargs.items()}
        except Unencodable as e:
            raise _fail(node, f"argument {e} cannot be stored", _PARTITION_HINT) from None
        val = node.meta.get("val")
        multi = isinstance(val, (tuple, list))
        outs = [Value(v, name=f"{node.name}_{i}") for i, v in enumerate(val)] if multi else []
        if multi:
            self.items[node] = outs
        else:
            outs = [Value(val, name=node.name)]
            self.value[node] = outs[0]
        self.graph.ops.append(Op(name, args, kwargs, outs, multi, (node.name,)))

    def outputs(self) -> None:
        for spec in self.program.graph_signature.output_specs:
            if spec.kind != OutputKind.USER_OUTPUT:
                raise FusedCpuLoweringError(
                    f"fused_cpu runs functional programs; output {spec.arg} is a "
                    f"{spec.kind.name}. Way out: {_PARTITION_HINT}"
                )
        output = self.program.graph.output_node()
        for value in output.args[0]:
            if not isinstance(value, Node) or value not in self.value:
                raise _fail(output, f"the output {value!r}", _PARTITION_HINT)
            self.graph.outputs.append(self.value[value])

    def read(self) -> Graph:
        self.placeholders()
        for node in self.program.graph.nodes:
            if node.op == "call_function":
                self.call(node)
            elif node.op == "get_attr":
                raise _fail(node, "a get_attr", _PARTITION_HINT)
        self.outputs()
        return self.graph


# ------------------------------------------------------------------------------ graph -> blob


class _Writer:
    """Numbers the graph's values into slots and writes the blob."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.slot: dict[Value, int] = {}
        for v in graph.inputs:
            self.slot[v] = len(self.slot)
        self.constants = [
            v
            for v in dict.fromkeys([*values_in([[op.args, op.kwargs] for op in graph.ops]),
                                    *graph.outputs])
            if v.const is not None and v not in self.slot
        ]  # fmt: skip
        for v in self.constants:
            self.slot[v] = len(self.slot)
        for op in graph.ops:
            for v in op.outs:
                self.slot[v] = len(self.slot)

    def ref(self, x: Any) -> Any:
        if isinstance(x, Value):
            return Ref(self.slot[x])
        if isinstance(x, list):
            return [self.ref(v) for v in x]
        return x

    def rows(self) -> list[OpRow]:
        return [
            OpRow(
                op.name,
                ",".join(op.nodes),
                tuple(self.ref(a) for a in op.args),
                {k: self.ref(v) for k, v in op.kwargs.items()},
                tuple(self.slot[v] for v in op.outs),
                op.multi,
                op.inplace,
            )
            for op in self.graph.ops
        ]

    def choose_inplace(self) -> None:
        """Mark the elementwise ops that may overwrite their first argument (module doc)."""
        rows = self.rows()
        inputs = [self.slot[v] for v in self.graph.inputs]
        constants = [self.slot[v] for v in self.constants]
        outputs = [self.slot[v] for v in self.graph.outputs]
        for i, op in enumerate(self.graph.ops):
            if not _inplace_candidate(op):
                continue
            rows[i] = _with_inplace(rows[i], True)
            if inplace_hazard(plan(inputs, constants, rows, outputs), rows, i) is None:
                op.inplace = True
            else:
                rows[i] = _with_inplace(rows[i], False)

    def blob(self) -> bytes:
        data = bytearray()
        constants = []
        for v in self.constants:
            data += b"\0" * (-len(data) % ALIGNMENT)
            raw = _tensor_bytes(v.const)
            constants.append(
                [
                    self.slot[v],
                    _DTYPE_NAMES[v.const.dtype],
                    list(v.const.shape),
                    len(data),
                    len(raw),
                ]
            )
            data += raw
        slot = self.slot.__getitem__
        ops = [
            [
                op.name,
                encode_arg(op.args, slot),
                {k: encode_arg(v, slot) for k, v in op.kwargs.items()},
                [slot(v) for v in op.outs] if op.multi else slot(op.out),
                ",".join(op.nodes),
            ]
            for op in self.graph.ops
        ]
        header = {
            "values": len(self.slot),
            "inputs": [slot(v) for v in self.graph.inputs],
            "outputs": [slot(v) for v in self.graph.outputs],
            "constants": constants,
            "ops": ops,
            "inplace": [int(op.inplace) for op in self.graph.ops],
        }
        text = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
        head = struct.pack("<4sII", MAGIC, FORMAT_VERSION, len(text)) + text
        head += b"\0" * (-len(head) % ALIGNMENT)
        return head + bytes(data)


def _inplace_candidate(op: Op) -> bool:
    if op.name not in INPLACE or op.multi or not op.args or not isinstance(op.args[0], Value):
        return False
    first, out = op.args[0], op.out
    if first.const is not None or not isinstance(first.meta, torch.Tensor):
        return False
    if not isinstance(out.meta, torch.Tensor):
        return False
    return first.meta.dtype == out.meta.dtype and same_shape(first.meta.shape, out.meta.shape)


def _with_inplace(row: OpRow, inplace: bool) -> OpRow:
    return OpRow(row.name, row.node, row.args, row.kwargs, row.outs, row.multi, inplace)


# ------------------------------------------------------------------------------ the backend


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


def lower_graph(program: Any, compile_specs: Sequence[CompileSpec] = ()) -> Graph:
    """The graph ``preprocess`` writes for an Edge program (read, rewritten, in-place marked)."""
    specs = _parse_specs(compile_specs)
    graph = _Reader(program).read()
    if specs.get("optimize", b"1") == b"1":
        optimize(graph)
    return graph


class FusedCpuBackend(BackendDetails):
    """The shipped CPU backend: runs fused ATen subgraphs from a JSON op-list blob."""

    backend_id = BACKEND_ID

    @classmethod
    def preprocess(
        cls, edge_program: Any, compile_specs: Sequence[CompileSpec]
    ) -> PreprocessResult:
        specs = _parse_specs(compile_specs)
        graph = lower_graph(edge_program, compile_specs)
        writer = _Writer(graph)
        if specs.get("inplace", b"1") == b"1":
            writer.choose_inplace()
        handles = {i: op.nodes for i, op in enumerate(graph.ops)}
        return PreprocessResult(writer.blob(), handles)

    @classmethod
    def runtime(cls) -> FusedCpuRuntime:
        return FusedCpuRuntime()
