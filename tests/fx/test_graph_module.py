"""GraphModule parity with torch.fx.GraphModule (the oracle).

Every test builds the same graph through both Graph APIs (``build_*`` take the fx namespace as
an argument) and compares generated code, printed text, numerics and module structure.
Run against the oracle itself with ``EXPORTIR_FX_IMPL=torch.fx``.
"""

from __future__ import annotations

import copy
import importlib
import io
import operator
import pickle
import re
import sys
import traceback
import warnings
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import torch
import torch.fx as tfx
from conftest import ours_fx_name


@pytest.fixture(scope="module")
def gm_mod():
    """The graph_module module of the implementation under test."""
    return importlib.import_module(ours_fx_name() + ".graph_module")


# ------------------------------------------------------------------------------------------
# Shared builders
# ------------------------------------------------------------------------------------------


class Inner(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("buf", torch.arange(4.0))
        self.scale = torch.nn.Parameter(torch.full((4,), 2.0))
        self.unused = torch.nn.ReLU()


class Root(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.sub = Inner()
        self.act = torch.nn.Tanh()
        self.spare = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Sigmoid())
        self.register_buffer("top", torch.ones(4))


def build_graph(fx):
    """x -> sub.lin -> +sub.buf -> *sub.scale -> act -> relu (method) -> +top -> (sum, getitem)"""
    g = fx.Graph()
    x = g.placeholder("x")
    lin = g.call_module("sub.lin", (x,))
    buf = g.get_attr("sub.buf")
    add = g.call_function(operator.add, (lin, buf))
    scale = g.get_attr("sub.scale")
    mul = g.call_function(torch.mul, (add, scale))
    act = g.call_module("act", (mul,))
    relu = g.call_method("relu", (act,))
    top = g.get_attr("top")
    out = g.call_function(torch.add, (relu, top), {"alpha": 2})
    first = g.call_function(operator.getitem, (out, 0))
    total = g.call_method("sum", (out,), {"dim": -1})
    g.output((total, first))
    return g


def make_pair(ours_fx, class_name="GraphModule"):
    root = Root()
    ours = ours_fx.GraphModule(root, build_graph(ours_fx), class_name)
    theirs = tfx.GraphModule(root, build_graph(tfx), class_name)
    return ours, theirs


def build_nested(fx):
    """An outer graph calling a child GraphModule ``inner`` via call_module."""
    inner_g = fx.Graph()
    a = inner_g.placeholder("a")
    w = inner_g.get_attr("w")
    inner_g.output(inner_g.call_function(torch.mul, (a, w)))
    inner = fx.GraphModule({"w": torch.full((3,), 3.0)}, inner_g, "Inner")

    g = fx.Graph()
    x = g.placeholder("x")
    y = g.call_module("inner", (x,))
    g.output(g.call_method("neg", (y,)))
    return fx.GraphModule({"inner": inner}, g, "Outer")


def eval_key_free(text: str) -> str:
    return re.sub(r"<eval_with_key>\.\d+", "<eval_with_key>.N", text)


X = torch.randn(2, 4)


# ------------------------------------------------------------------------------------------
# Construction, code, numerics
# ------------------------------------------------------------------------------------------


def test_code_and_numerics_match_torch(ours_fx):
    ours, theirs = make_pair(ours_fx)
    assert ours.code == theirs.code
    for a, b in zip(ours(X), theirs(X)):
        torch.testing.assert_close(a, b)


def test_copied_state_matches_torch(ours_fx):
    ours, theirs = make_pair(ours_fx)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [n for n, _ in ours.named_modules()] == [n for n, _ in theirs.named_modules()]
    assert [n for n, _ in ours.named_buffers()] == [n for n, _ in theirs.named_buffers()]
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    # objects are shared with the root, not copied
    assert ours.sub.lin is theirs.sub.lin
    assert not hasattr(ours.sub, "unused") and not hasattr(ours, "spare")


def test_class_name_and_per_instance_class(ours_fx):
    a, _ = make_pair(ours_fx, "MyModel")
    b, _ = make_pair(ours_fx)
    assert type(a).__name__ == "MyModel" and a._get_name() == "MyModel"
    assert type(b).__name__ == "GraphModule"
    assert type(a) is not type(b)
    assert isinstance(a, ours_fx.GraphModule) and isinstance(a, torch.nn.Module)
    type(a).forward = lambda self, x: "replaced"
    assert a(X) == "replaced"
    assert isinstance(b(X), tuple)


def test_training_flag_copied_from_root(ours_fx):
    root = Root().eval()
    gm = ours_fx.GraphModule(root, build_graph(ours_fx))
    assert gm.training is False


def test_graph_owning_module_and_setter_recompiles(ours_fx):
    ours, _ = make_pair(ours_fx)
    assert ours.graph.owning_module is ours
    g = ours_fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(torch.neg, (x,)))
    ours.graph = g
    assert g.owning_module is ours
    assert "torch.neg(x)" in ours.code
    torch.testing.assert_close(ours(X), -X)


