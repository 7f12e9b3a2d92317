"""An instrumented variant of a loaded fused CPU blob, for profiles and numerical debugging.

:func:`instrument` compiles a second function from the same validated op list as the one the
executor runs (:class:`~.executor.FusedProgram`), with one call ``hook(i, outs)`` after op
``i`` (``outs``: the op's results, before anything is released) and ``hook(-1, ())`` first.
The executor's own function is untouched: a program pays for instrumentation only when a
profiler or a debugger asks for it. The inserted lines name only ``_hook_`` and the
executor's own slot names; nothing from the blob reaches the source.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from exportir.runtime.backends.fused_cpu.executor import FusedCpuExecutionError, FusedProgram

Hook = Callable[[int, tuple[Any, ...]], None]


def op_table(program: FusedProgram) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Per op of the blob: its kernel-table name and the graph nodes it came from."""
    return tuple((row.name, tuple(n for n in row.node.split(",") if n)) for row in program.ops)


def instrument(program: FusedProgram, hook: Hook) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """``call(inputs) -> outputs`` running ``program`` with ``hook`` after every op."""
    lines = []
    for lineno, text in enumerate(program.source.split("\n"), start=1):
        lines.append(text)
        if lineno == 1:
            lines.append("    _hook_(-1, ())")
        index = program.line_ops.get(lineno)
        if index is not None:
            outs = [f"v{s}" for s in program.ops[index].outs]
            packed = f"({', '.join(outs)}{',' if len(outs) == 1 else ''})"
            lines.append(f"    _hook_({index}, {packed})")
    namespace = dict(program.fn.__globals__)
    namespace["_hook_"] = hook
    code = compile("\n".join(lines), "<fused_cpu instrumented>", "exec")
    exec(code, namespace)  # noqa: S102 - the executor's own source plus our hook calls
    fn = namespace["run"]

    def call(inputs: Sequence[Any]) -> tuple[Any, ...]:
        if len(inputs) != len(program.inputs):
            raise FusedCpuExecutionError(
                f"fused_cpu delegate takes {len(program.inputs)} inputs; got {len(inputs)}"
            )
        with torch.no_grad():
            return fn(*inputs)

    return call
