"""What loading a fused_cpu blob costs: the schema table read once per op name agrees with
torch's schemas, decode's normalized arguments are what the executor binds, the package's value
types are no dataclasses (their creation was most of the backend's first import), and a packed
weight is the only copy the loaded delegate holds next to the program's bytes."""

from __future__ import annotations

import dataclasses
import inspect
import pickle

import pytest
import torch
from test_delegate_blobs import _pointwise_conv, delegated_file, fused_blob

from exportir.runtime import Program
from exportir.runtime.backends import fused_cpu
from exportir.runtime.backends.fused_cpu import (
    dynamic_int8,
    executor,
    kernels,
    limits,
    plan,
    quantized,
    rnn,
    sized_conv,
)
from exportir.runtime.backends.fused_cpu import format as blob_format
from exportir.runtime.backends.fused_cpu.kernels import KERNELS, Ref, bind, normalize
from exportir.runtime.backends.fused_cpu.sized_conv import ConvPointwise


def test_signature_table_agrees_with_torch_schemas():
    for name in KERNELS:
        schema = kernels.op_schema(name)
        sig = kernels._signature(name)
        assert [p.name for p in sig.params] == [a.name for a in schema.arguments], name
        for p, a in zip(sig.params, schema.arguments):
            assert (p.kwarg_only, p.has_default, p.type_text) == (
                a.kwarg_only, a.has_default_value(), str(a.type)), (name, a.name)
            if a.has_default_value():
                assert p.default == a.default_value, (name, a.name)
        assert sig.returns == tuple(str(r.type) for r in schema.returns), name


_OPS = [
    ["aten.add.Tensor", [{"v": 0}, {"v": 1}], {"alpha": 2}, 3, "add"],
    ["aten.view_copy.default", [{"v": 3}, [3, 2]], {}, 4, "view"],
    ["aten._softmax.default", [{"v": 4}, -1, False], {}, 2, "softmax"],
]


def test_decoded_rows_carry_their_normalized_arguments_and_bind_from_them():
    blob = blob_format.decode_blob(fused_blob(_OPS, torch.ones(2, 3)).replace(
        b'"values": 3', b'"values": 5'))  # fmt: skip
    for row in blob.ops:
        assert row.normalized == normalize(row.name, row.args, row.kwargs)
        assert bind(row.name, row.args, row.kwargs, normalized=row.normalized) == bind(
            row.name, row.args, row.kwargs)
    x = torch.randn(2, 3)
    (out,) = fused_cpu.run(executor.build(blob), [x])
    torch.testing.assert_close(out, torch.softmax((x + 2).view(3, 2), -1))


def test_ref_is_an_immutable_hashable_value():
    assert Ref(3) == Ref(3) and Ref(3) != Ref(4) and Ref(3) != (3,)
    assert len({Ref(3), Ref(3), Ref(4)}) == 2
    assert pickle.loads(pickle.dumps(Ref(5))) == Ref(5)
    assert repr(Ref(2)) == "Ref(slot=2)"
    with pytest.raises(AttributeError, match="immutable"):
        Ref(1).slot = 2
    with pytest.raises(AttributeError, match="immutable"):
        del Ref(1).slot


@pytest.mark.parametrize("module", [executor, blob_format, kernels, limits, plan, quantized, rnn,
                                    dynamic_int8, sized_conv])
def test_fused_value_types_are_not_dataclasses(module):
    # a frozen dataclass compiles its methods from source when its module is imported (~0.6 ms
    # a class, paid by the first load of every fused program): keep them out of this package
    made = [c for _, c in inspect.getmembers(module, inspect.isclass)
            if c.__module__ == module.__name__ and dataclasses.is_dataclass(c)]  # fmt: skip
    assert not made, f"{module.__name__}: {made} are dataclasses; make them namedtuples (kernels.py)"


def test_a_packed_weight_is_the_only_copy_next_to_the_program_bytes():
    if not kernels._MKLDNN:
        pytest.skip("this torch has no oneDNN: weights are not packed")
    weight = torch.randn(4, 3, 1, 1)
    data = delegated_file(fused_blob([_pointwise_conv([1, 1])], weight), (1, 3, 5, 5),
                          (1, 4, 5, 5))  # fmt: skip
    program = Program.load(data)
    handle = program._handles[0][1]
    start = torch.frombuffer(data, dtype=torch.uint8).data_ptr()
    held = [v for v in handle.fn.__globals__.values() if isinstance(v, torch.Tensor)]
    (conv,) = [v for v in handle.fn.__globals__.values() if isinstance(v, ConvPointwise)]
    assert not any(t.is_mkldnn for t in held) and conv.weight.packed is None
    x = torch.randn(1, 3, 5, 5)
    expected = torch.nn.functional.conv2d(x, weight)
    torch.testing.assert_close(program.method()(x)[0], expected, rtol=1e-4, atol=1e-4)
    assert conv.weight.packed.is_mkldnn  # packed by the first call, for its input
    # every dense tensor views the file (the weight packing started from, too)
    for t in (*held, conv.weight.plain, *(c for _, c in handle.constants)):
        assert start <= t.data_ptr() < start + len(data)


def test_records_behave_as_the_namedtuples_they_replace():
    from exportir.runtime.backends.fused_cpu.records import record

    Row = record("Row", "a b c", defaults=(3,))
    r = Row(1, 2)
    assert r == (1, 2, 3) and tuple(r) == (1, 2, 3) and hash(r) == hash((1, 2, 3))
    assert (r.a, r.b, r.c) == (1, 2, 3) and Row(1, b=2, c=4).c == 4 and Row(a=1, b=2) == r
    assert r._replace(b=5) == Row(1, 5, 3) and type(r._replace(a=0)) is Row
    assert repr(r) == "Row(a=1, b=2, c=3)" and Row._fields == ("a", "b", "c")
    p = plan.Plan({1: 0}, {}, {1: 1}, frozenset(), frozenset(), frozenset())
    assert pickle.loads(pickle.dumps(p)) == p and type(pickle.loads(pickle.dumps(p))) is plan.Plan
    with pytest.raises(AttributeError):
        r.a = 4
    for bad, why in [(lambda: Row(1), "missing 'b'"), (lambda: Row(1, 2, 3, 4), "takes 3"),
                     (lambda: Row(1, 2, d=1), "unexpected argument 'd'"),
                     (lambda: Row(1, 2, a=1), "repeated argument 'a'"),
                     (lambda: r._replace(d=1), "unexpected fields")]:  # fmt: skip
        with pytest.raises(TypeError, match=why):
            bad()


@pytest.mark.parametrize("module", [executor, blob_format, kernels, limits, plan, quantized, rnn,
                                    dynamic_int8, sized_conv])
def test_fused_value_types_are_records_not_namedtuples(module):
    # collections.namedtuple eval()s source for each type it makes (~0.15 ms): records do not
    made = [c for _, c in inspect.getmembers(module, inspect.isclass)
            if c.__module__ == module.__name__ and issubclass(c, tuple)
            and any("_make" in vars(b) for b in c.__mro__)]  # fmt: skip
    assert not made, f"{module.__name__}: {made} are namedtuples; make them records (.records)"
