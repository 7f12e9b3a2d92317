"""Symbolic tracing: run a module or function on proxies and record what it does.

Contract: ``Tracer().trace(root)`` returns a :class:`Graph` whose placeholders are ``root``'s
parameters and whose other nodes are the torch calls, tensor methods, operators, leaf-module
calls and wrapped-function calls that ``root``'s Python code performed on its inputs.
``symbolic_trace(root)`` wraps that graph in a :class:`GraphModule`.

While a trace runs, ``nn.Module.__call__`` / ``nn.Module.__getattr__`` and the module globals
holding wrapped / autowrapped functions are temporarily replaced; :class:`_TracePatches` (in
``_patching``, with ``wrap``) owns every such replacement and undoes all of them when the trace
ends, even on error.
"""

from __future__ import annotations

import collections
import copy
import functools
import gc
import inspect
import math
import warnings
from collections.abc import Callable
from itertools import chain
from types import FunctionType, ModuleType
from typing import Any, ClassVar, Union

import torch
import torch.utils._pytree as torch_pytree

from exportir import pytree
from exportir.fx import _patching

# wrap() and the trace-time patching context live in _patching; re-exported so code written
# against torch.fx.tracer (and this module's former private surface) imports them from here.
from exportir.fx._patching import (  # noqa: F401
    _APPLY,
    _PATCHED_MARK,
    _REVERT,
    _autowrap_check,
    _create_wrapped_func,
    _create_wrapped_method,
    _drop_item,
    _find_proxy,
    _first_proxy,
    _maybe_revert_all_patches,
    _new_patcher,
    _Patch,
    _patch_wrapped_functions,
    _Patcher,
    _restore_attr,
    _restore_item,
    _set_attr,
    _set_item,
    _TracePatches,
    _wrapped_fns_to_patch,
    _wrapped_methods_to_patch,
    wrap,
)
from exportir.fx.codegen import _PyTreeCodeGen, _PyTreeInfo
from exportir.fx.graph import Graph
from exportir.fx.node import Argument, base_types
from exportir.fx.proxy import ParameterProxy, Proxy, Scope, ScopeContextManager, TracerBase

__all__ = [
    "PH",
    "PHBase",
    "PHWithMeta",
    "ProxyableClassMeta",
    "Tracer",
    "is_fx_tracing",
    "symbolic_trace",
    "wrap",
]

HAS_VARSTUFF = inspect.CO_VARARGS | inspect.CO_VARKEYWORDS


def __getattr__(name: str) -> Any:
    """Forward ``_current_patches`` (rebound on every trace; ``CURRENT_PATCHER`` in torch.fx)
    live from ``_patching``."""
    if name in ("_current_patches", "CURRENT_PATCHER"):
        return _patching._current_patches
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# The unpatched Module hooks, captured once so nested traces never call a tracer's wrapper.
_orig_module_call: Callable[..., Any] = torch.nn.Module.__call__
_orig_module_getattr: Callable[..., Any] = torch.nn.Module.__getattr__


def _find_constant_attribute_types() -> tuple[type, ...]:
    """Non-argument values that become ``get_attr`` constants (tensors, script objects, specs)."""
    found: list[type] = [torch.Tensor, torch.ScriptObject, torch_pytree.TreeSpec, pytree.TreeSpec]
    try:
        from torch._library.fake_class_registry import FakeScriptObject

        found.append(FakeScriptObject)
    except ImportError:  # torch without fake script objects
        pass
    return tuple(dict.fromkeys(found))


_CONSTANT_ATTRIBUTE_TYPES = _find_constant_attribute_types()
# torch.fx._symbolic_trace's names: the type alias (for annotations) and its members.
_ConstantAttributeType = Union[_CONSTANT_ATTRIBUTE_TYPES]  # noqa: UP007  # built from a tuple
_constant_attribute_types = _CONSTANT_ATTRIBUTE_TYPES

# Whether a symbolic trace is running (read by ProxyableClassMeta, is_fx_tracing). One flag
# per process, saved and restored around each trace, as torch.fx does.
_is_fx_tracing_flag = False


def is_fx_tracing() -> bool:
    """True while :meth:`Tracer.trace` is running."""
    return _is_fx_tracing_flag


def is_fx_symbolic_tracing() -> bool:
    """True while a symbolic trace (not a torch.compile) is running."""
    return _is_fx_tracing_flag and not torch.compiler.is_compiling()