def test_graph_setter_rejects_non_graph(ours_fx):
    messages = []
    for gm in make_pair(ours_fx):
        with pytest.raises(AssertionError) as info:
            gm.graph = "not a graph"
        messages.append(str(info.value))
    assert messages[0] == messages[1] == "Expected a Graph instance, but got <class 'str'>"


def test_recompile_after_in_place_edit(ours_fx):
    ours, theirs = make_pair(ours_fx)
    for gm in (ours, theirs):
        out = next(n for n in gm.graph.nodes if n.op == "output")
        with gm.graph.inserting_before(out):
            neg = gm.graph.call_function(torch.neg, (out.args[0][0],))
        out.args = ((neg, out.args[0][1]),)
    ours_code = ours.recompile()
    theirs_code = theirs.recompile()
    assert ours.code == theirs.code == ours_code.src == theirs_code.src
    assert ours_code._lineno_map == theirs_code._lineno_map
    assert ours._lineno_map == theirs._lineno_map
    torch.testing.assert_close(ours(X)[0], theirs(X)[0])


def test_code_property_missing_raises(ours_fx):
    gm = ours_fx.GraphModule.__new__(ours_fx.GraphModule)
    torch.nn.Module.__init__(gm)
    with pytest.raises(RuntimeError, match="Code has not been generated"):
        _ = gm.code


def test_generated_source_is_in_linecache(ours_fx):
    import inspect
    import linecache

    ours, _ = make_pair(ours_fx)
    filename = ours.forward.__code__.co_filename
    assert "<eval_with_key>" in filename
    assert "".join(linecache.getlines(filename)).rstrip() == ours.code.rstrip()
    assert inspect.getsource(ours.forward).strip() == ours.code.strip()


def test_co_fields_name_the_fake_file(ours_fx):
    g = build_graph(ours_fx)
    g._co_fields = {"co_filename": "model.py", "co_firstlineno": 7, "co_name": "forward"}
    gm = ours_fx.GraphModule(Root(), g)
    assert re.fullmatch(
        r"<eval_with_key>\.\d+ from model\.py:7 in forward", gm.forward.__code__.co_filename
    )
    g2 = build_graph(ours_fx)
    g2._co_fields = {"co_filename": "only_file.py"}
    assert ours_fx.GraphModule(Root(), g2).forward.__code__.co_filename == "only_file.py"


# ------------------------------------------------------------------------------------------
# dict roots and errors
# ------------------------------------------------------------------------------------------


def build_dict_graph(fx):
    g = fx.Graph()
    x = g.placeholder("x")
    w = g.get_attr("foo.bar.w")
    m = g.call_module("foo.bar", (x,))
    p = g.get_attr("p")
    g.output(g.call_function(operator.add, (g.call_function(operator.mul, (m, w)), p)))
    return g


def dict_root():
    return {
        "foo.bar.w": torch.full((4,), 5.0),
        "foo.bar": torch.nn.Linear(4, 4),
        "p": torch.nn.Parameter(torch.ones(4)),
    }


def test_dict_root_matches_torch(ours_fx):
    root = dict_root()
    ours = ours_fx.GraphModule(root, build_dict_graph(ours_fx))
    theirs = tfx.GraphModule(root, build_dict_graph(tfx))
    assert ours.code == theirs.code
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [n for n, _ in ours.named_buffers()] == ["foo.bar.w"]
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    torch.testing.assert_close(ours(X), theirs(X))


def test_dict_root_missing_target_message(ours_fx):
    root = dict_root()
    del root["p"]
    messages = []
    for fx in (ours_fx, tfx):
        with pytest.raises(RuntimeError) as info:
            fx.GraphModule(root, build_dict_graph(fx))
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    assert "referenced target p but that target was not provided in ``root``!" in messages[0]


