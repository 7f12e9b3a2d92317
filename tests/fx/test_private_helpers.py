"""Private helpers of torch.fx that passes import, at the same module paths, behaving the same.

The names come from a survey of public code (third-party passes, quantization and compiler
projects): ``from torch.fx.node import _get_qualified_name``, ``from torch.fx.graph import
_snake_case, _Namespace``, ``from torch.fx._symbolic_trace import _assert_is_none``,
``from torch.fx._compatibility import compatibility``... Each is compared with torch's on the
same inputs.
"""

from __future__ import annotations

import importlib
import math
import operator
import textwrap
import typing

import pytest
import torch
import torch.fx
from conftest import import_ours_fx, ours_fx_name

ours = import_ours_fx()
SANITY = ours is torch.fx


def _pair(module: str):
    """(torch.fx.<module>, <ours>.<module>)."""
    return importlib.import_module(f"torch.fx.{module}"), importlib.import_module(
        f"{ours_fx_name()}.{module}")


# Every name below is imported by public code from the torch.fx module it is listed under.
SURVEYED = {
    "node": [
        "_get_qualified_name", "_format_arg", "_type_repr", "_find_module_of_method",
        "_side_effectful_functions", "_side_effectful_need_to_be_preserved_pre_dispatch",
        "_legal_ops", "dtype_abbrs", "normalize_function", "normalize_module", "ArgsKwargsPair",
        "Argument", "Target", "base_types", "map_arg", "map_aggregate", "has_side_effect",
    ],
    "graph": [
        "_PyTreeCodeGen", "_PyTreeInfo", "_BoxedCodeGen", "_Namespace", "_snake_case",
        "_is_magic", "_format_target", "_parse_stack_trace", "_ParsedStackTrace",
        "_register_custom_builtin", "_custom_builtins", "_CustomBuiltin", "_node_list",
        "_is_from_torch", "_counter_regexp", "_get_qualified_name", "_type_repr", "dtype_abbrs",
        "magic_methods", "reflectable_magic_methods", "inplace_methods", "_origin_type_map",
        "_legal_ops", "_illegal_names", "_color_fns", "_color_codes", "_identity",
        "_make_color_fn", "_name_regex", "_illegal_char_regex", "_snake_case_sub",
        "PythonCode", "CodeGen", "TransformCodeFunc",
    ],
    "graph_module": [
        "_copy_attr", "_assign_attr", "_get_attr", "_has_attr", "_del_attr",
        "_get_attr_via_attr_list", "_USER_PRESERVED_ATTRIBUTES_KEY", "_forward_from_src",
        "_exec_with_source", "_method_from_src", "_format_import_block",
        "_format_import_statement", "reduce_graph_module", "reduce_package_graph_module",
        "_loader", "_EvalCacheLoader", "_is_from_torch", "_WrappedCall", "_CodeOnlyModule",
        "_print_readable", "_share_torchbind_and_process_group",
        "_share_torchbind_and_process_group_on_deepcopy",
    ],
    "_symbolic_trace": [
        "Tracer", "symbolic_trace", "wrap", "is_fx_tracing", "_assert_is_none", "_Patcher",
        "_ConstantAttributeType", "_constant_attribute_types", "_autowrap_check",
        "_wrapped_fns_to_patch", "_wrapped_methods_to_patch", "_proxyable_classes",
        "_create_wrapped_func", "_create_wrapped_method", "_maybe_revert_all_patches",
        "_new_patcher", "_patch_wrapped_functions", "_is_fx_tracing_flag", "CURRENT_PATCHER",
        "PH", "PHBase", "PHWithMeta", "ProxyableClassMeta", "HAS_VARSTUFF", "_orig_module_call",
        "_orig_module_getattr", "_find_proxy",
    ],
    "proxy": [
        "Proxy", "ParameterProxy", "Attribute", "TracerBase", "GraphAppendingTracer",
        "TraceError", "Scope", "ScopeContextManager", "MetaProxy", "magic_methods",
        "reflectable_magic_methods",
    ],
    "_compatibility": ["compatibility", "_BACK_COMPAT_OBJECTS", "_MARKED_WITH_COMPATIBILITY"],
    "_pytree": ["register_pytree_flatten_spec", "tree_flatten_spec", "SUPPORTED_NODES"],
    "immutable_collections": ["immutable_list", "immutable_dict"],
}