# --------------------------------------------------------------------------------------------
# ProxyableClassMeta
# --------------------------------------------------------------------------------------------

_proxyable_classes: dict[type, None] = {}


class ProxyableClassMeta(type):
    """Metaclass making construction of a class traceable.

    During tracing, constructing an instance from arguments that contain a Proxy records a
    ``call_function`` node whose target is the class; otherwise the instance is built normally.
    """

    def __init__(cls, name: str, bases: tuple[type, ...], attrs: dict[str, Any]) -> None:
        _proxyable_classes.setdefault(cls)
        super().__init__(name, bases, attrs)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        instance = cls.__new__(cls)
        if is_fx_tracing():
            proxy = _first_proxy((args, kwargs))
            if proxy is not None:
                return proxy.tracer.create_proxy("call_function", cls, args, kwargs)
        cls.__init__(instance, *args, **kwargs)
        return instance


# --------------------------------------------------------------------------------------------
# Placeholders for concrete_args
# --------------------------------------------------------------------------------------------


class PHBase:
    """Marks an input that stays symbolic inside ``concrete_args``."""

    def __repr__(self) -> str:
        return "PH"


PH = PHBase()


class PHWithMeta(PHBase):
    """A placeholder marker whose non-callable attributes are copied onto the created node."""

    def __init__(self, ph_key: str | None = None) -> None:
        super().__init__()
        self.ph_key = ph_key


def _transfer_attrs(fr: object, to: object) -> None:
    """Copy ``fr``'s public, non-callable attributes that ``to`` lacks onto ``to``."""
    for attr_name in dir(fr):
        value = getattr(fr, attr_name)
        if callable(value) or attr_name.startswith("__") or hasattr(to, attr_name):
            continue
        setattr(to, attr_name, value)


class _GCPaused:
    """Pause the cyclic garbage collector for a block; restore its previous state on exit.

    Tracing allocates many long-lived, cycle-linked objects (nodes, arguments); collector
    passes over them are pure cost (up to half the trace time on large models). Nested uses
    leave the collector as the outermost one found it.
    """

    def __enter__(self) -> None:
        self._was_enabled = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self._was_enabled:
            gc.enable()


