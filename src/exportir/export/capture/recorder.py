"""Non-strict capture: run the user's Python on fake tensors and record every ATen op.

The user's ``forward`` runs with the ordinary interpreter. Inputs are fake tensors, parameters
and buffers stay the module's real tensors but are mapped to fakes (and to placeholders) the
first time an op touches them, and a ``TorchDispatchMode`` records each ATen op reaching the
dispatcher into an :class:`exportir.fx.Graph`. Composite-implicit ops torch.export keeps whole
(``linear``, ``conv2d``, ``scaled_dot_product_attention``...) reach the recorder whole and become
one node each (_composite.py); the others arrive decomposed. Python values are static: they are
burned into the graph as literals, branches take the traced path and loops unroll.

The recorded graph still has in-place ops, ``out=`` ops and views of state; functionalize.py
turns it into the functional form and adds the mutation outputs.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Self

import sympy
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from exportir import pytree
from exportir.export.capture._composite import (
    CompositeOverrides,
    composite_plan,
    composite_value,
    with_grad_of,
)
from exportir.export.capture._constant_result import DataDependentHooks
from exportir.export.capture._draft_kernels import DraftProblems
from exportir.export.capture._errors import ExportError
from exportir.export.capture._finalize import finalize
from exportir.export.capture._indexing import SymIndexing
from exportir.export.capture._inputs import bind_inputs, flatten_with_names, forward_arg_names
from exportir.export.capture._layout_watch import LayoutWatch
from exportir.export.capture._module_state import ModuleState
from exportir.export.capture._node_meta import (
    AUTOGRAD_DETACH,
    ModuleCalls,
    TorchFunctions,
    current_stack_trace,
    innermost_user_frame,
    node_name,
    source_fn_entry,
)
from exportir.export.capture._outputs import _check_outputs, _output_value
from exportir.export.capture._runtime_asserts import insert_runtime_asserts, range_constraints
from exportir.export.capture._symbol_origins import note_origins
from exportir.export.capture.extension import NO_EXTENSION, CaptureExtension
from exportir.export.capture.fake import (
    FakeConverter,
    FakeTensor,
    fake_like,
    fakify,
    run_fake,
)
from exportir.export.capture.functionalize import made_by, view_base
from exportir.export.signature import ModuleCallEntry, ModuleCallSignature
from exportir.fx import Graph, GraphModule, Node
from exportir.symbolic import ShapeEnv
from exportir.symbolic.data_dependent import SYM_TYPES as _SYM_TYPES

aten = torch.ops.aten


@dataclass(frozen=True, slots=True)
class Lifted:
    """One lifted input: what it is (``"parameter"``, ``"buffer"``, ``"constant"``, ``"user"``)."""

    kind: str
    target: str | None
    persistent: bool | None
    value: Any  # the real tensor (state) or the user's leaf


# ops whose recording differs from "run on fakes, add a node" (keyed by op)
SpecialRule = Callable[["Recorder", Any, tuple, dict], Any]


class Recorder:
    """Graph-building state of one capture (or one retrace)."""

    def __init__(
        self, *, decomposition_table: dict | None = None, shape_env: ShapeEnv | None = None
    ) -> None:
        self.graph = Graph()
        self.nodes: dict[int, tuple[torch.Tensor, Node]] = {}
        self.shape_env = shape_env if shape_env is not None else ShapeEnv()
        self.converter = FakeConverter(self._lift_constant, self.shape_env)
        self._origins_noted = 0  # the ShapeEnv's unbacked count when origins were last noted
        # symbolic values -> the node computing them, made on first use (see sym_arg)
        self.sym_nodes: dict[int, tuple[Any, Any]] = {}
        self.sym_by_expr: dict[Any, Any] = {}
        self.inputs: dict[Node, Lifted] = {}
        self.attr_constants: dict[int, str] = {}
        self.decomposition_table = decomposition_table
        # composite-implicit ops recorded as one node, and those routed whole to dispatch
        self.preserved, self.whole = composite_plan(decomposition_table)
        self.fresh_factory: Any = None  # the result of a factory op, while it is the last op
        self.modules: ModuleCalls | None = None
        self.functions: TorchFunctions | None = None
        self.origin: Node | None = None  # retrace: the node being re-run (meta is copied)
        self.mode: CaptureMode | None = None
        self._lifted_count = 0
        # cond/map/while_loop bodies by name until the graph is final (control_flow.py)
        self.subgraphs: dict[str, GraphModule] = {}

    # -- inputs -------------------------------------------------------------------------

    def add_input(self, name: str, fake: Any, lifted: Lifted) -> Node:
        node = self.graph.placeholder(name)
        node.meta["val"] = fake
        self.inputs[node] = lifted
        if isinstance(fake, torch.Tensor):
            self.nodes[id(fake)] = (fake, node)
            self._track_sizes(fake, node)
        elif isinstance(fake, _SYM_TYPES):
            self._track_sym(fake.node, node)
        return node

    def add_state(self, kind: str, fqn: str, real: torch.Tensor, persistent: bool | None) -> None:
        _check_initialized(kind, fqn, real)
        fake = fake_like(real)
        if self.converter.lookup(real) is None:  # tied state: ops use the first name
            self.converter.register(real, fake)
        prefix = {"parameter": "p_", "buffer": "b_"}[kind]
        self.add_input(prefix + _sanitize(fqn), fake, Lifted(kind, fqn, persistent, real))

    def _lift_constant(self, real: torch.Tensor, fake: FakeTensor) -> None:
        _check_initialized("tensor", "", real)
        target = self.attr_constants.get(id(real))
        if target is None:  # named as torch.export does: under the innermost module running
            target = _join(self._innermost_module(), f"lifted_tensor_{self._lifted_count}")
            self._lifted_count += 1
        self.add_input("c_" + _sanitize(target), fake, Lifted("constant", target, None, real))

    def _innermost_module(self) -> str:
        stack = self.modules.current() if self.modules else {}
        return next(reversed(stack.values()))[0] if stack else ""

    # -- recording ------------------------------------------------------------------------

    def node_for(self, t: torch.Tensor) -> Node:
        if not isinstance(t, FakeTensor):
            t = self.converter.from_real(t)
        hit = self.nodes.get(id(t))
        if hit is None or hit[0] is not t:
            raise ExportError(
                "a fake tensor that was not created by this export reached the graph "
                f"(was it created under another FakeTensorMode?)\n  {innermost_user_frame()}"
            )
        return hit[1]

    def as_arg(self, x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return self.node_for(x)
        if isinstance(x, _SYM_TYPES):
            return self.sym_arg(x)
        if isinstance(x, torch.Size):
            return [self.as_arg(s) for s in x]
        if type(x) in (list, tuple):
            return type(x)(self.as_arg(a) for a in x)
        return x

    # -- symbolic values ------------------------------------------------------------------

    def _track_sym(self, sym_node: Any, producer: Any) -> None:
        """``producer``: the Node computing ``sym_node``'s value, or a thunk making it."""
        if id(sym_node) not in self.sym_nodes:
            self.sym_nodes[id(sym_node)] = (sym_node, producer)
        self.sym_by_expr.setdefault(sym_node.expr, producer)

    def _track_sizes(self, t: torch.Tensor, node: Node) -> None:
        for dim, size in enumerate(t.shape):
            if isinstance(size, torch.SymInt) and not size.node.expr.is_number:
                self._track_sym(size.node, _SymSize(self, node, dim, size))

    def on_sym_op(self, target: Any, operands: tuple, out: Any) -> None:
        """ShapeEnv listener: user code computed ``out = target(*operands)`` symbolically."""
        self._track_sym(out, _SymOp(self, target, operands, out))

    def sym_arg(self, x: Any) -> Any:
        """The graph argument for a SymInt/SymFloat/SymBool: a literal or the node computing it."""
        expr = x.node.expr
        if expr.is_number or expr in (sympy.true, sympy.false):
            return x.node.pytype(expr)
        # a value already in the graph is reused; else the op that computed this very value
        hit = self.sym_nodes.get(id(x.node))
        producer = self.sym_by_expr.get(expr)
        if not isinstance(producer, Node) and hit is not None and hit[0] is x.node:
            producer = hit[1]
        if producer is None:
            raise ExportError(
                f"the symbolic value {expr} reached the graph but no traced op computes it.\n"
                f"  {innermost_user_frame()}\n"
                "Compute it from tensor sizes (x.shape[i]) or .item() inside forward."
            )
        if isinstance(producer, Node):
            return producer
        node = producer.make()
        self._track_sym(x.node, node)
        self.sym_by_expr[expr] = node
        if hit is not None:
            self.sym_nodes[id(x.node)] = (x.node, node)
        return node

    def dispatch(self, func: Any, args: tuple, kwargs: dict) -> Any:
        fresh, self.fresh_factory = self.fresh_factory, None
        if func is aten.detach.default and fresh is not None and args[0] is fresh:
            return self._same_node(func, args, kwargs)
        out = self._dispatch(func, args, kwargs)
        if _is_factory(func):
            self.fresh_factory = out
        return out

    def _same_node(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """The ``detach`` torch's Python binding of a factory (``torch.arange``...) applies to
        the tensor it made: the result stands for the same node (torch.export, which traces
        above that binding's C++ code, never sees it either)."""
        out = run_fake(func, args, kwargs, self.converter)
        self.nodes[id(out)] = (out, self.node_for(args[0]))
        return out

    def _dispatch(self, func: Any, args: tuple, kwargs: dict) -> Any:
        table = self.decomposition_table
        if table and func in table:
            with self.mode:
                out = table[func](*args, **kwargs)
            if out is not NotImplemented:  # a table entry may decline (torch's convention)
                return out
            return self.record_whole(func, args, kwargs)
        special = SPECIAL_OPS.get(func)
        if special is not None:
            return special(self, func, args, kwargs)
        if func in self.preserved:
            return self.record_whole(func, args, kwargs)
        if _is_composite_implicit(func):
            # reached below autograd (from inside a decomposition): decompose like autograd would
            with self.mode:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        return self.run_and_record(func, args, kwargs)

    def run_and_record(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """The default rule: run ``func`` on fakes; a node when the result holds tensors."""
        _check_mutations(self, func, args, kwargs)
        watch = LayoutWatch(func, args, kwargs)  # in-place layout changes keep recorded vals
        out = run_fake(func, args, kwargs, self.converter)
        watch.settle(self.graph)
        if isinstance(out, _SYM_TYPES):  # .item(): the node binds an unbacked symbol
            self._track_sym(out.node, self.record(func, args, kwargs, out))
            return out
        if not _has_tensor(out):
            return out
        self.record(func, args, kwargs, out)
        return out

    def record_whole(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """A composite op kept whole: one node. Its value comes from its composite kernel,
        unrecorded (``_composite.composite_value``)."""
        try:
            out = composite_value(func, args, kwargs, self.converter)
        except (NotImplementedError, RuntimeError):
            # a part of it has data-dependent sizes (argwhere, nonzero(as_tuple=True),
            # repeat_interleave with a tensor of repeats), which only the recorder's rules
            # compute: recorded decomposed (torch.export keeps these whole)
            with self.mode:
                return func.decompose(*args, **kwargs)
        if isinstance(out, torch.Tensor) and id(out) in self.nodes:
            # the kernel handed back its input (``type_as`` of the same dtype): the kept op
            # is a node of its own, so its value is a tensor of its own
            out = fake_like(out)
        if torch._C._len_torch_dispatch_stack():  # outer captures (a cond body's) must not
            with _disable_current_modes():  # see its op
                out = with_grad_of(out, args)
        else:
            out = with_grad_of(out, args)
        self.record(func, args, kwargs, out)
        return out

    def record(self, func: Any, args: tuple, kwargs: dict, out: Any) -> Node:
        node_args = self.as_arg(tuple(args))
        name = node_name(func)
        if func is aten.detach.default and _saves_result(self.graph, node_args[0]):
            name = AUTOGRAD_DETACH
        node = self.graph.create_node(
            "call_function",
            func,
            node_args,
            {k: self.as_arg(v) for k, v in kwargs.items()},
            name=name,
        )
        self._fill_meta(node, func, _as_val(out))
        env = self.shape_env
        if env._unbacked != self._origins_noted:  # new unbacked symbols: note their origin
            note_origins(env, func, out)
            self._origins_noted = env._unbacked
        if isinstance(out, (tuple, list)):
            self._record_items(node, func, out)
        elif isinstance(out, torch.Tensor) and id(out) not in self.nodes:
            self.nodes[id(out)] = (out, node)
            self._track_sizes(out, node)
        return node

    def _record_items(self, node: Node, func: Any, out: tuple | list) -> None:
        for i, item in enumerate(out):
            if not isinstance(item, torch.Tensor) or id(item) in self.nodes:
                continue
            item_node = self.graph.create_node(
                "call_function", operator.getitem, (node, i), {}, name="getitem"
            )
            self._fill_meta(item_node, func, item)
            self.nodes[id(item)] = (item, item_node)
            self._track_sizes(item, item_node)

    def _fill_meta(self, node: Node, func: Any, val: Any) -> None:
        origin = self.origin
        if origin is not None:
            for key in ("stack_trace", "nn_module_stack", "source_fn_stack"):
                if key in origin.meta:
                    node.meta[key] = origin.meta[key]
        else:
            node.meta["stack_trace"] = current_stack_trace()
            node.meta["nn_module_stack"] = self.modules.current() if self.modules else {}
            node.meta["source_fn_stack"] = source_fn_entry(self.modules, self.functions, func)
        node.meta["val"] = val


class _SymSize:
    """Makes ``aten.sym_size.int(tensor, dim)`` when a symbolic size is first used."""

    __slots__ = ("dim", "node", "rec", "val")

    def __init__(self, rec: Recorder, node: Node, dim: int, val: Any) -> None:
        self.rec, self.node, self.dim, self.val = rec, node, dim, val

    def make(self) -> Node:
        rec = self.rec
        node = rec.graph.create_node(
            "call_function", aten.sym_size.int, (self.node, self.dim), {}, name="sym_size_int"
        )
        rec._fill_meta(node, aten.sym_size.int, self.val)
        return node


class _SymOp:
    """Makes ``operator.mul(a, 2)`` (etc.) when a symbolic result of user code is first used."""

    __slots__ = ("operands", "out", "rec", "target")

    def __init__(self, rec: Recorder, target: Any, operands: tuple, out: Any) -> None:
        self.rec, self.target, self.operands, self.out = rec, target, operands, out

    def make(self) -> Node:
        rec = self.rec
        expr = self.out.expr
        for o in self.operands:  # ``1 * s0`` (a decomposition's arithmetic) reads s0's node
            if o.pytype is self.out.pytype and o.expr == expr:
                return rec.sym_arg(_wrap_sym(o))
        args = tuple(rec.sym_arg(_wrap_sym(o)) for o in self.operands)
        node = rec.graph.create_node(
            "call_function", self.target, args, {}, name=node_name(self.target)
        )
        rec._fill_meta(node, self.target, _wrap_sym(self.out))
        return node


def _wrap_sym(sym_node: Any) -> Any:
    kind = {int: torch.SymInt, float: torch.SymFloat, bool: torch.SymBool}[sym_node.pytype]
    return kind(sym_node)


class CaptureMode(TorchDispatchMode):
    """Hands every ATen op to its :class:`Recorder`."""

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.recorder = recorder
        recorder.mode = self

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return self.recorder.dispatch(func, args, kwargs or {})


# --- special ops -------------------------------------------------------------------------


def _saves_result(graph: Any, arg: Any) -> bool:
    """``detach(arg)`` right after ``arg`` was made, of a result that requires grad."""
    if not isinstance(arg, Node) or not made_by(graph._root._prev, arg):
        return False
    val = arg.meta.get("val")
    return isinstance(val, torch.Tensor) and val.requires_grad


def _lift_fresh(rec: Recorder, func: Any, args: tuple, kwargs: dict) -> Any:
    """``torch.tensor(data)`` in forward: the data becomes a lifted constant, copied fresh
    (``clone``, the op torch.export's functionalization makes of ``lift_fresh_copy``)."""
    const = rec.converter.from_real(args[0])
    out = fake_like(const, requires_grad=False)
    rec.record(aten.clone.default, (const,), {}, out)
    return out


def _assert_tensor_metadata(rec: Recorder, func: Any, args: tuple, kwargs: dict) -> None:
    """Checked against the fake now, kept as a node (torch.export's guard before ``to``)."""
    x = args[0]
    wanted = {**dict(zip(("size", "stride", "dtype"), args[1:])), **kwargs}
    for what, want in wanted.items():
        have = _TENSOR_METADATA[what](x)
        if want is not None and have != want:
            raise ExportError(
                f"a tensor's {what} is {have}, where {want} was recorded.\n"
                f"  {innermost_user_frame()}"
            )
    rec.record(func, args, kwargs, None)


_TENSOR_METADATA: dict[str, Callable[[torch.Tensor], Any]] = {
    "size": lambda t: list(t.shape),
    "stride": lambda t: list(t.stride()),
    "dtype": lambda t: t.dtype,
    "device": lambda t: t.device,
    "layout": lambda t: t.layout,
}

SPECIAL_OPS: dict[Any, SpecialRule] = {
    aten.lift_fresh.default: _lift_fresh,
    aten.lift_fresh_copy.default: _lift_fresh,
    aten._assert_tensor_metadata.default: _assert_tensor_metadata,
}


@cache
def _is_factory(func: Any) -> bool:
    """An op taking tensor options (``arange``, ``zeros_like``...): Python bindings of these
    hand the result through ``make_variable``, which detaches it."""
    schema = getattr(func, "_schema", None)
    return schema is not None and any(a.name == "pin_memory" for a in schema.arguments)


@cache
def _is_composite_implicit(func: Any) -> bool:
    name = getattr(func, "name", None)
    if name is None:
        return False
    return torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")


class TraceSettings:
    """Process-wide torch settings capture runs under, restored on exit.

    The Python dispatcher makes torch's Python CompositeImplicitAutograd kernels (the ones in
    ``torch._decomp``, e.g. for ``lstm``) run instead of the C++ ones, and oneDNN (mkldnn) and
    NNPACK are off, as torch.export turns them off: CPU RNNs decompose into ordinary ATen ops
    rather than ``mkldnn_rnn_layer``, and a convolution's output layout is the one the
    remaining CPU backends choose (capture/_device_layout.py): the recorded ops are then the
    ones torch.export's decomposition produces.
    """

    __slots__ = ("_composite", "_dispatcher", "_mkldnn", "_nnpack", "_whole")

    def __init__(self, whole: frozenset[Any] = frozenset()) -> None:
        self._whole = whole  # composite ops that reach the recorder whole (_composite.py)

    def __enter__(self) -> Self:
        self._dispatcher = torch._C._EnablePythonDispatcher()
        self._dispatcher.__enter__()
        self._mkldnn = torch._C._get_mkldnn_enabled()
        torch._C._set_mkldnn_enabled(False)
        self._nnpack = torch._C._get_nnpack_enabled()
        torch._C._set_nnpack_enabled(False)
        self._composite = CompositeOverrides(self._whole).__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._composite.__exit__(*exc)
            torch._C._set_mkldnn_enabled(self._mkldnn)
            torch._C._set_nnpack_enabled(self._nnpack)
        finally:
            self._dispatcher.__exit__(*exc)


class ExportingFlags:
    """What torch.export tells the code it traces: ``torch.compiler.is_compiling()`` and
    ``torch.compiler.is_exporting()`` are True while the user's ``forward`` runs.

    Libraries branch on them (transformers skips data-dependent fast paths such as
    ``if (mask == 0).all()``); torch.export sets the same two module flags for the duration of
    tracing, and so do we, restoring them on exit.
    """

    __slots__ = ("_saved",)

    def __enter__(self) -> Self:
        flags = torch.compiler
        self._saved = (flags._is_compiling_flag, flags._is_exporting_flag)
        flags._is_compiling_flag = True
        flags._is_exporting_flag = True
        return self

    def __exit__(self, *exc: object) -> None:
        torch.compiler._is_compiling_flag, torch.compiler._is_exporting_flag = self._saved


# --- checks ------------------------------------------------------------------------------


@cache
def mutated_arg_names(func: Any) -> tuple[str, ...]:
    """Names of the schema arguments an op writes to (``self`` of ``add_``, ``out``...)."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return ()
    return tuple(
        a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write
    )


def _check_mutations(rec: Recorder, func: Any, args: tuple, kwargs: dict) -> None:
    names = mutated_arg_names(func)
    if not names:
        return
    for arg in _bound_args(func, args, kwargs, names):
        if not isinstance(arg, torch.Tensor):
            continue
        node = rec.node_for(arg)
        lifted = rec.inputs.get(_root_of(node))
        if lifted is None:
            continue
        if lifted.kind == "parameter":
            raise ExportError(
                f"forward updates parameter '{lifted.target}' in place ({func.name()}).\n"
                f"  {innermost_user_frame()}\n"
                "Parameters may not be updated during export: they are inputs of the exported "
                "program. Keep state that changes in a buffer (self.register_buffer(...))."
            )
        if lifted.kind == "constant" and lifted.target in rec.attr_constants.values():
            raise ExportError(
                f"forward updates the plain tensor attribute '{lifted.target}' in place "
                f"({func.name()}).\n  {innermost_user_frame()}\n"
                "Plain tensor attributes are constants of the exported program and may not be "
                "updated. Register it as a buffer (self.register_buffer(name, tensor)) instead."
            )


def _root_of(node: Node) -> Node:
    """Follow view ops back to the tensor whose storage they share."""
    while True:
        base = view_base(node)
        if base is None:
            return node
        node = base


def _bound_args(func: Any, args: tuple, kwargs: dict, names: tuple[str, ...]) -> list[Any]:
    found = []
    for i, a in enumerate(func._schema.arguments):
        if a.name not in names:
            continue
        if a.name in kwargs:
            found.append(kwargs[a.name])
        elif i < len(args) and not a.kwarg_only:
            found.append(args[i])
    return found


def _check_initialized(kind: str, fqn: str, t: torch.Tensor) -> None:
    if isinstance(t, torch.nn.parameter.UninitializedTensorMixin):
        raise ExportError(
            f"{kind} '{fqn}' is not initialized yet (a lazy module).\n  {innermost_user_frame()}\n"
            "All module state must be initialized before export: run the module once on real "
            "inputs (or call initialize_parameters) and export afterwards."
        )


# --- helpers -----------------------------------------------------------------------------


def _sanitize(name: str) -> str:
    out = "".join(c if c.isalnum() else "_" for c in name)
    return out.lower()


def _has_tensor(out: Any) -> bool:
    if isinstance(out, torch.Tensor):
        return True
    if isinstance(out, (tuple, list)):
        return any(isinstance(o, torch.Tensor) for o in out)
    return False


def _as_val(out: Any) -> Any:
    if isinstance(out, list):
        return list(out)
    if isinstance(out, tuple):
        return tuple(out)
    return out


def graph_module(rec: Recorder) -> GraphModule:
    return GraphModule(torch.nn.Module(), rec.graph)


# --- capturing a module --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CaptureResult:
    """Everything export needs to build an ExportedProgram (see docs/dev/export-plan.md)."""

    graph_module: GraphModule
    signature: Any  # ExportGraphSignature
    state_dict: dict[str, torch.Tensor]
    constants: dict[str, torch.Tensor]
    in_spec: pytree.TreeSpec
    out_spec: pytree.TreeSpec
    module_call_graph: list[Any]
    shape_env: ShapeEnv | None = None
    range_constraints: dict[Any, Any] | None = None
    problems: list[Any] = field(default_factory=list)  # draft mode: FailureReports (_problems.py)


# Per flat user input: None (static), {dim: size} for a tensor (size: a sympy expression over
# the ShapeEnv's symbols, or an int), or a sympy expression for an int input (a SymInt input).
DimsSpec = list[Any]


def capture(
    mod: torch.nn.Module,
    args: tuple,
    kwargs: dict,
    *,
    shape_env: ShapeEnv | None = None,
    symbolic_sizes: dict[int, dict[int, Any]] | None = None,
    dims_spec: DimsSpec | None = None,
    draft: bool = False,
    extension: CaptureExtension = NO_EXTENSION,
) -> CaptureResult:
    """Run ``mod(*args, **kwargs)`` on fakes; return the functional, lifted graph and its specs.

    ``symbolic_sizes`` (``{id(example tensor): {dim: sympy expr}}``, built by
    export/dynamic_shapes.py with symbols of ``shape_env``) or ``dims_spec`` (the same per flat
    input position) make input dimensions symbolic. ``draft=True`` decides data-dependent
    branches by the example inputs, checked by runtime asserts (draft_export). ``extension``
    adds what the rooms above capture trace (control flow).
    """
    rec = Recorder(shape_env=shape_env)
    _lift_module_state(rec, mod)
    flat, in_spec = pytree.tree_flatten((args, kwargs))
    if symbolic_sizes:
        dims_spec = [symbolic_sizes.get(id(leaf)) for leaf in flat]
    fake_leaves = _user_inputs(rec, mod, args, kwargs, flat, dims_spec)
    fake_args, fake_kwargs = pytree.tree_unflatten(fake_leaves, in_spec)
    env = rec.shape_env
    env.op_listener = rec.on_sym_op  # removed in finally: symbolic arithmetic -> graph nodes
    try:
        with ModuleState(mod) as state, ModuleCalls(mod) as calls, TorchFunctions() as functions:
            rec.modules, rec.functions = calls, functions
            hooks = DataDependentHooks(rec, mod, draft=draft)
            problems = DraftProblems(rec, hooks.values) if draft else None
            with ExportingFlags(), TraceSettings(rec.whole), CaptureMode(rec), \
                    extension.mode(), SymIndexing(), hooks, problems or nullcontext():
                out = mod(*fake_args, **fake_kwargs)
                on_problem = problems.state_update if problems is not None else None
                reassigned = {
                    fqn: rec.node_for(t)
                    for fqn, t in state.reassigned_buffers(on_problem).items()
                }
        flat_out, out_spec = pytree.tree_flatten(out)
        _check_outputs(mod, out, flat_out)
        rec.graph.output(tuple(_output_value(rec, o) for o in flat_out))
    finally:
        env.op_listener = None
    inserted = insert_runtime_asserts(rec.graph, env)
    gm, signature = finalize(rec, reassigned, appended=not inserted)
    gm = extension.finish(gm, rec.subgraphs)
    return CaptureResult(
        graph_module=gm,
        signature=signature,
        state_dict=_state_dict(rec),
        constants=_constants(rec),
        in_spec=in_spec,
        out_spec=out_spec,
        module_call_graph=_module_call_graph(
            mod, in_spec, out_spec, forward_arg_names(mod, args, kwargs)
        ),
        shape_env=env,
        range_constraints=range_constraints(gm, env),
        problems=problems.reports if problems is not None else [],
    )


def _lift_module_state(rec: Recorder, mod: torch.nn.Module) -> None:
    for fqn, p in mod.named_parameters(remove_duplicate=False):
        rec.add_state("parameter", fqn, p, None)
    non_persistent = {
        _join(prefix, name)
        for prefix, m in mod.named_modules()
        for name in m._non_persistent_buffers_set
    }
    for fqn, b in mod.named_buffers(remove_duplicate=False):
        rec.add_state("buffer", fqn, b, fqn not in non_persistent)
    state_ids = {id(t) for t in (*mod.parameters(), *mod.buffers())}
    for prefix, m in mod.named_modules():
        for name, v in vars(m).items():
            if isinstance(v, torch.Tensor) and id(v) not in state_ids:
                rec.attr_constants.setdefault(id(v), _join(prefix, name))


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def fakify_inputs(flat_inputs: list, dims_spec: DimsSpec | None, shape_env: ShapeEnv) -> list:
    """Fakes of the flat user inputs; dimensions named in ``dims_spec`` get symbolic sizes."""
    specs = dims_spec if dims_spec is not None else [None] * len(flat_inputs)
    return [_fakify_leaf(leaf, spec, shape_env) for leaf, spec in zip(flat_inputs, specs)]


def _fakify_leaf(leaf: Any, spec: Any, env: ShapeEnv) -> Any:
    if isinstance(leaf, torch.Tensor):
        if not spec:
            return fake_like(leaf)
        sizes = [env.symint(spec[d]) if d in spec else leaf.size(d) for d in range(leaf.dim())]
        return fakify(leaf, sizes)
    if spec is not None and isinstance(leaf, int) and not isinstance(leaf, bool):
        return env.symint(spec)
    return leaf


def _user_inputs(
    rec: Recorder, mod: torch.nn.Module, args: tuple, kwargs: dict, flat: list,
    dims_spec: Any = None,
) -> list:
    names = flatten_with_names(bind_inputs(mod, args, kwargs))
    fake_leaves = fakify_inputs(flat, dims_spec, rec.shape_env)
    fakes = []
    for (name, _), leaf, fake in zip(names, flat, fake_leaves):
        if not isinstance(leaf, (torch.Tensor, int, float, bool, str, type(None))):
            raise ExportError(
                f"input '{name}' is a {type(leaf).__name__}, which export cannot take as an "
                "input. Inputs are tensors, Python scalars/strings/None, and containers of them "
                "(register custom classes with exportir.register_dataclass / pytree)."
            )
        rec.add_input(name, fake, Lifted("user", None, None, leaf))
        fakes.append(fake)
    return fakes


def _state_dict(rec: Recorder) -> dict[str, torch.Tensor]:
    return {
        lifted.target: lifted.value
        for lifted in rec.inputs.values()
        if lifted.kind == "parameter" or (lifted.kind == "buffer" and lifted.persistent)
    }


def _constants(rec: Recorder) -> dict[str, torch.Tensor]:
    return {
        lifted.target: lifted.value
        for lifted in rec.inputs.values()
        if lifted.kind == "constant" or (lifted.kind == "buffer" and not lifted.persistent)
    }


def _module_call_graph(mod: torch.nn.Module, in_spec: Any, out_spec: Any, names: list[str]) -> list:
    root = ModuleCallEntry(
        "", ModuleCallSignature([], [], in_spec, out_spec, forward_arg_names=names)
    )
    return [root] + [ModuleCallEntry(fqn) for fqn, _ in mod.named_modules() if fqn]