@pytest.mark.parametrize("module, name", [(m, n) for m, names in SURVEYED.items() for n in names])
def test_surveyed_name_exists_where_torch_has_it(module, name):
    theirs, mine = _pair(module)
    assert hasattr(theirs, name), f"survey out of date: torch.fx.{module}.{name} is gone"
    assert hasattr(mine, name), f"{ours_fx_name()}.{module}.{name} is missing"
    if callable(getattr(theirs, name)) and not isinstance(getattr(theirs, name), type):
        assert callable(getattr(mine, name))


# --------------------------------------------------------------------------------------------
# torch.fx.node


def _outcome(fn, *args):
    """``fn(*args)``'s value, or the type of what it raised (helpers must fail alike too)."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001  # compared with torch's outcome
        return type(e)


def user_function(x):
    return x


user_lambda = lambda x: x  # _get_qualified_name reads a lambda's assigned name

QUALIFIED = [
    getattr, len, operator.add, operator.getitem, math.sqrt, torch.add, torch.relu,
    torch.Tensor.add, torch.Tensor.relu, torch.Tensor.__add__, torch.Tensor.size,
    torch.Tensor.backward, torch.nn.functional.relu, torch.nn.functional.gelu,
    torch.ops.aten.add.Tensor, torch.ops.aten.relu.default, torch.segment_reduce,
    torch._C._nn.linear, user_function, user_lambda,
]


@pytest.mark.parametrize("fn", QUALIFIED, ids=lambda f: getattr(f, "__name__", str(f)))
def test_get_qualified_name_matches_torch(fn):
    theirs, mine = _pair("node")
    assert _outcome(mine._get_qualified_name, fn) == _outcome(theirs._get_qualified_name, fn)


@pytest.mark.parametrize("fn", [torch.add, math.sqrt, user_function, torch.Tensor.add, len])
def test_find_module_of_method_matches_torch(fn):
    theirs, mine = _pair("node")
    assert _outcome(mine._find_module_of_method, fn) == _outcome(theirs._find_module_of_method, fn)


# typing spellings on purpose: _type_repr prints them differently from the builtin generics
TYPES = [
    int, str, type(None), torch.Tensor, torch.nn.Linear, list[int],
    typing.List[int],  # noqa: UP006
    typing.Optional[torch.Tensor],  # noqa: UP045
    tuple[int, ...], ..., user_function, None, "a string", typing.Any, dict[str, torch.Tensor],
]


@pytest.mark.parametrize("t", TYPES, ids=lambda t: getattr(t, "__qualname__", None) or repr(t))
def test_type_repr_matches_torch(t):
    theirs, mine = _pair("node")
    assert mine._type_repr(t) == theirs._type_repr(t)


def _args_with_nodes(fx):
    g = fx.Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    return [
        x, (x,), [x, 1, "s"], (x, [y, {"k": x}], None), {"a": x, 2: (y,)}, list(range(7)),
        (1, 2, 3, 4, 5, 6), [], (), torch.float32, slice(1, None), 2.5,
    ]


@pytest.mark.parametrize("max_list_len", [math.inf, 3, 0])
def test_format_arg_matches_torch(max_list_len):
    theirs, mine = _pair("node")
    expected = [theirs._format_arg(a, max_list_len) for a in _args_with_nodes(torch.fx)]
    assert [mine._format_arg(a, max_list_len) for a in _args_with_nodes(ours)] == expected


def test_node_tables_match_torch():
    theirs, mine = _pair("node")
    assert mine._legal_ops == theirs._legal_ops
    assert mine.dtype_abbrs is theirs.dtype_abbrs
    assert set(theirs._side_effectful_need_to_be_preserved_pre_dispatch) <= set(
        mine._side_effectful_need_to_be_preserved_pre_dispatch)


# --------------------------------------------------------------------------------------------
# torch.fx.graph


NAMES = ["snake_case", "camelCase", "PascalCase", "ALL_CAPS", "mod.pascalCase", "x1Y2", "",
         "__init__", "_private", "a.b.c", "HTTPServer"]


@pytest.mark.parametrize("s", NAMES)
def test_snake_case_and_magic_match_torch(s):
    theirs, mine = _pair("graph")
    assert mine._snake_case(s) == theirs._snake_case(s)
    assert mine._snake_case_sub(s) == theirs._snake_case_sub(s)
    assert mine._is_magic(s) == theirs._is_magic(s)
    assert mine._illegal_char_regex.sub("_", s) == theirs._illegal_char_regex.sub("_", s)
    ours_match, theirs_match = mine._name_regex.match(s), theirs._name_regex.match(s)
    assert (ours_match and ours_match.groups()) == (theirs_match and theirs_match.groups())


@pytest.mark.parametrize("target", ["weight", "layer.0.weight", "a.b-c.d", "0", "x.1x.y"])
def test_format_target_matches_torch(target):
    theirs, mine = _pair("graph")
    assert mine._format_target("self", target) == theirs._format_target("self", target)


STACK = textwrap.dedent("""\
    File "/app/model.py", line 10, in forward
        y = self.block(x)
    File "/app/block.py", line 42, in forward
        return torch.relu(x) + 1
