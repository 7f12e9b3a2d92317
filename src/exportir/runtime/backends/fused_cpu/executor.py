"""The fused CPU executor: a validated blob becomes one straight-line Python function.

At ``init`` the decoded op list is turned into the source of a single function, compiled once::

    def run(v0, v1):
        v3 = f0(v0, c2, c1)
        v4 = f1(v3)
        del v3
        return (v4,)

The source is made only of names this module makes up (``v<slot>`` locals, ``c<slot>``
constants, ``f<op>`` callables, ``k<n>`` literal arguments), the keywords ``None``, ``True``
and ``False``, and integers it formats itself (sizes passed as separate ints: ``x.reshape(2,
3)``); every callable, constant tensor and other literal comes in through the function's
namespace, and every callable is a kernel of the closed table (:mod:`.kernels`). Nothing from
the blob is ever pasted into the source. Keyword-argument names are the op's ATen schema names;
a kernel that is a ``torch.Tensor`` method is called as one (``v3.permute(0, 2, 1)``), its name
taken from the method object itself.

The function's globals hold no builtins but ``__import__``, and that one only hands out modules
already loaded (:func:`_loaded_module`): torch's C++ argument parsing imports ``torch`` from the
calling frame's builtins the first time it meets a Python float or an int list (to find
``torch.SymFloat`` / ``torch.SymInt``), and the calling frame is this function's. The source
never names ``__import__``, and nothing new can be loaded through it.

A value is dropped (``del``) after its last reader; ops the blob marks run in place after
:func:`.plan.inplace_hazard` agreed. An output that shares memory with a delegate input or
constant, or repeats an earlier output, is cloned. A failing op is found from the traceback's line number, so a call pays
nothing for error reporting.
"""

from __future__ import annotations

import keyword
import sys
from collections.abc import Sequence
from types import CodeType
from typing import Any

import torch

from exportir.runtime.backends.fused_cpu.format import Blob, OpRow, fail
from exportir.runtime.backends.fused_cpu.gemv import RowLinear
from exportir.runtime.backends.fused_cpu.kernels import Call, Ref, SchemaMismatch, bind
from exportir.runtime.backends.fused_cpu.limits import (
    DEFAULT_MAX_BYTES,
    FusedAllocationError,
    guard,
)
from exportir.runtime.backends.fused_cpu.plan import Plan, SlotError, inplace_hazard, plan, refs
from exportir.runtime.backends.fused_cpu.records import record

__all__ = ["FusedCpuExecutionError", "FusedProgram", "build", "run"]


class FusedCpuExecutionError(RuntimeError):
    """An op of the blob failed; the message names the op and its graph node."""


class FusedProgram(
    record(
        "FusedProgram", "num_values inputs outputs constants ops fn source code line_ops primes"
    )
):
    """A loaded blob (the runtime's delegate handle): ``fn(*inputs)`` runs it."""

    __slots__ = ()
    num_values: int
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    constants: tuple[tuple[int, torch.Tensor], ...]
    ops: tuple[OpRow, ...]
    fn: Any
    source: str
    code: CodeType
    line_ops: dict[int, int]
    # (one-row linear kernel, input position of its weight): shown its weight before the first
    # call runs (:meth:`.gemv.RowLinear.prime`), then emptied
    primes: list[tuple[RowLinear, int]]

    def failure(self, exc: BaseException) -> FusedCpuExecutionError:
        """The error to raise for ``exc`` raised while running: names the failing op."""
        line = None
        tb = exc.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code is self.code:
                line = tb.tb_lineno
            tb = tb.tb_next
        where = "fused_cpu delegate"
        index = self.line_ops.get(line) if line is not None else None
        if index is not None:
            op = self.ops[index]
            nodes = op.node.split(",")
            label = "graph node" if len(nodes) == 1 else "graph nodes"
            where = f"fused_cpu op {op.name} ({label} {', '.join(nodes)})"
        return FusedCpuExecutionError(f"{where} failed: {type(exc).__name__}: {exc}")


