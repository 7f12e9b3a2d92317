"""``operator_schemas`` against ``torch.fx.operator_schemas``: signatures read from schemas,
argument normalization, type matching and the mutation check."""

from __future__ import annotations

import importlib
import numbers
import re
import typing
import warnings

import pytest
import torch
import torch.fx.operator_schemas as theirs
import torch.nn.functional as F
from conftest import ours_fx_name

mine = importlib.import_module(f"{ours_fx_name()}.operator_schemas")


def _outcome(fn, *args, **kwargs):
    """A comparable summary: the repr of the value, or the exception type and message."""
    try:
        value = fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001  # compared with torch's outcome
        return (type(e).__name__, str(e))
    return re.sub(r" at 0x[0-9a-f]+", "", repr(value))


def _signature_text(module, schema):
    return _outcome(lambda: str(module._torchscript_schema_to_signature_impl(schema)))


def test_every_registered_schema_gives_torchs_signature():
    """All ~4,400 operator schemas: same parameters, kinds, defaults, annotations, returns."""
    schemas = torch._C._jit_get_all_schemas()
    assert len(schemas) > 1000
    diffs = [str(s) for s in schemas if _signature_text(mine, s) != _signature_text(theirs, s)]
    assert diffs == []


@pytest.mark.parametrize("op", [
    torch.add, torch.sum, torch.cat, torch.clamp, torch.nonzero, torch.rand_like,
    torch.ops.aten.add.Tensor, torch.ops.aten.add, torch.ops.aten.uniform_.default, len, abs,
    F.relu, lambda x: x,
], ids=lambda op: getattr(op, "__name__", str(op)))
@pytest.mark.parametrize("return_schemas", [False, True])
def test_get_signature_for_torch_op_matches_torch(op, return_schemas):
    assert _outcome(mine.get_signature_for_torch_op, op, return_schemas) == _outcome(
        theirs.get_signature_for_torch_op, op, return_schemas)


x = torch.arange(6.0).reshape(2, 3)

NORMALIZE = [
    (torch.add, (x, x), {}, None, None),
    (torch.add, (x, 2), {}, None, None),
    (torch.add, (x, x), {}, (torch.Tensor, torch.Tensor), None),
    (torch.add, (x, 2), {}, (torch.Tensor, int), None),
    (torch.add, (x, 2), {}, (torch.Tensor, str), None),
    (torch.sum, (x,), {}, None, None),
    (torch.sum, (x,), {"dim": 1}, None, None),
    (torch.sum, (x, 1), {}, (torch.Tensor, int), None),
    (torch.nonzero, (x,), {}, None, None),
    (torch.clamp, (x,), {"min": 0.0}, None, None),
    (torch.clamp, (x, 0.0), {}, (torch.Tensor, float), None),
    (torch.clamp, (x,), {"min": x}, None, {"min": torch.Tensor}),
    (torch.cat, ([x, x],), {}, None, None),
    (torch.cat, ([x, x], 1), {}, (list[torch.Tensor], int), None),
    (torch.mean, (x,), {"dim": [0]}, None, None),
    (torch.mean, (x, [0]), {}, (torch.Tensor, list[int]), None),
    (torch.mean, (x, (0,)), {}, (torch.Tensor, tuple[int]), None),
    (torch.transpose, (x, 0, 1), {}, (torch.Tensor, int, int), None),
    (torch.ops.aten.add.Tensor, (x, x), {}, None, None),
    (torch.ops.aten.add, (x, x), {}, None, None),
    (torch.ops.aten.add, (x, x), {}, (torch.Tensor, torch.Tensor), None),
    (torch.ops.aten.uniform_.default, (x, 0.0, 1.0), {}, None, None),
    (F.max_pool2d, (x.view(1, 1, 2, 3), 2), {}, None, None),
    (F.adaptive_max_pool1d, (x.view(1, 2, 3), 2), {}, None, None),
    (F.relu, (x,), {}, None, None),
    (F.dropout, (x,), {"p": 0.2}, None, None),
    (F.layer_norm, (x, [3]), {}, None, None),
    (len, ([1, 2],), {}, None, None),
]