def test_unsupported_root_type_message(ours_fx):
    messages = []
    for fx in (ours_fx, tfx):
        with pytest.raises(RuntimeError) as info:
            fx.GraphModule(42, build_graph(fx))
        messages.append(str(info.value))
    assert messages[0] == messages[1] == "Unsupported type 42 passed for root!"


def test_module_root_missing_target_raises_attribute_error(ours_fx):
    messages = []
    for fx in (ours_fx, tfx):
        g = fx.Graph()
        x = g.placeholder("x")
        g.output(g.call_module("nope.lin", (x,)))
        with pytest.raises(AttributeError) as info:
            fx.GraphModule(Root(), g)
        messages.append(str(info.value))
    assert messages[0] == messages[1]


# ------------------------------------------------------------------------------------------
# Printing
# ------------------------------------------------------------------------------------------


def test_print_readable_matches_torch(ours_fx):
    ours, theirs = make_pair(ours_fx, "Net")
    buf = io.StringIO()
    with redirect_stdout(buf):
        text = ours.print_readable()
    assert text == theirs.print_readable(print_output=False)
    assert buf.getvalue() == text + "\n"
    assert text.startswith("class Net(torch.nn.Module):\n    def forward(self, x):\n")


def test_print_readable_nested_matches_torch(ours_fx):
    ours = build_nested(ours_fx)
    theirs = build_nested(tfx)
    assert ours.print_readable(False) == theirs.print_readable(False)
    assert "    class inner(torch.nn.Module):" in ours.print_readable(False)


def test_print_readable_additional_meta(ours_fx):
    ours, theirs = make_pair(ours_fx)
    for gm in (ours, theirs):
        for i, node in enumerate(gm.graph.nodes):
            node.meta["seq_nr"] = i
    assert ours.print_readable(False, additional_meta=["seq_nr"]) == theirs.print_readable(
        False, additional_meta=["seq_nr"]
    )


def test_str_matches_torch(ours_fx):
    ours, theirs = make_pair(ours_fx, "Net")
    assert str(ours) == str(theirs)
    ours_n, theirs_n = build_nested(ours_fx), build_nested(tfx)
    assert str(ours_n) == str(theirs_n)


# ------------------------------------------------------------------------------------------
# Errors inside generated code
# ------------------------------------------------------------------------------------------


def build_failing(fx):
    """Three ops so the failing line has generated context before and after it."""
    g = fx.Graph()
    x = g.placeholder("x")
    r = g.call_function(torch.relu, (x,))
    bad = g.call_function(torch.add, (r, g.get_attr("top")))
    g.output(g.call_function(torch.neg, (bad,)))
    return fx.GraphModule(Root(), g)


def _failing_call(gm, capsys):
    with pytest.raises(RuntimeError) as info:
        gm(torch.randn(3, 5))
    return info.value, capsys.readouterr().err


def test_error_in_generated_code_prints_context(ours_fx, capsys):
    # The oracle compiles first: torch.fx does not check linecache for a free fake file name,
    # so it must not come after ours in a process that runs both.
    theirs_exc, theirs_err = _failing_call(build_failing(tfx), capsys)
    ours_exc, ours_err = _failing_call(build_failing(ours_fx), capsys)
    assert str(ours_exc) == str(theirs_exc)
    marker = "Call using an FX-traced Module"
    assert marker in ours_err
    assert ours_err[ours_err.index(marker) :] == theirs_err[theirs_err.index(marker) :]
    assert "~~~ <--- HERE" in ours_err
    assert "torch.add(relu, top)" in ours_err.split(marker)[0]  # the traceback shows the line
    # re-raised without the generated frames
    assert not any(
        "eval_with_key" in f.filename for f in traceback.extract_tb(ours_exc.__traceback__)
    )


def test_error_outside_generated_code_passes_through(ours_fx, capsys):
    class Boom(torch.nn.Module):
        def forward(self, x):
            raise ValueError("boom")

    g = ours_fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_module("boom", (x,)))
    gm = ours_fx.GraphModule({"boom": Boom()}, g)
    with pytest.raises(ValueError, match="boom"):
        gm(X)
    assert "Call using an FX-traced Module" not in capsys.readouterr().err


# ------------------------------------------------------------------------------------------
# Copies and pickling
# ------------------------------------------------------------------------------------------


