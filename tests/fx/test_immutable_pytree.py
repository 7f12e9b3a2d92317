"""immutable_list / immutable_dict are pytree nodes under torch's pytree and under ours.

Third-party passes walk ``node.args`` with ``torch.utils._pytree``; what they see for our
containers must be what they see for torch.fx's: the elements as leaves, keyed like list/dict,
and a round trip that gives back the same container type.
"""

from __future__ import annotations

import importlib
import operator

import pytest
import torch
import torch.fx
import torch.fx.immutable_collections as torch_ic
import torch.utils._pytree as tpt
from conftest import import_ours_fx, ours_fx_name

import exportir.pytree as ept

ours_ic = importlib.import_module(f"{ours_fx_name()}.immutable_collections")


def _nested(ic):
    """[1, {'a': 2, 'b': [3, 4]}, (5,)] built from module ``ic``'s immutable types."""
    inner = ic.immutable_dict(a=2, b=ic.immutable_list([3, 4]))
    return ic.immutable_list([1, inner, (5,)])


def _shape(spec) -> tuple:
    """A spec's structure with type names for the node types (classes differ by module)."""
    if spec.is_leaf():
        return ("*",)
    return (spec.type.__name__, spec.context, tuple(_shape(c) for c in spec.children()))


def test_three_element_list_has_three_leaves_under_torch_pytree():
    lst = ours_ic.immutable_list([1, 2, 3])
    assert tpt.tree_leaves(lst) == [1, 2, 3]
    assert tpt.tree_structure(lst).num_children == 3


@pytest.mark.parametrize("flatten", [tpt.tree_flatten, ept.tree_flatten], ids=["torch", "ours"])
def test_flatten_matches_torch_fx_containers(flatten):
    ours_leaves, ours_spec = flatten(_nested(ours_ic))
    theirs_leaves, theirs_spec = flatten(_nested(torch_ic))
    assert ours_leaves == theirs_leaves == [1, 2, 3, 4, 5]
    assert _shape(ours_spec) == _shape(theirs_spec)


@pytest.mark.parametrize("pytree", [tpt, ept], ids=["torch", "ours"])
def test_unflatten_round_trip_keeps_types(pytree):
    tree = _nested(ours_ic)
    leaves, spec = pytree.tree_flatten(tree)
    back = pytree.tree_unflatten([v * 10 for v in leaves], spec)
    assert back == [10, {"a": 20, "b": [30, 40]}, (50,)]
    assert type(back) is ours_ic.immutable_list
    assert type(back[1]) is ours_ic.immutable_dict
    assert type(back[1]["b"]) is ours_ic.immutable_list


@pytest.mark.parametrize("pytree", [tpt, ept], ids=["torch", "ours"])
def test_tree_map_keeps_types(pytree):
    mapped = pytree.tree_map(lambda v: -v, _nested(ours_ic))
    assert mapped == [-1, {"a": -2, "b": [-3, -4]}, (-5,)]
    assert type(mapped) is ours_ic.immutable_list and type(mapped[1]) is ours_ic.immutable_dict


@pytest.mark.parametrize("pytree", [tpt, ept], ids=["torch", "ours"])
def test_key_paths_match_torch_fx_containers(pytree):
    def paths(tree):
        return [(pytree.keystr(p), v) for p, v in pytree.tree_flatten_with_path(tree)[0]]

    assert paths(_nested(ours_ic)) == paths(_nested(torch_ic))
    assert paths(_nested(ours_ic))[2] == ("[1]['b'][0]", 3)


def test_torch_spec_dump_loads_back_as_our_types():
    spec = tpt.tree_structure(_nested(ours_ic))
    loaded = tpt.treespec_loads(tpt.treespec_dumps(spec))
    assert loaded == spec
    assert type(tpt.tree_unflatten([1, 2, 3, 4, 5], loaded)) is ours_ic.immutable_list


def test_torch_fx_containers_still_load_as_themselves():
    """Registering ours must not take over the serialized names of torch.fx's types."""
    spec = tpt.tree_structure(_nested(torch_ic))
    loaded = tpt.treespec_loads(tpt.treespec_dumps(spec))
    assert type(tpt.tree_unflatten([1, 2, 3, 4, 5], loaded)) is torch_ic.immutable_list


def test_our_spec_dumps_name_the_torch_fx_types():
    """Our pytree writes torch.fx's names, so a dumped spec reads as torch's does."""
    assert ept.treespec_dumps(ept.tree_structure(_nested(ours_ic))) == tpt.treespec_dumps(
        tpt.tree_structure(_nested(torch_ic)))


def _node_args_leaves(fx):
    g = fx.Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    cat = g.call_function(torch.cat, ([x, y, x],), {"dim": 0})
    add = g.call_function(operator.add, (cat, {"k": [y]}))
    return [
        [n.name if isinstance(n, fx.Node) else n for n in tpt.tree_leaves((node.args, node.kwargs))]
        for node in (cat, add)
    ]


def test_walking_node_args_with_torch_pytree_matches_torch_fx():
    ours = _node_args_leaves(import_ours_fx())
    assert ours == _node_args_leaves(torch.fx)
    assert ours[0] == ["x", "y", "x", 0]


def test_tree_map_over_node_args_rebuilds_immutable_containers():
    fx = import_ours_fx()
    g = fx.Graph()
    x = g.placeholder("x")
    cat = g.call_function(torch.cat, ([x, x],), {"dim": 0})
    renamed = tpt.tree_map(lambda a: a.name if isinstance(a, fx.Node) else a, cat.args)
    assert renamed == (["x", "x"],) and type(renamed[0]) is ours_ic.immutable_list


MUTATIONS = {
    "append": lambda m: m.immutable_list([1]).append(2),
    "setitem": lambda m: m.immutable_list([1]).__setitem__(0, 2),
    "iadd": lambda m: m.immutable_list([1]).__iadd__([2]),
    "sort": lambda m: m.immutable_list([2, 1]).sort(),
    "dict_setitem": lambda m: m.immutable_dict(a=1).__setitem__("a", 2),
    "dict_update": lambda m: m.immutable_dict(a=1).update(b=2),
    "dict_ior": lambda m: m.immutable_dict(a=1).__ior__({}),
    "fromkeys": lambda m: m.immutable_dict.fromkeys("ab"),
}


@pytest.mark.parametrize("mutate", MUTATIONS.values(), ids=MUTATIONS.keys())
def test_mutation_errors_match_torch_fx(mutate):
    messages = []
    for ic in (torch_ic, ours_ic):
        with pytest.raises(TypeError) as info:
            mutate(ic)
        messages.append(str(info.value))
    assert messages[0] == messages[1]


@pytest.mark.parametrize("make", [
    lambda m: m.immutable_list([1, 2]) + [3],
    lambda m: m.immutable_list([1, 2, 3])[1:],
    lambda m: m.immutable_dict(a=1) | {"b": 2},
    lambda m: m.immutable_list([1, 2]).copy(),
], ids=["add", "slice", "or", "copy"])
def test_non_mutating_operations_return_plain_containers_like_torch_fx(make):
    assert type(make(ours_ic)) is type(make(torch_ic))
    assert make(ours_ic) == make(torch_ic)
