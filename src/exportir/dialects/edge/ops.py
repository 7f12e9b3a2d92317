"""Edge operators: ATen operator overloads specialised with dtype constraints.

``ops.edge.aten.add.Tensor`` mirrors ExecuTorch's ``exir_ops.edge.aten.add.Tensor``: an
:class:`EdgeOpOverload` wrapping ``torch.ops.aten.add.Tensor`` whose ``_schema`` is an
:class:`EdgeFunctionSchema`. The schema's tensor arguments and returns are
:class:`EdgeArgument`s carrying ``allowed_types`` (the dtypes ``edge.yaml`` allows for them);
everything else is the ATen schema. Calling an edge op calls the ATen op.

Packets and overloads are created on first access and cached on the packet, so
``ops.edge.aten.add.Tensor is ops.edge.aten.add.Tensor``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._ops import OpOverload, OpOverloadPacket

from exportir.dialects.edge.constraints import (
    DtypeSet,
    OpDtypeConstraint,
    constraint_for,
    is_tensor_like,
    permissive_constraint,
    tensor_variable_names,
)

__all__ = [
    "EdgeArgument",
    "EdgeFunctionSchema",
    "EdgeOpOverload",
    "EdgeOpOverloadPacket",
    "ops",
    "to_edge_op",
]


class EdgeArgument:
    """A schema argument or return with the dtypes the edge dialect allows for it."""

    __slots__ = ("_argument", "allowed_types", "variable")

    def __init__(self, argument: torch._C.Argument, variable: str, allowed: DtypeSet) -> None:
        self._argument = argument
        self.variable = variable  # its name in edge.yaml ("self", "__ret_0")
        self.allowed_types = allowed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._argument, name)

    def __repr__(self) -> str:
        return repr(self._argument)

    def __str__(self) -> str:
        return str(self._argument)


class EdgeFunctionSchema:
    """An ATen ``FunctionSchema`` whose tensor arguments/returns are :class:`EdgeArgument`s."""

    __slots__ = ("arguments", "dtype_constraint", "returns", "schema")

    def __init__(self, schema: torch._C.FunctionSchema, constraint: OpDtypeConstraint) -> None:
        self.schema = schema
        self.dtype_constraint = constraint
        arg_vars, ret_vars = tensor_variable_names(schema)
        arg_set = set(arg_vars)
        self.arguments: list[Any] = [
            EdgeArgument(a, a.name, constraint.allowed_types(a.name)) if a.name in arg_set else a
            for a in schema.arguments
        ]
        returns: list[Any] = []
        remaining = iter(ret_vars)
        for ret in schema.returns:
            if is_tensor_like(ret.type):
                name = next(remaining)
                returns.append(EdgeArgument(ret, name, constraint.allowed_types(name)))
            else:
                returns.append(ret)
        self.returns = returns

    def __getattr__(self, name: str) -> Any:
        return getattr(self.schema, name)

    def __str__(self) -> str:
        return str(self.schema)

    def __repr__(self) -> str:
        return repr(self.schema)


class EdgeOpOverload:
    """An edge operator: an ATen ``OpOverload`` plus dtype constraints.

    ``__name__`` is ``aten.add.Tensor`` and printed code refers to it as
    ``exportir.dialects.edge.ops.aten.add.Tensor`` (as ExecuTorch's do under their module).
    Attributes it does not define (``tags``, ``namespace``, ``_overloadname``...) are read from
    the ATen op.
    """

    __slots__ = ("__name__", "__qualname__", "_edge_name", "_op", "_schema")

    def __init__(self, op: OpOverload) -> None:
        self._op = op
        constraint = constraint_for(op) or permissive_constraint(op._schema)
        self._schema = EdgeFunctionSchema(op._schema, constraint)
        self.__name__ = f"{op.namespace}.{op._schema.name.split('::', 1)[1]}.{op._overloadname}"
        self.__qualname__ = self.__name__
        self._edge_name = f"edge.{self.__name__}"

    @property
    def aten_op(self) -> OpOverload:
        """The underlying ``torch.ops.<namespace>.<name>.<overload>``."""
        return self._op

    @property
    def name_in_dialect(self) -> str:
        """``edge.aten.add.Tensor``: where the op lives in ``exportir.dialects.edge.ops``."""
        return self._edge_name

    @property
    def dtype_constraint(self) -> OpDtypeConstraint:
        return self._schema.dtype_constraint

    def __getattr__(self, name: str) -> Any:
        return getattr(self._op, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._op(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<EdgeOpOverload: {self.__name__}>: schema = {self._schema.schema}"

    __str__ = __repr__

    # Edge ops are singletons (one per ATen overload): copying and pickling keep identity.
    def __deepcopy__(self, memo: dict[int, Any]) -> EdgeOpOverload:
        return self

    def __copy__(self) -> EdgeOpOverload:
        return self

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (_edge_op_by_name, (self._op.namespace, self.__name__.split(".", 1)[1]))


def _edge_op_by_name(namespace: str, rest: str) -> EdgeOpOverload:
    name, _, overload = rest.rpartition(".")
    return getattr(getattr(getattr(ops.edge, namespace), name), overload)


class EdgeOpOverloadPacket:
    """All overloads of one op in the edge namespace: ``ops.edge.aten.add``."""

    def __init__(self, namespace: str, packet: OpOverloadPacket) -> None:
        self._namespace = namespace
        self._packet = packet
        self._overloads: dict[str, EdgeOpOverload] = {}
        self.__name__ = f"{namespace}.{packet._qualified_op_name.split('::', 1)[1]}"

    def overloads(self) -> list[str]:
        return list(self._packet.overloads())

    def __getattr__(self, overload: str) -> EdgeOpOverload:
        if overload.startswith("__"):
            raise AttributeError(overload)
        cached = self._overloads.get(overload)
        if cached is not None:
            return cached
        aten = getattr(self._packet, overload, None)
        if not isinstance(aten, OpOverload):
            raise AttributeError(  # noqa: TRY004  # the getattr protocol: AttributeError
                f"edge op packet 'edge.{self.__name__}' has no overload {overload!r}; "
                f"available overloads: {self.overloads()}"
            )
        op = self._overloads[overload] = EdgeOpOverload(aten)
        return op

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._packet(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<EdgeOpOverloadPacket(op='edge.{self.__name__}', parent_op='{self.__name__}')>"

    def __str__(self) -> str:
        return f"edge.{self.__name__}"


class _EdgeNamespace:
    """``ops.edge.<namespace>``: packets created on first access."""

    def __init__(self, namespace: str) -> None:
        self._namespace = namespace
        self._packets: dict[str, EdgeOpOverloadPacket] = {}

    def __getattr__(self, name: str) -> EdgeOpOverloadPacket:
        if name.startswith("__"):
            raise AttributeError(name)
        cached = self._packets.get(name)
        if cached is not None:
            return cached
        packet = getattr(getattr(torch.ops, self._namespace), name, None)
        if not isinstance(packet, OpOverloadPacket):
            raise AttributeError(  # noqa: TRY004  # the getattr protocol: AttributeError
                f"there is no operator {self._namespace}::{name} to specialise"
            )
        edge_packet = self._packets[name] = EdgeOpOverloadPacket(self._namespace, packet)
        return edge_packet


class _EdgeOps:
    """``ops.edge``: one :class:`_EdgeNamespace` per operator namespace (``aten``, custom)."""

    def __init__(self) -> None:
        self._namespaces: dict[str, _EdgeNamespace] = {}

    def __getattr__(self, namespace: str) -> _EdgeNamespace:
        if namespace.startswith("__"):
            raise AttributeError(namespace)
        ns = self._namespaces.get(namespace)
        if ns is None:
            ns = self._namespaces[namespace] = _EdgeNamespace(namespace)
        return ns


class _Ops:
    """The dialect namespaces: ``ops.edge`` (a backend dialect adds its own later)."""

    def __init__(self) -> None:
        self.edge = _EdgeOps()


ops = _Ops()


def to_edge_op(op: OpOverload) -> EdgeOpOverload:
    """The edge operator specialising ``op`` (``aten.add.Tensor`` -> ``edge.aten.add.Tensor``)."""
    name = op._schema.name.split("::", 1)[1]
    return getattr(getattr(getattr(ops.edge, op.namespace), name), op._overloadname)


# Printed code refers to an edge op as ``<module>.<__name__>``; resolve that path too.
aten = ops.edge.aten
