"""Shared helpers for the export tests (corpus, oracle, seed examples) and the benchmark.

``EXPORTIR_EXPORT_IMPL`` names the implementation the tests treat as "ours": ``exportir``
(default) or ``torch.export`` (the oracle itself). Running the corpus tests with
``EXPORTIR_EXPORT_IMPL=torch.export`` sanity-checks the harness: a test that fails there is
either wrong or pins a deliberate difference from torch 2.13 (those are listed in
``tests/export/test_corpus.py``).

Nothing here imports ``exportir.export`` at module import time, so test modules stay collectable
while the package is incomplete; :func:`ours` imports it on first use.
"""

from __future__ import annotations

import copy
import functools
import importlib
import operator
import os
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

IMPL_ENV = "EXPORTIR_EXPORT_IMPL"


def ours_name() -> str:
    return os.environ.get(IMPL_ENV, "exportir")


@dataclass(frozen=True)
class ExportImpl:
    """The entry points of one export implementation."""

    name: str
    export: Callable[..., Any]
    save: Callable[..., Any] | None
    load: Callable[..., Any] | None
    register_dataclass: Callable[..., Any] | None
    module: Any


@functools.cache
def ours() -> ExportImpl:
    """The implementation under test (``exportir`` unless overridden by ``EXPORTIR_EXPORT_IMPL``)."""
    name = ours_name()
    if name == "torch.export":
        import torch.export as te

        return ExportImpl(name, te.export, te.save, te.load, te.register_dataclass, te)
    mod = importlib.import_module(name)
    # The top-level re-exports may lag behind the subpackage: fall back to ``<name>.export``.
    sub = importlib.import_module(f"{name}.export")

    def entry(attr: str) -> Any:
        value = getattr(mod, attr, None)
        if value is None or not callable(value) or isinstance(value, type(sub)):
            value = getattr(sub, attr, None)
        return value

    return ExportImpl(name, entry("export"), entry("save"), entry("load"), entry("register_dataclass"), mod)


def torch_export(module: torch.nn.Module, args: tuple, kwargs: dict | None = None) -> Any:
    """The oracle: ``torch.export.export(..., strict=False)``, with torch's warnings muted."""
    import torch.export as te

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return te.export(module, args, kwargs or {}, strict=False)


def quiet(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


# --------------------------------------------------------------------------------------------
# Graph summaries.


def op_name(target: Any) -> str:
    """A stable name for a call_function target: ``aten.add.Tensor``, ``operator.getitem``,
    ``higher_order.cond``, ``exportir_test.scaled_tanh.default``."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"higher_order.{target.name()}"
    module = getattr(target, "__module__", None) or type(target).__module__
    if module == "_operator":
        module = "operator"
    return f"{module}.{getattr(target, '__name__', repr(target))}"


def op_multiset(ep: Any) -> Counter[str]:
    """How many call_function nodes of each target the program's graph has."""
    return Counter(op_name(n.target) for n in ep.graph.nodes if n.op == "call_function")


def is_core_or_allowed(target: Any, custom_namespaces: frozenset[str]) -> bool:
    """Core ATen, ``operator.getitem``, a higher-order op, or a custom op in an allowed
    namespace (custom ops are kept whole in the ATen dialect)."""
    if target is operator.getitem:
        return True
    if isinstance(target, torch._ops.HigherOrderOperator):
        return True
    if isinstance(target, torch._ops.OpOverload):
        if target.namespace in custom_namespaces:
            return True
        return torch.Tag.core in target.tags
    return False


def _arg_row(arg: Any) -> tuple:
    kind = type(arg).__name__
    row: tuple = (kind, getattr(arg, "name", None))
    if kind == "ConstantArgument":
        row += (repr(arg.value),)
    return row


def signature_rows(ep: Any) -> tuple[list[tuple], list[tuple]]:
    """The graph signature as comparable rows: ``(kind, arg class, arg name, target,
    persistent)`` per input spec and ``(kind, arg class, arg name, target)`` per output spec."""
    sig = ep.graph_signature
    inputs = [
        (s.kind.name, *_arg_row(s.arg), s.target, getattr(s, "persistent", None)) for s in sig.input_specs
    ]
    outputs = [(s.kind.name, *_arg_row(s.arg), s.target) for s in sig.output_specs]
    return inputs, outputs


# --------------------------------------------------------------------------------------------
# Running programs against eager.


def leaves(tree: Any) -> list[Any]:
    import torch.utils._pytree as pytree

    return pytree.tree_leaves(tree)


def buffers_of(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: b.detach().clone() for name, b in module.named_buffers()}


def assert_same_tree(actual: Any, expected: Any, what: str) -> None:
    """Same pytree structure and types, tensors close (exact for ints/bools)."""
    import torch.utils._pytree as pytree

    a_leaves, a_spec = pytree.tree_flatten(actual)
    e_leaves, e_spec = pytree.tree_flatten(expected)
    assert a_spec == e_spec, f"{what}: output structure differs\n ours:  {a_spec}\n eager: {e_spec}"
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        if isinstance(e, torch.Tensor):
            assert isinstance(a, torch.Tensor), f"{what}: leaf {i} is {type(a).__name__}, expected a Tensor"
            torch.testing.assert_close(a, e, msg=lambda m, i=i: f"{what}: leaf {i}: {m}")
        else:
            assert a == e and type(a) is type(e), f"{what}: leaf {i}: {a!r} != {e!r}"


def deepcopy_module(module: torch.nn.Module) -> torch.nn.Module:
    return copy.deepcopy(module)
