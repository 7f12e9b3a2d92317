"""Differential tests: exportir.pytree against torch.utils._pytree (the oracle)."""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import subprocess
import sys
from collections import OrderedDict, defaultdict, deque, namedtuple
from typing import Any, NamedTuple

import pytest
import torch
import torch.fx._pytree as torch_fx_pytree
import torch.utils._pytree as tp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exportir import pytree as ep

# --------------------------------------------------------------------------- strategies

NT0 = namedtuple("NT0", [])
NT1 = namedtuple("NT1", ["a"])
NT2 = namedtuple("NT2", ["a", "b"])


class NT3(NamedTuple):
    x: Any
    y: Any
    z: Any


NAMEDTUPLES = (NT0, NT1, NT2, NT3)
for _i, _cls in enumerate(NAMEDTUPLES):
    tp._register_namedtuple(_cls, serialized_type_name=f"test_pytree.NT{_i}")
    ep.register_namedtuple(_cls, serialized_type_name=f"test_pytree.NT{_i}")

leaves = st.one_of(
    st.integers(-5, 5),
    st.none(),
    st.text(max_size=3),
    st.floats(allow_nan=False, width=32),
    st.builds(lambda n: torch.arange(n), st.integers(0, 3)),
)
keys = st.one_of(st.text(max_size=3), st.integers(0, 9))


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    seq = st.lists(children, max_size=4)
    kv = st.dictionaries(keys, children, max_size=4)
    return st.one_of(
        seq.map(tuple),
        seq,
        kv,
        kv.map(OrderedDict),
        kv.map(lambda d: defaultdict(list, d)),
        st.builds(lambda xs, m: deque(xs, maxlen=m), seq, st.sampled_from([None, 4, 8])),
        st.lists(children, max_size=3).map(lambda xs: NAMEDTUPLES[len(xs)](*xs)),
    )