def _loaded_module(
    name: str,
    globals: Any = None,
    locals: Any = None,
    fromlist: Sequence[str] = (),
    level: int = 0,
) -> Any:
    """``__import__`` for the generated function's frame (module docstring): an absolute import
    of a module already in ``sys.modules``; anything else raises ImportError."""
    module = sys.modules.get(name) if level == 0 else None
    if module is None:
        raise ImportError(
            f"fused_cpu delegate: a kernel tried to import {name!r}, which is not loaded; "
            "import it before running the program"
        )
    if fromlist or "." not in name:
        return module
    return sys.modules[name.partition(".")[0]]


# The generated function's builtins: only what CPython's C-level imports look up.
_BUILTINS = {"__import__": _loaded_module}


class _Source:
    """Builds the function's source and namespace."""

    def __init__(self, blob: Blob, p: Plan, max_bytes: int) -> None:
        self.blob = blob
        self.plan = p
        self.max_bytes = max_bytes
        self.constants = {s for s, _ in blob.constants}
        self.namespace: dict[str, Any] = {"__builtins__": dict(_BUILTINS)}
        self.literals = 0
        self.lines: list[str] = []
        self.line_ops: dict[int, int] = {}
        self.row_linears: list[RowLinear] = []  # one group: they block by the blob's total
        self.primes: list[tuple[RowLinear, int]] = []
        self.input_at = {slot: k for k, slot in enumerate(blob.inputs)}

    def constant(self, x: Any) -> torch.Tensor | None:
        """The tensor of a constant slot ``x`` reads, else None."""
        if isinstance(x, Ref) and x.slot in self.constants:
            return self.namespace[f"c{x.slot}"]
        return None

    def name(self, slot: int) -> str:
        return f"c{slot}" if slot in self.constants else f"v{slot}"

    def literal(self, value: Any) -> str:
        if value is None or isinstance(value, bool):
            return repr(value)  # None / True / False
        if type(value) is int:
            return str(int(value))  # an integer we format ourselves
        name = f"k{self.literals}"
        self.literals += 1
        self.namespace[name] = value
        return name

    def arg(self, x: Any) -> str:
        if isinstance(x, Ref):
            return self.name(x.slot)
        if isinstance(x, (list, tuple)) and any(isinstance(v, Ref) for v in x):
            return "[" + ", ".join(self.arg(v) for v in x) + "]"
        return self.literal(x)

    def expression(self, i: int, call: Call) -> str:
        if call.form == "alias":
            return self.arg(call.args[0])
        if call.form == "item":
            return f"{self.arg(call.args[0])}[{self.literal(call.args[1])}]"
        parts = [self.arg(a) for a in call.args]
        if call.splat and len(call.args) > 1 and _ints(call.args[1]):
            parts[1:2] = [str(int(d)) for d in call.args[1]]  # our own integers
        for key, value in call.kwargs.items():
            if not key.isidentifier() or keyword.iskeyword(key):  # schema names; never happens
                raise fail(f"ops[{i}].kwargs", f"argument name {key!r} is not an identifier")
            parts.append(f"{key}={self.arg(value)}")
        method = _tensor_method(call.fn)
        if method is not None and call.args and isinstance(call.args[0], Ref):
            return f"{parts[0]}.{method}({', '.join(parts[1:])})"
        fn = f"f{i}"
        self.namespace[fn] = call.fn
        return f"{fn}({', '.join(parts)})"

    def op(self, i: int, row: OpRow) -> None:
        try:
            call = bind(row.name, row.args, row.kwargs, row.inplace, self.constant, row.normalized)
        except SchemaMismatch as e:  # decode checked the arguments; kept for direct callers
            raise fail(f"ops[{i}]", f"{row.name}: {e}") from None
        if isinstance(call.fn, RowLinear):
            call.fn.join(self.row_linears)
            self._prime(call)
        try:
            call = guard(row.name, row.node, call, self.max_bytes)
        except FusedAllocationError as e:
            raise fail(f"ops[{i}]", str(e)) from None
        targets = ", ".join(self.name(s) for s in row.outs)
        if row.multi:
            targets += "," if len(row.outs) == 1 else ""
            if not row.outs:
                targets = "_"
        self.line_ops[len(self.lines) + 2] = i  # +1: the def line, +1: 1-based
        self.lines.append(f"    {targets} = {self.expression(i, call)}")
        dead = [
            s
            for s in (*self._reads(row), *row.outs)
            if self.plan.last_use.get(s, i) == i
            and s not in self.plan.external
            and s not in self.plan.outputs
        ]
        if dead:
            self.lines.append(f"    del {', '.join(self.name(s) for s in dict.fromkeys(dead))}")

    def _prime(self, call: Call) -> None:
        """Show a one-row linear its weight before it runs: a constant now, a delegate input
        when the first call starts (so the first call, not the second, lays weights out)."""
        w = call.args[1] if len(call.args) > 1 else None
        if not isinstance(w, Ref):
            return
        tensor = self.constant(w)
        if tensor is not None:
            call.fn.prime(tensor)
        elif w.slot in self.input_at:
            self.primes.append((call.fn, self.input_at[w.slot]))

    def _reads(self, row: OpRow) -> list[int]:
        return refs(row.args) + refs(row.kwargs)

    def result(self) -> str:
        items = []
        seen: set[int] = set()
        for s in self.blob.outputs:
            shared = self.plan.root[s] in self.plan.external or s in seen
            seen.add(s)
            items.append(f"{self.name(s)}.clone()" if shared else self.name(s))
        return f"    return ({', '.join(items)}{',' if len(items) == 1 else ''})"


