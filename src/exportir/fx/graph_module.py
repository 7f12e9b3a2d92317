"""GraphModule: an ``nn.Module`` whose ``forward`` is generated from an FX ``Graph``.

Contract (mirrors ``torch.fx.GraphModule`` of torch 2.13):

* every instance gets its own singleton subclass (``GraphModuleImpl``) so ``forward`` and
  ``__call__`` can be installed per instance; ``type(gm).__name__`` is the ``class_name``;
* ``gm.graph = g`` (and the constructor) sets ``g.owning_module`` and recompiles;
* ``recompile()`` generates source with ``graph.python_code(root_module="self")``, compiles it
  under a fake file name (``<eval_with_key>.N``) registered in :mod:`linecache` so tracebacks
  show the generated lines, and installs ``forward`` on the instance's class;
* pickling never stores the generated function or the graph: ``__reduce__`` returns
  ``(reduce_graph_module, (state, import_block))`` and unpickling re-traces the code.

Source registration and (deferred) compilation live in ``_source_registry``; ``to_folder``
and the fast sympy printer in ``_graph_module_io``. Both are re-exported here.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import itertools
import linecache
import sys
import traceback
import types
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Self

import torch
from torch.nn.modules.module import _addindent
from torch.package import Importer, PackageExporter, PackageImporter, sys_importer

# Moved out of this module; re-exported so existing imports keep working.
from exportir.fx._graph_module_io import (  # noqa: F401
    _REPR_SAFE_MODULES,
    _SYMPY_CALL_STYLE,
    _TAB,
    _child_init_line,
    _fast_sym_repr,
    _is_negation,
    _sym_atom_str,
    _sym_product_str,
    _sym_sum_str,
    _tensor_init_lines,
    _write_folder,
)
from exportir.fx._source_registry import (  # noqa: F401
    _exec_with_source,
    _forward_from_src,
    _LazyForward,
    _loader,
    _method_from_src,
    _SourceRegistry,
)
from exportir.fx.codegen import (  # noqa: F401
    PythonCode,
    _BoxedCodeGen,
    _custom_builtins,
    _is_from_torch,
    _override_sym_repr,
    _PyTreeCodeGen,
)
from exportir.fx.graph import Graph

if TYPE_CHECKING:
    import os

    from exportir.fx.node import Node

__all__ = ["GraphModule", "reduce_graph_module", "reduce_package_graph_module"]

_USER_PRESERVED_ATTRIBUTES_KEY = "_user_preserved_attributes"
_EvalCacheLoader = _SourceRegistry  # torch.fx.graph_module's name for the class of ``_loader``
_EVAL_KEY_MARKER = "eval_with_key"
_IMPL_CLASS_NAME = "GraphModuleImpl"


# --------------------------------------------------------------------------------------------
# Import blocks and (un)pickling
# --------------------------------------------------------------------------------------------


def _format_import_statement(name: str, obj: object, importer: Importer) -> str:
    builtin = _custom_builtins.get(name)
    if builtin is not None:
        return builtin.import_str
    if isinstance(obj, types.ModuleType):  # e.g. ``exportir`` for wrapped-function lines
        return f"import {obj.__name__}" if obj.__name__ == name else f"import {obj.__name__} as {name}"
    module_name, attr_name = importer.get_name(obj)
    return f"from {module_name} import {attr_name} as {name}"


def _format_import_block(globals: dict[str, Any], importer: Importer) -> str:
    """Sorted, de-duplicated import statements that recreate ``globals`` (stable for hashing)."""
    statements = {_format_import_statement(n, o, importer) for n, o in globals.items()}
    return "\n".join(sorted(statements))


def reduce_graph_module(body: dict[str, Any], import_block: str) -> torch.nn.Module:
    """Unpickle hook: rebuild a GraphModule from its state and generated code."""
    fn_src = body.get("_code") or body["code"]
    forward = _forward_from_src(import_block + fn_src, {})
    return _deserialize_graph_module(forward, body)


def reduce_package_graph_module(
    importer: PackageImporter, body: dict[str, Any], generated_module_name: str
) -> torch.nn.Module:
    """torch.package unpickle hook: the code lives in a module saved in the package."""
    forward = importer.import_module(generated_module_name).forward
    return _deserialize_graph_module(forward, body)


class _CodeOnlyModule(torch.nn.Module):
    """A module whose state is a pickled GraphModule's ``__dict__`` (forward set per use)."""

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__()
        self.__dict__ = body


