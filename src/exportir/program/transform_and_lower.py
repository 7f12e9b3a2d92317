"""``to_edge_transform_and_lower``: ATen -> Edge -> transform passes -> backends, in one call.

Mirrors ExecuTorch's ``exir.to_edge_transform_and_lower``. Backends that match on ops the core
decomposition would expand (``aten._scaled_dot_product_flash_attention_for_cpu`` becomes ~25
ops) say so with ``Partitioner.ops_to_not_decompose(program) -> (ops, filter)``; for each
method this function

1. asks every partitioner of the method for its ops and filter, on the ATen program;
2. decomposes to core ATen keeping those ops whole; a node of such an op is kept when some
   partitioner that listed the op has no filter or its ``filter(node)`` is true, and is
   decomposed otherwise (the filter sees the ATen node, with its ``meta["val"]``);
3. converts to the Edge dialect, whose verifier accepts the kept ops while they wait;
4. runs ``transform_passes`` (``EdgeProgramManager.transform``);
5. lowers with each partitioner in turn (round *i* uses the *i*-th partitioner of every method
   that has one), as ``EdgeProgramManager.to_backend``;
6. decomposes the kept nodes no partitioner claimed, so that every method is valid Edge IR under
   ``compile_config`` and can go ``to_program()``. (ExecuTorch raises instead: "Node ... was not
   decomposed or delegated".) Ops produced by this late decomposition are not offered to the
   partitioners again.

Preserving an op whose decomposition the core table does not hold is a no-op (it is core ATen
already); mutable ops and ops whose result aliases an input are not preserved (a warning says
so), as in ExecuTorch. Ops in ``compile_config.preserve_ops`` stay whole regardless.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch._ops import OpOverload

from exportir.dialects.backend import Partitioner
from exportir.dialects.edge.config import EdgeCompileConfig
from exportir.export.program.exported_program import ExportedProgram
from exportir.fx.node import Node
from exportir.fx.passes.infra.pass_manager import PassManager
from exportir.passes.decompose_nodes import aten_op_of, decompose_nodes
from exportir.program.manager import (
    EdgeProgramManager,
    _as_methods,
    core_decomposition_table,
    edge_from_core_aten,
)

__all__ = ["to_edge_transform_and_lower"]

Pass = Callable[..., Any]
NodeFilter = Callable[[Node], bool]


@dataclasses.dataclass(frozen=True, slots=True)
class _Request:
    """The ops one partitioner asked to keep whole in one method, and its node filter."""

    ops: frozenset[OpOverload]
    node_filter: NodeFilter | None

    def keeps(self, node: Node) -> bool:
        if node.target not in self.ops:
            return False
        return self.node_filter is None or bool(self.node_filter(node))


# ------------------------------------------------------------------------------ arguments


def _partitioner_list(value: Any, where: str) -> tuple[Partitioner, ...]:
    if value is None:
        return ()
    items = (value,) if isinstance(value, Partitioner) else value
    if not isinstance(items, (list, tuple)):
        raise TypeError(
            f"{where} must be a Partitioner or a list of Partitioners; got {type(value).__name__}"
        )
    for i, p in enumerate(items):
        if not isinstance(p, Partitioner):
            raise TypeError(
                f"{where}[{i}] is a {type(p).__name__}, not a Partitioner; pass instances of "
                "exportir.dialects.backend.Partitioner subclasses (e.g. FusedCpuPartitioner())"
            )
    return tuple(items)


def _unknown_methods(names: Any, methods: Mapping[str, Any], what: str) -> None:
    unknown = sorted(set(names) - set(methods))
    if unknown:
        raise ValueError(
            f"{what} names methods {unknown} that are not among the programs "
            f"{sorted(methods)}; use the method names of the programs you pass"
        )


def _partitioners_by_method(
    partitioner: Any, methods: Mapping[str, ExportedProgram]
) -> dict[str, tuple[Partitioner, ...]]:
    if isinstance(partitioner, Mapping):
        _unknown_methods(partitioner, methods, "partitioner")
        return {
            name: _partitioner_list(partitioner.get(name), f"partitioner[{name!r}]")
            for name in methods
        }
    shared = _partitioner_list(partitioner, "partitioner")
    return {name: shared for name in methods}


def _pass_list(value: Any, where: str) -> list[Pass]:
    if isinstance(value, PassManager):
        return [value]
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise TypeError(
            f"{where} must be a list of passes, a PassManager, or a dict of method name -> "
            f"passes; got {type(value).__name__}"
        )
    bad = [i for i, p in enumerate(value) if not callable(p)]
    if bad:
        raise TypeError(f"{where}[{bad[0]}] is not callable; a pass is called on the graph module")
    return list(value)


def _transform_passes(
    transform_passes: Any, methods: Mapping[str, ExportedProgram]
) -> list[Pass] | dict[str, list[Pass]] | None:
    if transform_passes is None:
        return None
    if isinstance(transform_passes, Mapping):
        _unknown_methods(transform_passes, methods, "transform_passes")
        return {
            name: _pass_list(passes, f"transform_passes[{name!r}]")
            for name, passes in transform_passes.items()
        }
    return _pass_list(transform_passes, "transform_passes")


# ------------------------------------------------------------------------------ preserving


def _preservable(op: Any, who: str, core_table: Mapping[Any, Any]) -> bool:
    if not isinstance(op, OpOverload):
        raise TypeError(
            f"{who}.ops_to_not_decompose returned {op!r} ({type(op).__name__}); it must list "
            "OpOverloads such as torch.ops.aten.linear.default"
        )
    if op not in core_table:
        return False  # core ATen already (or no decomposition): nothing to keep
    schema = op._schema
    if schema.is_mutable or any(r.alias_info is not None for r in schema.returns):
        warnings.warn(
            f"{who} asked to keep {op} whole; the request is ignored because the op "
            f"{'mutates an input' if schema.is_mutable else 'returns an alias of an input'}",
            stacklevel=2,
        )
        return False
    return True


def _request(
    partitioner: Partitioner,
    ep: ExportedProgram,
    config: EdgeCompileConfig,
    core_table: Mapping[Any, Any],
) -> _Request:
    who = type(partitioner).__name__
    answer = partitioner.ops_to_not_decompose(ep)
    if not (isinstance(answer, tuple) and len(answer) == 2):
        raise TypeError(
            f"{who}.ops_to_not_decompose must return (list of OpOverloads, filter or None); "
            f"got {type(answer).__name__}"
        )
    ops, node_filter = answer
    if node_filter is not None and not callable(node_filter):
        raise TypeError(
            f"{who}.ops_to_not_decompose returned a filter of type "
            f"{type(node_filter).__name__}; it must be a callable node -> bool, or None"
        )
    user_kept = set(config.preserve_ops)
    kept = frozenset(
        op for op in ops or () if _preservable(op, who, core_table) and op not in user_kept
    )
    return _Request(kept, node_filter)


def _preserving_lower(
    ep: ExportedProgram, partitioners: tuple[Partitioner, ...], config: EdgeCompileConfig
) -> tuple[ExportedProgram, frozenset[OpOverload]]:
    """Steps 1-3 of the module docstring for one method: its Edge program and the ops kept."""
    core_table = core_decomposition_table(config)
    requests = [_request(p, ep, config, core_table) for p in partitioners]
    ops = frozenset().union(*(r.ops for r in requests))
    table = core_decomposition_table(config)
    aten = ep.run_decompositions({op: fn for op, fn in table.items() if op not in ops})
    if ops:

        def declined(node: Node) -> bool:
            return node.target in ops and not any(r.keeps(node) for r in requests)

        aten = decompose_nodes(aten, declined, table)
    return edge_from_core_aten(aten, _accepting(config, ops)), ops


def _accepting(config: EdgeCompileConfig, ops: frozenset[OpOverload]) -> EdgeCompileConfig:
    """``config`` whose verifier also accepts ``ops`` (kept whole until partitioned)."""
    extra = sorted(ops - set(config.preserve_ops), key=str)
    return dataclasses.replace(config, preserve_ops=[*config.preserve_ops, *extra])


def _decompose_unclaimed(
    manager: EdgeProgramManager,
    kept: Mapping[str, frozenset[OpOverload]],
    config: EdgeCompileConfig,
    constant_methods: Mapping[str, Any] | None,
) -> EdgeProgramManager:
    """Step 6: what is left of the kept ops is decomposed; verified under ``config``."""
    table = core_decomposition_table(config)
    final: dict[str, ExportedProgram] = {}
    for name, ops in kept.items():  # the programs' own method order
        ep = manager.exported_program(name)
        if ops:
            ep = decompose_nodes(
                ep, lambda n, ops=ops: aten_op_of(n.target) in ops, table, edge=True
            )
        final[name] = ep
    return EdgeProgramManager(final, constant_methods, config)


# ------------------------------------------------------------------------------ the API


def to_edge_transform_and_lower(
    programs: ExportedProgram | Mapping[str, ExportedProgram],
    transform_passes: Sequence[Pass] | Mapping[str, Sequence[Pass]] | PassManager | None = None,
    partitioner: Partitioner
    | Sequence[Partitioner]
    | Mapping[str, Partitioner | Sequence[Partitioner]]
    | None = None,
    constant_methods: Mapping[str, Any] | None = None,
    compile_config: EdgeCompileConfig | None = None,
    generate_etrecord: bool = False,
) -> EdgeProgramManager:
    """Lower ``programs`` to the Edge dialect, run ``transform_passes``, then delegate with
    ``partitioner``; see the module docstring for the steps.

    ``programs``: one ``ExportedProgram`` (method ``"forward"``) or ``{name: program}``.
    ``transform_passes``: a list of passes (every method), a ``PassManager``, or a dict of
    method name -> passes. ``partitioner``: a list of partitioners (every method, applied in
    order; one ``Partitioner`` is taken as a list of one) or a dict of method name -> list.
    ``constant_methods`` and ``compile_config``: as for ``to_edge``. ``generate_etrecord``:
    accepted for ExecuTorch's spelling; every emitted program gives its ETRecord
    (``.to_program().get_etrecord()``, see ``exportir.program.etrecord``) either way.

    Returns an ``EdgeProgramManager`` verified under ``compile_config``.
    """
    if isinstance(constant_methods, EdgeCompileConfig):
        raise TypeError("constant_methods got an EdgeCompileConfig; pass it as compile_config=...")
    if not isinstance(generate_etrecord, bool):
        raise TypeError(f"generate_etrecord must be a bool; got {generate_etrecord!r}")
    config = compile_config or EdgeCompileConfig()
    methods = _as_methods(programs, "to_edge_transform_and_lower")
    plan = _partitioners_by_method(partitioner, methods)
    passes = _transform_passes(transform_passes, methods)

    lowered = {name: _preserving_lower(ep, plan[name], config) for name, ep in methods.items()}
    kept = {name: ops for name, (_, ops) in lowered.items()}
    working = _accepting(config, frozenset().union(*kept.values()))
    manager = EdgeProgramManager(
        {name: ep for name, (ep, _) in lowered.items()}, constant_methods, working
    )
    if passes is not None:
        manager = manager.transform(passes)
    for i in range(max((len(parts) for parts in plan.values()), default=0)):
        manager = manager.to_backend(
            {name: parts[i] for name, parts in plan.items() if i < len(parts)}
        )
    return _decompose_unclaimed(manager, kept, config, constant_methods)