def _ints(x: Any) -> bool:
    return isinstance(x, list) and bool(x) and all(type(d) is int for d in x)


def _tensor_method(fn: Any) -> str | None:
    """The name of ``fn`` when it is a ``torch.Tensor`` method (called as ``x.name(...)``)."""
    name = getattr(fn, "__name__", None)
    if isinstance(name, str) and name.isidentifier() and getattr(torch.Tensor, name, None) is fn:
        return name
    return None


def build(blob: Blob, max_bytes: int = DEFAULT_MAX_BYTES) -> FusedProgram:
    """Check lifetimes and in-place requests of a decoded blob and compile its function. Ops
    whose result size an argument decides allocate at most ``max_bytes`` (:mod:`.limits`)."""
    constants = [s for s, _ in blob.constants]
    try:
        p = plan(blob.inputs, constants, blob.ops, blob.outputs)
    except SlotError as e:
        raise fail(e.field, str(e)) from None
    for i, row in enumerate(blob.ops):
        if row.inplace:
            hazard = inplace_hazard(p, blob.ops, i)
            if hazard is not None:
                raise fail(f"inplace[{i}]", f"{row.name} cannot run in place: {hazard}")
    src = _Source(blob, p, max_bytes)
    for slot, tensor in blob.constants:
        src.namespace[f"c{slot}"] = tensor  # before the ops: kernels may prepare constants
    for i, row in enumerate(blob.ops):
        src.op(i, row)
    params = ", ".join(f"v{s}" for s in blob.inputs)
    text = "\n".join([f"def run({params}):", *src.lines, src.result(), ""])
    code = compile(text, "<fused_cpu>", "exec")
    exec(code, src.namespace)  # noqa: S102 - our own source, made of our own names (docstring)
    fn = src.namespace["run"]
    return FusedProgram(
        num_values=blob.num_values,
        inputs=blob.inputs,
        outputs=blob.outputs,
        constants=blob.constants,
        ops=blob.ops,
        fn=fn,
        source=text,
        code=fn.__code__,
        line_ops=src.line_ops,
        primes=src.primes,
    )


def run(program: FusedProgram, inputs: Sequence[Any]) -> tuple[Any, ...]:
    """Run a loaded blob on ``inputs``; returns its outputs."""
    if len(inputs) != len(program.inputs):
        raise FusedCpuExecutionError(
            f"fused_cpu delegate takes {len(program.inputs)} inputs; got {len(inputs)}"
        )
    if program.primes:  # the first call
        primes = program.primes[:]
        program.primes.clear()
        for fn, k in primes:
            fn.prime(inputs[k])
    try:
        if torch.is_grad_enabled():
            with torch.no_grad():
                return program.fn(*inputs)
        return program.fn(*inputs)
    except FusedAllocationError:
        raise
    except Exception as e:
        raise program.failure(e) from e