def _retrace_code_only(com: _CodeOnlyModule, body: dict[str, Any]) -> Graph:
    """Trace ``com.forward`` treating every submodule as a leaf (they were leaves before)."""
    tracer_cls = body.get("_tracer_cls")
    if tracer_cls is None:
        from exportir.fx.tracer import Tracer  # import here: tracer imports this module

        tracer_cls = Tracer

    class KeepModules(tracer_cls):  # type: ignore[misc, valid-type]  # dynamic base class
        def is_leaf_module(self, _: torch.nn.Module, __: str) -> bool:
            return True

    graph = KeepModules().trace(com, **body.get("_tracer_extras", {}))
    graph._tracer_cls = tracer_cls
    return graph


def _deserialize_graph_module(
    forward: Callable[..., Any],
    body: dict[str, Any],
    graph_module_cls: type | None = None,
) -> torch.nn.Module:
    """Rebuild a GraphModule from ``body`` (a ``__dict__`` without ``_graph``) and ``forward``."""
    # A throwaway subclass carries ``forward`` (tracers read it from the class), so the shared
    # _CodeOnlyModule class is never mutated.
    code_only_cls = type("_CodeOnlyModule", (_CodeOnlyModule,), {"forward": forward})
    com = code_only_cls(body)
    graph = _retrace_code_only(com, body)

    stack_traces = body.pop("_graphmodule_graph_node_meta_stack_trace", None)
    if stack_traces is not None:
        for node in graph.nodes:
            trace = stack_traces.get(node.name)
            if trace is not None:
                node.meta["stack_trace"] = trace

    cls = graph_module_cls or GraphModule
    gm = cls(com, graph, class_name=body.get("_graphmodule_cls_name", "GraphModule"))
    # The constructor keeps only what the graph references; restore the rest of the state.
    for key, value in body.items():
        if not hasattr(gm, key):
            setattr(gm, key, value)
    return gm


# --------------------------------------------------------------------------------------------
# Qualified-name attribute helpers
# --------------------------------------------------------------------------------------------


def _install(to_module: torch.nn.Module, field: str, value: Any) -> None:
    """Plain tensors become buffers; parameters, modules and other values are set as is."""
    if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
        to_module.register_buffer(field, value)
    else:
        setattr(to_module, field, value)


def _child_or_new(module: torch.nn.Module, item: str) -> Any:
    child = getattr(module, item, None)
    if child is None:
        child = torch.nn.Module()
        setattr(module, item, child)
    return child


def _copy_attr(from_module: torch.nn.Module, to_module: torch.nn.Module, target: str) -> None:
    """Copy ``from_module.<target>`` to ``to_module.<target>``, creating empty parent Modules.

    Stops early when a parent along the path is already the very same object in both.
    """
    *prefix, field = target.split(".")
    for item in prefix:
        src_child = getattr(from_module, item)
        dst_child = getattr(to_module, item, None)
        if src_child is dst_child:
            return
        if dst_child is None:
            dst_child = torch.nn.Module()
            setattr(to_module, item, dst_child)
        from_module, to_module = src_child, dst_child
    _install(to_module, field, getattr(from_module, field))


def _assign_attr(from_obj: object, to_module: torch.nn.Module, target: str) -> None:
    """Set ``to_module.<target> = from_obj``, creating empty parent Modules."""
    *prefix, field = target.split(".")
    for item in prefix:
        to_module = _child_or_new(to_module, item)
    _install(to_module, field, from_obj)


def _get_attr_via_attr_list(model: torch.nn.Module, attr_list: list[str]) -> Any:
    if not attr_list:
        return model
    *prefix, field = attr_list
    current: Any = model
    for item in prefix:
        current = getattr(current, item, None)
        if current is None:
            raise AssertionError(f"Attribute '{item}' not found in model")
    return getattr(current, field)


