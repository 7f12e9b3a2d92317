"""Fast kernel bindings (exportir.runtime.bindings) compute exactly what the generic out overload
computes: same values bit for bit, same dtype, same shape, for every entry kind (alternative
overload, scalar stand-in, direct Python binding, functional + copy, unread outs), with
broadcasting, dtype promotion, Scalar overloads and arguments that change per call.

Reproduce one case: ``pytest tests/runtime/test_bindings.py -k '<case id>'``.
"""

from __future__ import annotations

import pytest
import torch

from exportir.runtime import bindings, default_kernel_registry

aten = torch.ops.aten


def _r(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(*shape, dtype=dtype)
    if dtype == torch.bool:
        return torch.rand(*shape) > 0.5
    return torch.randint(-5, 6, shape, dtype=dtype)


def _e(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype)


# (case id, op name, inputs (schema order, outs excluded), outs by name, expected entry):
# the entry is the bound function's name, or "generic" when no fast entry applies (full_like.out
# and _to_copy.out take fewer arguments than their functional ops: no twin).
def _cases() -> list[tuple]:
    x, y = _r(2, 3), _r(2, 3)
    row = _r(3)
    xi = _r(2, 3, dtype=torch.int64)
    xd = _r(2, 3, dtype=torch.float64)
    img = _r(1, 3, 8, 8)
    w = _r(4, 3, 3, 3)
    f32, i64, b8 = torch.float32, torch.int64, torch.bool
    return [
        ("add", "aten::add.out", (x, y, 1), {"out": _e(2, 3)}, "add"),
        ("add_broadcast_alpha", "aten::add.out", (x, row, 2.5), {"out": _e(2, 3)}, "add"),
        ("add_int_float_promote", "aten::add.out", (xi, x, 1), {"out": _e(2, 3)}, "add"),
        ("add_scalar_f32", "aten::add.Scalar_out", (x, 0.1, 1), {"out": _e(2, 3)}, "add"),
        ("add_scalar_int_alpha", "aten::add.Scalar_out", (x, 3, 2), {"out": _e(2, 3)}, "add"),
        ("sub_scalar_f64", "aten::sub.Scalar_out", (xd, 0.3, 1),
         {"out": _e(2, 3, dtype=torch.float64)}, "sub"),
        ("mul_scalar_f32", "aten::mul.Scalar_out", (x, 1 / 3), {"out": _e(2, 3)}, "mul"),
        ("mul_scalar_i64", "aten::mul.Scalar_out", (xi, 7), {"out": _e(2, 3, dtype=i64)}, "mul"),
        ("mul_scalar_int_by_float", "aten::mul.Scalar_out", (xi, 0.5), {"out": _e(2, 3)},
         "mul"),
        ("mul_scalar_huge_int", "aten::mul.Scalar_out", (x, 2**40 + 1), {"out": _e(2, 3)},
         "mul"),
        ("mul_scalar_bool_tensor", "aten::mul.Scalar_out", (_r(2, 3, dtype=b8), 2),
         {"out": _e(2, 3, dtype=i64)}, "mul"),
        ("div_scalar", "aten::div.Scalar_out", (x, 3.0), {"out": _e(2, 3)}, "div"),
        ("div_scalar_int_true", "aten::div.Scalar_out", (xi, 2), {"out": _e(2, 3)}, "generic"),
        ("div_scalar_mode", "aten::div.Scalar_mode_out", (xi, 2, "floor"),
         {"out": _e(2, 3, dtype=i64)}, "div"),
        ("mul", "aten::mul.out", (x, row), {"out": _e(2, 3)}, "mul"),
        ("div_mode", "aten::div.out_mode", (x, y, "trunc"), {"out": _e(2, 3)}, "div"),
        ("eq_scalar", "aten::eq.Scalar_out", (xi, 1), {"out": _e(2, 3, dtype=b8)}, "eq"),
        ("lt_scalar_f32", "aten::lt.Scalar_out", (x, 0.25), {"out": _e(2, 3, dtype=b8)}, "lt"),
        ("ge_scalar_int_on_float", "aten::ge.Scalar_out", (x, 0), {"out": _e(2, 3, dtype=b8)},
         "ge"),
        ("pow_scalar", "aten::pow.Tensor_Scalar_out", (x.abs(), 0.5), {"out": _e(2, 3)}, "pow"),
        ("addmm", "aten::addmm.out", (row, x, _r(3, 3), 1, 1), {"out": _e(2, 3)}, "addmm"),
        ("addmm_beta_alpha", "aten::addmm.out", (row, x, _r(3, 3).t(), 0.5, 2.0),
         {"out": _e(2, 3)}, "addmm"),
        ("bmm", "aten::bmm.out", (_r(2, 3, 4), _r(2, 4, 5)), {"out": _e(2, 3, 5)}, "bmm"),
        ("relu", "aten::relu.out", (torch.tensor([-1.0, 0.0, float("nan"), 2.0]),),
         {"out": _e(4)}, "clamp_min"),
        ("relu_int", "aten::relu.out", (xi,), {"out": _e(2, 3, dtype=i64)}, "clamp_min"),
        ("sigmoid", "aten::sigmoid.out", (x,), {"out": _e(2, 3)}, "sigmoid"),
        ("gelu_tanh", "aten::gelu.out", (x, "tanh"), {"out": _e(2, 3)}, "gelu"),
        ("softmax", "aten::_softmax.out", (x, 1, False), {"out": _e(2, 3)}, "_softmax"),
        ("where", "aten::where.self_out", (x > 0, x, row), {"out": _e(2, 3)}, "where"),
        ("clamp", "aten::clamp.out", (x, -0.5, 0.5), {"out": _e(2, 3)}, "clamp"),
        ("mean_dim", "aten::mean.out", (x, [1], True, None), {"out": _e(2, 1)}, "mean"),
        ("sum_dim", "aten::sum.IntList_out", (x, [0], False, None), {"out": _e(3)}, "sum"),
        ("amax", "aten::amax.out", (x, [1], False), {"out": _e(2)}, "amax"),
        ("any", "aten::any.all_out", (x > 0,), {"out": _e((), dtype=b8)}, "any"),
        ("cat", "aten::cat.out", ([x, y], 0), {"out": _e(4, 3)}, "cat"),
        ("logical_not", "aten::logical_not.out", (x > 0,), {"out": _e(2, 3, dtype=b8)},
         "logical_not"),
        ("embedding", "aten::embedding.out", (_r(10, 4), torch.tensor([[1, 2], [9, 0]]), -1,
         False, False), {"out": _e(2, 2, 4)}, "run"),
        ("convolution", "aten::convolution.out", (img, w, _r(4), [1, 1], [1, 1], [1, 1], False,
         [0, 0], 1), {"out": _e(1, 4, 8, 8)}, "run"),
        ("max_pool2d_with_indices", "aten::max_pool2d_with_indices.out", (img, [2, 2], [2, 2],
         [0, 0], [1, 1], False), {"out": _e(1, 3, 4, 4), "indices": _e(1, 3, 4, 4, dtype=i64)},
         "max_pool2d_with_indices"),
        ("avg_pool2d", "aten::avg_pool2d.out", (img, [2, 2], [2, 2], [0, 0], False, True, None),
         {"out": _e(1, 3, 4, 4)}, "avg_pool2d"),
        ("upsample_nearest", "aten::upsample_nearest2d.vec_out", (img, None, [2.0, 2.0]),
         {"out": _e(1, 3, 16, 16)}, "run"),
        ("upsample_bilinear", "aten::upsample_bilinear2d.vec_out", (img, [12, 12], True, None),
         {"out": _e(1, 3, 12, 12)}, "run"),
        ("layer_norm", "aten::native_layer_norm.out", (_r(2, 3, 8), [8], _r(8), _r(8), 1e-5),
         {"out0": _e(2, 3, 8), "out1": _e(2, 3, 1), "out2": _e(2, 3, 1)}, "run_many"),
        ("batch_norm_no_training", "aten::_native_batch_norm_legit_no_training.out",
         (img, _r(3), _r(3), _r(3), _r(3).abs(), 0.1, 1e-5),
         {"out0": _e(1, 3, 8, 8), "out1": _e(0), "out2": _e(0)}, "_native_batch_norm_legit"),
        ("full_like", "aten::full_like.out", (x, 2.5, None), {"out": _e(2, 3)}, "generic"),
        ("select_copy", "aten::select_copy.int_out", (x, 1, 2), {"out": _e(2)}, "select_copy"),
        ("clone_contiguous", "aten::clone.out", (x.t(), torch.contiguous_format),
         {"out": _e(3, 2)}, "run"),
        ("view_copy", "aten::view_copy.out", (x, [3, 2]), {"out": _e(3, 2)}, "view_copy"),
        ("to_copy_dtype", "aten::_to_copy.out", (x, False, None),
         {"out": _e(2, 3, dtype=torch.float64)}, "generic"),
        ("f32_out_of_int_add", "aten::add.out", (xi, xi, 1), {"out": _e(2, 3, dtype=f32)},
         "add"),
    ]


CASES = _cases()


def _args(inputs: tuple, outs: dict) -> list:
    return [*inputs, *outs.values()]


def _fresh(outs: dict) -> dict:
    return {k: torch.full_like(v, 7) if v.numel() else torch.empty_like(v) for k, v in outs.items()}


def _op(name: str) -> torch._ops.OpOverload:
    ns_op, overload = name.split(".")
    return getattr(getattr(aten, ns_op.split("::")[1]), overload)


def _same(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


def _check_outs(name: str, got: dict, want: dict) -> None:
    for key, expected in want.items():
        if expected.numel() == 0 and name.endswith("no_training.out"):  # left empty by ATen
            assert got[key].numel() == 0
            continue
        _same(got[key], expected)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bound_kernel_matches_the_generic_overload(case):
    _, name, inputs, outs, entry = case
    torch.manual_seed(0)
    kernel = default_kernel_registry().lookup(name)
    want, got = _fresh(outs), _fresh(outs)
    positional, keywords = bindings.split_arguments(_op(name), _args(inputs, want))
    _op(name)._op(*positional, **keywords)
    with torch.no_grad():
        kernel.bind(_args(inputs, got))()
    _check_outs(name, got, want)
    call = bindings.fast_call(name, _op(name), _args(inputs, _fresh(outs)))
    chosen = "generic" if call is None else getattr(call.fn, "__name__", "?")
    assert chosen == entry, f"{name}: expected entry {entry}, got {chosen}"


@pytest.mark.parametrize(
    "case", [c for c in CASES if not isinstance(c[2][0], list)], ids=lambda c: c[0]
)
def test_changing_first_argument_is_passed_per_call(case):
    _, name, inputs, outs, _ = case
    kernel = default_kernel_registry().lookup(name)
    first = inputs[0]
    sample = torch.empty((0,) * first.dim(), dtype=first.dtype)
    got, want = _fresh(outs), _fresh(outs)
    with torch.no_grad():
        bound = kernel.bind([sample, *_args(inputs, got)[1:]], (0,))
        for _ in range(2):  # the same call, twice, with the real tensor
            bound(first.clone())
    positional, keywords = bindings.split_arguments(_op(name), _args(inputs, want))
    _op(name)._op(*positional, **keywords)
    _check_outs(name, got, want)


def test_unread_outs_are_not_written_and_the_read_one_matches():
    name = "aten::native_layer_norm.out"
    kernel = default_kernel_registry().lookup(name)
    x, w, b = torch.randn(2, 3, 8), torch.randn(8), torch.randn(8)
    outs = {"out0": _e(2, 3, 8), "out1": torch.full((2, 3, 1), 7.0),
            "out2": torch.full((2, 3, 1), 7.0)}
    with torch.no_grad():
        kernel.bind([x, [8], w, b, 1e-5, *outs.values()], (), (6, 7))()
    _same(outs["out0"], torch.native_layer_norm(x, [8], w, b, 1e-5)[0])
    assert outs["out1"].eq(7).all() and outs["out2"].eq(7).all()
    call = bindings.fast_call(name, _op(name), [x, [8], w, b, 1e-5, *outs.values()],
                              unread=frozenset({"out1", "out2"}))
    assert call is not None and call.fn.__name__ == "run"


def test_functional_copy_with_an_out_of_another_shape_runs_the_generic_overload():
    x = torch.randn(1, 3, 4, 4)
    w = torch.randn(2, 3, 1, 1)
    out = torch.empty(0)  # a dynamic out, emptied before the call: resized by the overload
    kernel = default_kernel_registry().lookup("aten::convolution.out")
    with torch.no_grad():
        kernel.bind([x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1, out])()
    _same(out, torch.convolution(x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1))


def test_dispatched_observes_the_overload_without_running_it():
    x, out = torch.ones(3), torch.full((3,), 5.0)
    assert bindings.dispatched(torch.add, (x, 2.0), {"out": out}) is aten.add.out
    assert out.eq(5).all()  # nothing ran
    assert bindings.dispatched(torch.layer_norm, (torch.ones(2, 4), [4]), {}) is (
        aten.native_layer_norm.default
    )
    assert bindings.dispatched(torch.add, ("not a tensor",), {}) is None


def test_scalar_stand_in_only_where_the_dtype_holds_the_scalar_exactly():
    f32, i32 = torch.ones(1), torch.ones(1, dtype=torch.int32)
    assert bindings._scalar_stand_in(f32, 0.1).dtype == torch.float32
    assert bindings._scalar_stand_in(f32, 2**24).item() == 2**24
    assert bindings._scalar_stand_in(f32, 2**24 + 1) is None
    assert bindings._scalar_stand_in(f32, True) is None  # a bool is no int here
    assert bindings._scalar_stand_in(i32, 1) is None
    assert bindings._scalar_stand_in(torch.ones(1, dtype=torch.int64), 0.5) is None


def test_a_custom_binder_may_decline_and_the_kernel_packs_arguments():
    from exportir.runtime import Kernel

    seen = []
    kernel = Kernel("mylib::f.out", lambda args: seen.append(list(args)), 2, (1,),
                    binder=lambda args, changing, unread, out: None)
    kernel.bind([1, 2], (0,))(5)
    kernel.bind([1, 2])()
    assert seen == [[5, 2], [1, 2]]
    assert kernel.bind_functional([1, 2], (0,)) is None


def test_functional_entry_returns_what_the_out_would_hold():
    x, y = torch.randn(2, 3), torch.randn(3)
    for name, args in [
        ("aten::mul.out", [x, y, _e(2, 3)]),
        ("aten::relu.out", [x, _e(2, 3)]),
        ("aten::addmm.out", [y, x, torch.randn(3, 3), 1, 1, _e(2, 3)]),
        ("aten::convolution.out", [torch.randn(1, 2, 4, 4), torch.randn(3, 2, 1, 1), None,
                                   [1, 1], [0, 0], [1, 1], False, [0, 0], 1, _e(1, 3, 4, 4)]),
    ]:
        kernel = default_kernel_registry().lookup(name)
        with torch.no_grad():
            got = kernel.bind_functional(args)()
        out = args[-1]
        positional, keywords = bindings.split_arguments(_op(name), args)
        _op(name)._op(*positional, **keywords)
        _same(got, out)
        assert got.stride() == out.stride()


def test_functional_entry_refuses_an_out_of_other_strides_or_dtype():
    x = torch.randn(2, 3)
    kernel = default_kernel_registry().lookup("aten::relu.out")
    assert kernel.bind_functional([x, _e(3, 2).t()]) is None  # column-major out
    assert kernel.bind_functional([x, _e(2, 3, dtype=torch.float64)]) is None
    two_outs = default_kernel_registry().lookup("aten::native_layer_norm.out")
    assert two_outs.bind_functional([x, [3], None, None, 1e-5, _e(2, 3), _e(2, 1),
                                     _e(2, 1)]) is None


@pytest.mark.parametrize("changing", [(1,), (2,), (0, 2), (1, 2), (0, 1, 2)])
def test_changing_arguments_at_any_positions(changing):
    bias, x, w = torch.randn(3), torch.randn(2, 4), torch.randn(4, 3)
    real = [bias, x, w, 0.5, 2.0]
    args = list(real)
    for p in changing:
        args[p] = torch.empty_like(real[p], device="meta")
    kernel = default_kernel_registry().lookup("aten::addmm.out")
    got = _e(2, 3)
    with torch.no_grad():
        kernel.bind([*args, got], changing)(*[real[p] for p in changing])
    _same(got, torch.addmm(bias, x, w, beta=0.5, alpha=2.0))


def test_kernels_of_torch_ops_are_shared_across_registries_but_registrations_are_not():
    from exportir.runtime.kernels import Kernel, KernelRegistry, default_kernel_registry

    first, second = default_kernel_registry(), default_kernel_registry()
    assert first.lookup("aten::add.out") is second.lookup("aten::add.out")  # made once
    custom = KernelRegistry()
    mine = Kernel("aten::add.out", lambda args: None, 4, (3,))
    custom.register(mine)
    assert custom.lookup("aten::add.out") is mine
    assert default_kernel_registry().lookup("aten::add.out") is not mine