def test_deepcopy_matches_torch(ours_fx):
    ours, theirs = make_pair(ours_fx, "Net")
    ours.meta["info"] = [1, 2]
    theirs.meta["info"] = [1, 2]
    ours_copy, theirs_copy = copy.deepcopy(ours), copy.deepcopy(theirs)
    assert type(ours_copy).__name__ == type(theirs_copy).__name__
    assert ours_copy.code == theirs_copy.code == ours.code
    assert ours_copy.graph is not ours.graph
    assert ours_copy.graph.owning_module is ours_copy
    assert ours_copy.sub.lin is not ours.sub.lin
    assert ours_copy.meta == {"info": [1, 2]} and ours_copy.meta["info"] is not ours.meta["info"]
    for a, b in zip(ours_copy(X), theirs_copy(X)):
        torch.testing.assert_close(a, b)
    assert list(ours_copy.state_dict()) == list(theirs_copy.state_dict())


def test_deepcopy_hooks_and_preserved_attributes(ours_fx):
    ours, _ = make_pair(ours_fx)
    seen = []
    ours._register_deepcopy_hook(lambda gm: seen.append(gm))
    ours.meta["_user_preserved_attributes"] = {"extra": 7}
    dup = copy.deepcopy(ours)
    assert seen == [dup]
    assert dup.extra == 7
    assert len(dup._deepcopy_hooks) == 1


def test_copy_shares_state_and_meta(ours_fx):
    ours, theirs = make_pair(ours_fx, "Net")
    ours.meta["k"] = 1
    dup = copy.copy(ours)
    assert type(dup).__name__ == type(copy.copy(theirs)).__name__ == "GraphModule"
    assert dup.meta is ours.meta
    assert dup.sub.lin is ours.sub.lin
    assert dup.code == ours.code
    replica = ours._replicate_for_data_parallel()
    assert replica._is_replica is True


def test_reduce_never_pickles_the_forward(ours_fx, gm_mod):
    ours, theirs = make_pair(ours_fx)
    fn, (state, import_block) = ours.__reduce__()
    assert fn is gm_mod.reduce_graph_module
    assert "_graph" not in state and "_code" in state
    assert not any(callable(v) and getattr(v, "__name__", "") == "forward" for v in state.values())
    their_block = theirs.__reduce__()[1][1]
    assert set(import_block.splitlines()) >= {
        line for line in their_block.splitlines() if "pytree" not in line
    }


def test_pickle_round_trip(ours_fx):
    ours, theirs = make_pair(ours_fx, "Net")
    ours.extra_attr = "kept"
    loaded = pickle.loads(pickle.dumps(ours))
    theirs_loaded = pickle.loads(pickle.dumps(theirs))
    assert type(loaded).__name__ == type(theirs_loaded).__name__
    assert loaded.code == theirs_loaded.code
    assert loaded.extra_attr == "kept"
    assert list(loaded.state_dict()) == list(theirs_loaded.state_dict())
    for a, b in zip(loaded(X), theirs(X)):
        torch.testing.assert_close(a, b)


def test_pickle_nested_round_trip(ours_fx):
    loaded = pickle.loads(pickle.dumps(build_nested(ours_fx)))
    theirs = pickle.loads(pickle.dumps(build_nested(tfx)))
    assert loaded.code == theirs.code
    torch.testing.assert_close(loaded(torch.ones(3)), theirs(torch.ones(3)))


# ------------------------------------------------------------------------------------------
# Submodule editing
# ------------------------------------------------------------------------------------------


def _modules(gm):
    return [n for n, _ in gm.named_modules()]


@pytest.mark.parametrize(
    "target",
    ["extra", "sub.new", "deep.er.leaf", "sub.lin.inner", "top.x", "sub.buf.y"],
)
def test_add_submodule_matches_torch(ours_fx, target):
    ours, theirs = make_pair(ours_fx)
    results = []
    for gm in (ours, theirs):
        results.append(gm.add_submodule(target, torch.nn.Identity()))
    assert results[0] == results[1]
    assert _modules(ours) == _modules(theirs)


@pytest.mark.parametrize("target", ["act", "sub.lin", "sub", "missing", "sub.buf", "top", "a.b"])
def test_delete_submodule_matches_torch(ours_fx, target):
    ours, theirs = make_pair(ours_fx)
    results = [gm.delete_submodule(target) for gm in (ours, theirs)]
    assert results[0] == results[1]
    assert _modules(ours) == _modules(theirs)


