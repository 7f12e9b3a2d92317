"""dynamic_shapes: Dim and friends, spec validation (vs torch.export's texts), the guard solver."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import sympy
import torch
import torch.export as texport

from exportir.export.dynamic import _constraints as C
from exportir.export.dynamic.dims import (
    Dim,
    ShapesCollection,
    UserError,
    UserErrorType,
    as_dim_spec,
    dims,
    plan_dims,
)

# ---------------------------------------------------------------------------- Dim objects


@pytest.mark.parametrize(
    "make",
    [
        lambda D: D("dx"),
        lambda D: D("dx", min=3, max=6),
        lambda D: D("dx", max=64),
        lambda D: D("dx", min=2),
        lambda D: 2 * D("dx"),
        lambda D: D("dx") + 1,
        lambda D: D("dx", min=1) - 1,
        lambda D: 2 * D("dx", min=1) + 1,
        lambda D: (D("dx") + 1) * 3,
        lambda D: D.AUTO,
        lambda D: D.DYNAMIC(max=10),
        lambda D: D.STATIC,
        lambda D: D.AUTO(min=2, max=8),
    ],
)
def test_dim_repr_and_bounds_match_torch(make):
    ours, theirs = make(Dim), make(texport.Dim)
    assert repr(ours) == repr(theirs)
    if hasattr(theirs, "min") and not hasattr(theirs, "type"):
        assert str(ours.min) == str(theirs.min)
        assert str(ours.max) == str(theirs.max)
        assert ours.__name__ == theirs.__name__


@pytest.mark.parametrize(
    "bad",
    [lambda D: D("dx") * 0, lambda D: D("dx") + 1.5, lambda D: 1 - D("dx"), lambda D: D("dx") * -2],
)
def test_dim_rejects_non_increasing_linear_like_torch(bad):
    with pytest.raises(NotImplementedError) as ours:
        bad(Dim)
    with pytest.raises(NotImplementedError) as theirs:
        bad(texport.Dim)
    assert str(ours.value) == str(theirs.value)


def test_dim_validation_and_dims():
    with pytest.raises(ValueError, match="inconsistent min=5, max=3"):
        Dim("dx", min=5, max=3)
    with pytest.raises(ValueError, match="valid identifier"):
        Dim("d x")
    a, b = dims("a", "b", max=8)
    assert (a.__name__, b.max, repr(b)) == ("a", 8, "Dim('b', min=0, max=8)")
    with pytest.raises(TypeError):
        Dim.AUTO(max=3)(max=4)


def test_torch_dims_are_accepted_duck_typed():
    dx = texport.Dim("dx", min=3, max=6)
    assert as_dim_spec(dx).kind == "named" and as_dim_spec(dx).max == 6
    spec = as_dim_spec(2 * dx + 1)
    assert (spec.kind, spec.name, spec.scale, spec.offset) == ("derived", "dx", 2, 1)
    assert as_dim_spec(texport.Dim.AUTO).kind == "auto"
    assert as_dim_spec(texport.Dim.DYNAMIC(max=4)).max == 4
    assert as_dim_spec(texport.Dim("u")).max is None


# ---------------------------------------------------------------------------- spec validation


class Three(torch.nn.Module):
    def forward(self, x, ys, d=None):
        return x + ys[0] + ys[1] + d["a"]


X, YS, D = torch.randn(4, 3), (torch.randn(4, 3), torch.randn(4, 3)), {"a": torch.randn(4, 3)}

_dx = texport.Dim("dx")

SPECS = {
    "none_for_tuple": {"x": {0: _dx}, "ys": None, "d": None},
    "list_for_tuple": ({0: _dx}, [{0: _dx}, {0: _dx}], {"a": None}),
    "wrong_count": {"x": {0: _dx}, "ys": ({0: _dx},), "d": None},
    "dict_for_tuple": {"x": {0: _dx}, "ys": {0: _dx}, "d": None},
    "wrong_dict_keys": {"x": None, "ys": (None, None), "d": {"b": None}},
    "wrong_top_keys": {"x": None, "z": None, "d": None},
    "too_short": {"x": (_dx,), "ys": (None, None), "d": {"a": None}},
    "bad_dim": {"x": {0: "a"}, "ys": (None, None), "d": {"a": None}},
    "bad_dim_tuple": {"x": (_dx, 3.5), "ys": (None, None), "d": {"a": None}},
    "bad_shape": {"x": 5, "ys": (None, None), "d": {"a": None}},
    "diff_defs": {"x": {0: texport.Dim("dx", max=8)}, "ys": ({0: texport.Dim("dx", max=9)}, None), "d": {"a": None}},
}


def _torch_message(spec) -> str:
    with pytest.raises(Exception) as info:  # whatever torch raises is the oracle
        texport.export(Three(), (X, YS), {"d": D}, dynamic_shapes=spec)
    return str(info.value).split("\n\nThe error above occurred")[0]


@pytest.mark.parametrize("case", sorted(SPECS))
def test_spec_validation_messages_match_torch(case):
    spec = SPECS[case]
    with pytest.raises(UserError) as ours:
        plan_dims(Three(), (X, YS), {"d": D}, spec)
    assert ours.value.error_type is UserErrorType.INVALID_INPUT
    assert str(ours.value) == _torch_message(spec)


def test_nested_spec_plans_one_request_per_marked_dim():
    dx = Dim("dx")
    plan = plan_dims(Three(), (X, YS), {"d": D}, {"x": {0: dx}, "ys": ({0: dx}, (dx, 3)), "d": {"a": {0: dx + 1}}})
    got = [(r.source, r.spec.kind) for r in plan.requests]
    assert got == [
        ("L['x'].size()[0]", "named"),
        ("L['ys'][0].size()[0]", "named"),
        ("L['ys'][1].size()[0]", "named"),
        ("L['ys'][1].size()[1]", "static"),
        ("L['d']['a'].size()[0]", "derived"),
    ]


def test_tuple_spec_in_input_order_and_static_int_mismatch():
    plan = plan_dims(Three(), (X, YS), {"d": D}, ({0: Dim("b")}, (None, None), {"a": None}))
    assert [r.source for r in plan.requests] == ["L['x'].size()[0]"]
    with pytest.raises(UserError, match=r"Static shape constraint of 5 does not match input size of 4, for L\['x'\].size\(\)\[0\]"):
        plan_dims(Three(), (X, YS), {"d": D}, ({0: 5}, (None, None), {"a": None}))


def test_non_tensor_input_with_shape_is_rejected_like_torch():
    class M(torch.nn.Module):
        def forward(self, x, n):
            return x * n

    with pytest.raises(UserError, match=r"Cannot associate shape \{0: Dim\('dx', min=0\)\} specified at `dynamic_shapes\[1\]` to non-tensor type <class 'float'>"):
        plan_dims(M(), (X, 2.0), None, ({0: Dim("dx")}, {0: Dim("dx")}))


def test_shapes_collection_builds_nested_spec():
    sc = ShapesCollection()
    batch = Dim("batch")
    sc[X] = {0: batch}
    sc[YS[1]] = (batch, None)
    assert sc.dynamic_shapes(Three(), (X, YS), {"d": D}) == {
        "x": {0: batch}, "ys": (None, (batch, None)), "d": {"a": None}
    }
    plan = plan_dims(Three(), (X, YS), {"d": D}, sc)
    assert [r.source for r in plan.requests] == ["L['x'].size()[0]", "L['ys'][1].size()[0]"]
    stray = ShapesCollection()
    stray[torch.randn(2)] = (None,)
    with pytest.raises(ValueError, match="were not found in args"):
        stray.dynamic_shapes(Three(), (X, YS), {"d": D})


# ---------------------------------------------------------------------------- the solver


@dataclass(frozen=True)
class Frame:
    filename: str
    lineno: int
    name: str
    code: str


@dataclass(frozen=True)
class G:
    expr: object
    frame: object = Frame("model.py", 12, "forward", "if x.shape[0] > 5:")


s0, s1, s2 = sympy.symbols("s0 s1 s2", integer=True, positive=True)


def _info(sym, hint, src, dim, **kw):
    return C.SymbolInfo(sym, hint, (src,), as_dim_spec(dim), **kw)


X0, Y0 = "L['x'].size()[0]", "L['y'].size()[0]"


def _violation(table, guards, replacements=None) -> str:
    with pytest.raises(UserError) as info:
        C.solve(table, guards, replacements)
    assert info.value.error_type is UserErrorType.CONSTRAINT_VIOLATION
    return str(info.value)


def test_solver_range_violation_suggests_dim_with_min():
    table = C.SymbolTable((_info(s0, 8, X0, Dim("dx")),))
    msg = _violation(table, [G(sympy.Gt(s0, 5))])
    assert msg.startswith(
        "Constraints violated (dx)! For more information, run with TORCH_LOGS=\"+dynamic\".\n"
        "  - Not all values of dx = L['x'].size()[0] in the specified range satisfy the generated "
        "guard 6 <= L['x'].size()[0] and L['x'].size()[0] <= IntInfinity()\n"
        "    (guard added at model.py:12 in forward: if x.shape[0] > 5:)\n"
    )
    assert msg.endswith("Suggested fixes:\n  dx = Dim('dx', min=6)")


def test_solver_two_sided_range_with_user_bound():
    table = C.SymbolTable((_info(s0, 5, X0, Dim("dx", max=5)),))
    msg = _violation(table, [G(sympy.Ge(s0, 3))])
    assert "in the specified range dx <= 5 satisfy the generated guard 3 <= L['x'].size()[0] and L['x'].size()[0] <= 5" in msg
    assert msg.endswith("  dx = Dim('dx', min=3, max=5)")
    table = C.SymbolTable((_info(s0, 5, X0, Dim("dx")),))
    msg = _violation(table, [G(sympy.Ge(s0, 3)), G(sympy.Le(s0, 6))])
    assert msg.endswith("  dx = Dim('dx', min=3, max=6)")


def test_solver_spec_that_implies_guards_passes():
    table = C.SymbolTable((_info(s0, 5, X0, Dim("dx", min=3, max=6)),))
    sol = C.solve(table, [G(sympy.Ge(s0, 3)), G(sympy.Le(s0, 6)), G(sympy.Ne(s0, 1))])
    assert sol.ranges == {s0: C.Range(3, 6)}


def test_solver_specialization():
    table = C.SymbolTable((_info(s0, 4, X0, Dim("dx")),))
    msg = _violation(table, [G(sympy.Eq(s0, 4))])
    assert "You marked dx as dynamic but your code specialized it to be a constant (4)." in msg
    assert msg.endswith("Suggested fixes:\n  dx = 4")


def test_solver_specialization_of_dynamic_hint_names_the_source():
    src = "L['x'].size()[1]"
    table = C.SymbolTable((_info(s0, 3, src, Dim.DYNAMIC),))
    msg = _violation(table, [G(sympy.Eq(s0, 3))])
    assert msg.startswith(f"Constraints violated ({src})!")
    assert "Suggested fixes" not in msg


def test_solver_equal_and_derived_relations():
    table = C.SymbolTable((_info(s0, 4, X0, Dim("dx")), _info(s1, 4, Y0, Dim("dy"))))
    msg = _violation(table, [G(sympy.Eq(s0, s1))])
    assert "The values of dy = L['y'].size()[0] and dx = L['x'].size()[0] must always be equal." in msg
    assert msg.endswith("Suggested fixes:\n  dy = dx")
    table = C.SymbolTable((_info(s0, 5, X0, Dim("dx")), _info(s1, 4, Y0, Dim("dy"))))
    msg = _violation(table, [G(sympy.Eq(s0 - 1, s1))])
    assert "The values of dx = L['x'].size()[0] must always be related to the values of dy = L['y'].size()[0] by dx = dy + 1." in msg
    assert msg.endswith("  dx = dy + 1")
    table = C.SymbolTable((_info(s0, 4, X0, Dim("dx")), _info(s1, 8, Y0, Dim("dy"))))
    assert _violation(table, [G(sympy.Eq(2 * s0, s1))]).endswith("  dy = 2*dx")


def test_solver_auto_dims_take_what_the_guards_imply():
    table = C.SymbolTable((_info(s0, 5, X0, Dim.AUTO), _info(s1, 4, Y0, Dim.AUTO), _info(s2, 6, "L['z'].size()[0]", Dim.AUTO)))
    sol = C.solve(table, [G(sympy.Eq(s0 - 1, s1)), G(sympy.Eq(s2, 6)), G(sympy.Le(s1, 9))])
    assert sol.replacements == {s0: s1 + 1, s2: 6}
    assert sol.ranges == {s1: C.Range(2, 9), s1 + 1: C.Range(3, 10)}


def test_solver_reads_shape_env_replacements_and_negations():
    table = C.SymbolTable((_info(s0, 4, X0, Dim("dx")), _info(s1, 4, Y0, Dim("dx2"))))
    msg = _violation(table, [G(sympy.Not(sympy.Gt(s0, 10)))], {s1: s0})
    assert "must always be equal" in msg and "dx = Dim('dx', max=10)" in msg and "dx2 = dx" in msg


def test_solver_derived_ranges():
    table = C.SymbolTable((_info(s0, 4, Y0, Dim("dy")),), ((s0 + 1, as_dim_spec(Dim("dy") + 1)),))
    assert C.solve(table, []).ranges == {s0: C.Range(0, C._INF), s0 + 1: C.Range(1, C._INF)}