def _patch_function(fn: FunctionType, nargs: int) -> FunctionType:
    """A copy of ``fn`` whose ``*args``/``**kwargs``/keyword-only parameters are plain
    positional ones, so placeholders can be passed for them positionally."""
    co = fn.__code__
    new_code = co.replace(
        co_argcount=nargs,
        co_posonlyargcount=0,
        co_kwonlyargcount=0,
        co_flags=co.co_flags & ~HAS_VARSTUFF,
    )
    return FunctionType(new_code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


# --------------------------------------------------------------------------------------------
# Tracer
# --------------------------------------------------------------------------------------------


@functools.cache
def _accepts_proxy_factory(create_proxy: Callable[..., Any]) -> bool:
    """Whether a (possibly overridden) ``create_proxy`` function takes ``proxy_factory_fn``."""
    return "proxy_factory_fn" in inspect.signature(create_proxy).parameters


# Exact types that Tracer.create_arg hands straight to TracerBase.create_arg.
_PLAIN_ARG_TYPES: frozenset[type] = frozenset(
    {Proxy, tuple, list, dict, int, float, bool, str, complex, type(None), slice, torch.dtype,
     torch.device}
)


def _first_names(pairs: Any) -> dict[int, str]:
    """id(value) -> the first name it appears under in ``named_*()`` order."""
    names: dict[int, str] = {}
    for name, value in pairs:
        names.setdefault(id(value), name)
    return names


class Tracer(TracerBase):
    """Tracer(autowrap_modules=(math,), autowrap_functions=())

    Implements ``symbolic_trace``: ``symbolic_trace(m)`` is ``Tracer().trace(m)`` wrapped in a
    GraphModule. Subclass and override ``is_leaf_module``, ``call_module``, ``create_arg``,
    ``getattr``, ``create_proxy`` ... to change what gets recorded.
    """

    _qualname_counter: ClassVar[dict[str, int]] = collections.defaultdict(int)

    def __init__(
        self,
        autowrap_modules: tuple[ModuleType, ...] = (math,),
        autowrap_functions: tuple[Callable[..., Any], ...] = (),
        param_shapes_constant: bool = False,
    ) -> None:
        """Args:
        autowrap_modules: modules whose public functions are recorded as leaf calls
            wherever they are called from (``math.sqrt`` and ``from math import sqrt``).
        autowrap_functions: further functions recorded as leaf calls.
        param_shapes_constant: shape queries on parameters (``shape``, ``size()``, ...)
            return real values instead of proxies.
        """
        super().__init__()
        self._autowrap_function_ids: set[int] = {
            id(value)
            for name, value in chain.from_iterable(m.__dict__.items() for m in autowrap_modules)
            if not name.startswith("_") and callable(value)
        }
        self._autowrap_function_ids.update(id(f) for f in autowrap_functions)
        self._autowrap_search: list[ModuleType] = list(autowrap_modules)
        self.param_shapes_constant = param_shapes_constant
        self.submodule_paths: dict[torch.nn.Module, str] | None = None
        self.root_module_name: str = ""
        self.scope = Scope("", None)
        self.module_stack = collections.OrderedDict()
        self.num_calls: dict[str, int] = {}
        self.node_name_to_scope: dict[str, tuple[str, type]] = {}
        self._name_caches: dict[str, dict[int, str]] = {}

    # -- naming --------------------------------------------------------------------------------

    def get_fresh_qualname(self, prefix: str) -> str:
        """A ``prefix<N>`` attribute name not yet present on ``self.root``."""
        qualname = f"{prefix}0"
        if not hasattr(self.root, qualname):
            self._qualname_counter[prefix] = 0
            return qualname
        i = self._qualname_counter[prefix]
        while True:
            qualname = f"{prefix}{i}"
            i += 1
            if not hasattr(self.root, qualname):
                break
        self._qualname_counter[prefix] = i
        return qualname

    def _name_of(self, kind: str, value: Any) -> str | None:
        """Qualified name of a parameter/buffer/module of ``self.root`` (cached id lookup).

        A miss rebuilds the cache once, so members registered during the trace are found.
        """
        cache = self._name_caches.get(kind)
        if cache is None or id(value) not in cache:
            cache = _first_names(getattr(self.root, f"named_{kind}")())
            self._name_caches[kind] = cache
        return cache.get(id(value))

    # -- arguments -----------------------------------------------------------------------------

    def create_arg(self, a: Any) -> Argument:
        """Lower ``a`` into a node argument.

        Parameters, buffers and submodules of the root become ``get_attr`` nodes; other
        tensors (and script objects, tree specs) are stored on the root as
        ``_tensor_constant<N>`` etc. and fetched with ``get_attr``; named tuples become
        constructor calls; instances of ProxyableClassMeta classes become constants.
        """
        if type(a) in _PLAIN_ARG_TYPES:  # fast path: cannot be a member or a constant
            return super().create_arg(a)
        if isinstance(a, torch.nn.Parameter):
            name = self._name_of("parameters", a)
            if name is None:
                raise NameError("parameter is not a member of this module")
            return self.create_node("get_attr", name, (), {})
        if isinstance(a, torch.Tensor):
            name = self._buffer_name(a)
            if name is not None:
                return self.create_node("get_attr", name, (), {})
        elif isinstance(a, torch.nn.Module):
            name = self._name_of("modules", a)
            if name is not None:
                return self.create_node("get_attr", name, (), {})
        if isinstance(a, tuple) and hasattr(a, "_fields"):
            args = tuple(self.create_arg(elem) for elem in a)
            return self.create_node("call_function", a.__class__, args, {})
        if isinstance(a, _CONSTANT_ATTRIBUTE_TYPES) or _is_opaque_reference(a):
            return self.create_node("get_attr", self._constant_qualname(a), (), {})
        if type(a) in _proxyable_classes:
            qualname = self.get_fresh_qualname(f"_{a.__class__.__name__}_constant_")
            setattr(self.root, qualname, a)
            return self.create_node("get_attr", qualname, (), {})
        return super().create_arg(a)

    def _buffer_name(self, t: torch.Tensor) -> str | None:
        cache = self._name_caches.get("buffers")
        if cache is None:
            cache = _first_names(self.root.named_buffers())
            self._name_caches["buffers"] = cache
        return cache.get(id(t))

    def _constant_qualname(self, a: Any) -> str:
        """Where constant ``a`` lives on the root, storing it under a fresh name if needed."""
        qualname = self.tensor_attrs.get(a)
        if qualname:
            return qualname
        qualname = self.get_fresh_qualname(_constant_prefix(a))
        self.tensor_attrs[a] = qualname
        setattr(self.root, qualname, a)
        return qualname

    # -- modules -------------------------------------------------------------------------------

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        """Leaf modules appear as ``call_module`` nodes: by default those defined in
        ``torch.nn`` / ``torch.ao.nn``, except ``Sequential``."""
        module = m.__module__
        from_torch_nn = module.startswith(("torch.nn", "torch.ao.nn"))
        return from_torch_nn and not isinstance(m, torch.nn.Sequential)

    def path_of_module(self, mod: torch.nn.Module) -> str:
        """The qualified name of ``mod`` in ``self.root`` (``"foo.bar"``)."""
        if self.submodule_paths:
            path = self.submodule_paths.get(mod)
            if path is None:
                raise NameError("module is not installed as a submodule")
            return path
        for name, candidate in self.root.named_modules():
            if mod is candidate:
                return name
        raise NameError("module is not installed as a submodule")

    def call_module(
        self,
        m: torch.nn.Module,
        forward: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Record a call to ``m``: a ``call_module`` node if it is a leaf, else trace through
        ``forward``. Maintains ``scope`` and ``module_stack`` for the duration."""
        qualname = self.path_of_module(m)
        with ScopeContextManager(self.scope, Scope(qualname, type(m))) as scope:
            num_calls = self.num_calls.get(qualname, 0)
            module_key = f"{scope.module_path}@{num_calls}" if num_calls > 0 else scope.module_path
            self.module_stack[module_key] = (qualname, scope.module_type)
            self.num_calls[qualname] = num_calls + 1
            if self.is_leaf_module(m, qualname):
                ret_val = self.create_proxy("call_module", qualname, args, kwargs)
            else:
                ret_val = forward(*args, **kwargs)
            key, _ = self.module_stack.popitem(last=True)
            if key != module_key:
                raise AssertionError(f"Unexpected key {key}, expected {module_key}")
        return ret_val

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict[str, Proxy]) -> Any:
        """The value seen for ``module.attr`` during tracing: parameters (and, with
        ``proxy_buffer_attributes``, buffers) of the root become cached ``get_attr`` proxies."""
        if isinstance(attr_val, torch.nn.Parameter):
            proxy = self._attr_proxy("parameters", attr_val, parameter_proxy_cache)
            if proxy is not None:
                return proxy
        if self.proxy_buffer_attributes and isinstance(attr_val, torch.Tensor):
            proxy = self._attr_proxy("buffers", attr_val, parameter_proxy_cache)
            if proxy is not None:
                return proxy
        return attr_val

    def _attr_proxy(self, kind: str, value: Any, cache: dict[str, Proxy]) -> Proxy | None:
        name = self._name_of(kind, value)
        if name is None:
            return None
        if name not in cache:
            kwargs: dict[str, Any] = {}
            if _accepts_proxy_factory(getattr(self.create_proxy, "__func__", self.create_proxy)):
                kwargs["proxy_factory_fn"] = (
                    (lambda node: ParameterProxy(self, node, name, value))
                    if self.param_shapes_constant
                    else None
                )
            cache[name] = self.create_proxy("get_attr", name, (), {}, **kwargs)
        return cache[name]

    # -- inputs --------------------------------------------------------------------------------

    def create_args_for_root(
        self,
        root_fn: Callable[..., Any],
        is_module: bool,
        concrete_args: dict[str, Any] | tuple[Any, ...] | None = None,
    ) -> tuple[Any, list[Any]]:
        """Create the placeholders for ``root_fn``'s signature (incl. ``*args``/``**kwargs``)
        and return ``(fn_to_call, args)``. Structured ``concrete_args`` make ``fn_to_call`` a
        wrapper taking flat inputs, and switch the graph to pytree code generation."""
        fn_for_analysis = inspect.unwrap(root_fn)
        co = fn_for_analysis.__code__
        total_args = co.co_argcount + co.co_kwonlyargcount
        orig_args = list(co.co_varnames)
        names_iter = iter(co.co_varnames)
        args: list[Any] = []
        skip_arg_idx = 0
        if is_module:
            if total_args == 0:
                raise RuntimeError("``self`` argument cannot be part of *args expansion!")
            skip_arg_idx = 1
            next(names_iter)
            args.append(self.root)
        sig = inspect.signature(fn_for_analysis)
        has_varstuff = bool(co.co_flags & HAS_VARSTUFF)
        if isinstance(concrete_args, tuple) and concrete_args and has_varstuff and total_args == 1:
            args.extend(self._flat_input_placeholders(concrete_args))
            return root_fn, args
        arg_names = [next(names_iter) for _ in range(skip_arg_idx, total_args)]
        if isinstance(concrete_args, tuple):
            if len(arg_names) != len(concrete_args):
                raise RuntimeError(
                    f"Tracing expected {len(arg_names)} arguments but got "
                    f"{len(concrete_args)} concrete arguments"
                )
            concrete_args = dict(zip(arg_names, concrete_args))
        args.extend(
            self._proxy_placeholder(name, concrete_args, sig, fn_for_analysis)
            for name in arg_names
        )
        if co.co_kwonlyargcount > 0 or has_varstuff:
            for flag, star in ((inspect.CO_VARARGS, "*"), (inspect.CO_VARKEYWORDS, "**")):
                if co.co_flags & flag:
                    name = star + next(names_iter)
                    args.append(self._proxy_placeholder(name, concrete_args, sig, fn_for_analysis))
            root_fn = _patch_function(root_fn, len(args))
        return self._maybe_flatten_inputs(root_fn, args, orig_args[:total_args])

    def _flat_input_placeholders(self, concrete_args: tuple[Any, ...]) -> list[Proxy]:
        """``input_<i>`` placeholders for a ``(*args, **kwargs)`` root given flat inputs."""
        out = []
        for i, concrete_arg in enumerate(concrete_args):
            proxy = self.create_proxy("placeholder", f"input_{i}", (), {})
            if isinstance(concrete_arg, PHBase) and concrete_arg != PH:
                _transfer_attrs(fr=concrete_arg, to=proxy.node)
            out.append(proxy)
        return out

    def _maybe_flatten_inputs(
        self, root_fn: Callable[..., Any], args: list[Any], orig_args: list[str]
    ) -> tuple[Any, list[Any]]:
        flat_args, in_spec = pytree.tree_flatten(tuple(args))
        if all(child.is_leaf() for child in in_spec.children()):
            return root_fn, args
        self.graph._codegen = _PyTreeCodeGen(_PyTreeInfo(orig_args, in_spec, None))

        def flatten_fn(*args):  # type: ignore[no-untyped-def]  # annotations leak into code
            tree_out = root_fn(*pytree.tree_unflatten(list(args), in_spec))
            out_args, out_spec = pytree.tree_flatten(tree_out)
            codegen = self.graph._codegen
            if not isinstance(codegen, _PyTreeCodeGen):
                raise AssertionError(  # noqa: TRY004  # torch.fx's error type
                    f"Expected _codegen to be _PyTreeCodeGen, got {type(codegen)}"
                )
            codegen.pytree_info = codegen.pytree_info._replace(out_spec=out_spec)
            return out_args

        return flatten_fn, flat_args

    def _proxy_placeholder(
        self,
        name: str,
        concrete_args: dict[str, Any] | None,
        sig: inspect.Signature,
        fn_for_analysis: Callable[..., Any],
    ) -> Any:
        """The value passed for parameter ``name``: a placeholder proxy, or the concrete
        value (with placeholders + guards for its leaves) when it is in ``concrete_args``."""
        if concrete_args is not None and name in concrete_args:
            return self._specialize(name, concrete_args[name], sig)
        default: tuple[Any, ...] = ()
        if name[0] != "*":
            param = sig.parameters[name]
            if param.default is not inspect.Parameter.empty:
                default = (param.default,)
        type_expr = fn_for_analysis.__annotations__.get(name, None)
        return self.create_proxy("placeholder", name, default, {}, type_expr=type_expr)

    def _specialize(self, name: str, value: Any, sig: inspect.Signature) -> Any:
        count = 0

        def replace_ph(x: Any) -> Any:
            nonlocal count
            count += 1
            param = sig.parameters[name]
            default = () if param.default is inspect.Parameter.empty else (param.default,)
            out = self.create_proxy("placeholder", f"{name}_{count}", default, {})
            if isinstance(x, PHBase):
                if x != PH:
                    _transfer_attrs(fr=x, to=out.node)
                return out
            self._guard_specialized(name, x, out)
            return x

        return pytree.tree_map(replace_ph, value)

    def _guard_specialized(self, name: str, x: Any, out: Proxy) -> None:
        """Record an assert that input leaf ``out`` equals the specialized value ``x``."""
        if type(x) is bool or (type(x) in base_types and type(x) is not torch.Tensor):
            torch._assert(
                out == x, f"{name} has been specialized to have value {x} but got another value"
            )
        elif x is None:
            msg = f"{name} has been specialized to have value None but got another value"
            self.create_proxy("call_function", _assert_is_none, (out, msg), {})
        else:
            warnings.warn(
                f"Was not able to add assertion to guarantee correct input {name} to "
                f"specialized function. It is up to the user to make sure that your inputs "
                f"match the inputs you specialized the function with."
            )

    # -- the trace -----------------------------------------------------------------------------

    def trace(
        self,
        root: torch.nn.Module | Callable[..., Any],
        concrete_args: dict[str, Any] | None = None,
    ) -> Graph:
        """Trace ``root`` (a Module's ``traced_func_name`` method, or a function) into a Graph.

        Afterwards ``self.root`` is the module that owns the graph's attributes (a fresh
        ``nn.Module`` when ``root`` is a function); constants found while tracing are stored
        on it.
        """
        global _is_fx_tracing_flag
        saved_flag, _is_fx_tracing_flag = _is_fx_tracing_flag, True
        try:
            with _GCPaused():
                self._trace_into_graph(root, concrete_args)
        except RuntimeError as e:
            _attach_partial_graph(e, getattr(self, "graph", None))
            raise
        finally:
            _is_fx_tracing_flag = saved_flag
        return self.graph

    def _trace_into_graph(
        self, root: torch.nn.Module | Callable[..., Any], concrete_args: Any
    ) -> None:
        fn = self._setup_root(root)
        self._new_graph(fn)
        if not isinstance(fn, FunctionType):
            raise AssertionError(f"Expected FunctionType, got {type(fn)}")  # noqa: TRY004  # as torch.fx
        fn_globals = fn.__globals__  # read before create_args_for_root may patch fn
        fn, args = self.create_args_for_root(fn, isinstance(root, torch.nn.Module), concrete_args)
        self._run(fn, args, fn_globals)
        self.submodule_paths = None

    def _setup_root(self, root: torch.nn.Module | Callable[..., Any]) -> Any:
        """Set ``self.root`` and related caches; return the function to trace."""
        self._name_caches = {}
        if not isinstance(root, torch.nn.Module):
            self.root = torch.nn.Module()
            return root
        self.root = root
        if not hasattr(type(root), self.traced_func_name):
            raise AssertionError(
                f"traced_func_name={self.traced_func_name} doesn't exist in "
                f"{type(root).__name__}"
            )
        self.root_module_name = root._get_name()
        self.submodule_paths = {mod: name for name, mod in root.named_modules()}
        return getattr(type(root), self.traced_func_name)

    def _new_graph(self, fn: Any) -> None:
        """Start ``self.graph`` and index the root's tensor-like attributes."""
        self.graph = Graph(tracer_cls=getattr(self, "__class__", None))
        code = getattr(fn, "__code__", None)
        if code is not None:
            self.graph._co_fields = {
                "co_name": code.co_name,
                "co_filename": code.co_filename,
                "co_firstlineno": code.co_firstlineno,
            }
        self.tensor_attrs: dict[Any, str] = {}
        _collect_tensor_attrs(self.root, [], self.tensor_attrs)

    def _run(self, fn: Callable[..., Any], args: list[Any], fn_globals: dict[str, Any]) -> None:
        """Call ``fn`` on the placeholders with module hooks and leaf wrappers installed,
        and record its result as the output node."""
        parameter_proxy_cache: dict[str, Proxy] = {}
        with _TracePatches() as patches:
            self._install_module_hooks(patches, parameter_proxy_cache)
            patches.patch_wrapped_functions()
            patches.autowrap(fn_globals, self._autowrap_function_ids)
            for module in self._autowrap_search:
                patches.autowrap(module.__dict__, self._autowrap_function_ids)
            ann = inspect.get_annotations(inspect.unwrap(fn))
            result = self.create_arg(fn(*args))
            self.create_node("output", "output", (result,), {}, type_expr=ann.get("return", None))

    def _install_module_hooks(
        self, patches: _TracePatches, parameter_proxy_cache: dict[str, Proxy]
    ) -> None:
        """Route submodule calls to :meth:`call_module` and attribute reads to :meth:`getattr`."""
        function_ids = self._autowrap_function_ids

        @functools.wraps(_orig_module_getattr)
        def module_getattr_wrapper(mod: torch.nn.Module, attr: str) -> Any:
            attr_val = _orig_module_getattr(mod, attr)
            return self.getattr(attr, attr_val, parameter_proxy_cache)

        @functools.wraps(_orig_module_call)
        def module_call_wrapper(mod: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            def forward(*args: Any, **kwargs: Any) -> Any:
                return _orig_module_call(mod, *args, **kwargs)

            globals_ = getattr(getattr(mod, "forward", mod), "__globals__", None)
            if globals_ is not None:
                patches.autowrap(globals_, function_ids)
            return self.call_module(mod, forward, args, kwargs)

        # Not deduplicated: a trace nested in another installs its own hooks on top.
        patches.patch_method(torch.nn.Module, "__getattr__", module_getattr_wrapper, False)
        patches.patch_method(torch.nn.Module, "__call__", module_call_wrapper, False)

    def __deepcopy__(self, memo: dict[int, Any]) -> Tracer:
        # Modules in _autowrap_search cannot be deep-copied; share them.
        new_tracer = Tracer.__new__(Tracer)
        for k, v in self.__dict__.items():
            new_tracer.__dict__[k] = copy.copy(v) if k == "_autowrap_search" else copy.deepcopy(v, memo)
        return new_tracer


def _constant_prefix(a: Any) -> str:
    """Attribute-name prefix for a constant stored on the root."""
    if isinstance(a, torch.Tensor):
        return "_tensor_constant"
    if isinstance(a, torch.ScriptObject) or type(a).__name__ == "FakeScriptObject":
        return "_torchbind_obj"
    if isinstance(a, (torch_pytree.TreeSpec, pytree.TreeSpec)):
        return "_tree_spec_constant"
    if _is_opaque_reference(a):
        return "_opaque_obj"
    raise RuntimeError(f"cannot create constant arg for {a} of type {type(a)}.")


def _is_opaque_reference(a: Any) -> bool:
    try:
        from torch._library.opaque_object import is_opaque_reference_type
    except ImportError:  # torch without opaque objects
        return False
    return is_opaque_reference_type(type(a))


def _collect_tensor_attrs(m: torch.nn.Module, prefix: list[str], out: dict[Any, str]) -> None:
    """Record ``value -> qualified name`` for tensor-like plain attributes in the hierarchy."""
    for k, v in m.__dict__.items():
        if isinstance(v, _CONSTANT_ATTRIBUTE_TYPES):
            out[v] = ".".join(prefix + [k])
    for k, child in m.named_children():
        _collect_tensor_attrs(child, prefix + [k], out)


def _attach_partial_graph(e: RuntimeError, graph: Any) -> None:
    """On data-dependent errors, attach the graph traced so far as ``e.partial_fx_graph``."""
    if graph is None or not e.args or not isinstance(e.args[0], str):
        return
    if "data-dependent" in e.args[0]:
        e.partial_fx_graph = graph.python_code(root_module="self", verbose=True).src  # type: ignore[attr-defined]  # extra context on the error


def symbolic_trace(
    root: torch.nn.Module | Callable[..., Any],
    concrete_args: dict[str, Any] | None = None,
) -> Any:
    """Trace ``root`` (a module or function) and return a ``GraphModule`` of what it does.

    ``concrete_args`` specializes inputs to fixed values (guarded by asserts in the graph);
    nested structures in it are flattened with pytrees, with :data:`PH` marking leaves that
    stay symbolic.
    """
    from exportir.fx.graph_module import GraphModule

    with _GCPaused():
        tracer = Tracer()
        graph = tracer.trace(root, concrete_args)
        name = root.__class__.__name__ if isinstance(root, torch.nn.Module) else root.__name__
        return GraphModule(tracer.root, graph, name)


@wrap
def _assert_is_none(value: Any, msg: str) -> None:
    """Target recorded to guard an input specialized to ``None``."""
    if value is not None:
        raise AssertionError(msg)