def test_delete_all_unused_submodules_matches_torch(ours_fx):
    ours, theirs = make_pair(ours_fx)
    for gm in (ours, theirs):
        gm.add_submodule("dead.end", torch.nn.ReLU())
        gm.add_submodule("act.inside", torch.nn.ReLU())  # under a called module: kept
        gm.add_submodule("sub.lonely", torch.nn.ReLU())
        assert gm.delete_all_unused_submodules() is None
    assert _modules(ours) == _modules(theirs)
    assert "act.inside" in _modules(ours) and "dead" not in _modules(ours)


# ------------------------------------------------------------------------------------------
# Attribute helpers
# ------------------------------------------------------------------------------------------


def test_copy_attr_and_assign_attr(gm_mod):
    src = Root()
    dst = torch.nn.Module()
    gm_mod._copy_attr(src, dst, "sub.buf")
    assert "sub.buf" in dict(dst.named_buffers())
    gm_mod._copy_attr(src, dst, "sub.scale")
    assert "sub.scale" in dict(dst.named_parameters())
    dst2 = torch.nn.Module()
    dst2.sub = src.sub
    gm_mod._copy_attr(src, dst2, "sub.lin.weight")  # parent already installed: no-op
    assert dst2.sub is src.sub

    tgt = torch.nn.Module()
    gm_mod._assign_attr(torch.zeros(2), tgt, "a.b.c")
    gm_mod._assign_attr(3, tgt, "a.k")
    assert "a.b.c" in dict(tgt.named_buffers()) and tgt.a.k == 3
    assert gm_mod._has_attr(tgt, "a") and not gm_mod._has_attr(tgt, "z")
    assert gm_mod._get_attr(tgt, "a.k") == 3
    gm_mod._del_attr(tgt, "a.k")
    assert not hasattr(tgt.a, "k")


# ------------------------------------------------------------------------------------------
# to_folder
# ------------------------------------------------------------------------------------------


def _import_folder(folder: Path, module_name: str):
    sys.path.insert(0, str(folder.parent))
    try:
        pkg = importlib.import_module(folder.name)
        return getattr(pkg, module_name)
    finally:
        sys.path.remove(str(folder.parent))
        for name in [m for m in sys.modules if m == folder.name or m.startswith(folder.name + ".")]:
            del sys.modules[name]


def _folder_gm(fx):
    """Top-level params/buffers, a repr-safe child and a child that must be pickled."""
    torch.manual_seed(1)
    root = torch.nn.Module()
    root.lin = torch.nn.Linear(4, 4)
    root.act = torch.nn.Softplus()
    root.register_buffer("shift", torch.arange(4.0))
    root.w = torch.nn.Parameter(torch.randn(4))
    g = fx.Graph()
    x = g.placeholder("x")
    y = g.call_module("lin", (x,))
    y = g.call_module("act", (y,))
    y = g.call_function(operator.add, (y, g.get_attr("shift")))
    g.output(g.call_function(operator.mul, (y, g.get_attr("w"))))
    return fx.GraphModule(root, g)


def test_to_folder_imports_and_matches_torch(ours_fx, tmp_path):
    ours, theirs = _folder_gm(ours_fx), _folder_gm(tfx)
    ours_dir, theirs_dir = tmp_path / "ours_pkg", tmp_path / "theirs_pkg"
    with warnings.catch_warnings(record=True) as ours_w:
        warnings.simplefilter("always")
        ours.to_folder(ours_dir, "Exported")
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        theirs.to_folder(theirs_dir, "Exported")
    expected = (
        "Was not able to save the following children modules as reprs -"
        "saved as pickled files instead: ['act']"
    )
    assert [str(w.message) for w in ours_w] == [expected]
    assert sorted(p.name for p in ours_dir.iterdir()) == sorted(
        p.name for p in theirs_dir.iterdir()
    )
    assert (ours_dir / "__init__.py").read_text() == "from .module import *"

    def normalized(folder: Path) -> list[str]:
        text = (folder / "module.py").read_text().replace(str(folder), "<DIR>")
        return [line for line in text.splitlines() if "pytree" not in line]

    assert normalized(ours_dir) == normalized(theirs_dir)

    cls = _import_folder(ours_dir, "Exported")
    rebuilt = cls()
    torch.testing.assert_close(rebuilt(X), theirs(X))
    assert type(rebuilt.lin) is torch.nn.Linear


# ------------------------------------------------------------------------------------------
# Hooks
# ------------------------------------------------------------------------------------------


