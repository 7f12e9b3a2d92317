"""Emission: edge/backend ``ExportedProgram`` s -> :class:`schema.Program`.

For each method, in graph order: placeholders become input / constant / state values, each
``call_function`` node becomes one instruction (its op's out variant, a delegate call, a
runtime primitive on symbolic scalars, or, for a custom op without an out variant, its
functional fallback), and the output node's mutations become ``MoveCall`` s into the mutated
buffers / inputs. An op whose out variant mutates some inputs (training batch norm) runs on
copies of them (``MoveCall`` s first). Kernel nodes that depend on no input are folded: run
once here, stored as constants (``MethodEmitter.fold``); constants are stored only if something
reads them. Views of static tensors (and copies changing neither dtype nor layout) emit no
instruction: their value aliases the source's memory (``schema.ViewOf``,
``MethodEmitter.alias``). Then the planned tensors get arena offsets
(:func:`planning.plan_method`) and the program is validated as the loader will validate it.

Before anything is built, :func:`check_kernel_coverage` checks that every node can run; a program
that cannot run is never written. The output depends only on the graphs and tensor values:
the same model gives the same ``Program`` (and the same bytes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from exportir.format import planning, schema, validate
from exportir.program import _emit_method, _emit_program, kernels
from exportir.program.kernels import (
    ControlFlowNotSupportedError,
    EmitError,
    KernelCoverageError,
    source_line,
)

__all__ = [
    "ControlFlowNotSupportedError",
    "EmitConfig",
    "EmitError",
    "KernelCoverageError",
    "check_kernel_coverage",
    "emit_program",
    "source_line",
]


@dataclass(frozen=True, slots=True)
class EmitConfig:
    """How to emit. ``kernel_available(name, overload)`` lets a runtime's kernel registry
    narrow the coverage check (default: every ATen out variant is available)."""

    alignment: int = 16
    kernel_available: Callable[[str, str], bool] | None = None
    share_mutable_buffers: bool = False
    """Buffers that methods mutate are one state shared by every method of the program
    (``schema.SharedState``): an LLM's ``prefill`` and ``decode`` write one KV cache. Buffers
    are matched by name; each must have the same dtype and shape in every method."""


def check_kernel_coverage(
    methods: Mapping[str, Any], config: EmitConfig | None = None
) -> None:
    """Raise :class:`KernelCoverageError` listing every op no kernel can run, with the nodes and
    their source lines, before anything is emitted."""
    config = config or EmitConfig()
    missing: dict[tuple[str, str], list[str]] = {}
    for method_name, ep in methods.items():
        for gm, node in _calls_with_branches(ep.graph_module):
            if node.target in kernels.UNSUPPORTED_CONTROL_FLOW:
                raise kernels.control_flow_error(node, method_name)
            kind = kernels.classify(node, gm)
            op = kernels.aten_op(node.target)
            if kind in ("kernel", "fallback") and config.kernel_available is not None:
                chosen = (kernels.out_variant(op).operator if kind == "kernel"
                          else kernels.fallback_operator(op))
                if not config.kernel_available(chosen.name, chosen.overload):
                    kind = f"!the runtime has no kernel {chosen}"
            if kind == "fallback" and not _resolvable(op):
                kind = (f"!custom op {kernels.qualified_name(op)} cannot be found by name in "
                        "torch.ops (the runtime resolves it by name at load)")
            if not kind.startswith("!"):
                continue
            where = source_line(node)
            entry = f"{method_name}:{node.name}" + (f" ({where})" if where else "")
            missing.setdefault((kernels.display_name(op), kind[1:]), []).append(entry)
    if not missing:
        return
    lines = [
        f"{len(missing)} operator(s) have no kernel the runtime can run; no program was written:"
    ]
    for (op_name, reason), nodes in sorted(missing.items()):
        lines.append(f"  {op_name}: {reason}; nodes: {', '.join(nodes)}")
    lines.append(
        "Fix: decompose these ops (run_decompositions / to_edge), delegate them to a backend "
        "(to_backend), or register a kernel for them in the runtime."
    )
    raise KernelCoverageError("\n".join(lines))


def _calls_with_branches(gm: Any) -> Iterator[tuple[Any, Any]]:
    """``(owning module, node)`` for every call_function node, the subgraphs of ``cond``,
    ``map`` and ``while_loop`` included (the emitter runs them inline)."""
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        bodies = _BODIES.get(node.target)
        if bodies is not None:
            for attr in node.args[bodies]:
                yield from _calls_with_branches(kernels.get_attr(gm, attr.target))
            continue
        yield gm, node


# control flow the emitter runs inline: which arguments are its subgraphs
_BODIES: dict[Any, slice] = {
    torch.ops.higher_order.cond: slice(1, 3),
    torch.ops.higher_order.map_impl: slice(0, 1),
    torch.ops.higher_order.while_loop: slice(0, 2),
}


def _resolvable(op: Any) -> bool:
    ns, _, name = op._schema.name.partition("::")
    try:
        packet = getattr(getattr(torch.ops, ns), name)
        return getattr(packet, op._schema.overload_name or "default") is op
    except (AttributeError, RuntimeError):
        return False


_BUFFER_MUTATION = "BUFFER_MUTATION"


def _shared_buffers(methods: Mapping[str, Any]) -> frozenset[str]:
    """Names of the buffers some method mutates, checked to have one dtype and shape in every
    method that has them."""
    names = {
        s.target for ep in methods.values() for s in ep.graph_signature.output_specs
        if s.kind.name == _BUFFER_MUTATION
    }
    seen: dict[str, tuple[str, Any]] = {}
    for method_name, ep in methods.items():
        for name in sorted(names):
            t = ep.state_dict.get(name, ep.constants.get(name))
            if not isinstance(t, torch.Tensor):
                continue
            kind = (t.dtype, tuple(t.shape))
            first = seen.setdefault(name, (method_name, kind))
            if first[1] != kind:
                raise EmitError(
                    f"buffer {name!r} is {kind[0]}{list(kind[1])} in method {method_name!r} "
                    f"and {first[1][0]}{list(first[1][1])} in {first[0]!r}: a shared buffer "
                    "needs one dtype and shape (export every method from one module)")
    return frozenset(names)


def emit_program(
    methods: Mapping[str, Any],
    config: EmitConfig | None = None,
    *,
    constant_methods: Mapping[str, Any] | None = None,
) -> schema.Program:
    """Emit ``methods`` (name -> edge or backend ``ExportedProgram``) as one program.

    ``constant_methods`` (name -> int/float/bool/str/tensor or a tuple/list of them) become
    methods without instructions returning those values. Raises :class:`KernelCoverageError`
    before emitting if some node cannot run, :class:`EmitError` for unsupported graphs.
    """
    config = config or EmitConfig()
    check_kernel_coverage(methods, config)
    builder = _emit_program.ProgramBuilder()
    if config.share_mutable_buffers:
        builder.shared = _shared_buffers(methods)
    emitted = []
    for name in sorted(methods):
        emitted.append(_emit_method.MethodEmitter(name, methods[name], builder, config).emit())
    for name in sorted(constant_methods or {}):
        if name in methods:
            raise EmitError(f"constant method {name!r} clashes with a method of the same name")
        emitted.append(_emit_program.constant_method(name, constant_methods[name], builder))
    looping = any(planning.loops(m.instructions) for m in emitted)
    program = schema.Program(
        version=schema.LOOP_FORMAT_VERSION if looping else schema.FORMAT_VERSION,
        methods=tuple(emitted),
        constants=tuple(builder.constants),
        delegates=tuple(builder.delegates),
    )
    validate.validate_program(program)
    return program
