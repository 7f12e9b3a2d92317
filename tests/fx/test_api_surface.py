"""The public surface of exportir.fx against torch.fx's backward-compatibility registry.

Every object torch marks ``@compatibility(is_backward_compatible=True)`` must exist in exportir.fx
at the mapped location with the same call signature (parameter names, kinds and defaults;
annotations ignored), and every public member of such a class must exist on ours. Objects not
built yet are listed in ``MISSING`` with a reason; the list is itself tested, so it cannot go
stale: a MISSING name must really be absent or raise ``NotImplementedError``.
"""

from __future__ import annotations

import importlib
import inspect
import types

import pytest
import torch.fx
from conftest import import_ours_fx, ours_fx_name
from torch.fx._compatibility import _BACK_COMPAT_OBJECTS

# Importing these fills the registry with everything torch.fx marks backward compatible.
TORCH_FX_MODULES = {
    # torch.fx.<module>            -> <ours>.<module>
    "torch.fx._symbolic_trace": "tracer",
    "torch.fx.graph": "graph",
    "torch.fx.node": "node",
    "torch.fx.proxy": "proxy",
    "torch.fx.graph_module": "graph_module",
    "torch.fx.interpreter": "interpreter",
    "torch.fx.subgraph_rewriter": "subgraph_rewriter",
    "torch.fx.immutable_collections": "immutable_collections",
    "torch.fx.passes.shape_prop": "passes.shape_prop",
    "torch.fx.passes.reinplace": "passes.reinplace",
    "torch.fx.passes.runtime_assert": "passes.runtime_assert",
    "torch.fx.passes.split_module": "passes.split_module",
}
for _m in TORCH_FX_MODULES:
    importlib.import_module(_m)

# Sanity mode (EXPORTIR_FX_IMPL=torch.fx): the harness checks torch.fx against itself.
SANITY = ours_fx_name() == "torch.fx"
if SANITY:
    TORCH_FX_MODULES = {m: m[len("torch.fx."):] for m in TORCH_FX_MODULES}

# Qualified names (relative to the ours package, e.g. "passes.reinplace.reinplace") that are not
# built yet, with the reason. Member-level entries name "module.Class.member".
MISSING: dict[str, str] = {}
if SANITY:
    MISSING = {}


def _compat_objects() -> list[tuple[str, object]]:
    """(ours-relative qualified name, torch object) for each registered backward-compat object."""
    out = []
    for obj in _BACK_COMPAT_OBJECTS:
        mod = getattr(obj, "__module__", None)
        if mod not in TORCH_FX_MODULES:
            continue
        out.append((f"{TORCH_FX_MODULES[mod]}.{obj.__qualname__}", obj))
    return sorted(out, key=lambda t: t[0])


COMPAT = _compat_objects()


def _resolve(root: types.ModuleType, dotted: str):
    """Import as many leading atoms as modules, then getattr the rest. Raises on absence."""
    atoms = dotted.split(".")
    obj: object = root
    for i, atom in enumerate(atoms):
        if isinstance(obj, types.ModuleType) and not hasattr(obj, atom):
            obj = importlib.import_module(f"{obj.__name__}.{atom}")
        else:
            obj = getattr(obj, atom)
    return obj


def _same_default(expected, actual) -> bool:
    if expected is inspect.Parameter.empty or actual is inspect.Parameter.empty:
        return expected is actual
    if isinstance(expected, types.ModuleType):
        return actual is expected
    if isinstance(expected, (types.FunctionType, types.LambdaType, types.BuiltinFunctionType)):
        return callable(actual)
    if isinstance(expected, (tuple, list)):
        return (type(actual) is type(expected) and len(actual) == len(expected)
                and all(_same_default(e, a) for e, a in zip(expected, actual)))
    return type(actual) is type(expected) and actual == expected


def _signature(obj):
    try:
        return inspect.signature(obj)
    except (TypeError, ValueError) as e:
        return type(e)


def _describe(sig) -> str:
    if isinstance(sig, type):
        return f"<no signature: {sig.__name__}>"
    return "(" + ", ".join(f"{p.kind.name} {p.name}={p.default!r}" for p in sig.parameters.values()) + ")"