def test_hook_registration_messages(ours_fx):
    ours, theirs = make_pair(ours_fx)
    names = [
        "_register_create_node_hook",
        "_register_erase_node_hook",
        "_register_deepcopy_hook",
        "_register_replace_node_hook",
    ]
    for name in names:
        msgs = []
        for gm in (ours, theirs):
            with pytest.raises(AssertionError) as info:
                getattr(gm, name)(None)
            msgs.append(str(info.value))
        assert msgs[0] == msgs[1]
    hook = lambda node: None
    ours._register_create_node_hook(hook)
    assert ours._create_node_hooks == [hook]
    ours._unregister_create_node_hook(hook)
    assert ours._create_node_hooks == []
    with ours._set_replace_hook(hook):
        assert ours._replace_hooks == [hook]
    assert ours._replace_hooks == []


# ------------------------------------------------------------------------------------------
# Traced modules: pytree codegen, torch.package, symbolic sizes
# ------------------------------------------------------------------------------------------


def dict_in_fn(x):
    return x["a"] + x["b"], x["a"]


def test_pytree_codegen_sets_specs_and_survives_pickle(ours_fx):
    inputs = {"a": torch.ones(2), "b": torch.full((2,), 3.0)}
    results = []
    for fx in (ours_fx, tfx):
        gm = fx.symbolic_trace(dict_in_fn, concrete_args={"x": {"a": fx.PH, "b": fx.PH}})
        loaded = pickle.loads(pickle.dumps(gm))
        results.append((gm, loaded))
    (ours, ours_loaded), (theirs, theirs_loaded) = results
    assert type(ours.graph._codegen).__name__ == "_PyTreeCodeGen"
    assert ours.code == theirs.code
    assert str(ours._in_spec) == str(theirs._in_spec)
    assert str(ours._out_spec) == str(theirs._out_spec)
    assert ours_loaded.code == theirs_loaded.code
    for a, b in zip(ours_loaded(inputs), theirs(inputs)):
        torch.testing.assert_close(a, b)
    for a, b in zip(copy.deepcopy(ours)(inputs), theirs(inputs)):
        torch.testing.assert_close(a, b)


