"""The per-method emitter behind :func:`exportir.program.emit.emit_program`.

One :class:`MethodEmitter` walks one graph in order and builds the value table, the operator
table, the instruction schedule and the debug table; then it plans the memory of the tensors it
created (:mod:`planning`) and freezes everything into a :class:`schema.Method`.
"""

from __future__ import annotations

from typing import Any

import torch

from exportir.format import planning, schema
from exportir.fx import Node
from exportir.fx.node import map_arg
from exportir.program import kernels
from exportir.program._debug_nodes import DebugNodes
from exportir.program._emit_control_flow import CONTROL_FLOW
from exportir.program._emit_program import ProgramBuilder, tensor_bytes
from exportir.program._emit_values import (
    _TENSORS,
    _dim_order,
    _finalize,
    _nbytes,
    _numel,
    _order_of,
    _PendingTensor,
    _same_layout,
    _size_bound,
)
from exportir.program._input_dims import input_sizes
from exportir.program.kernels import EmitError, source_line

_CONSTANT_KINDS = ("PARAMETER", "BUFFER", "CONSTANT_TENSOR")
_RUNTIME_SCALARS = (schema.Int, schema.Double, schema.Bool)

# Constant folding stores a node's results when they are no larger than the constant tensors it
# reads (a weight's permute_copy) or when each is at most this many bytes: small input-independent
# subgraphs (a causal mask from arange / le / logical_and: 128 x 128 float32 or 256 x 256 bool)
# are computed once here instead of on every call, while a large factory result (a zeros() of
# megabytes) stays an instruction: stored, it would grow the file and cost more to read than to
# recompute.
FOLD_MAX_RESULT_BYTES = 64 * 1024

# Ops that read only the shape and dtype of their tensor argument: folded whatever computes it.
_SHAPE_ONLY = frozenset({"aten::full_like", "aten::zeros_like", "aten::ones_like"})

# Factories whose contents are undefined: folded, they would put arbitrary bytes in the file.
_UNINITIALIZED = frozenset({
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::empty_permuted",
    "aten::new_empty", "aten::new_empty_strided",
})
_MUTATION_KINDS = ("BUFFER_MUTATION", "PARAMETER_MUTATION")


