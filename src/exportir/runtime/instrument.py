"""Instrumented execution states: the machinery behind profiles and intermediate captures.

An instrumented state is an ordinary :class:`~exportir.runtime.method.MethodState` of the
method, built on its own (own arenas, own value frame) over a view of the program whose
delegates are wrapped by a :class:`Session`: the normal ``Method`` and its run loop are never
touched, so a program that is not being profiled pays nothing. The session then wraps the
state's compiled steps (checked runs) and bare calls (trusted runs) to observe each
instruction, and a backend offering ``debug_ops(handle)`` / ``instrument(handle, hook)`` (the
fused CPU backend does) to observe each op inside a delegate call.

Nodes are looked up in the method's debug tables: ``DebugEntry`` per instruction and, since
format 2.2, the ``DebugNode`` table (op, ``file:line``, ``nn.Module`` path); without the
latter an instruction is still named by its op and node.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from exportir.format import schema
from exportir.runtime.kernels import canonical_op_name
from exportir.runtime.method import Method, MethodState


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What the debug tables say about a graph node: its op, source line and module."""

    name: str
    target: str = ""
    source: str = ""
    module: str = ""
    module_type: str = ""


class Session:
    """Observes one instrumented state. Subclasses override the hooks; the defaults observe
    nothing (an instrumented state with a bare session runs exactly as the method does)."""

    pc: int = -1  # the instruction running (set by the wrappers; read by delegate hooks)

    def wrap_call(self, pc: int, call: Callable[[], object]) -> Callable[[], object]:
        return call

    def wrap_step(self, pc: int, step: Callable[[list[Any]], int]) -> Callable[[list[Any]], int]:
        return step

    def delegate_hook(self, delegate: int) -> Callable[[int, tuple[Any, ...]], None] | None:
        """The hook an instrumented delegate calls after each of its ops, ``hook(i, outs)``
        (``hook(-1, ())`` first; :attr:`pc` names the calling instruction); ``None`` leaves
        the delegate uninstrumented."""
        return None


class _ProgramView:
    """The loaded program as an instrumented state sees it: delegates wrapped by the session,
    everything else the program's own (constants, kernels, limits, locks)."""

    def __init__(self, program: Any, session: Session) -> None:
        self._real = program
        self._session = session

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def _delegate(self, index: int, site: Any) -> tuple[Any, Any]:
        backend, handle = self._real._delegate(index, site)
        return _DelegateProbe(backend, index, self._session), handle


class _DelegateProbe:
    """A delegate backend seen through a session: calls its instrumented variant when the
    backend offers one and the session asks for per-op hooks, else the backend itself."""

    def __init__(self, backend: Any, index: int, session: Session) -> None:
        self.backend = backend
        self.index = index
        self.session = session
        self.fresh_outputs = getattr(backend, "fresh_outputs", False)
        self.thread_safe = getattr(backend, "thread_safe", False)
        self._calls: dict[int, Any] = {}

    def execute(self, handle: Any, inputs: Sequence[Any]) -> Any:
        call = self._calls.get(id(handle))
        if call is None:
            call = self._calls[id(handle)] = self._instrumented(handle)
        return call(inputs)

    def _instrumented(self, handle: Any) -> Callable[[Sequence[Any]], Any]:
        hook = self.session.delegate_hook(self.index)
        if hook is None or not hasattr(self.backend, "instrument"):
            return lambda inputs: self.backend.execute(handle, inputs)
        return self.backend.instrument(handle, hook)


def instrumented_state(method: Method, session: Session) -> MethodState:
    """A fresh execution state of ``method`` observed by ``session``: every compiled step
    and trusted call wrapped (:meth:`Session.wrap_step`, :meth:`Session.wrap_call`)."""
    state = MethodState(_ProgramView(method._program, session), method.meta)
    state._steps = [session.wrap_step(pc, s) for pc, s in enumerate(state._steps)]
    if state._calls is not None:
        state._calls = [session.wrap_call(pc, c) for pc, c in enumerate(state._calls)]
    state._direct = None  # a lone delegate's direct call would pass by the wrapped calls
    return state


def delegate_ops(method: Method, index: int) -> tuple[tuple[str, tuple[str, ...]], ...] | None:
    """Per op of delegate ``index``: its name and graph nodes, when its backend says."""
    backend, handle = method._program._delegate(index, None)
    describe = getattr(backend, "debug_ops", None)
    return None if describe is None else describe(handle)


# ------------------------------------------------------------------------------ debug tables


def node_table(meta: schema.Method) -> dict[tuple[int, str], NodeInfo]:
    """(scope, node name) -> NodeInfo from the method's DebugNode table (format 2.2)."""
    return {
        (n.scope, n.name): NodeInfo(n.name, n.target, n.source, n.module, n.module_type)
        for n in meta.nodes
    }