class Traceable(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("offset", torch.arange(4.0))

    def forward(self, x):
        return torch.relu(self.lin(x) + self.offset).sum(-1)


def test_traced_module_pickle_and_deepcopy(ours_fx):
    ours = ours_fx.symbolic_trace(Traceable())
    theirs = tfx.symbolic_trace(Traceable())
    assert ours.code == theirs.code
    ours_loaded, theirs_loaded = (
        pickle.loads(pickle.dumps(ours)),
        pickle.loads(pickle.dumps(theirs)),
    )
    assert ours_loaded.code == theirs_loaded.code
    assert type(ours_loaded).__name__ == type(theirs_loaded).__name__  # torch: "GraphModule"
    torch.testing.assert_close(ours_loaded(X), theirs(X))
    dup = copy.deepcopy(ours)
    assert str(dup.graph) == str(copy.deepcopy(theirs).graph)
    torch.testing.assert_close(dup(X), theirs(X))


def test_torch_package_round_trip(ours_fx):
    from torch.package import PackageExporter, PackageImporter

    loaded_modules = []
    for fx in (ours_fx, tfx):
        root = torch.nn.Module()
        root.lin = torch.nn.Linear(3, 3)
        g = fx.Graph()
        x = g.placeholder("x")
        y = g.call_module("lin", (x,))
        y.meta["stack_trace"] = 'File "a.py", line 3, in f'
        g.output(g.call_function(operator.add, (y, 1)))
        gm = fx.GraphModule(root, g, "Pk")
        gm.note = "kept"
        buf = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with PackageExporter(buf) as exporter:
                exporter.extern(["torch.**", "exportir.**", "sympy.**", "math", "operator"])
                exporter.save_pickle("m", "m.pkl", gm)
        buf.seek(0)
        loaded = PackageImporter(buf).load_pickle("m", "m.pkl")
        torch.testing.assert_close(loaded(torch.ones(3)), gm(torch.ones(3)))
        loaded_modules.append(loaded)
    ours, theirs = loaded_modules
    assert ours.code == theirs.code
    assert type(ours).__name__ == "Pk" and ours.note == "kept"
    assert [n.meta.get("stack_trace") for n in ours.graph.nodes] == [
        n.meta.get("stack_trace") for n in theirs.graph.nodes
    ]


def _symbolic_values():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        ShapeEnv,
        StatelessSymbolicContext,
    )

    mode = FakeTensorMode(shape_env=ShapeEnv())
    ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.DYNAMIC])
    t = mode.from_tensor(torch.randn(3, 4), symbolic_context=ctx)
    with mode:
        flat = t.reshape(-1)
        longer = torch.cat([flat, flat[1:]])
        half = longer[: flat.shape[0] // 2]
    return t, longer.shape[0], half.shape[0], flat.shape[0] - t.shape[1]


def build_symbolic(fx, values):
    t, size, half, diff = values
    g = fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = t
    s = g.call_method("size", (x, 0))
    s.meta["val"] = size
    s2 = g.call_function(operator.floordiv, (s, 2))
    s2.meta["val"] = half
    s3 = g.call_function(operator.sub, (s, s2))
    s3.meta["val"] = diff
    g.output((s, s2, s3))
    return fx.GraphModule(torch.nn.Module(), g)


@pytest.mark.parametrize("fast", [False, True])
def test_print_readable_symbolic_sizes(ours_fx, fast):
    values = _symbolic_values()
    ours = build_symbolic(ours_fx, values).print_readable(False, fast_sympy_print=fast)
    theirs = build_symbolic(tfx, values).print_readable(False, fast_sympy_print=fast)
    assert ours == theirs
    assert ("FloorDiv(" in ours) == fast


# ------------------------------------------------------------------------------------------
# forward installation
# ------------------------------------------------------------------------------------------


def test_instance_forward_override_and_class_forward(ours_fx):
    ours, _ = make_pair(ours_fx)
    fn = type(ours).forward
    assert callable(fn) and fn.__name__ == "forward"
    assert list(inspect_params(fn)) == ["self", "x"]
    ours.forward = lambda x: "instance"
    assert ours(X) == "instance"
    del ours.forward
    assert isinstance(ours(X), tuple)


def inspect_params(fn):
    import inspect

    return inspect.signature(fn).parameters


def test_recompile_twice_keeps_working(ours_fx):
    ours, theirs = make_pair(ours_fx)
    first = ours.recompile()
    second = ours.recompile()
    assert first.src == second.src == theirs.code
    for a, b in zip(ours(X), theirs(X)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"include_stride": True, "include_device": True},
        {"colored": True},
        {"expanded_def": True},
    ],
)
def test_print_readable_options_match_torch(ours_fx, kwargs):
    values = _symbolic_values()
    ours = build_symbolic(ours_fx, values)
    theirs = build_symbolic(tfx, values)
    for gm in (ours, theirs):
        node = next(iter(gm.graph.nodes))
        node.meta["val"] = torch.empty(2, 3)
        gm.recompile()
    assert ours.print_readable(False, **kwargs) == theirs.print_readable(False, **kwargs)


def test_subclass_with_own_call_is_wrapped(ours_fx, capsys):
    calls = []

    def make_cls(fx):
        class Counting(fx.GraphModule):
            def __call__(self, *args, **kwargs):
                calls.append(type(self).__name__)
                return super().__call__(*args, **kwargs)

        return Counting

    for fx in (ours_fx, tfx):
        gm = make_cls(fx)(Root(), build_graph(fx), "Counted")
        assert isinstance(gm(X), tuple)
        dup = copy.deepcopy(gm)
        assert type(dup).__mro__[1].__name__ == "Counting"
        dup(X)
    assert calls == ["Counted", "GraphModule", "Counted", "GraphModule"]
    failing = make_cls(ours_fx)(Root(), build_failing(ours_fx).graph)
    with pytest.raises(RuntimeError):
        failing(torch.randn(3, 5))
    assert "Call using an FX-traced Module" in capsys.readouterr().err


def test_share_unpicklable_context_keeps_plain_deepcopy(gm_mod, ours_fx):
    ours, theirs = make_pair(ours_fx)
    with gm_mod._share_torchbind_and_process_group_on_deepcopy():
        dup = copy.deepcopy(ours)
    assert dup.sub.lin is not ours.sub.lin and dup.code == theirs.code


def test_source_registry_cache_alias(gm_mod):
    key = gm_mod._loader.cache("def f():\n    return 1\n", {})
    import linecache

    assert "eval_with_key" in key
    assert linecache.getlines(key) == ["def f():\n", "    return 1\n"]
