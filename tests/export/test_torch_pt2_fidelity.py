"""What torch.export's .pt2 keeps, kept both ways (docs/export.md, "What survives both ways"):
ranges of derived sizes (``Dim("d") + 1``, ``2 * d``) and the example inputs torch pickles,
with torch as the oracle."""

from __future__ import annotations

import io
import json
import warnings
import zipfile

import pytest
import torch
import torch.export as texport

import exportir
from exportir.export.serialize import SerializationError
from exportir.export.serialize.torch_expr import parse_range_key


class _Derived(torch.nn.Module):
    def forward(self, x, y, z):
        return x[1:] + y, z.reshape(-1, 2).sum(0) + y.sum()


class _OnlyDerived(torch.nn.Module):
    """The root dim appears only through ``d + 1``: nothing but the derived range bounds x."""

    def forward(self, x):
        return x[1:] * 2


def _derived_case():
    d = texport.Dim("d", min=3, max=100)
    args = (torch.randn(6, 3), torch.randn(5, 3), torch.randn(10))
    return _Derived(), args, {"x": {0: d + 1}, "y": {0: d}, "z": {0: 2 * d}}


def _save(ep) -> io.BytesIO:
    buf = io.BytesIO()
    texport.save(ep, buf)
    buf.seek(0)
    return buf


def _load(buf):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return exportir.load(buf)


def _outcome(module, args):
    try:
        return module(*args)
    except RuntimeError as e:
        return f"RuntimeError: {e}"


def _same(a, b) -> None:
    if isinstance(a, str) or isinstance(b, str):
        assert a == b
        return
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y)


def _renamed(ranges) -> dict[str, str]:
    """range_constraints as text with the one symbol named S (torch numbers its symbols)."""
    import re

    return {re.sub(r"s\d+", "S", str(k)): str(v) for k, v in ranges.items()}


PROBES = [  # (x rows, y rows, z length): in range, above, below, inconsistent
    (6, 5, 10), (101, 100, 200), (200, 199, 398), (3, 2, 4), (6, 5, 12), (6, 5, 11),
]


def test_derived_ranges_load_from_torch_and_are_enforced():
    model, args, shapes = _derived_case()
    tep = texport.export(model, args, dynamic_shapes=shapes)
    ep = _load(_save(tep))
    assert {str(k): str(v) for k, v in ep.range_constraints.items()} == \
        {str(k): str(v) for k, v in tep.range_constraints.items()}
    ours, theirs = ep.module(), tep.module(check_guards=False)  # torch's input checks
    for rows in PROBES:
        probe = tuple(torch.randn(n, 3) for n in rows[:2]) + (torch.randn(rows[2]),)
        _same(_outcome(ours, probe), _outcome(theirs, probe))


def test_a_derived_range_alone_bounds_its_input():
    d = texport.Dim("d", min=3, max=100)
    tep = texport.export(_OnlyDerived(), (torch.randn(6, 3),), dynamic_shapes={"x": {0: d + 1}})
    module = _load(_save(tep)).module()
    with pytest.raises(RuntimeError, match=r"args\[0\]\.shape\[0\] to be <= 101, but got 102"):
        module(torch.randn(102, 3))
    with pytest.raises(RuntimeError, match=r"args\[0\]\.shape\[0\] to be >= 4, but got 3"):
        module(torch.randn(3, 3))
    x = torch.randn(101, 3)
    torch.testing.assert_close(module(x), _OnlyDerived()(x))


def test_derived_ranges_saved_for_torch_equal_torch_export():
    model, args, shapes = _derived_case()
    ep = exportir.export(model, args, dynamic_shapes=shapes)
    buf = io.BytesIO()
    exportir.save(ep, buf, format="torch")
    buf.seek(0)
    loaded = texport.load(buf)
    assert _renamed(loaded.range_constraints) == \
        _renamed(texport.export(model, args, dynamic_shapes=shapes).range_constraints)
    for rows in PROBES:
        probe = tuple(torch.randn(n, 3) for n in rows[:2]) + (torch.randn(rows[2]),)
        _same(_outcome(loaded.module(check_guards=False), probe), _outcome(ep.module(), probe))


def test_from_torch_keeps_derived_ranges():
    model, args, shapes = _derived_case()
    tep = texport.export(model, args, dynamic_shapes=shapes)
    ep = exportir.from_torch(tep)
    assert {str(k): str(v) for k, v in ep.range_constraints.items()} == \
        {str(k): str(v) for k, v in tep.range_constraints.items()}


@pytest.mark.parametrize("text, expected", [
    ("s0", "s0"),
    ("s17 + 1", ["+", "s17", 1]),
    ("2*s0 - 1", ["+", ["*", 2, "s0"], ["*", -1, 1]]),
    ("-s0 + 5", ["+", ["*", -1, "s0"], 5]),
    ("((2*s0)//2)", ["//", ["*", 2, "s0"], 2]),
    ("Max(2, s0)", ["max", 2, "s0"]),
    ("s0/2 + s1**2", ["+", ["*", "s0", ["q", 1, 2]], ["**", "s1", 2]]),
])
def test_range_keys_parse_with_the_infix_grammar(text, expected):
    assert parse_range_key(text, "k") == expected


@pytest.mark.parametrize("text, match", [
    ("__import__('os').system('true')", "not a call a range key may hold"),
    ("eval(1)", "not a call"),
    ("lambda: 0", "unexpected text"),
    ("s0 +", "unexpected end"),
    ("s0)", "trailing text"),
    ("s0/s1", "nonzero integer divisor"),
    ("(" * 100 + "s0" + ")" * 100, "nested too deeply"),
    ("1" * 5000, "exceeds"),
])
def test_hostile_range_keys_are_refused(text, match):
    with pytest.raises(SerializationError, match=match):
        parse_range_key(text, "k")


def _members(buf: io.BytesIO) -> dict[str, bytes]:
    with zipfile.ZipFile(buf) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def _zip(members: dict[str, bytes]) -> io.BytesIO:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    out.seek(0)
    return out


def _edit_ranges(edit) -> io.BytesIO:
    model, args, shapes = _derived_case()
    members = _members(_save(texport.export(model, args, dynamic_shapes=shapes)))
    name = next(n for n in members if n.endswith("models/model.json"))
    program = json.loads(members[name])
    edit(program["range_constraints"])
    members[name] = json.dumps(program).encode()
    return _zip(members)


def test_a_hostile_range_key_in_a_file_names_the_key():
    buf = _edit_ranges(lambda r: r.update({"__import__('os').system('x')": {"min_val": 0,
                                                                             "max_val": 1}}))
    with pytest.raises(SerializationError, match=r"range_constraints/__import__"):
        _load(buf)


def test_a_range_key_over_symbols_the_graph_lacks_is_dropped_as_torch_does():
    buf = _edit_ranges(lambda r: r.update({"s99 + 1": {"min_val": 0, "max_val": 1}}))
    assert "s99 + 1" not in {str(k) for k in _load(buf).range_constraints}