def instruction_label(program: Any, meta: schema.Method, ins: schema.Instruction) -> str:
    """The op an instruction runs, as a profile names it."""
    match ins:
        case schema.KernelCall(op_index=i) if 0 <= i < len(meta.operators):
            op = meta.operators[i]
            return canonical_op_name(op.name, op.overload)
        case schema.DelegateCall(delegate_index=d):
            return f"delegate {program._backend_id(d)}"
        case schema.MoveCall():
            return "move"
        case schema.JumpFalseCall():
            return "jump_false"
        case schema.FreeCall():
            return "free"
    return type(ins).__name__


def instruction_node(
    meta: schema.Method, ins: schema.Instruction, nodes: dict[tuple[int, str], NodeInfo]
) -> NodeInfo:
    """The graph node an instruction came from (its DebugEntry, completed by the node table)."""
    if not 0 <= ins.debug < len(meta.debug):
        return NodeInfo("")
    entry = meta.debug[ins.debug]
    found = nodes.get((schema.DEBUG_METHOD_SCOPE, entry.node_name))
    if found is not None:
        return found if found.source else NodeInfo(found.name, found.target, entry.source,
                                                   found.module, found.module_type)
    return NodeInfo(entry.node_name, "", entry.source)


def written_values(program: Any, meta: schema.Method, ins: schema.Instruction) -> tuple[int, ...]:
    """The values an instruction writes (list values by their items)."""
    match ins:
        case schema.KernelCall(op_index=i, args=args):
            op = meta.operators[i]
            kernel = program.kernels.lookup(canonical_op_name(op.name, op.overload))
            if kernel is None:
                return ()
            written = [args[p] for p in kernel.writes if p < len(args)]
            if kernel.result_slot:
                written.append(args[-1])
        case schema.DelegateCall(outputs=outputs):
            written = list(outputs)
        case schema.MoveCall(dst=dst):
            written = [dst]
        case _:
            return ()
    items: list[int] = []
    for v in written:
        value = meta.values[v]
        items.extend(getattr(value, "items", (v,)))
    return tuple(items)


# ------------------------------------------------------------------------------ intermediates


@dataclass(frozen=True, slots=True)
class Intermediate:
    """What one instruction (``op_index`` None) or one op inside a delegate call wrote in a
    run: ``nodes`` are the graph nodes it came from (scope: the method's graph, or delegate
    ``delegate``), ``values`` copies of the values it wrote, in order."""

    pc: int
    op: str
    nodes: tuple[str, ...]
    values: tuple[Any, ...]
    delegate: int | None = None
    op_index: int | None = None


def _copy(value: Any) -> Any:
    return value.detach().clone() if hasattr(value, "detach") else value


class _CaptureSession(Session):
    """Copies every value each instruction and each delegate op writes (a checked run)."""

    def __init__(self, method: Method) -> None:
        self.meta = method.meta
        self.program = method._program
        self.found: list[Intermediate] = []
        self._ops: dict[int, Any] = {}
        self._method = method

    def wrap_step(self, pc: int, step: Callable[[list[Any]], int]) -> Callable[[list[Any]], int]:
        ins = self.meta.instructions[pc]
        written = written_values(self.program, self.meta, ins)
        entry = self.meta.debug[ins.debug] if 0 <= ins.debug < len(self.meta.debug) else None
        nodes = (entry.node_name,) if entry is not None and entry.node_name else ()
        op = instruction_label(self.program, self.meta, ins)
        found, session = self.found, self

        def captured(values: list[Any]) -> int:
            session.pc = pc
            nxt = step(values)
            found.append(Intermediate(pc, op, nodes, tuple(_copy(values[i]) for i in written)))
            return nxt

        return captured

    def wrap_call(self, pc: int, call: Callable[[], object]) -> Callable[[], object]:
        def refused() -> None:  # a capture makes one checked run; trusted calls never run
            raise RuntimeError("an intermediate capture runs the checked steps only")

        return refused

    def delegate_hook(self, delegate: int) -> Callable[[int, tuple[Any, ...]], None] | None:
        if delegate not in self._ops:
            self._ops[delegate] = delegate_ops(self._method, delegate)
        table = self._ops[delegate]
        if table is None:
            return None
        found, session = self.found, self

        def hook(i: int, outs: tuple[Any, ...]) -> None:
            if i < 0 or i >= len(table):
                return
            name, nodes = table[i]
            found.append(Intermediate(session.pc, name, tuple(nodes),
                                      tuple(_copy(v) for v in outs), delegate, i))

        return hook


def capture_intermediates(method: Method, args: Sequence[Any], kwargs: dict[str, Any] | None = None
                          ) -> tuple[tuple[Any, ...], list[Intermediate]]:
    """Run ``method`` once (checked, on a fresh instrumented state) and return its outputs and
    every intermediate it wrote, in execution order (a delegate's ops before the delegate
    instruction's own results)."""
    session = _CaptureSession(method)
    state = instrumented_state(method, session)
    outputs = state.execute(state._flatten_inputs(tuple(args), dict(kwargs or {})))
    return outputs, session.found