def assert_same_signature(expected_obj, actual_obj, what: str) -> None:
    exp, act = _signature(expected_obj), _signature(actual_obj)
    msg = f"{what}: signature {_describe(act)}\n  != torch's {_describe(exp)}"
    if isinstance(exp, type) or isinstance(act, type):
        assert exp is act, msg
        return
    ep, ap = list(exp.parameters.values()), list(act.parameters.values())
    assert [(p.name, p.kind) for p in ap] == [(p.name, p.kind) for p in ep], msg
    for e, a in zip(ep, ap):
        assert _same_default(e.default, a.default), f"{msg}\n  default of {e.name!r} differs"


def _is_missing(name: str) -> bool:
    return name in MISSING or any(name.startswith(m + ".") for m in MISSING)


@pytest.fixture(scope="module")
def ours():
    return import_ours_fx()


def test_registry_is_populated():
    names = {n for n, _ in COMPAT}
    assert len(COMPAT) >= 90
    tracer = TORCH_FX_MODULES["torch.fx._symbolic_trace"]
    assert {f"{tracer}.symbolic_trace", "graph.Graph", "node.Node.__init__",
            "passes.shape_prop.ShapeProp"} <= names


def test_all_matches_torch(ours):
    assert ours.__all__ == torch.fx.__all__


@pytest.mark.parametrize("name", [
    n for n in dir(torch.fx)
    if not n.startswith("_") and not isinstance(getattr(torch.fx, n), types.ModuleType)
])
def test_top_level_names(ours, name):
    """Everything torch.fx exports at top level (``__all__`` and the rest, e.g. ``PH``)."""
    assert hasattr(ours, name), f"{ours_fx_name()}.{name} is missing"
    theirs = getattr(torch.fx, name)
    if callable(theirs):
        assert_same_signature(theirs, getattr(ours, name), name)


@pytest.mark.parametrize("name,theirs", [c for c in COMPAT if not _is_missing(c[0])],
                         ids=[n for n, _ in COMPAT if not _is_missing(n)])
def test_compat_object(ours, name, theirs):
    try:
        mine = _resolve(ours, name)
    except (ImportError, AttributeError) as e:
        pytest.fail(f"{ours_fx_name()}.{name} is missing ({e}); build it or list it in MISSING")
    if inspect.isclass(theirs):
        assert inspect.isclass(mine), f"{name} must be a class"
        assert_same_signature(theirs, mine, name)
        for member in dir(theirs):
            if member.startswith("_") or _is_missing(f"{name}.{member}"):
                continue
            assert hasattr(mine, member), f"{name}.{member} is missing"
    else:
        assert callable(mine), f"{name} must be callable"
        assert_same_signature(theirs, mine, name)


def test_class_hierarchy(ours):
    assert issubclass(ours.GraphModule, torch.nn.Module)
    assert issubclass(ours.Tracer, ours.proxy.TracerBase)
    assert issubclass(ours.Transformer, ours.Interpreter)
    assert issubclass(ours.proxy.GraphAppendingTracer, ours.proxy.TracerBase)
    assert issubclass(ours.proxy.Attribute, ours.Proxy)
    assert issubclass(ours.proxy.TraceError, ValueError)
    assert issubclass(ours.immutable_collections.immutable_list, list)
    assert issubclass(ours.immutable_collections.immutable_dict, dict)
    assert ours.PH is _resolve(ours, TORCH_FX_MODULES["torch.fx._symbolic_trace"] + ".PH")


@pytest.mark.parametrize("name", sorted(MISSING))
def test_missing_list_is_current(ours, name):
    """A MISSING name must be absent, or a stub raising NotImplementedError."""
    try:
        obj = _resolve(ours, name)
    except (ImportError, AttributeError):
        return
    sig = _signature(obj)
    if isinstance(sig, type):
        pytest.fail(f"{name} exists; remove it from MISSING")
    required = [p for p in sig.parameters.values()
                if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    with pytest.raises(NotImplementedError):
        obj(*[None] * len(required))