trees = st.recursive(leaves, _containers, max_leaves=25)
SETTINGS = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def same_objects(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


# --------------------------------------------------------------------------- differential


@SETTINGS
@given(trees)
def test_flatten_matches_torch(tree: Any) -> None:
    ours_leaves, ours = ep.tree_flatten(tree)
    theirs_leaves, theirs = tp.tree_flatten(tree)
    assert same_objects(ours_leaves, theirs_leaves)
    assert repr(ours) == repr(theirs)
    assert str(ours) == str(theirs)
    assert (ours.num_leaves, ours.num_nodes, ours.num_children) == (
        theirs.num_leaves, theirs.num_nodes, theirs.num_children)
    assert ours.is_leaf() == theirs.is_leaf()
    assert ours.type is theirs.type
    assert ours.context == theirs.context
    assert same_objects(ep.tree_leaves(tree), theirs_leaves)
    assert same_objects(list(ep.tree_iter(tree)), theirs_leaves)
    assert same_objects(ep.arg_tree_leaves(tree, k=tree), tp.arg_tree_leaves(tree, k=tree))


@SETTINGS
@given(trees)
def test_unflatten_round_trips(tree: Any) -> None:
    leaves_, spec = ep.tree_flatten(tree)
    rebuilt = ep.tree_unflatten(leaves_, spec)
    again_leaves, again = ep.tree_flatten(rebuilt)
    assert same_objects(again_leaves, leaves_)
    assert again == spec and hash(again) == hash(spec)
    theirs = tp.tree_unflatten(leaves_, tp.tree_structure(tree))
    assert repr(tp.tree_structure(rebuilt)) == repr(tp.tree_structure(theirs))
    assert type(rebuilt) is type(tree)
    assert ep.treespec_pprint(spec) == tp.treespec_pprint(tp.tree_structure(tree))


@SETTINGS
@given(trees)
def test_paths_and_maps_match_torch(tree: Any) -> None:
    ours_pairs, ours_spec = ep.tree_flatten_with_path(tree)
    theirs_pairs, _ = tp.tree_flatten_with_path(tree)
    assert [ep.keystr(p) for p, _ in ours_pairs] == [tp.keystr(p) for p, _ in theirs_pairs]
    assert all(ep.key_get(tree, p) is v for p, v in ours_pairs)
    assert same_objects(ours_spec.flatten_up_to(tree), ep.tree_leaves(tree))

    def tag(x: Any) -> Any:
        return ("leaf", id(x))

    assert repr(ep.tree_map(tag, tree)) == repr(tp.tree_map(tag, tree))
    only = ep.tree_map_only(int, lambda x: x + 100, tree)
    assert repr(only) == repr(tp.tree_map_only(int, lambda x: x + 100, tree))
    with_path = ep.tree_map_with_path(lambda p, x: ep.keystr(p), tree)
    assert repr(with_path) == repr(tp.tree_map_with_path(lambda p, x: tp.keystr(p), tree))
    pred = lambda x: x is None
    assert ep.tree_any(pred, tree) == tp.tree_any(pred, tree)
    assert ep.tree_all(pred, tree) == tp.tree_all(pred, tree)


@SETTINGS
@given(trees)
def test_dumps_matches_torch_and_loads_round_trips(tree: Any) -> None:
    spec = ep.tree_structure(tree)
    text = ep.treespec_dumps(spec)
    assert text == tp.treespec_dumps(tp.tree_structure(tree))
    assert ep.treespec_loads(text) == spec
    assert repr(ep.treespec_loads(text)) == repr(tp.treespec_loads(text))


@SETTINGS
@given(trees)
def test_tree_flatten_spec_matches_torch_fx(tree: Any) -> None:
    spec = ep.tree_structure(tree)
    ours = ep.tree_flatten_spec(tree, spec)
    theirs = torch_fx_pytree.tree_flatten_spec(tree, ep.to_torch_treespec(spec))
    assert same_objects(ours, theirs)


@SETTINGS
@given(trees)
def test_torch_spec_interop(tree: Any) -> None:
    torch_spec = tp.tree_structure(tree)
    ours = ep.from_torch_treespec(torch_spec)
    assert ours == ep.tree_structure(tree)
    assert repr(ep.to_torch_treespec(ours)) == repr(torch_spec)
    assert ep.to_torch_treespec(ours) == torch_spec
    leaves_ = tp.tree_leaves(tree)
    assert same_objects(ep.tree_leaves(ep.tree_unflatten(leaves_, torch_spec)), leaves_)


def test_is_leaf_predicate_matches_torch() -> None:
    tree = {"a": (1, 2), "b": [3, (4, 5)], "c": None}
    is_tuple = lambda x: isinstance(x, tuple)
    ours_leaves, ours = ep.tree_flatten(tree, is_leaf=is_tuple)
    theirs_leaves, theirs = tp.tree_flatten(tree, is_leaf=is_tuple)
    assert ours_leaves == theirs_leaves == [(1, 2), 3, (4, 5), None]
    assert repr(ours) == repr(theirs)
    assert ep.tree_is_leaf((1,), is_leaf=is_tuple) and not ep.tree_is_leaf((1,))
    assert ep.tree_is_leaf(None) == tp.tree_is_leaf(None) is True


def test_none_is_a_leaf_and_repr_format() -> None:
    leaves_, spec = ep.tree_flatten(None)
    assert leaves_ == [None] and repr(spec) == "*" and spec.is_leaf()
    spec = ep.tree_structure(((1, 2), {"k": [None]}))
    assert repr(spec) == (
        "TreeSpec(tuple, None, [TreeSpec(tuple, None, [*,\n"
        "    *]),\n"
        "  TreeSpec(dict, ['k'], [TreeSpec(list, None, [*])])])"
    )
    assert ep.treespec_tuple([ep.treespec_leaf()] * 2) == ep.tree_structure((1, 2))
    assert ep.treespec_dict(a=ep.treespec_leaf()) == ep.tree_structure({"a": 0})
    assert ep.tree_structure([1]) != ep.tree_structure((1,))
    assert ep.tree_structure({"a": 1, "b": 2}) != ep.tree_structure({"b": 1, "a": 2})


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("count", [0, 1, 3, 7])
def test_unflatten_wrong_leaf_count_matches_torch(count: int) -> None:
    tree = ([1, 2], {"a": 3}, NT2(4, 5))
    with pytest.raises(ValueError) as ours:
        ep.tree_unflatten(list(range(count)), ep.tree_structure(tree))
    with pytest.raises(ValueError) as theirs:
        tp.tree_unflatten(list(range(count)), tp.tree_structure(tree))
    assert str(ours.value) == str(theirs.value)
    assert "`leaves` has length" in str(ours.value)


FLATTEN_UP_TO_CASES = [
    ([1, 2], (1, 2)),
    ([1, 2], [1, 2, 3]),
    ({"a": 1, "b": 2}, {"a": 1, "c": 2}),
    ({"a": 1}, OrderedDict(a=[1, 2])),  # dict kinds are interchangeable
    (NT2(1, 2), (1, 2)),
    (NT2(1, 2), NT3(1, 2, 3)),
    ((1, [2]), (1, 5)),
    (deque([1, 2], maxlen=3), deque([1, [2]], maxlen=5)),
]


@pytest.mark.parametrize("prefix,tree", FLATTEN_UP_TO_CASES)
def test_flatten_up_to_matches_torch(prefix: Any, tree: Any) -> None:
    def run(mod: Any) -> Any:
        try:
            return ("ok", mod.tree_structure(prefix).flatten_up_to(tree))
        except ValueError as e:
            return ("error", str(e))

    assert run(ep) == run(tp)


def test_tree_map_with_rests_matches_torch() -> None:
    fn = lambda x, y: [x] + y
    assert ep.tree_map(fn, [5, 6], [[7, 9], [1, 2]]) == [[5, 7, 9], [6, 1, 2]]
    with pytest.raises(ValueError, match="Node arity mismatch"):
        ep.tree_map(fn, [5, 6], [[7, 9]])


def test_tree_flatten_spec_reads_by_spec_and_rejects_mismatch() -> None:
    spec = ep.tree_structure(([1, 2], {"x": 3}))
    args = ([10, 20, 30], {"x": 40, "extra": 50})
    assert ep.tree_flatten_spec(args, spec) == [10, 20, 40]
    assert ep.tree_flatten_spec(args, spec) == torch_fx_pytree.tree_flatten_spec(
        args, tp.tree_structure(([1, 2], {"x": 3})))
    spec = ep.tree_structure(deque([1, 2]))
    with pytest.raises(RuntimeError, match="is different from expected spec"):
        ep.tree_flatten_spec(deque([1, 2, 3]), spec)


# --------------------------------------------------------------------------- registration


class Pair:
    def __init__(self, left: Any, right: Any, tag: str = "p") -> None:
        self.left, self.right, self.tag = left, right, tag


def _pair_flatten(p: Pair) -> tuple[list[Any], str]:
    return [p.left, p.right], p.tag


def _pair_unflatten(values: Any, tag: str) -> Pair:
    return Pair(*values, tag=tag)


def _pair_keys(p: Pair) -> tuple[list[Any], str]:
    return [(ep.GetAttrKey("left"), p.left), (ep.GetAttrKey("right"), p.right)], p.tag


ep.register_pytree_node(
    Pair, _pair_flatten, _pair_unflatten, serialized_type_name="test_pytree.Pair",
    flatten_with_keys_fn=_pair_keys,
)


def test_custom_node_registration() -> None:
    tree = [Pair(1, (2, 3), tag="t"), 4]
    leaves_, spec = ep.tree_flatten(tree)
    assert leaves_ == [1, 2, 3, 4]
    assert repr(spec) == (
        "TreeSpec(list, None, [TreeSpec(Pair, t, [*,\n"
        "    TreeSpec(tuple, None, [*,\n"
        "      *])]),\n"
        "  *])"
    )
    rebuilt = ep.tree_unflatten([10, 20, 30, 40], spec)
    assert (rebuilt[0].left, rebuilt[0].right, rebuilt[0].tag) == (10, (20, 30), "t")
    assert [ep.keystr(p) for p, _ in ep.tree_leaves_with_path(tree)] == [
        "[0].left", "[0].right[0]", "[0].right[1]", "[1]"]
    assert ep.treespec_loads(ep.treespec_dumps(spec)) == spec
    assert ep.is_registered(Pair) and not tp.tree_structure(tree).children()[0].type
    with pytest.raises(ValueError, match="already registered"):
        ep.register_pytree_node(Pair, _pair_flatten, _pair_unflatten)
    with pytest.raises(ValueError, match="Node context mismatch for custom node type"):
        spec.flatten_up_to([Pair(1, (2, 3), tag="other"), 4])


def test_registry_is_an_explicit_object() -> None:
    registry = ep.PytreeRegistry()
    registry.register(Pair, _pair_flatten, _pair_unflatten, serialized_type_name="x.Pair")
    assert registry.type_for_name("x.Pair") is Pair
    registry.unregister(Pair)
    assert registry.type_for_name("x.Pair") is None
    with pytest.raises(ValueError, match="must be None or registered"):
        registry.register(Pair, _pair_flatten, _pair_unflatten, to_dumpable_context=str)


def _make_points() -> tuple[type, type]:
    def make() -> type:
        @dataclasses.dataclass
        class Point:
            x: Any
            y: Any = None
            note: str = dataclasses.field(default="n", init=False)

        return Point

    return make(), make()


OursPoint, TorchPoint = _make_points()
ep.register_dataclass(OursPoint, serialized_type_name="test_pytree.Point")
torch.export.register_dataclass(TorchPoint, serialized_type_name="test_pytree.TorchPoint")


@pytest.mark.parametrize("y", [None, 2, (3, [4])])
def test_register_dataclass_matches_torch(y: Any) -> None:
    ours_leaves, ours = ep.tree_flatten([OursPoint(torch.ones(1), y)])
    theirs_leaves, theirs = tp.tree_flatten([TorchPoint(torch.ones(1), y)])
    assert repr(ours) == repr(theirs)
    assert len(ours_leaves) == len(theirs_leaves)
    rebuilt = ep.tree_unflatten(ours_leaves, ours)[0]
    assert isinstance(rebuilt, OursPoint) and rebuilt.y == y
    assert [ep.keystr(p) for p, _ in ep.tree_leaves_with_path(OursPoint(1, y))] == [
        tp.keystr(p) for p, _ in tp.tree_leaves_with_path(TorchPoint(1, y))]
    assert ep.treespec_loads(ep.treespec_dumps(ours)) == ours


def test_register_dataclass_field_name_checks() -> None:
    @dataclasses.dataclass
    class Box:
        a: Any
        b: Any

    with pytest.raises(ValueError, match="Missing fields in `field_names`"):
        ep.register_dataclass(Box, field_names=["a"])
    ep.register_dataclass(Box, field_names=["a"], drop_field_names=["b"])
    assert ep.tree_leaves(Box(1, 2)) == [1]
    with pytest.raises(ValueError, match="field_names must be specified"):
        ep.register_dataclass(Pair)


def test_class_registered_only_with_torch_is_honoured() -> None:
    class TorchOnly:
        def __init__(self, items: list[Any]) -> None:
            self.items = items

    tp.register_pytree_node(
        TorchOnly, lambda t: (t.items, len(t.items)), lambda v, c: TorchOnly(list(v)),
        serialized_type_name="test_pytree.TorchOnly",
        flatten_with_keys_fn=lambda t: ([(tp.SequenceKey(i), v) for i, v in enumerate(t.items)],
                                        len(t.items)),
    )
    tree = {"t": TorchOnly([1, (2, 3)])}
    assert ep.is_registered(TorchOnly)
    ours_leaves, ours = ep.tree_flatten(tree)
    theirs_leaves, theirs = tp.tree_flatten(tree)
    assert ours_leaves == theirs_leaves == [1, 2, 3]
    assert repr(ours) == repr(theirs)
    assert isinstance(ep.tree_unflatten(ours_leaves, ours)["t"], TorchOnly)
    assert ep.treespec_dumps(ours) == tp.treespec_dumps(theirs)
    assert ep.treespec_loads(ep.treespec_dumps(ours)) == ours
    assert [ep.keystr(p) for p, _ in ep.tree_leaves_with_path(tree)] == [
        "['t'][0]", "['t'][1][0]", "['t'][1][1]"]


def test_torch_structseq_and_size_flatten_like_torch() -> None:
    tree = (torch.max(torch.ones(2, 3), 0), torch.Size([4, 5]))
    ours_leaves, ours = ep.tree_flatten(tree)
    theirs_leaves, theirs = tp.tree_flatten(tree)
    assert repr(ours) == repr(theirs)
    assert same_objects(ours_leaves, theirs_leaves)
    assert type(ep.tree_unflatten(ours_leaves, ours)[0]) is torch.return_types.max
    assert ep.tree_flatten_spec(tree[0], ours.child(0)) == list(tree[0])


@pytest.mark.parametrize("obj", [
    torch.return_types.max((1, 2)), torch.return_types.max, os.stat_result(tuple(range(10))),
    NT2(1, 2), NT2, (1, 2), tuple, torch.Size([2]), 3, None,
], ids=repr)
def test_structseq_predicates_match_torch(obj: Any) -> None:
    for name in ("is_structseq", "is_structseq_class", "is_structseq_instance"):
        assert getattr(ep, name)(obj) == getattr(tp, name)(obj), name


def test_names_in_torch_all_exist() -> None:
    """Every name torch.utils._pytree exports exists here (``PyTreeSpec`` is our TreeSpec)."""
    assert sorted(set(tp.__all__) - set(dir(ep))) == []
    assert ep.PyTreeSpec is ep.TreeSpec


def test_deregister_pytree_node_undoes_registration() -> None:
    class Box:
        def __init__(self, v: Any) -> None:
            self.v = v

    ep.register_pytree_node(Box, lambda b: ([b.v], None), lambda v, c: Box(*v))
    assert ep.tree_leaves(Box(3)) == [3]
    ep._deregister_pytree_node(Box)
    assert ep.tree_leaves(Box(3))[0].v == 3  # a leaf again
    with pytest.raises(KeyError):
        ep._deregister_pytree_node(Box)


# --------------------------------------------------------------------------- serialization


class Color(enum.Enum):
    RED = 1


# An enum registered as a node without leaves: its context is the enum member itself.
ep.register_pytree_node(
    Color, lambda c: ([], c), lambda v, c: c, serialized_type_name="test_pytree.Color"
)


def test_serialization_errors_are_clear() -> None:
    class Unknown(NamedTuple):
        a: int

    spec = ep.tree_structure([Unknown(1)])
    with pytest.raises(ValueError, match="Can't serialize TreeSpec of namedtuple"):
        ep.treespec_dumps(spec)
    with pytest.raises(ValueError) as ours:
        ep.treespec_loads(json.dumps([1, {"type": "nope.Type", "context": "null",
                                          "children_spec": []}]))
    with pytest.raises(NotImplementedError) as theirs:
        tp.treespec_loads(json.dumps([1, {"type": "nope.Type", "context": "null",
                                          "children_spec": []}]))
    assert str(ours.value) == str(theirs.value)
    for bad in ["not json", "[2, {}]", "[1, {\"type\": 3}]", "{}"]:
        with pytest.raises(ValueError):
            ep.treespec_loads(bad)
    spec = ep.TreeSpec(frozenset, None, [])
    with pytest.raises(ValueError, match="is not registered"):
        ep.treespec_dumps(spec)
    with pytest.raises(ValueError, match="Unknown protocol"):
        ep.treespec_dumps(ep.tree_structure([1]), protocol=7)


def test_defaultdict_and_enum_context_round_trip() -> None:
    tree = defaultdict(int, {"a": 1, "b": [2]})
    spec = ep.tree_structure(tree)
    text = ep.treespec_dumps(spec)
    assert text == tp.treespec_dumps(tp.tree_structure(tree))
    assert ep.treespec_loads(text) == spec
    assert ep.treespec_loads(text).context[0] is int
    enum_spec = ep.tree_structure([Color.RED])
    assert "__enum__" in ep.treespec_dumps(enum_spec)
    assert ep.treespec_loads(ep.treespec_dumps(enum_spec)) == enum_spec
    assert ep.tree_unflatten([], enum_spec) == [Color.RED]


# Crafted specs that, resolved with getattr / import, would import a module or bind code that
# runs later (a defaultdict factory runs on the first missing key). All must be refused.
_CODE_NAMES = [("os", "system"), ("builtins", "eval"), ("builtins", "exec"),
               ("subprocess", "run"), ("subprocess", "Popen"), ("subprocess", "check_output"),
               ("torch", "_dynamo"), ("torch", "onnx"), ("some_module_that_is_not_loaded", "f")]


def _spec_json(type_name: str, context: Any) -> str:
    return json.dumps([1, {"type": type_name, "context": context, "children_spec": []}])


def _factory_spec(module: str, name: str) -> str:
    return _spec_json("collections.defaultdict", {
        "default_factory_module": module, "default_factory_name": name, "dict_context": ["k"]})


def _enum_spec(module: str, name: str) -> str:
    return _spec_json("builtins.list", json.dumps({"__enum__": True, "fqn": f"{module}:{name}",
                                                  "name": "X"}))


CRAFTED_SPECS: dict[str, tuple[str, str]] = {
    **{f"factory-{m}.{n}": (_factory_spec(m, n), "default_factory .* is not allowed")
       for m, n in _CODE_NAMES + [("builtins", "bool"), ("collections", "OrderedDict")]},
    **{f"enum-{m}:{n}": (_enum_spec(m, n), "enum fqn: ")
       for m, n in _CODE_NAMES + [("exportir.pytree", "TreeSpec.unflatten"),
                                  ("exportir.pytree", "TreeSpec.<locals>")]},
    **{f"namedtuple-{m}.{n}": (_spec_json("collections.namedtuple", f"{m}.{n}"),
                               "Can't deserialize TreeSpec of namedtuple class")
       for m, n in _CODE_NAMES},
    # registered node types that are not namedtuple classes
    "namedtuple-builtins.dict": (_spec_json("collections.namedtuple", "builtins.dict"),
                                 "not a namedtuple class"),
    "namedtuple-test_pytree.Color": (_spec_json("collections.namedtuple", "test_pytree.Color"),
                                     "not a namedtuple class"),
    "type-os.system": (_spec_json("os.system", "null"), "is not registered"),
    "factory-not-str": (_spec_json("collections.defaultdict", {
        "default_factory_module": ["os"], "default_factory_name": "system",
        "dict_context": []}), "default_factory .* is not allowed"),
}


@pytest.mark.parametrize("label", sorted(CRAFTED_SPECS))
def test_crafted_specs_are_rejected(label: str) -> None:
    payload, message = CRAFTED_SPECS[label]
    with pytest.raises(ep.TreeSpecSerializationError, match=message):
        ep.treespec_loads(payload)


def test_crafted_specs_import_nothing() -> None:
    # A fresh interpreter, so that nothing imported by other tests hides a lazy import. The
    # LazyLoader module checks that reading a namespace never executes a lazy module either.
    code = f"""
import importlib.util, json, sys
import torch
import exportir.pytree as ep
spec = importlib.util.find_spec("colorsys")
spec.loader = importlib.util.LazyLoader(spec.loader)
lazy = sys.modules["colorsys"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lazy)
payloads = {[p for p, _ in CRAFTED_SPECS.values()]!r}
payloads.append({_enum_spec("colorsys", "rgb_to_hsv")!r})
before = set(sys.modules)
for payload in payloads:
    try:
        ep.treespec_loads(payload)
    except ep.TreeSpecSerializationError:
        continue
    raise SystemExit("accepted: " + payload)
assert set(sys.modules) == before, sorted(set(sys.modules) - before)
assert "torch._dynamo" not in sys.modules and "torch.onnx" not in sys.modules
assert type(lazy).__name__ == "_LazyModule", "the lazy module was executed"
"""
    env_path = ":".join(p for p in sys.path if p)
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": env_path})


class Outer:
    class Inner(enum.Enum):
        A = "a"


@pytest.mark.parametrize("factory", [list, dict, set, int, float, str, tuple])
def test_safe_defaultdict_factories_round_trip_like_torch(factory: Any) -> None:
    tree = defaultdict(factory, {"a": 1, 2: [3]})
    text = ep.treespec_dumps(ep.tree_structure(tree))
    assert text == tp.treespec_dumps(tp.tree_structure(tree))
    loaded = ep.treespec_loads(text)
    assert loaded == ep.tree_structure(tree) and loaded.context[0] is factory
    assert tp.treespec_loads(text) == tp.tree_structure(tree)


def test_none_factory_and_nested_enum_round_trip() -> None:
    spec = ep.tree_structure(defaultdict(None, {"a": 1}))
    loaded = ep.treespec_loads(ep.treespec_dumps(spec))
    assert loaded == spec and loaded.context[0] is None
    enum_spec = ep.tree_structure([Outer.Inner.A])
    assert ep.treespec_loads(ep.treespec_dumps(enum_spec)) == enum_spec


def test_unsafe_factory_dumps_like_torch_but_does_not_load() -> None:
    tree = defaultdict(bool, {"a": 1})
    text = ep.treespec_dumps(ep.tree_structure(tree))
    assert text == tp.treespec_dumps(tp.tree_structure(tree))
    with pytest.raises(ep.TreeSpecSerializationError, match="builtins.bool"):
        ep.treespec_loads(text)


def test_export_serializer_vets_with_the_same_allowlist() -> None:
    from exportir.export.serialize import program as serialize_program

    assert serialize_program._SAFE_FACTORIES == set(ep.SAFE_DEFAULTDICT_FACTORIES)


def test_import_has_no_torch_side_effects() -> None:
    code = ("import sys, exportir.pytree as p; "
            "assert p.tree_leaves({'a': (1, None)}) == [1, None]; "
            "assert not [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]")
    env_path = ":".join(p for p in sys.path if p)
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": env_path})


def test_spec_pickles_and_deepcopies() -> None:
    import copy
    import pickle

    spec = ep.tree_structure(({"a": [1, 2]}, NT2(1, None), deque([1], maxlen=2)))
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert copy.deepcopy(spec) == spec
    assert pickle.loads(pickle.dumps(ep.treespec_leaf())).is_leaf()


def test_namedtuple_registered_only_with_torch_serializes() -> None:
    class OnlyTorchNT(NamedTuple):
        u: Any
        v: Any

    tp._register_namedtuple(OnlyTorchNT, serialized_type_name="test_pytree.OnlyTorchNT")
    tree = [OnlyTorchNT(1, {"k": 2})]
    text = ep.treespec_dumps(ep.tree_structure(tree))
    assert text == tp.treespec_dumps(tp.tree_structure(tree))
    loaded = ep.treespec_loads(text)
    assert loaded == ep.tree_structure(tree)
    assert ep.tree_unflatten([5, 6], loaded) == [OnlyTorchNT(5, {"k": 6})]
    assert namedtuple in ep.SUPPORTED_NODES and OnlyTorchNT not in ep.SUPPORTED_NODES