class MethodEmitter:
    def __init__(self, name: str, ep: Any, program: ProgramBuilder, config: Any) -> None:
        self.name = name
        self.ep = ep
        self.gm = ep.graph_module
        self.program = program
        self.config = config
        self.values: list[Any] = []  # schema.EValue or _PendingTensor
        self.instructions: list[schema.Instruction] = []
        self.debug: list[schema.DebugEntry] = []
        self.debug_nodes = DebugNodes()  # the debug node table (format 2.2)
        self.operators: dict[schema.Operator, int] = {}
        self.node_value: dict[Node, int] = {}
        self.node_items: dict[Node, tuple[int, ...]] = {}
        self.literals: dict[tuple[Any, ...], int] = {}
        self.inputs: list[int] = []
        self.input_names: list[str] = []
        self.input_vals: list[Any] = []  # their meta["val"]: the symbolic input sizes
        self.whole_method: list[int] = []
        self.by_input_name: dict[str, int] = {}
        self.state_value: dict[str, int] = {}
        self.scalar_tensors: dict[Node, int] = {}
        self.written_inputs: set[int] = set()  # user inputs the method mutates
        # nodes whose value is known at emit time (weights, lifted constants, folded nodes):
        # a constant value is made only when an instruction or output reads the node
        self.constants: dict[Node, Any] = {}
        self.current: Node | None = None  # the node being emitted (debug info of helpers)
        # meta tensors (weights attached after emission) -> their names in the program
        self.meta_names = {
            id(t): name for name, t in (*ep.state_dict.items(), *ep.constants.items())
            if isinstance(t, torch.Tensor) and t.device.type == "meta"
        }

    # -- values ---------------------------------------------------------------------------------

    def add(self, value: Any) -> int:
        self.values.append(value)
        return len(self.values) - 1

    def literal(self, value: Any) -> int:
        """A deduplicated literal value (Int/Double/Bool/String/Null/lists of literals)."""
        key = (type(value).__name__, repr(value))
        found = self.literals.get(key)
        if found is None:
            found = self.literals[key] = self.add(value)
        return found

    def weight_name(self, t: torch.Tensor) -> str:
        name = self.meta_names.get(id(t))
        if name is None:
            raise EmitError(f"method {self.name!r}, node {getattr(self.current, 'name', '?')!r}: a constant computed from meta tensors has "
                            "no data; only the model's own parameters and buffers may be meta")
        return name

    def constant_tensor(self, t: torch.Tensor) -> int:
        if t.device.type == "meta" and t._base is None:  # weights attached after emission
            return self.literal(
                schema.Tensor(kernels.scalar_type(t.dtype), tuple(t.shape),
                              tuple(range(t.dim())),
                              schema.ConstantData(self.program.deferred(t, self.weight_name(t))))
            )
        root = t._base
        if (
            root is not None and root.dtype == t.dtype and root.is_contiguous()
            and root._base is None and t.storage_offset() >= root.storage_offset()
        ):  # a view of a constant (folded permute of a weight): no bytes of its own
            base = self.constant_tensor(root)
            return self.literal(
                schema.Tensor(
                    kernels.scalar_type(t.dtype),
                    tuple(t.shape),
                    _order_of(t.stride()),
                    schema.ViewOf(base, t.storage_offset() - root.storage_offset(),
                                  tuple(t.stride())),
                )
            )
        buffer = self.program.constant(tensor_bytes(t))
        return self.literal(
            schema.Tensor(
                kernels.scalar_type(t.dtype),
                tuple(t.shape),
                tuple(range(t.dim())),
                schema.ConstantData(buffer),
            )
        )

    def new_tensor(self, val: Any, name: str, contiguous: bool = False) -> int:
        if not isinstance(val, torch.Tensor):
            raise EmitError(f"node {name!r} of method {self.name!r} has no tensor meta['val']")
        sizes, bounded, dynamic = [], True, False
        for s in val.shape:
            n, ok = _size_bound(s)
            sizes.append(n)
            bounded &= ok
            dynamic |= not isinstance(s, int)
        pending = _PendingTensor(
            kernels.scalar_type(val.dtype),
            tuple(sizes),
            tuple(range(val.dim())) if contiguous else _dim_order(val),
            dynamic,
            bounded,
            name,
        )
        return self.add(pending)

    def scalar_value(self, val: Any, name: str) -> int:
        """A scalar produced at run time (symbolic int / float / bool)."""
        if isinstance(val, (bool, torch.SymBool)):
            return self.add(schema.Bool(bool(val) if isinstance(val, bool) else False))
        if isinstance(val, (float, torch.SymFloat)):
            return self.add(schema.Double(float(val) if isinstance(val, float) else 0.0))
        if isinstance(val, (int, torch.SymInt)):
            return self.add(schema.Int(val if isinstance(val, int) else _size_bound(val)[0]))
        if isinstance(val, str):
            return self.add(schema.String(val))
        if val is None:
            return self.add(schema.Null())
        raise EmitError(f"node {name!r} of method {self.name!r}: unsupported scalar {val!r}")

    def operator_index(self, op: schema.Operator) -> int:
        found = self.operators.get(op)
        if found is None:
            found = self.operators[op] = len(self.operators)
        return found

    def emit_instruction(self, ins_factory: Any, node: Node) -> None:
        self.debug.append(schema.DebugEntry(node.name, source_line(node)))
        self.debug_nodes.add(node)
        self.instructions.append(ins_factory(len(self.debug) - 1))

    # -- arguments ------------------------------------------------------------------------------

    def node_ref(self, node: Node) -> int:
        found = self.node_value.get(node)
        if found is None and isinstance(self.constants.get(node), torch.Tensor):
            found = self.node_value[node] = self.constant_tensor(self.constants[node])
        if found is None:
            raise EmitError(
                f"method {self.name!r}: node {node.name!r} is used but produced no single value "
                f"(a tuple needs getitem)"
            )
        return found

    def tensor_arg(self, value: Any, dtype_hint: torch.dtype | None) -> int:
        if isinstance(value, Node):
            ref = self.node_ref(value)
            if isinstance(self.values[ref], (schema.Tensor, _PendingTensor)):
                return ref
            if isinstance(self.values[ref], _RUNTIME_SCALARS):
                return self.scalar_as_tensor(value, ref)
            raise EmitError(f"node {value.name!r} is not a tensor but is passed as one")
        if isinstance(value, torch.Tensor):
            return self.constant_tensor(value)
        if isinstance(value, bool):
            return self.constant_tensor(torch.tensor(value))
        if isinstance(value, int):
            return self.constant_tensor(torch.tensor(value, dtype=torch.int64))
        if isinstance(value, float):
            floating = dtype_hint is not None and (dtype_hint.is_floating_point)
            return self.constant_tensor(
                torch.tensor(value, dtype=dtype_hint if floating else torch.float32)
            )
        raise EmitError(f"expected a tensor argument; got {value!r}")

    def scalar_as_tensor(self, value: Node, ref: int) -> int:
        """A 0-dim tensor holding the run-time scalar ``value`` (a symbolic size used as a
        ``Tensor`` operand, ``h * x.shape[0]``): ``aten::scalar_tensor.out`` fills it where the
        scalar is first used as a tensor. Its dtype follows Python's scalar promotion: int64 for
        ints, the default float dtype for floats, bool for bools."""
        found = self.scalar_tensors.get(value)
        if found is not None:
            return found
        scalar = self.values[ref]
        dtype = (torch.bool if isinstance(scalar, schema.Bool) else torch.int64
                 if isinstance(scalar, schema.Int) else torch.get_default_dtype())
        out = self.new_tensor(torch.empty((), dtype=dtype), f"{value.name}_tensor")
        index = self.operator_index(kernels.operator_of(torch.ops.aten.scalar_tensor.out))
        self.emit_instruction(lambda d: schema.KernelCall(index, (ref, out), d), self.current)
        self.scalar_tensors[value] = out
        return out

    def scalar_arg(self, value: Any) -> int:
        if isinstance(value, Node):
            return self.node_ref(value)
        if isinstance(value, torch.dtype):
            return self.literal(schema.Int(int(kernels.scalar_type(value))))
        if isinstance(value, torch.layout):
            return self.literal(schema.Int(kernels.LAYOUTS.get(value, 0)))
        if isinstance(value, torch.memory_format):
            return self.literal(schema.Int(kernels.MEMORY_FORMATS.get(value, 0)))
        if isinstance(value, torch.device):  # a model built on meta runs on the CPU
            return self.literal(schema.String(str(_on_cpu(value))))
        if isinstance(value, bool):
            return self.literal(schema.Bool(value))
        if isinstance(value, int):
            return self.literal(schema.Int(value))
        if isinstance(value, float):
            return self.literal(schema.Double(value))
        if isinstance(value, str):
            return self.literal(schema.String(value))
        if value is None:
            return self.literal(schema.Null())
        raise EmitError(f"unsupported argument value {value!r} ({type(value).__name__})")

    def list_arg(self, elem: Any, value: Any, hint: torch.dtype | None) -> int:
        kind = elem.kind()
        items = list(value)
        if kind == "TensorType":
            return self.add(schema.TensorList(tuple(self.tensor_arg(v, hint) for v in items)))
        if kind == "OptionalType":
            refs = tuple(
                self.literal(schema.Null()) if v is None else self.tensor_arg(v, hint)
                for v in items
            )
            return self.add(schema.OptionalTensorList(refs))
        if kind in ("IntType", "SymIntType"):
            refs = tuple(self.scalar_arg(v) for v in items)
            if any(isinstance(v, Node) for v in items):
                return self.add(schema.IntList(refs))
            return self.literal(schema.IntList(refs))
        if kind == "FloatType":
            return self.literal(schema.DoubleList(tuple(float(v) for v in items)))
        if kind == "BoolType":
            return self.literal(schema.BoolList(tuple(bool(v) for v in items)))
        raise EmitError(f"unsupported list argument type {elem}[]")

    def arg(self, typ: Any, value: Any, hint: torch.dtype | None) -> int:
        kind = typ.kind()
        if kind == "OptionalType":
            if value is None:
                return self.literal(schema.Null())
            return self.arg(typ.getElementType(), value, hint)
        if kind == "TensorType":
            return self.tensor_arg(value, hint)
        if kind == "ListType":
            if isinstance(value, (int, Node)) and not isinstance(value, bool):
                value = [value]  # int[2] arguments accept a single int
            return self.list_arg(typ.getElementType(), value, hint)
        return self.scalar_arg(value)

    # -- nodes ----------------------------------------------------------------------------------

    def bind(self, node: Node, op: torch._ops.OpOverload) -> dict[str, Any]:
        bound: dict[str, Any] = {}
        positional = [a for a in op._schema.arguments if not a.kwarg_only]
        for a, v in zip(positional, node.args):
            bound[a.name] = v
        bound.update(node.kwargs)
        for a in op._schema.arguments:
            if a.name not in bound and not a.is_out:
                if not a.has_default_value():
                    raise EmitError(
                        f"node {node.name!r}: argument {a.name!r} of {kernels.display_name(op)} "
                        "is missing"
                    )
                bound[a.name] = a.default_value
        return bound

    def results(self, node: Node, choice: kernels.KernelChoice) -> list[int]:
        val = node.meta.get("val")
        # a view runs as its *_copy op, whose result is contiguous
        contiguous = kernels.is_view_copy(choice.functional)
        if isinstance(val, (list, tuple)):
            items = tuple(
                self.new_tensor(v, f"{node.name}[{i}]", contiguous) for i, v in enumerate(val)
            )
            if _returns_list(choice.functional):
                return [self.bind_items(node, items, True)]
            self.node_items[node] = items
            if len(items) != choice.num_results:
                raise EmitError(
                    f"node {node.name!r}: {kernels.display_name(choice.out)} has "
                    f"{choice.num_results} out arguments for {len(items)} results"
                )
            return list(items)
        ref = self.new_tensor(val, node.name, contiguous)
        self.node_value[node] = ref
        return [ref]

    def bind_items(self, node: Node, items: tuple[int, ...], as_list: bool) -> int | None:
        """Record the values of a node with several results (a ``TensorList`` value too when its
        op returns a list); returns that list value."""
        self.node_items[node] = items
        if not as_list:
            return None
        ref = self.node_value[node] = self.add(schema.TensorList(items))
        return ref

    def emit_kernel(self, node: Node) -> None:
        op = kernels.aten_op(node.target)
        choice = kernels.out_variant(op)
        if choice is None:  # checked by check_kernel_coverage; kept for direct callers
            raise EmitError(f"node {node.name!r}: {kernels.display_name(op)} has no out variant")
        bound = self.bind(node, op)
        results = self.results(node, choice)
        val = node.meta.get("val")
        hint = val.dtype if isinstance(val, torch.Tensor) else None
        copied = {}
        for name, index in choice.copied:  # the mutated inputs run on copies in these results
            src = self.tensor_arg(bound.get(name), hint)
            self.emit_instruction(
                lambda d, s=src, t=results[index]: schema.MoveCall(s, t, d), node
            )
            copied[name] = results[index]
        skip = {index for _, index in choice.copied}
        outs = [r for i, r in enumerate(results) if i not in skip]
        args, k = [], 0
        for a in choice.out._schema.arguments:
            if a.is_out:
                args.append(outs[k])
                k += 1
            elif a.name in copied:
                args.append(copied[a.name])
            else:
                args.append(self.arg(a.type, bound.get(a.name), hint))
        index = self.operator_index(choice.operator)
        self.emit_instruction(lambda d: schema.KernelCall(index, tuple(args), d), node)

    def fold(self, node: Node) -> bool:
        """Constant folding: a kernel node that depends on no input (its tensor inputs are all
        constants, or it has none, or it reads only their static shapes: a weight's
        ``permute_copy``, a lifted scalar's cast, a causal mask built from ``arange``, a
        ``full_like``) runs once, here, and its result is stored as a constant instead of being
        recomputed on every call. Nodes are not folded when they are random or uninitialized
        (``empty``), have symbolic sizes, or would store more bytes than the constants they read
        unless each result is at most :data:`FOLD_MAX_RESULT_BYTES`. Returns whether ``node``
        was folded."""
        op = kernels.aten_op(node.target)
        if torch.Tag.nondeterministic_seeded in op.tags or op._schema.name in _UNINITIALIZED:
            return False
        val = node.meta.get("val")
        vals = tuple(val) if isinstance(val, (list, tuple)) else (val,)
        if not vals or not all(
            isinstance(v, torch.Tensor) and all(isinstance(s, int) for s in v.shape) for v in vals
        ):
            return False
        inputs = node.all_input_nodes
        read = [self.constants[n] for n in inputs if isinstance(self.constants.get(n), torch.Tensor)]
        sizes = [v.numel() * v.element_size() for v in vals]
        if max(sizes) > FOLD_MAX_RESULT_BYTES and sum(sizes) > sum(
            t.numel() * t.element_size() for t in read
        ):
            return False
        known = {n: self.constants.get(n) for n in inputs}
        if op._schema.name in _SHAPE_ONLY:  # any static tensor will do: only its shape is read
            known = {n: _zeros_like_val(n) if v is None else v for n, v in known.items()}
        if any(v is None for v in known.values()):
            return False
        args, kwargs = map_arg((node.args, node.kwargs), known.__getitem__)
        kwargs = {k: _on_cpu(v) for k, v in kwargs.items()}
        # a view op (or view copy) of a constant folds to a real view: stored as a ViewOf its
        # root (constant_tensor), not as a second copy of the bytes (a tied weight's transpose)
        rule = kernels.alias_rule(op)
        if isinstance(rule, torch._ops.OpOverload) and (
            rule._schema.name not in kernels.STORAGE_RELATIVE_VIEWS
        ):
            with torch.no_grad():
                try:
                    result = rule(*args, **kwargs)
                except Exception:  # noqa: BLE001 - not a view over these strides: copy below
                    rule = None
        if not isinstance(rule, torch._ops.OpOverload):
            if any(t.device.type == "meta" for t in read):  # no data: the runtime computes it
                return False
            try:
                with torch.no_grad():
                    result = op(*args, **kwargs)
            except Exception:  # noqa: BLE001 - not foldable here: the runtime runs it instead
                return False
        results = tuple(result) if isinstance(result, (list, tuple)) else (result,)
        if len(results) != len(vals) or any(
            not isinstance(r, torch.Tensor) or r.dtype != v.dtype or tuple(r.shape) != tuple(v.shape)
            for r, v in zip(results, vals)
        ):
            return False
        self.constants[node] = results if isinstance(val, (list, tuple)) else results[0]
        return True

    def alias_layout(self, ref: int) -> tuple[int, int, tuple[int, ...]] | None:
        """(root, offset, strides) of tensor value ``ref`` when a view may alias it: its root is
        a constant, a static planned tensor written only by the instruction producing it (not
        method state), or a static, contiguous user input the method never writes; else None."""
        v = self.values[ref]
        if isinstance(v, _PendingTensor):
            if v.dynamic or not v.bounded or v.initial is not None:
                return None
            return ref, 0, schema.dense_strides(v.sizes, v.dim_order)
        if not isinstance(v, schema.Tensor) or v.dynamic:
            return None
        match v.storage:
            case schema.ViewOf(base=base, offset=offset, strides=strides):
                return base, offset, strides
            case schema.ConstantData():
                return ref, 0, schema.dense_strides(v.sizes, v.dim_order)
            case schema.InputStorage() if ref not in self.written_inputs and v.dim_order == tuple(
                range(len(v.sizes))
            ):
                return ref, 0, schema.dense_strides(v.sizes, v.dim_order)
        return None

    def alias(self, node: Node) -> bool:
        """A view (or a copy changing neither dtype nor layout: ``kernels.alias_rule``) of a
        static tensor becomes a value with ``schema.ViewOf`` storage and no instruction: its
        offset and strides in the source's root come from running the view op on a meta
        stand-in laid out like the source. Returns False (the copy kernel runs instead) when
        the source cannot be aliased (:meth:`alias_layout`), a size is symbolic, or the view is
        not expressible over the source's strides (``view`` of a non-contiguous alias)."""
        rule = kernels.alias_rule(kernels.aten_op(node.target))
        src = node.args[0] if node.args else None
        val = node.meta.get("val")
        vals = tuple(val) if isinstance(val, (list, tuple)) else (val,)
        if rule is kernels.NOT_ALIASING or not isinstance(src, Node) or not vals or any(
            n is not src for n in node.all_input_nodes
        ) or not all(
            isinstance(v, torch.Tensor) and all(isinstance(s, int) for s in v.shape) for v in vals
        ):
            return False
        ref = self.node_ref(src)
        layout = self.alias_layout(ref) if isinstance(self.values[ref], _TENSORS) else None
        if layout is None or (
            rule is not None and rule._schema.name in kernels.STORAGE_RELATIVE_VIEWS
            and layout[0] != ref
        ):
            return False
        root, offset, strides = layout
        source = self.values[ref]
        dtype = getattr(torch, schema.TORCH_DTYPE_NAME[source.dtype])
        numel = _numel(self.values[root].sizes)
        stand_in = torch.empty(numel, dtype=dtype, device="meta").as_strided(
            source.sizes, strides, offset
        )
        if rule is None:  # the source itself, if indistinguishable from the fresh copy
            results: tuple[Any, ...] = (stand_in,)  # (its whole storage: as_strided sees it)
            if val.dtype != dtype or val.layout != torch.strided or offset or numel != _numel(
                source.sizes
            ) or not _same_layout(val, stand_in):
                return False
        else:
            try:
                result = rule(stand_in, *node.args[1:], **node.kwargs)
            except (RuntimeError, ValueError, TypeError):  # not expressible over these strides
                return False
            results = tuple(result) if isinstance(result, (list, tuple)) else (result,)
        if len(results) != len(vals) or any(
            r.dtype != v.dtype or r.shape != v.shape for r, v in zip(results, vals)
        ):
            return False
        items = tuple(
            self.add(schema.Tensor(
                source.dtype, tuple(r.shape), _order_of(r.stride()),
                schema.ViewOf(root, r.storage_offset(), tuple(r.stride())),
            ))
            for r in results
        )
        if isinstance(val, (list, tuple)):
            self.bind_items(node, items, _returns_list(kernels.aten_op(node.target)))
        else:
            self.node_value[node] = items[0]
        return True

    def emit_fallback(self, node: Node) -> None:
        """A custom op without an out variant: its functional schema's arguments, then one
        planned out tensor per result (:data:`schema.FUNCTIONAL_FALLBACK`)."""
        op = kernels.aten_op(node.target)
        bound = self.bind(node, op)
        val = node.meta.get("val")
        vals = tuple(val) if isinstance(val, (list, tuple)) else (val,)
        hint = vals[0].dtype if vals and isinstance(vals[0], torch.Tensor) else None
        args = [self.arg(a.type, bound.get(a.name), hint) for a in op._schema.arguments]
        outs = tuple(self.new_tensor(v, f"{node.name}[{i}]") for i, v in enumerate(vals))
        if isinstance(val, (list, tuple)):
            self.node_items[node] = outs
        else:
            self.node_value[node] = outs[0]
        index = self.operator_index(kernels.fallback_operator(op))
        self.emit_instruction(lambda d: schema.KernelCall(index, (*args, *outs), d), node)

    def emit_prim(self, node: Node, op: schema.Operator) -> None:
        args = [self.scalar_arg(a) if not isinstance(a, Node) else self.node_ref(a)
                for a in node.args]
        out = self.scalar_value(node.meta.get("val"), node.name)
        self.node_value[node] = out
        index = self.operator_index(op)
        self.emit_instruction(lambda d: schema.KernelCall(index, (*args, out), d), node)

    def emit_delegate(self, node: Node) -> None:
        lowered = kernels.delegate_module(node, self.gm)
        index = self.program.delegate(lowered)
        self.debug_nodes.add_delegate(lowered, index)
        inputs = []
        for a in node.args[1:]:
            for item in a if isinstance(a, (list, tuple)) else (a,):
                if isinstance(item, Node) and item in self.constants:
                    self.node_ref(item)
                is_tensor = isinstance(item, (Node, torch.Tensor)) and not (
                    isinstance(item, Node) and item in self.node_value
                    and not isinstance(self.values[self.node_value[item]],
                                       (schema.Tensor, _PendingTensor))
                )
                inputs.append(self.tensor_arg(item, None) if is_tensor else self.scalar_arg(item))
        outs = self.result_tensors(node, "{name}[{i}]")
        self.emit_instruction(
            lambda d: schema.DelegateCall(index, tuple(inputs), outs, d), node
        )

    def result_tensors(self, node: Node, item_name: str) -> tuple[int, ...]:
        """New tensor values for ``node``'s result (one, or one per item of a tuple result,
        named by ``item_name.format(name=..., i=...)``), recorded as the node's values."""
        val = node.meta.get("val")
        if isinstance(val, (list, tuple)):
            outs = tuple(self.new_tensor(v, item_name.format(name=node.name, i=i))
                         for i, v in enumerate(val))
            self.node_items[node] = outs
            return outs
        self.node_value[node] = self.new_tensor(val, node.name)
        return (self.node_value[node],)

    def emit_getitem(self, node: Node) -> None:
        src, idx = node.args
        folded = self.constants.get(src)
        if isinstance(folded, tuple) and isinstance(idx, int):
            self.constants[node] = folded[idx]
            return
        items = self.node_items.get(src)
        if items is None or not isinstance(idx, int) or not -len(items) <= idx < len(items):
            raise EmitError(f"node {node.name!r}: getitem {idx!r} of {src!r} has no value")
        self.node_value[node] = items[idx]

    def open_jump(self, cond_ref: int, node: Node) -> int:
        """A ``JumpFalseCall`` whose destination :meth:`close_jump` sets; returns its index."""
        self.emit_instruction(lambda d: schema.JumpFalseCall(cond_ref, -1, d), node)
        return len(self.instructions) - 1

    def close_jump(self, index: int) -> None:
        """Point the jump at ``index`` to the next instruction to be emitted."""
        jump = self.instructions[index]
        self.instructions[index] = schema.JumpFalseCall(
            jump.cond_value, len(self.instructions), jump.debug
        )

    def inline_body(self, body: Any) -> list[Any]:
        """Emit the nodes of a control-flow body (its placeholders already bound) into this
        method; returns the values its output node names."""
        owner, self.gm = self.gm, body
        try:
            for inner in body.graph.nodes:
                if inner.op == "get_attr":
                    obj = kernels.get_attr(body, inner.target)
                    if isinstance(obj, torch.Tensor):
                        self.constants[inner] = obj
                elif inner.op == "call_function":
                    self.current = inner
                    self.emit_call(inner)
                elif inner.op == "output":
                    results = inner.args[0]
                    return list(results) if isinstance(results, (list, tuple)) else [results]
        finally:
            self.gm = owner
        return []

    def emit_call(self, node: Node) -> None:
        loop = CONTROL_FLOW.get(node.target)
        if loop is not None:
            loop(self, node)
            return
        kind = kernels.classify(node, self.gm)
        if kind == "getitem":
            self.emit_getitem(node)
        elif kind == "delegate":
            self.emit_delegate(node)
        elif kind == "kernel":
            if not self.fold(node) and not self.alias(node):
                self.emit_kernel(node)
        elif kind == "fallback":
            self.emit_fallback(node)
        elif kind == "prim":
            self.emit_prim(node, schema.Operator(*kernels.PYTHON_PRIMS[node.target]))
        elif kind == "sym":
            self.emit_prim(node, kernels.operator_of(kernels.aten_op(node.target)))
        elif kind != "skip":
            raise EmitError(f"node {node.name!r} cannot run: {kind.lstrip('!')}")

    # -- placeholders, outputs ------------------------------------------------------------------

    def state_tensor(self, target: str) -> torch.Tensor:
        found = self.ep.state_dict.get(target)
        if found is None:
            found = self.ep.constants.get(target)
        if not isinstance(found, torch.Tensor):
            raise EmitError(f"method {self.name!r}: no tensor for lifted state {target!r}")
        return found

    def emit_placeholder(self, node: Node, spec: Any, mutated: set[str]) -> None:
        kind = spec.kind.name
        if kind in _CONSTANT_KINDS:
            t = self.state_tensor(spec.target)
            if spec.target in mutated or spec.target in self.program.shared:
                ref = self.new_tensor(t, node.name)
                self.values[ref].initial = (
                    self.program.deferred(t, spec.target, state=True) if t.device.type == "meta"
                    else self.program.constant(tensor_bytes(t)))
                self.whole_method.append(ref)
                self.state_value[spec.target] = ref
                self.node_value[node] = ref
            else:
                self.constants[node] = t  # made a constant value when something reads it
        elif kind == "USER_INPUT":
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                ref = self.new_tensor(val, node.name)
                p = self.values[ref]
                self.values[ref] = schema.Tensor(
                    p.dtype, p.sizes, p.dim_order, schema.InputStorage(), p.dynamic
                )
            else:
                ref = self.scalar_value(val, node.name)
            self.node_value[node] = ref
            self.by_input_name[node.name] = ref
            self.inputs.append(ref)
            self.input_names.append(node.name)
            self.input_vals.append(val)
        elif kind == "TOKEN":
            self.node_value[node] = self.literal(schema.Null())
        else:
            raise EmitError(f"method {self.name!r}: input {node.name!r} of kind {kind} "
                            "cannot be emitted")

    def output_ref(self, value: Any) -> int:
        if isinstance(value, Node):
            return self.node_ref(value)
        if isinstance(value, torch.Tensor):
            return self.constant_tensor(value)
        return self.scalar_arg(value)

    def emit_outputs(self, node: Node) -> tuple[list[int], list[str]]:
        flat = node.args[0] if isinstance(node.args[0], (list, tuple)) else (node.args[0],)
        specs = self.ep.graph_signature.output_specs
        outputs, names, moves = [], [], []
        for spec, value in zip(specs, flat):
            kind = spec.kind.name
            if kind in _MUTATION_KINDS:
                moves.append((self.output_ref(value), self.state_value[spec.target]))
            elif kind == "USER_INPUT_MUTATION":
                moves.append((self.output_ref(value), self.by_input_name[spec.target]))
            elif kind != "TOKEN":
                outputs.append(self.output_ref(value))
                names.append(getattr(spec.arg, "name", ""))
        for src, dst in moves:
            if src != dst:
                self.emit_instruction(lambda d, s=src, t=dst: schema.MoveCall(s, t, d), node)
        return outputs, names

    # -- driver ---------------------------------------------------------------------------------

    def emit(self) -> schema.Method:
        sig = self.ep.graph_signature
        mutated = {s.target for s in sig.output_specs if s.kind.name in _MUTATION_KINDS}
        written = {s.target for s in sig.output_specs if s.kind.name == "USER_INPUT_MUTATION"}
        specs = {s.arg.name: s for s in sig.input_specs if hasattr(s.arg, "name")}
        outputs: list[int] = []
        output_names: list[str] = []
        for node in self.ep.graph.nodes:
            if node.op == "placeholder":
                spec = specs.get(node.name)
                if spec is None:
                    raise EmitError(f"placeholder {node.name!r} has no input spec")
                self.emit_placeholder(node, spec, mutated)
                if node.name in written:
                    self.written_inputs.add(self.node_value[node])
            elif node.op == "get_attr":
                obj = kernels.get_attr(self.gm, node.target)
                if isinstance(obj, torch.Tensor):
                    self.constants[node] = obj
            elif node.op == "call_function":
                self.current = node
                self.emit_call(node)
            elif node.op == "output":
                outputs, output_names = self.emit_outputs(node)
            else:
                raise EmitError(f"node {node.name!r}: op {node.op!r} cannot be emitted")
        return self.finish(outputs, output_names)

    def finish(self, outputs: list[int], output_names: list[str]) -> schema.Method:
        planned = {
            i: _nbytes(v) for i, v in enumerate(self.values)
            if isinstance(v, _PendingTensor) and v.bounded
        }
        names = {i: v.name for i, v in enumerate(self.values) if isinstance(v, _PendingTensor)}
        shared = {ref: name for name, ref in self.state_value.items()
                  if name in self.program.shared}
        plan = planning.plan_method(
            self.values, self.instructions, planned, outputs=outputs,
            whole_method=self.whole_method, names=names, alignment=self.config.alignment,
            arena_of=dict.fromkeys(shared, 1),
        )
        values = tuple(_finalize(v, plan, i) for i, v in enumerate(self.values))
        ops = tuple(sorted(self.operators, key=self.operators.__getitem__))
        symbols, input_dims = input_sizes(self.ep, self.input_names, self.input_vals)
        return schema.Method(
            name=self.name,
            values=values,
            inputs=tuple(self.inputs),
            outputs=tuple(outputs),
            operators=ops,
            instructions=tuple(self.instructions),
            debug=tuple(self.debug),
            plan=schema.MethodPlan(plan.arenas, plan.lower_bound, plan.alignment),
            input_names=tuple(self.input_names),
            output_names=tuple(output_names),
            in_spec=_spec_json(self.ep, 0),
            out_spec=_spec_json(self.ep, 1),
            symbols=symbols,
            input_dims=input_dims,
            nodes=self.debug_nodes.table(),
            shared_state=tuple(schema.SharedState(name, ref)
                               for ref, name in sorted(shared.items(), key=lambda e: e[1])),
        )


def _on_cpu(value: Any) -> Any:
    """``value``, with the ``meta`` device (a model built on it) replaced by the CPU."""
    if isinstance(value, torch.device) and value.type == "meta":
        return torch.device("cpu")
    return value


def _returns_list(op: torch._ops.OpOverload) -> bool:
    returns = op._schema.returns
    return len(returns) == 1 and returns[0].type.kind() == "ListType"


def _zeros_like_val(node: Node) -> torch.Tensor | None:
    """A zero tensor shaped like ``node``'s static tensor value, or None."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or not all(isinstance(s, int) for s in val.shape):
        return None
    return torch.zeros(val.shape, dtype=val.dtype)


def _spec_json(ep: Any, which: int) -> str:
    from exportir.pytree import treespec_dumps

    try:
        spec = ep.call_spec[which]
        return "" if spec is None else treespec_dumps(spec)
    except (TypeError, ValueError, NotImplementedError, AttributeError):  # unserializable spec:
        # left out; the method stays callable with flat inputs
        return ""