""")


@pytest.mark.parametrize("filter_fn", [None, lambda file, name, code: "model" in file,
                                       lambda *_: False], ids=["none", "model_only", "reject"])
def test_parse_stack_trace_matches_torch(filter_fn):
    theirs, mine = _pair("graph")
    expected = theirs._parse_stack_trace(STACK, filter_fn)
    got = mine._parse_stack_trace(STACK, filter_fn)
    if expected is None:
        assert got is None
        return
    assert (got.file, got.lineno, got.name, got.code) == (
        expected.file, expected.lineno, expected.name, expected.code)
    assert got.get_summary_str() == expected.get_summary_str()
    assert isinstance(got, mine._ParsedStackTrace)


@pytest.mark.parametrize("obj", [torch.add, torch.nn.functional.relu, torch.Tensor,
                                 operator.add, user_function, math.sqrt, torch])
def test_is_from_torch_matches_torch(obj):
    theirs, mine = _pair("graph")
    assert mine._is_from_torch(obj) == theirs._is_from_torch(obj)


def _namespace_names(ns_cls):
    ns = ns_cls()
    objs = [object() for _ in range(8)]
    candidates = ["add", "add", "add_1", "class", "1x", "foo.bar", "add", "getattr"]
    names = [ns.create_name(c, o) for c, o in zip(candidates, objs)]
    names.append(ns.create_name("anything", objs[0]))  # an object keeps its name
    return names


def test_namespace_matches_torch():
    theirs, mine = _pair("graph")
    assert _namespace_names(mine._Namespace) == _namespace_names(theirs._Namespace)


def test_graph_tables_match_torch():
    theirs, mine = _pair("graph")
    for name in ("magic_methods", "reflectable_magic_methods", "inplace_methods",
                 "_origin_type_map", "_legal_ops", "_color_codes"):
        assert getattr(mine, name) == getattr(theirs, name), name
    assert mine._counter_regexp.pattern == theirs._counter_regexp.pattern
    assert set(mine._custom_builtins) == set(theirs._custom_builtins)
    assert set(theirs._illegal_names) <= set(mine._illegal_names)
    assert mine._color_fns["red"]("x") == theirs._color_fns["red"]("x")
    assert mine._make_color_fn("\033[1m")("y") == theirs._make_color_fn("\033[1m")("y")
    assert mine._CustomBuiltin._fields == theirs._CustomBuiltin._fields


# --------------------------------------------------------------------------------------------
# torch.fx.graph_module


class _Inner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)


class _Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _Inner()
        self.register_buffer("buf", torch.ones(1))


def _attr_ops(gm_mod):
    src, dst = _Outer(), torch.nn.Module()
    gm_mod._copy_attr(src, dst, "inner.lin.weight")
    gm_mod._copy_attr(src, dst, "buf")
    gm_mod._assign_attr(torch.zeros(3), dst, "extra.t")
    seen = [
        gm_mod._has_attr(dst, "buf"), gm_mod._has_attr(dst, "nope"),
        sorted(name for name, _ in dst.named_buffers()),
        sorted(name for name, _ in dst.named_parameters()),
        type(dst.inner).__name__, gm_mod._get_attr(dst, "extra.t").tolist(),
        gm_mod._get_attr_via_attr_list(src, ["inner", "lin"]).in_features,
    ]
    gm_mod._del_attr(dst, "extra.t")
    seen.append(gm_mod._has_attr(dst, "extra.t"))
    return seen


def test_attribute_helpers_match_torch():
    theirs, mine = _pair("graph_module")
    assert _attr_ops(mine) == _attr_ops(theirs)


@pytest.mark.skipif(SANITY, reason="intended difference from torch.fx")
def test_has_attr_walks_dotted_paths():
    """torch.fx's _has_attr checks later segments on ``True``; ours follows the path."""
    _, mine = _pair("graph_module")
    model = _Outer()
    assert mine._has_attr(model, "inner.lin.weight")
    assert not mine._has_attr(model, "inner.lin.nope")
    assert not mine._has_attr(model, "inner.nope.weight")


