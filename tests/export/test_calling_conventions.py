"""Every calling convention of ``forward``: exported, named and replayed by ``ep.module()`` as
torch.export does (torch.export(strict=False) is the oracle for placeholder names, the root
call signature's ``forward_arg_names`` and the ``in_spec``)."""

from __future__ import annotations

import inspect

import pytest
import torch

from exportir import pytree
from exportir.export import export
from exportir.export.capture._inputs import InputBindingError


def _t() -> torch.Tensor:
    return torch.randn(3)


def _pos(self, x, y):
    return x + y


def _varargs(self, *args):
    return args[0] * args[1]


def _pos_varargs(self, x, *args):
    return x * args[0] - args[1]


def _kwonly(self, x, *, k):
    return x * k


def _varkw(self, x, **kw):
    return x * kw["a"] - kw["b"]


def _default(self, x, y=None, n=2):
    return x * n if y is None else x + y * n


def _mixed(self, a, b=2, *args, c, d=3, **kw):
    out = a * b + c * d + kw["e"]
    for x in args:
        out = out * x
    return out


def _nested(self, x, *args, **kw):
    return x * args[0][0] * kw["d"]["q"] + args[1]["r"]


# name -> (forward, args, kwargs)
CONVENTIONS = {
    "positional": (_pos, lambda: (_t(), _t()), dict),
    "varargs": (_varargs, lambda: (_t(), _t()), dict),
    "positional_and_varargs": (_pos_varargs, lambda: (_t(), _t(), _t()), dict),
    "keyword_only": (_kwonly, lambda: (_t(),), lambda: {"k": _t()}),
    "var_keyword": (_varkw, lambda: (_t(),), lambda: {"b": _t(), "a": _t()}),
    "default_left_out": (_default, lambda: (_t(),), dict),
    "default_passed": (_default, lambda: (_t(), _t(), 3), dict),
    "default_by_keyword": (_default, lambda: (_t(),), lambda: {"n": 4, "y": _t()}),
    "args_by_keyword": (_pos, tuple, lambda: {"y": _t(), "x": _t()}),
    "mixed": (_mixed, lambda: (_t(), _t(), _t(), _t()), lambda: {"c": _t(), "e": _t()}),
    "mixed_keywords_first": (_mixed, lambda: (_t(),), lambda: {"e": _t(), "c": _t(), "b": _t()}),
    "nested": (_nested, lambda: (_t(), (_t(),), {"r": _t()}), lambda: {"d": {"q": _t()}}),
}


def _module(forward):
    cls = type("M", (torch.nn.Module,), {"forward": forward})
    return cls()


def _case(name):
    forward, make_args, make_kwargs = CONVENTIONS[name]
    torch.manual_seed(0)
    return _module(forward), make_args(), make_kwargs()


def _signature(ep):
    names = [spec.arg.name for spec in ep.graph_signature.input_specs]
    root = ep.module_call_graph[0].signature
    in_spec = pytree.from_torch_treespec(ep.call_spec.in_spec) if not isinstance(
        ep.call_spec.in_spec, pytree.TreeSpec) else ep.call_spec.in_spec
    return names, root.forward_arg_names, str(in_spec)


@pytest.mark.parametrize("name", list(CONVENTIONS))
def test_signature_matches_torch(name):
    m, args, kwargs = _case(name)
    ours = _signature(export(m, args, kwargs))
    theirs = _signature(torch.export.export(m, args, kwargs, strict=False))
    assert ours == theirs


@pytest.mark.parametrize("name", list(CONVENTIONS))
def test_module_replays_the_convention(name):
    m, args, kwargs = _case(name)
    module = export(m, args, kwargs).module()
    torch.testing.assert_close(module(*args, **kwargs), m(*args, **kwargs))
    # new values, same structure
    fresh = pytree.tree_map(lambda v: v + 1 if isinstance(v, torch.Tensor) else v, (args, kwargs))
    torch.testing.assert_close(module(*fresh[0], **fresh[1]), m(*fresh[0], **fresh[1]))


def test_module_forward_parameters_are_torch_names():
    m, args, kwargs = _case("mixed")
    module = export(m, args, kwargs).module()
    params = list(inspect.signature(module.forward).parameters)
    assert params == ["a", "b", "args_0", "args_1", "c", "e"]


def test_module_accepts_keywords_in_another_order():
    m, args, kwargs = _case("var_keyword")
    module = export(m, args, kwargs).module()
    reordered = dict(reversed(list(kwargs.items())))
    torch.testing.assert_close(module(*args, **reordered), m(*args, **kwargs))


def test_module_rejects_a_different_convention():
    m, args, kwargs = _case("keyword_only")
    module = export(m, args, kwargs).module()
    with pytest.raises(ValueError, match="kwarg keyword mismatch"):
        module(args[0], kwargs["k"])


def test_example_inputs_that_do_not_bind_name_forward_and_the_fix():
    m, args, kwargs = _case("keyword_only")
    with pytest.raises(InputBindingError) as info:
        export(m, args + (kwargs["k"],))
    text = str(info.value)
    assert "too many positional arguments" in text
    assert "Keyword-only parameter(s) ['k'] must be given in kwargs ({'k': ...})" in text
    assert f'File "{__file__}", line {_kwonly.__code__.co_firstlineno}, in _kwonly' in text
    assert "forward(x, *, k)" in text
    # the fix the message gives: the keyword input in kwargs
    export(m, args, {"k": kwargs["k"]})


def test_function_export_names_its_parameters():
    def f(x, *rest, scale):
        return x * rest[0] * scale

    args, kwargs = (_t(), _t()), {"scale": _t()}
    ep = export(f, args, kwargs)
    assert [s.arg.name for s in ep.graph_signature.input_specs] == ["x", "rest_0", "scale"]
    torch.testing.assert_close(ep.module()(*args, **kwargs), f(*args, **kwargs))
