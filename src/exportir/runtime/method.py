"""A loaded method: planned memory, bound instructions, and the executor.

Preparing a :class:`Method` (once, when ``program.method(name)`` is first called):

1. builds the value table: planned tensors view the method's arenas (allocated here, once),
   constants view the program's constant segment, runtime-owned tensors start empty, scalars and
   lists are materialised; mutable state is copied from its initial constant; views
   (``ViewOf``) alias their base (views of inputs: per call, after the inputs are bound);
2. compiles every instruction into a checked *step* — one ``match`` over the closed
   ``schema.Instruction`` union (:meth:`MethodState._compile`; the state lives in
   :mod:`exportir.runtime._state`, its steps in :mod:`exportir.runtime._steps`) — and, for
   kernels, a bare call (the kernel bound once to every argument that never changes, through its
   fastest entry: :mod:`exportir.runtime.bindings`). Kernels and delegates are looked up here, so a missing
   kernel or backend fails at load, not halfway through a run.

Running (``method(*inputs)`` or ``method.execute(inputs)``) checks and binds the inputs into
the method's value frame, runs the instructions from 0 — the checked steps on a first run (and
after a failure), then the bare calls wherever shapes cannot vary (:meth:`MethodState._run`) —
and returns the outputs. **Outputs are copies**: tensors are cloned out of the arena (and out of the
constant segment and the caller's inputs), so a later call, which reuses the same arena, never
changes a result already returned.

Any exception inside a step becomes a :class:`RuntimeFailure` naming the instruction index, the
op, the graph node and the user's source line (from the method's debug table).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from exportir.format import schema
from exportir.runtime._state import MethodState, _MethodInfo

if TYPE_CHECKING:
    from exportir.runtime.program import Program

__all__ = ["Method", "MethodState"]


class Method(_MethodInfo):
    """One executable method of a loaded :class:`~exportir.runtime.program.Program`.

    Calls may come from many threads at once: each call runs on an execution state
    (:class:`MethodState`: arenas, value frame, compiled steps) taken from the method's pool
    and given back when the call returns; a state is made when every one is busy, so a method
    keeps as many as it ever had concurrent calls. A method with mutable state (buffers it
    updates, kept across calls) runs one call at a time, in the order the calls take its lock,
    as if one thread made them. A delegate whose backend does not declare
    ``thread_safe = True`` runs one call at a time (its own lock).
    """

    __slots__ = ("_idle", "_lock", "_program", "_state", "meta", "name")

    def __init__(self, program: Program, meta: schema.Method) -> None:
        self.name = meta.name
        self.meta = meta
        self._program = program
        self._state = MethodState(program, meta)  # made now: a missing kernel fails at load
        self._idle = collections.deque([self._state])
        stateful = any(isinstance(v, schema.Tensor) and v.initial is not None for v in meta.values)
        # state shared with other methods: their calls take turns on the program's lock
        self._lock = (program._shared_lock if meta.shared_state
                      else threading.Lock() if stateful else None)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run with the model's own calling convention; returns outputs structured as the
        model returned them (a flat tuple when the program has no output spec)."""
        state = self._state
        outputs = self.execute(state._flatten_inputs(args, kwargs))
        if state._rebuild is not None:
            return state._rebuild(outputs)
        return outputs

    def execute(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        """Run with the flat inputs (one per ``meta.inputs``); returns the flat outputs.

        Raises :class:`MethodInputError` for inputs that do not match the method and
        :class:`RuntimeFailure` when an instruction fails. Output tensors are copies.
        """
        if self._lock is not None:
            with self._lock:
                return self._state.execute(inputs)
        idle = self._idle
        try:
            state = idle.pop()
        except IndexError:  # every state is running a call: one more
            state = MethodState(self._program, self.meta)
        try:
            return state.execute(inputs)
        finally:
            idle.append(state)

    def profile(self, *args: Any, repeat: int = 10, warmup: int = 1, **kwargs: Any) -> Any:
        """Time every instruction (and every op inside delegates whose backend can be
        instrumented) over ``repeat`` runs after ``warmup`` uncounted ones, on an execution
        state of its own; returns an :class:`exportir.runtime.profile.Profile`."""
        from exportir.runtime.profile import profile_method

        return profile_method(self, args, kwargs, repeat=repeat, warmup=warmup)

    @property
    def num_states(self) -> int:
        """How many execution states the method holds (at least 1; one per concurrent call)."""
        return len(self._idle) if self._lock is None else 1

    def __repr__(self) -> str:
        return (
            f"Method({self.name!r}, inputs={len(self.meta.inputs)}, "
            f"outputs={len(self.meta.outputs)}, instructions={self.num_instructions}, "
            f"arenas={list(self.meta.plan.arenas)})"
        )
