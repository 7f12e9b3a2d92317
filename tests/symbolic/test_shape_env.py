"""ShapeEnv / SymNode unit tests: simplification, ranges, guards, replacements, unbacked errors."""

import pytest
import sympy
import torch

from exportir.symbolic import GuardOnDataDependentSymNode, ShapeEnv, ValueRanges


def _env(hint=4):
    env = ShapeEnv()
    s0 = env.create_backed_symbol(hint, "x.size()[0]")
    return env, env.symint(s0)


def test_arithmetic_prints_like_torch():
    _, n = _env()
    assert [str(v) for v in (n, n * 2, n + 1, (n * 2) // 2, n - 1)] == ["s0", "2*s0", "s0 + 1", "s0", "s0 - 1"]
    assert (n * 6) // (n * 2) == 3


def test_guard_refines_range_and_records_user_line():
    env, n = _env()
    assert bool(n > 3)
    assert str(env.var_to_range[sympy.Symbol("s0", integer=True, positive=True)]) == "VR[4, int_oo]"
    (g,) = env.guards
    assert str(g.expr) == "s0 > 3" and g.frame.filename == __file__
    assert bool(n >= 4) and len(env.guards) == 1  # decided by the range: no new guard


def test_equality_guard_adds_replacement():
    env, n = _env()
    s1 = env.create_backed_symbol(5, "y.size()[0]")
    m = env.symint(s1)
    assert bool(m == n + 1)
    assert str(m + 0) == "s0 + 1" and str(env.replacements) == "{s1: s0 + 1}"


def test_int_specializes():
    env, n = _env(7)
    assert int(n) == 7
    assert str(env.guards[0].expr) == "Eq(s0, 7)"


def test_meta_kernels_compute_symbolically():
    _, n = _env()
    with torch._C._EnablePythonDispatcher():
        m = torch.empty_strided((n, 6), (6, 1), device="meta")
        assert str(m.view(-1).shape) == "torch.Size([6*s0])"
        assert str(torch.cat([m, m]).shape) == "torch.Size([2*s0, 6])"
        assert str(m[1:].shape) == "torch.Size([s0 - 1, 6])"


def test_unbacked_check_refines_and_defers():
    env = ShapeEnv()
    u = env.create_unbacked_symint()
    torch._check(u >= 0)
    torch._check(u <= 10)
    assert env.var_to_range[u.node.expr] == ValueRanges.of(0, 10)
    assert [str(r.expr) for r in env.deferred_runtime_asserts] == ["u0 >= 0", "u0 <= 10"]
    assert bool(u < 11)  # decided by the range


def test_unbacked_guard_error_names_line_and_fix():
    env = ShapeEnv()
    u = env.create_unbacked_symint()
    with pytest.raises(GuardOnDataDependentSymNode) as info:
        if u == 1:  # the user's line
            pass
    text = str(info.value)
    assert "Could not guard on data-dependent expression Eq(u0, 1) (unhinted: Eq(u0, 1))" in text
    assert "if u == 1:  # the user's line" in text and __file__ in text
    assert "torch._check(u == 1)" in text and "torch._check(u != 1)" in text


def test_value_range_bounds():
    env = ShapeEnv()
    s = env.create_backed_symbol(4, "x", vr=ValueRanges.of(2, 64))
    assert str(env.bound(2 * s + 1)) == "VR[5, 129]"
    assert env.evaluate_static(s >= 2) is True
    assert env.evaluate_static(s > 10) is None


# -- memo tables: answers change exactly when what is known changes -------------------------


def test_undecided_static_answer_is_recomputed_after_a_guard():
    env, n = _env(8)
    s0 = n.node.expr
    assert env.evaluate_static(s0 > 5) is None  # memoized as undecided
    assert bool(n > 6)  # guard: s0 in [7, oo]
    assert env.evaluate_static(s0 > 5) is True
    assert env.evaluate_static(s0 < 3) is False


def test_replace_memo_follows_new_replacements():
    env, n = _env(4)
    s1 = env.create_backed_symbol(5, "y.size()[0]")
    assert env.replace(s1 + 1) == s1 + 1
    assert bool(env.symint(s1) == n + 1)
    assert str(env.replace(s1 + 1)) == "s0 + 2"


def test_arithmetic_memo_keeps_int_and_float_apart():
    _, n = _env(4)
    assert str(n * 2) == "2*s0"
    f = n.node.mul(n.node.wrap_float(2.0))
    assert f.pytype is float and str(f.expr) == "2.0*s0"
    assert str((n * 2).node.expr) == "2*s0"


def test_repeated_comparisons_record_one_guard():
    env, n = _env(4)
    m = env.symint(env.create_backed_symbol(6, "y.size()[0]"))
    for _ in range(50):
        assert bool(m > n)
    assert len(env.guards) == 1