@pytest.mark.parametrize("only_kwargs", [False, True])
@pytest.mark.parametrize("target, args, kwargs, arg_types, kwarg_types", NORMALIZE,
                         ids=[f"{getattr(c[0], '__name__', c[0])}-{i}"
                              for i, c in enumerate(NORMALIZE)])
def test_normalize_function_matches_torch(target, args, kwargs, arg_types, kwarg_types,
                                          only_kwargs):
    call = (target, args, kwargs, arg_types, kwarg_types, only_kwargs)
    assert _outcome(mine.normalize_function, *call) == _outcome(theirs.normalize_function, *call)
    assert _outcome(mine._normalize_function_or_error, *call) == _outcome(
        theirs._normalize_function_or_error, *call)


class _EdgeLike:
    """Wraps an OpOverload the way ExecuTorch's EdgeOpOverload does (``_op``)."""

    def __init__(self, op):
        self._op = op

    def __call__(self, *args, **kwargs):
        return self._op(*args, **kwargs)


def test_normalize_unwraps_edge_style_ops_like_torch():
    call = (_EdgeLike(torch.ops.aten.add.Tensor), (x, x), {}, None, None, True)
    expected = _outcome(theirs.normalize_function, *call)
    assert _outcome(mine.normalize_function, *call) == expected
    assert "alpha" in expected


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)
        self.custom = _EdgeLike(None)


@pytest.mark.parametrize("target", ["lin", "missing"])
@pytest.mark.parametrize("only_kwargs", [False, True])
def test_normalize_module_matches_torch(target, only_kwargs):
    root = _Net()
    call = (root, target, (x,), None, only_kwargs)
    assert _outcome(mine.normalize_module, *call) == _outcome(theirs.normalize_module, *call)


TYPE_PAIRS = [
    (int, int), (int, bool), (int, torch.dtype), (float, int), (numbers.Number, int),
    (numbers.Number, float), (numbers.Number, complex), (torch.Tensor, torch.nn.Parameter),
    (typing.Optional[torch.Tensor], torch.Tensor),  # noqa: UP045  # schema spelling
    (typing.Optional[torch.Tensor], type(None)),  # noqa: UP045
    (typing.Union[int, str], str),  # noqa: UP007
    (typing.List[int], int),  # noqa: UP006
    (typing.List[int], list[int]),  # noqa: UP006
    (typing.List[int], list[bool]),  # noqa: UP006
    (typing.List[torch.Tensor], tuple[torch.Tensor, ...]),  # noqa: UP006
    (typing.List[torch.Tensor], tuple[torch.Tensor, int]),  # noqa: UP006
    (typing.List[int], typing.Tuple[()]),  # noqa: UP006
    (typing.List[typing.Optional[int]], list[int]),  # noqa: UP006, UP045
    (str, int), (list, list),
]


@pytest.mark.parametrize("signature_type, argument_type", TYPE_PAIRS, ids=str)
def test_type_matches_matches_torch(signature_type, argument_type):
    with warnings.catch_warnings(record=True) as ours_warned:
        warnings.simplefilter("always")
        got = mine.type_matches(signature_type, argument_type)
    with warnings.catch_warnings(record=True) as theirs_warned:
        warnings.simplefilter("always")
        expected = theirs.type_matches(signature_type, argument_type)
    assert got == expected
    assert [str(w.message) for w in ours_warned] == [str(w.message) for w in theirs_warned]


@pytest.mark.parametrize("value", [
    [int, bool], [bool, int], (int,), (int, str), [], (), [torch.nn.Module, torch.nn.Linear],
    int, "text", [1, 2],
], ids=repr)
def test_create_type_hint_matches_torch(value):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert mine.create_type_hint(value) == theirs.create_type_hint(value)


@pytest.mark.parametrize("target, args, kwargs", [
    (torch.add, (x, x), {"out": x}),
    (torch.add, (x, x), {}),
    (torch.sum, (x,), {}),
    (torch.nonzero, (x,), {"out": x}),
    (len, ([1],), {}),
], ids=["add_out", "add", "sum", "nonzero_out", "len"])
def test_check_for_mutable_operation_matches_torch(target, args, kwargs):
    assert _outcome(mine.check_for_mutable_operation, target, args, kwargs) == _outcome(
        theirs.check_for_mutable_operation, target, args, kwargs)