def _get_attr(model: torch.nn.Module, attr_name: str) -> Any:
    return _get_attr_via_attr_list(model, attr_name.split("."))


def _del_attr(model: torch.nn.Module, attr_name: str) -> None:
    *prefix, field = attr_name.split(".")
    delattr(_get_attr_via_attr_list(model, prefix), field)


def _has_attr(model: torch.nn.Module, attr_name: str) -> bool:
    """True if the dotted path ``attr_name`` resolves on ``model``.

    torch.fx's version tests each later segment on the bool ``True`` instead of the parent it
    found, so it answers False for nearly every dotted path; this one walks the path.
    """
    *prefix, field = attr_name.split(".")
    current: Any = model
    for item in prefix:
        if not hasattr(current, item):
            return False
        current = getattr(current, item)
    return hasattr(current, field)


# --------------------------------------------------------------------------------------------
# Readable printing
# --------------------------------------------------------------------------------------------


def _print_readable(
    module: torch.nn.Module,
    module_name: str,
    print_output: bool = True,
    include_stride: bool = False,
    include_device: bool = False,
    colored: bool = False,
    expanded_def: bool = False,
    additional_meta: list[str] | None = None,
) -> str:
    """``class <name>(torch.nn.Module):`` + verbose forward, then nested GraphModule children."""
    graph = getattr(module, "graph", None)
    if not isinstance(graph, Graph):
        raise AssertionError("print_readable must be used on a module with a graph")  # noqa: TRY004  # torch.fx raises this type
    verbose = graph.python_code(
        root_module="self",
        verbose=True,
        include_stride=include_stride,
        include_device=include_device,
        colored=colored,
        expanded_def=expanded_def,
        additional_meta=additional_meta,
    )
    header = f"class {module_name}(torch.nn.Module):\n"
    module_code = _addindent(header + verbose.src.lstrip("\n"), 4)
    children = [
        _print_readable(
            child,
            child_name,
            print_output=False,
            include_stride=include_stride,
            include_device=include_device,
            colored=colored,
            additional_meta=additional_meta,
        )
        for child_name, child in module.named_children()
        if isinstance(child, GraphModule)
    ]
    output = module_code + _addindent("\n".join(["", *children]), 4)
    if print_output:
        print(output)
    return output


# --------------------------------------------------------------------------------------------
# Error context for failures inside generated code
# --------------------------------------------------------------------------------------------