def test_eval_cache_loader_matches_torch():
    theirs, mine = _pair("graph_module")
    co = {"co_filename": "f.py", "co_firstlineno": 3, "co_name": "fn"}
    keys = []
    for mod in (theirs, mine):
        loader = mod._EvalCacheLoader()
        key = loader.cache("x = 1\n", {}, co)
        keys.append((key.split(" from ")[1], loader.get_source(key), loader.get_source("nope")))
    assert keys[0] == keys[1] == ("f.py:3 in fn", "x = 1\n", None)
    assert isinstance(mine._loader, mine._EvalCacheLoader)


# --------------------------------------------------------------------------------------------
# torch.fx._symbolic_trace


def _observe_trace(fx):
    """What code running inside a trace sees through ``<fx>._symbolic_trace``."""
    st = importlib.import_module(f"{fx.__name__}._symbolic_trace")
    seen = {}

    class M(torch.nn.Module):
        def forward(self, x):
            seen["flag"] = st._is_fx_tracing_flag
            seen["tracing"] = st.is_fx_tracing()
            seen["patcher"] = st.CURRENT_PATCHER is not None
            seen["call_patched"] = torch.nn.Module.__call__ is not st._orig_module_call
            with st._maybe_revert_all_patches():
                seen["call_reverted"] = torch.nn.Module.__call__ is st._orig_module_call
            seen["call_reapplied"] = torch.nn.Module.__call__ is not st._orig_module_call
            return x + 1

    fx.symbolic_trace(M())
    seen["after"] = (st._is_fx_tracing_flag, st.CURRENT_PATCHER,
                     torch.nn.Module.__call__ is st._orig_module_call)
    return seen


def test_trace_state_seen_through_symbolic_trace_module_matches_torch():
    expected = _observe_trace(torch.fx)
    assert _observe_trace(ours) == expected
    assert expected["call_reverted"] and expected["after"] == (False, None, True)


def test_patcher_patches_and_restores_like_torch():
    results = []
    for fx in (torch.fx, ours):
        st = importlib.import_module(f"{fx.__name__}._symbolic_trace")
        frame = {"f": user_function}

        class K:
            def m(self):
                return "orig"

        with st._Patcher() as patcher:
            patcher.patch(frame, "f", lambda x: "patched")
            patcher.patch(frame, "len", lambda x: -1)  # a builtin name, added then dropped
            patcher.patch_method(K, "m", lambda self: "patched")
            inside = (frame["f"](0), frame["len"]([]), K().m(), patcher.visit_once(frame),
                      patcher.visit_once(frame))
        results.append((inside, frame, K().m()))
    assert results[0] == results[1]
    assert results[1] == (("patched", -1, "patched", True, False), {"f": user_function}, "orig")


def test_assert_is_none_is_the_tracers_object():
    st = importlib.import_module(f"{ours_fx_name()}._symbolic_trace")

    def f(x, y):
        return x

    gm = ours.symbolic_trace(f, concrete_args={"y": None})
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert st._assert_is_none in targets
    assert st.symbolic_trace is ours.symbolic_trace


def test_constant_attribute_type_alias_matches_torch():
    theirs, mine = _pair("_symbolic_trace")
    ours_args = set(typing.get_args(mine._ConstantAttributeType))
    assert set(typing.get_args(theirs._ConstantAttributeType)) <= ours_args
    assert set(mine._constant_attribute_types) == ours_args


# --------------------------------------------------------------------------------------------
# torch.fx._compatibility


def test_compatibility_decorator_matches_torch():
    theirs, mine = _pair("_compatibility")
    for compat in (True, False):
        made = []
        for mod in (theirs, mine):
            def fn():
                """Does a thing.

                In detail.
                """

            class Cls:
                pass

            made.append((mod.compatibility(is_backward_compatible=compat)(fn),
                         mod.compatibility(is_backward_compatible=compat)(Cls), mod))
        (tf, tc, tmod), (mf, mc, mmod) = made
        assert (mf.__doc__, mc.__doc__) == (tf.__doc__, tc.__doc__)
        assert mf in mmod._MARKED_WITH_COMPATIBILITY
        assert (mf in mmod._BACK_COMPAT_OBJECTS) is compat is (tf in tmod._BACK_COMPAT_OBJECTS)
