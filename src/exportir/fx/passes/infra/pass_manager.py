"""Runs a list of passes in a constraint-respecting order, to a fixed point."""

from __future__ import annotations

import inspect
import logging
from collections import deque
from collections.abc import Callable
from functools import wraps
from typing import Any

from torch import nn

from exportir.fx.graph_module import GraphModule
from exportir.fx.passes.infra.pass_base import PassResult

logger = logging.getLogger(__name__)
logger.setLevel(logging.WARNING)

__all__ = ["PassManager", "pass_result_wrapper", "this_before_that_pass_constraint"]

Pass = Callable[..., Any]
Constraint = Callable[[Pass, Pass], bool]


def _pass_name(fn: Pass) -> str:
    return fn.__name__ if inspect.isfunction(fn) else type(fn).__name__


def pass_result_wrapper(fn: Callable[..., Any]) -> Callable[..., PassResult | None]:
    """Adapt a pass returning None (in-place) or a module into one returning a
    ``PassResult`` (``modified=True``)."""
    if fn is None:
        return None  # type: ignore[return-value]  # torch.fx accepts and returns None

    @wraps(fn)
    def wrapped_fn(gm: nn.Module) -> PassResult | None:
        result = fn(gm)
        if result is None:
            return PassResult(gm, True)
        if isinstance(result, PassResult):
            return result
        if isinstance(result, nn.Module):
            return PassResult(result, True)
        return None

    if not inspect.isfunction(fn):
        wrapped_fn.__name__ = type(fn).__name__
    return wrapped_fn


def _validate_pass_schedule_constraint(constraint: Constraint, passes: list[Pass]) -> None:
    for i, first in enumerate(passes):
        for j, later in enumerate(passes[i + 1 :]):
            if not constraint(first, later):
                # ``j`` counts from ``first``'s successor, as in torch.fx's message.
                raise RuntimeError(
                    f"pass schedule constraint violated. Expected {first} before {later}"
                    f" but found {first} at index {i} and {later} at index {j} in pass"
                    f" list."
                )


def _topological_sort_passes(passes: list[Pass], constraints: list[Constraint]) -> list[Pass]:
    """Order ``passes`` so that every constraint holds (Kahn's algorithm, FIFO,
    stable for independent passes). RuntimeError lists passes in a cycle."""
    if not constraints:
        return passes
    successors: dict[Pass, list[Pass]] = {p: [] for p in passes}
    indegree: dict[Pass, int] = dict.fromkeys(passes, 0)
    ready: deque[Pass] = deque()
    for a in passes:
        for b in passes:
            if a == b:
                continue
            for constraint in constraints:
                if not constraint(a, b):  # b must run before a
                    successors[b].append(a)
                    indegree[a] += 1
        if indegree[a] == 0:
            ready.append(a)
    done: set[Pass] = set()
    ordered: list[Pass] = []
    while ready:
        current = ready.popleft()
        ordered.append(current)
        done.add(current)
        for nxt in successors[current]:
            if nxt not in done:
                indegree[nxt] -= 1
                if indegree[nxt] == 0:
                    ready.append(nxt)
    stuck = [p for p, d in indegree.items() if d != 0]
    if stuck:
        raise RuntimeError(f"Circular dependency detected within the following passes: {stuck}")
    return ordered


def this_before_that_pass_constraint(this: Pass, that: Pass) -> Constraint:
    """Constraint: ``this`` must run before ``that``."""

    def depends_on(a: Pass, b: Pass) -> bool:
        return a != that or b != this

    return depends_on


class PassManager:
    """Collects passes and ordering constraints and runs them.

    Args:
        passes: callables taking a module and returning a ``PassResult``.
        constraints: ``constraint(a, b)`` is False when ``a`` may not run before ``b``.
        steps: maximum number of rounds over all passes (stops early once a round
            changes nothing).
        run_checks_after_each_pass: run ``check`` after every pass.
        suppress_check_failures: kept for API compatibility.
    """

    passes: list[Callable[..., PassResult | None]]
    constraints: list[Constraint]
    _validated: bool = False
    steps: int = 1

    def __init__(
        self,
        passes: list[Callable[..., PassResult | None]] | None = None,
        constraints: list[Constraint] | None = None,
        steps: int | None = None,
        run_checks_after_each_pass: bool = False,
        suppress_check_failures: bool = False,
    ) -> None:
        self.passes = passes or []
        self.constraints = constraints or []
        if steps:
            self.steps = steps
        self.run_checks_after_each_pass = run_checks_after_each_pass
        self.suppress_check_failures = suppress_check_failures

    def add_pass(self, _pass: Callable[..., PassResult | None]) -> None:
        """Append a pass."""
        self.passes.append(_pass)
        self._validated = False

    def add_constraint(self, constraint: Constraint) -> None:
        """Add an ordering constraint."""
        self.constraints.append(constraint)
        self._validated = False

    def validate_constraints(self) -> None:
        """Raise RuntimeError if the current pass order violates a constraint."""
        if self._validated:
            return
        for constraint in self.constraints:
            _validate_pass_schedule_constraint(constraint, self.passes)
        self._validated = True

    def solve_constraints(self) -> None:
        """Reorder the passes to satisfy every constraint."""
        self.passes = _topological_sort_passes(self.passes, self.constraints)
        self._validated = True

    def add_checks(self, check: Callable[[nn.Module], None]) -> None:
        """Install ``check(module)``, run before the passes (and after each one
        with ``run_checks_after_each_pass``)."""
        if len(inspect.signature(check).parameters) != 1:
            raise TypeError(
                "PassManager check function should only take in one variable, a module"
            )
        self.check = check  # type: ignore[method-assign]  # instance-level override, by design

    def check(self, module: nn.Module) -> None:
        """Graph invariants to check; nothing by default."""

    def __call__(self, module: nn.Module) -> PassResult:
        """Run all passes (in solved order) up to ``steps`` rounds, until a round
        modifies nothing. A failing pass is reported with the passes before it."""
        if not self._validated:
            self.solve_constraints()
        self.check(module)
        overall_modified = False
        for _ in range(self.steps):
            module, modified = self._run_round(module)
            overall_modified = overall_modified or modified
            if not modified:
                break
        return PassResult(module, overall_modified)

    def _run_round(self, module: nn.Module) -> tuple[nn.Module, bool]:
        modified = False
        for index, fn in enumerate(self.passes):
            name = _pass_name(fn)
            logger.debug("Running pass '%s'", name)
            try:
                result = fn(module)
                if not isinstance(result, PassResult) and not hasattr(result, "graph_module"):
                    raise TypeError(
                        f"The result of the pass {name} should be type PassResult."
                        + "Please wrap it with pass_result_wrapper()"
                    )
                module = result.graph_module
                modified = modified or result.modified
                if isinstance(module, GraphModule):
                    logger.debug("Graph after pass '%s': %s", name, module.graph)
                    module.recompile()
                if self.run_checks_after_each_pass:
                    self.check(module)
            except Exception as error:
                earlier = [_pass_name(p) for p in self.passes[:index]]
                raise Exception(  # noqa: TRY002 (torch.fx raises a bare Exception here)
                    f"An error occurred when running the '{name}' pass after the "
                    f"following passes: {earlier}"
                ) from error
        return module, modified