class _WrappedCall:
    """``__call__`` of a GraphModule class: on an error raised inside generated code, print
    the traceback plus the generated lines around the failing one (marked) to stderr."""

    def __init__(self, cls: type, cls_call: Callable[..., Any] | None) -> None:
        self.cls = cls
        self.cls_call = cls_call

    @staticmethod
    def _generate_error_message(frame_summary: traceback.FrameSummary) -> str:
        lineno = frame_summary.lineno
        line = frame_summary.line
        if lineno is None:
            raise AssertionError("frame_summary.lineno is None")
        if line is None:
            raise AssertionError("frame_summary.line is None")
        src_lines = linecache.getlines(frame_summary.filename)
        header = (
            "Call using an FX-traced Module, "
            f"line {lineno} of the traced Module's generated forward function:"
        )
        return "\n".join(
            [
                traceback.format_exc(),
                header,
                "".join(src_lines[lineno - 2 : lineno]),
                "~" * len(line) + "~~~ <--- HERE",
                "\n".join(src_lines[lineno : lineno + 2]),
            ]
        )

    def __call__(self, obj: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            if self.cls_call is not None:
                return self.cls_call(obj, *args, **kwargs)
            return super(self.cls, obj).__call__(*args, **kwargs)  # type: ignore[misc]
        except Exception as e:
            if not e.__traceback__:
                raise AssertionError("Exception has no traceback") from e
            innermost = traceback.StackSummary.extract(traceback.walk_tb(e.__traceback__))[-1]
            if _EVAL_KEY_MARKER not in innermost.filename:
                raise
            print(_WrappedCall._generate_error_message(innermost), file=sys.stderr)
            raise e.with_traceback(None)  # the context was printed above


def _call_wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
    return self._wrapped_call(self, *args, **kwargs)


# --------------------------------------------------------------------------------------------
# GraphModule
# --------------------------------------------------------------------------------------------


_share_unpicklable_on_deepcopy = contextvars.ContextVar(
    "_share_torchbind_and_process_group", default=False
)
_share_torchbind_and_process_group = _share_unpicklable_on_deepcopy  # torch.fx's name


@contextlib.contextmanager
def _share_torchbind_and_process_group_on_deepcopy() -> Iterator[None]:
    """Within the context, ``GraphModule`` deepcopies share (instead of failing to copy)
    torchbind objects lacking ``__getstate__``/``__setstate__`` and ProcessGroups."""
    token = _share_unpicklable_on_deepcopy.set(True)
    try:
        yield
    finally:
        _share_unpicklable_on_deepcopy.reset(token)


def _is_uncopyable(value: object) -> bool:
    if isinstance(value, torch.ScriptObject):
        has = value._has_method  # type: ignore[attr-defined]  # ScriptObject API, untyped
        return not (has("__getstate__") and has("__setstate__"))
    dist = torch.distributed
    return dist.is_available() and isinstance(value, dist.ProcessGroup)


def _share_unpicklable(values: Iterable[object], memo: dict[int, Any]) -> None:
    """Pre-seed ``memo`` so deepcopy maps each uncopyable value to itself."""
    for value in values:
        if _is_uncopyable(value):
            memo.setdefault(id(value), value)


def _str_target(node: Node) -> str:
    if not isinstance(node.target, str):
        raise AssertionError(f"Expected node.target to be str, got {type(node.target)}")  # noqa: TRY004  # torch.fx raises this type
    return node.target


def _attr_targets(graph: Graph) -> Iterator[tuple[Node, str]]:
    """(node, qualified name) for every get_attr / call_module node."""
    for node in graph.nodes:
        if node.op in ("get_attr", "call_module"):
            yield node, _str_target(node)


def _used_module_paths(gm: GraphModule) -> set[str]:
    """Qualified names a graph keeps alive: every prefix of a get_attr/call_module target and,
    for call_module, everything below the called module."""
    used: set[str] = set()
    for node in gm.graph.nodes:
        if node.op not in ("call_module", "get_attr") or not isinstance(node.target, str):
            continue
        target = node.target
        used.update(itertools.accumulate(target.split("."), lambda a, b: f"{a}.{b}"))
        if node.op != "call_module":
            continue
        try:
            submod = gm.get_submodule(target)
        except AttributeError:
            continue
        used.update(f"{target}.{name}" for name, _ in submod.named_modules() if name)
    return used


class GraphModule(torch.nn.Module):
    """An ``nn.Module`` whose ``forward`` is Python code generated from ``self.graph``.

    Assigning ``gm.graph`` regenerates ``gm.code`` and ``gm.forward``; after mutating the
    graph in place, call ``gm.recompile()`` to bring them up to date.
    """

    __jit_unused_properties__: ClassVar[list[str]] = ["graph", "_boxed_call"]

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        # One singleton subclass per instance, derived from the first non-singleton class
        # in the MRO so that copies of copies do not stack singleton layers.
        base = next(t for t in cls.__mro__ if t.__qualname__.split(".")[-1] != _IMPL_CLASS_NAME)

        class GraphModuleImpl(base):  # type: ignore[misc, valid-type]  # dynamic base class
            pass

        return super().__new__(GraphModuleImpl)

    def __init__(
        self,
        root: torch.nn.Module | dict[str, Any],
        graph: Graph,
        class_name: str = "GraphModule",
    ) -> None:
        """Build a module running ``graph``.

        ``root`` is an ``nn.Module`` (objects named by get_attr/call_module targets are copied
        from its hierarchy by qualified name) or a dict ``{qualified name: object}``.
        ``class_name`` names the generated class in reprs and error messages.
        """
        super().__init__()
        self.__class__.__name__ = class_name
        if isinstance(root, torch.nn.Module):
            self._init_from_module(root, graph)
        elif isinstance(root, dict):
            self._init_from_dict(root, graph)
        else:
            raise RuntimeError("Unsupported type " + str(root) + " passed for root!")  # noqa: TRY004  # torch.fx raises this type

        self.graph = graph
        tracer_cls = graph._tracer_cls
        # Locally defined tracers cannot be pickled; only keep importable ones.
        keep = tracer_cls is not None and "<locals>" not in tracer_cls.__qualname__
        self._tracer_cls = tracer_cls if keep else None
        self._tracer_extras: dict[str, Any] = graph._tracer_extras or {}
        self.meta: dict[str, Any] = {}
        self._replace_hooks: list[Callable[[Node, str, Node], object]] = []
        self._create_node_hooks: list[Callable[[Node], object]] = []
        self._erase_node_hooks: list[Callable[[Node], object]] = []
        self._deepcopy_hooks: list[Callable[[GraphModule], object]] = []
        self.shape_env: Any = None

    def _init_from_module(self, root: torch.nn.Module, graph: Graph) -> None:
        if hasattr(root, "training"):
            self.training = root.training
        if isinstance(root, _CodeOnlyModule):
            # Unpickling: keep every child, buffer and parameter, referenced or not.
            names = itertools.chain(
                (k for k, _ in root.named_children()),
                (k for k, _ in root.named_buffers()),
                (k for k, _ in root.named_parameters()),
            )
            for name in names:
                _copy_attr(root, self, name)
        for _, target in _attr_targets(graph):
            _copy_attr(root, self, target)

    def _init_from_dict(self, root: dict[str, Any], graph: Graph) -> None:
        targets: list[str] = []
        for node, target in _attr_targets(graph):
            if target not in root:
                raise RuntimeError(
                    f"Node {node} referenced target {target} but that target was not "
                    "provided in ``root``!"
                )
            targets.append(target)
        # Shallow names first, so "foo" does not overwrite an already assigned "foo.bar".
        for target in sorted(targets, key=lambda t: t.count(".")):
            _assign_attr(root[target], self, target)

    # -- graph and code -----------------------------------------------------------------------

    @property
    def _boxed_call(self) -> bool:
        return isinstance(self._graph._codegen, _BoxedCodeGen)

    @property
    def graph(self) -> Graph:
        """Return the ``Graph`` underlying this ``GraphModule``"""
        return self._graph

    @graph.setter
    def graph(self, g: Graph) -> None:
        if not isinstance(g, Graph):
            raise AssertionError(f"Expected a Graph instance, but got {type(g)}")  # noqa: TRY004  # torch.fx raises this type
        self._graph = g
        g.owning_module = self
        self.recompile()

    @property
    def code(self) -> str:
        """Return the Python code generated from the ``Graph`` underlying this ``GraphModule``."""
        if not hasattr(self, "_code"):
            raise RuntimeError("Code has not been generated! Please report a bug to PyTorch")
        return self._code

    def recompile(self) -> PythonCode:
        """Regenerate ``code`` and ``forward`` from ``graph`` (call after editing the graph)."""
        graph = self._graph
        if isinstance(graph._codegen, _PyTreeCodeGen):
            self._in_spec = graph._codegen.pytree_info.in_spec
            self._out_spec = graph._codegen.pytree_info.out_spec

        python_code = graph.python_code(root_module="self")
        self._code = python_code.src
        self._lineno_map = python_code._lineno_map
        self._prologue_start = python_code._prologue_start

        cls = type(self)
        co_fields = getattr(graph, "_co_fields", None) or {}
        cls.forward = _LazyForward(self._code, python_code.globals, co_fields, cls)

        # Wrap the class's own __call__ if it defines one; otherwise defer to super() at call
        # time (never capture nn.Module.__call__ itself).
        if "_wrapped_call" not in vars(cls):
            own_call = cls.__call__ if "__call__" in vars(cls) else None
            cls._wrapped_call = _WrappedCall(cls, own_call)  # type: ignore[attr-defined]
        self._recompile_submodules()
        cls.__call__ = _call_wrapped  # type: ignore[method-assign]
        return python_code

    def _recompile_submodules(self) -> list[tuple[str, PythonCode]]:
        """Recompile direct GraphModule children; returns (name, PythonCode) pairs."""
        return [
            (name, child.recompile())
            for name, child in self.named_children()
            if isinstance(child, GraphModule)
        ]

    # -- submodule editing ----------------------------------------------------------------------

    def add_submodule(self, target: str, m: torch.nn.Module) -> bool:
        """Install ``m`` at qualified name ``target``, creating empty parent Modules.

        Returns False (installing nothing further) if a parent on the path exists but is
        not an ``nn.Module``.
        """
        *prefix, field = target.split(".")
        mod: Any = self
        for item in prefix:
            mod = _child_or_new(mod, item)
            if not isinstance(mod, torch.nn.Module):
                return False
        mod.add_module(field, m)
        return True

    def delete_submodule(self, target: str) -> bool:
        """Delete the submodule at ``target``; False if the path does not name a Module."""
        *path, field = target.split(".")
        mod: Any = self
        for item in path:
            if not hasattr(mod, item):
                return False
            mod = getattr(mod, item)
            if not isinstance(mod, torch.nn.Module):
                return False
        if not isinstance(getattr(mod, field, None), torch.nn.Module):
            return False
        delattr(mod, field)
        return True

    def delete_all_unused_submodules(self) -> None:
        """Delete every submodule not used by the graph (used: called by call_module, an
        ancestor of a get_attr/call_module target, or inside a called module)."""
        used = _used_module_paths(self)
        for name in [n for n, _ in self.named_modules() if n not in used]:
            self.delete_submodule(name)

    # -- export to files ------------------------------------------------------------------------

    def to_folder(self, folder: str | os.PathLike[str], module_name: str = "FxModule") -> None:
        """Write an importable package so that ``from <folder> import <module_name>`` works:
        ``module.py`` (class + generated forward), ``state_dict.pt`` and ``<child>.pt`` for
        children that cannot be recreated from their repr."""
        _write_folder(self, Path(folder), module_name)

    # -- serialization and copies ---------------------------------------------------------------

    def __reduce_package__(self, exporter: PackageExporter) -> tuple[Any, ...]:
        state = self.__dict__.copy()
        state["_graphmodule_cls_name"] = self.__class__.__name__
        del state["_graph"]
        state["_graphmodule_graph_node_meta_stack_trace"] = {
            node.name: node.meta["stack_trace"]
            for node in self.graph.nodes
            if "stack_trace" in node.meta
        }
        generated_module_name = f"fx-generated._{exporter.get_unique_id()}"
        python_code = self.recompile()
        import_block = _format_import_block(python_code.globals, exporter.importer)
        exporter.save_source_string(generated_module_name, import_block + self.code)
        return (reduce_package_graph_module, (state, generated_module_name))

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle the generated code and the state, never the Graph (re-traced on load)."""
        state = self.__dict__.copy()
        python_code = self.recompile()
        import_block = _format_import_block(python_code.globals, sys_importer)
        del state["_graph"]
        return (reduce_graph_module, (state, import_block))

    def _deepcopy_init(self) -> Callable[..., None]:
        return GraphModule.__init__

    def __deepcopy__(self, memo: dict[int, Any]) -> GraphModule:
        result = type(self).__new__(type(self))
        memo[id(self)] = result
        if _share_unpicklable_on_deepcopy.get():
            _share_unpicklable(self.__dict__.values(), memo)
        state_copy = _CodeOnlyModule(copy.deepcopy(self.__dict__, memo))
        self._deepcopy_init()(result, state_copy, state_copy.__dict__["_graph"])
        # __init__ resets hook lists; carry over the state-dict and graph hooks explicitly.
        preserved = (
            "_state_dict_hooks",
            "_load_state_dict_pre_hooks",
            "_load_state_dict_post_hooks",
            "_replace_hooks",
            "_create_node_hooks",
            "_erase_node_hooks",
            "_deepcopy_hooks",
        )
        for attr in preserved:
            if attr in self.__dict__:
                setattr(result, attr, copy.deepcopy(self.__dict__[attr], memo))
        result.meta = copy.deepcopy(getattr(self, "meta", {}), memo)
        for name, value in result.meta.get(_USER_PRESERVED_ATTRIBUTES_KEY, {}).items():
            setattr(result, name, value)
        for hook in getattr(self, "_deepcopy_hooks", ()):
            hook(result)
        return result

    def __copy__(self) -> GraphModule:
        result = GraphModule(self, self.graph)
        result.meta = getattr(self, "meta", {})
        return result

    def _replicate_for_data_parallel(self) -> GraphModule:
        replica = self.__copy__()
        object.__setattr__(replica, "_is_replica", True)
        return replica

    # -- printing -------------------------------------------------------------------------------

    def print_readable(
        self,
        print_output: bool = True,
        include_stride: bool = False,
        include_device: bool = False,
        colored: bool = False,
        *,
        fast_sympy_print: bool = False,
        expanded_def: bool = False,
        additional_meta: list[str] | None = None,
    ) -> str:
        """Return (and by default print) the verbose code of this module and its GraphModule
        children as ``class <name>(torch.nn.Module):`` blocks.

        ``additional_meta`` lists ``node.meta`` keys shown as ``key: value`` per node.
        """
        sym_ctx = (
            _override_sym_repr(_fast_sym_repr) if fast_sympy_print else contextlib.nullcontext()
        )
        with sym_ctx:
            return _print_readable(
                self,
                self._get_name(),
                print_output,
                include_stride,
                include_device,
                colored,
                expanded_def,
                additional_meta,
            )

    def __str__(self) -> str:
        reminder = "# To see more debug info, please use `graph_module.print_readable()`"
        return "\n".join([super().__str__(), self._code, reminder])

    # -- graph mutation hooks -------------------------------------------------------------------

    @contextlib.contextmanager
    def _set_replace_hook(self, f: Callable[[Node, str, Node], object]) -> Iterator[None]:
        """Within the context, call ``f(old_node, new_name, user)`` on node replacement/rename."""
        if not callable(f):
            raise AssertionError("Replace hook must be a callable.")  # noqa: TRY004  # torch.fx raises this type
        self._register_replace_node_hook(f)
        try:
            yield
        finally:
            self._unregister_replace_node_hook(f)

    def _register_replace_node_hook(self, f: Callable[[Node, str, Node], object]) -> None:
        self._replace_hooks.append(_checked_hook(f, "create_node"))

    def _unregister_replace_node_hook(self, f: Callable[[Node, str, Node], object]) -> None:
        self._replace_hooks.remove(_checked_hook(f, "create_node"))

    def _register_create_node_hook(self, f: Callable[[Node], object]) -> None:
        self._create_node_hooks.append(_checked_hook(f, "create_node"))

    def _unregister_create_node_hook(self, f: Callable[[Node], object]) -> None:
        self._create_node_hooks.remove(_checked_hook(f, "create_node"))

    def _register_erase_node_hook(self, f: Callable[[Node], object]) -> None:
        self._erase_node_hooks.append(_checked_hook(f, "erase_node"))

    def _unregister_erase_node_hook(self, f: Callable[[Node], object]) -> None:
        self._erase_node_hooks.remove(_checked_hook(f, "erase_node"))

    def _register_deepcopy_hook(self, f: Callable[[GraphModule], object]) -> None:
        self._deepcopy_hooks.append(_checked_hook(f, "deepcopy"))

    def _unregister_deepcopy_hook(self, f: Callable[[GraphModule], object]) -> None:
        self._deepcopy_hooks.remove(_checked_hook(f, "deepcopy"))


def _checked_hook(f: Any, kind: str) -> Any:
    """Return ``f`` if callable; torch's message names the hook kind (replace hooks reuse
    "create_node")."""
    if not callable(f):
        raise AssertionError(f"{kind} hook must be a callable.")  # noqa: TRY004  # torch.fx raises this type
    return f
