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
from pt2_members import load_quietly, members, torch_saved, zip_members

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
    ep = load_quietly(torch_saved(tep))
    assert {str(k): str(v) for k, v in ep.range_constraints.items()} == \
        {str(k): str(v) for k, v in tep.range_constraints.items()}
    ours, theirs = ep.module(), tep.module(check_guards=False)  # torch's input checks
    for rows in PROBES:
        probe = tuple(torch.randn(n, 3) for n in rows[:2]) + (torch.randn(rows[2]),)
        _same(_outcome(ours, probe), _outcome(theirs, probe))


def test_a_derived_range_alone_bounds_its_input():
    d = texport.Dim("d", min=3, max=100)
    tep = texport.export(_OnlyDerived(), (torch.randn(6, 3),), dynamic_shapes={"x": {0: d + 1}})
    module = load_quietly(torch_saved(tep)).module()
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


_members, _zip = members, zip_members


def _edit_ranges(edit) -> io.BytesIO:
    model, args, shapes = _derived_case()
    members = _members(torch_saved(texport.export(model, args, dynamic_shapes=shapes)))
    name = next(n for n in members if n.endswith("models/model.json"))
    program = json.loads(members[name])
    edit(program["range_constraints"])
    members[name] = json.dumps(program).encode()
    return _zip(members)


def test_a_hostile_range_key_in_a_file_names_the_key():
    buf = _edit_ranges(lambda r: r.update({"__import__('os').system('x')": {"min_val": 0,
                                                                             "max_val": 1}}))
    with pytest.raises(SerializationError, match=r"range_constraints/__import__"):
        load_quietly(buf)


def test_a_range_key_over_symbols_the_graph_lacks_is_dropped_as_torch_does():
    buf = _edit_ranges(lambda r: r.update({"s99 + 1": {"min_val": 0, "max_val": 1}}))
    assert "s99 + 1" not in {str(k) for k in load_quietly(buf).range_constraints}


# --------------------------------------------------------------------------- example inputs


class _Inputs(torch.nn.Module):
    def forward(self, x, y, z=None, *, k, n=3, flags=(True, 1.5, "s")):
        return x[1:] + y + k + n


def _inputs_case():
    x = torch.randn(6, 3)
    return _Inputs(), (x, x[1:], None), {"k": torch.arange(3.0), "n": 2, "flags": [False, 2.5, "t"]}


def _same_tree(a, b) -> None:
    fa, sa = torch.utils._pytree.tree_flatten(a)
    fb, sb = torch.utils._pytree.tree_flatten(b)
    assert sa == sb
    for x, y in zip(fa, fb, strict=True):
        if isinstance(x, torch.Tensor):
            assert type(y) is torch.Tensor and x.dtype == y.dtype and x.stride() == y.stride()
            assert x.requires_grad == y.requires_grad
            torch.testing.assert_close(x, y, rtol=0, atol=0)
        else:
            assert type(x) is type(y) and x == y


def test_example_inputs_load_from_torch_as_torch_loads_them():
    model, args, kwargs = _inputs_case()
    buf = torch_saved(texport.export(model, args, kwargs))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ep = exportir.load(buf)
    assert not [w for w in caught if "sample_inputs" in str(w.message)]  # nothing skipped
    buf.seek(0)
    theirs = texport.load(buf).example_inputs
    _same_tree(ep.example_inputs, theirs)
    x, y = ep.example_inputs[0][:2]
    assert x.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()  # y is x[1:]
    torch.testing.assert_close(ep.module()(*ep.example_inputs[0], **ep.example_inputs[1]),
                               model(*args, **kwargs))


def test_example_inputs_saved_for_torch():
    model, args, kwargs = _inputs_case()
    ep = exportir.export(model, args, kwargs)
    buf = io.BytesIO()
    exportir.save(ep, buf, format="torch")
    buf.seek(0)
    _same_tree(texport.load(buf).example_inputs, ep.example_inputs)
    buf.seek(0)
    _same_tree(load_quietly(buf).example_inputs, ep.example_inputs)


def test_inputs_a_reader_would_refuse_are_not_written():
    class Box:
        pass

    ep = exportir.export(_OnlyDerived(), (torch.randn(4, 3),))
    ep.example_inputs = ((torch.randn(4, 3),), {})
    ep._example_inputs = ((torch.randn(4, 3), Box()), {})  # what a user's tree might hold
    buf = io.BytesIO()
    with pytest.warns(UserWarning, match="hold a .*Box; they are not written"):
        exportir.save(ep, buf, format="torch")
    buf.seek(0)
    assert load_quietly(buf).example_inputs is None


# hand-written pickle streams (protocol 2), each wrapped as torch.save's zip
_CANARY = "CANARY"


def _stream(body: bytes) -> bytes:
    return b"\x80\x02" + body + b"."


def _global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _text(s: str) -> bytes:
    return b"X" + len(s).to_bytes(4, "little") + s.encode()


def _call(module: str, name: str, arg: str) -> bytes:
    return _global(module, name) + _text(arg) + b"\x85R"  # TUPLE1, REDUCE


def _tensor(key: str = "0", numel: int = 3, size: int = 3, offset: int = 0,
            storage: str = "FloatStorage", device: str = "cpu") -> bytes:
    pid = (b"(" + _text("storage") + _global("torch", storage) + _text(key) + _text(device)
           + b"J" + numel.to_bytes(4, "little") + b"tQ")
    return (_global("torch._utils", "_rebuild_tensor_v2") + b"(" + pid
            + b"J" + offset.to_bytes(4, "little") + b"J" + size.to_bytes(4, "little") + b"\x85"
            + b"K\x01\x85" + b"\x89" + _global("collections", "OrderedDict") + b")R" + b"tR")


def _inputs(*leaves: bytes) -> bytes:
    return _stream(b"(" + b"".join(leaves) + b"t}\x86")  # ((leaves...), {})


def _torch_save_zip(pkl: bytes, storages: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        zf.writestr("archive/data.pkl", pkl)
        zf.writestr("archive/byteorder", "little")
        zf.writestr("archive/version", "3\n")
        for key, data in storages.items():
            zf.writestr(f"archive/data/{key}", data)
    return out.getvalue()


def _with_samples(pkl: bytes, storages: dict[str, bytes] | None = None) -> io.BytesIO:
    buf = torch_saved(texport.export(_OnlyDerived(), (torch.randn(4, 3),)))
    members = _members(buf)
    name = next(n for n in members if "/data/sample_inputs/" in n)
    members[name] = _torch_save_zip(pkl, storages if storages is not None else
                                    {"0": torch.arange(3.0).numpy().tobytes()})
    return _zip(members)


def test_a_hand_written_stream_reads_as_torch_load_reads_it():
    storage = {"0": torch.arange(12.0).numpy().tobytes()}
    pkl = _inputs(_tensor(numel=12, size=4, offset=8))
    ep = load_quietly(_with_samples(pkl, storage))
    _same_tree(ep.example_inputs, torch.load(io.BytesIO(_torch_save_zip(pkl, storage)),
                                             weights_only=True))


@pytest.mark.parametrize("module, name", [("os", "system"), ("posix", "system"),
                                          ("builtins", "eval"), ("builtins", "exec"),
                                          ("subprocess", "getoutput")])
def test_a_stream_naming_a_callable_is_refused_and_nothing_runs(tmp_path, module, name):
    canary = tmp_path / _CANARY
    code = {"system": f"touch {canary}", "getoutput": f"touch {canary}",
            "eval": f"open({str(canary)!r}, 'w')", "exec": f"open({str(canary)!r}, 'w')"}[name]
    buf = _with_samples(_inputs(_call(module, name, code)))
    with pytest.warns(UserWarning, match=rf"sample_inputs/model\.pt: .*data\.pkl: GLOBAL "
                                         rf"'{module}\.{name}' .*\(opcode at byte 3\)"):
        ep = exportir.load(buf)
    assert ep.example_inputs is None
    assert not canary.exists()


def _hooks() -> bytes:
    return _global("collections", "OrderedDict") + b")R"


@pytest.mark.parametrize("pkl, storages, match", [
    (_inputs(_tensor(numel=4)), None, "data/0: member has 12 bytes, .* says 16"),
    (_inputs(_tensor(size=9, numel=3)), None, "needs 9 elements"),
    (_inputs(_tensor(offset=3)), None, "needs 6 elements, storage 0 has 3"),
    (_inputs(_tensor(key="../x")), None, "not a member name"),
    (_inputs(_tensor(key="7")), None, "data/7 is missing"),
    (_inputs(_tensor(device="cuda:0")), None, "only cpu"),
    (_inputs(_tensor(storage="UntypedStorage")), None, "GLOBAL 'torch.UntypedStorage'"),
    (_inputs(_global("torch", "FloatStorage") + b")R"), None, "REDUCE calls torch.FloatStorage"),
    (_inputs(_hooks()), None, "input of kind Hooks"),
    (_inputs(_global("torch._utils", "_rebuild_tensor_v2")), None, "input of kind Global"),
    (_stream(b"]q\x00h\x00a" + b"\x85}\x86"), None, "nest deeper"),  # a list holding itself
    (_stream(_text("x") + b"}\x86"), None, r"not \(args tuple, kwargs dict"),
    (_stream(b"(t]\x86"), None, "not .args tuple"),
    (_stream(b"(t}]Ns\x86"), None, "dict key of type list"),
    (_inputs(b"}" + b"N" + b"b"), None, "opcode BUILD"),
    (_inputs(b"(" + _global("builtins", "object") + b"o"), None, "GLOBAL 'builtins.object'"),
    (_inputs(b"I1\n"), None, "opcode INT"),
    (b"\x80\x02(N", None, "without STOP|not a pickle stream"),
    (b"\x80\x02X\xff\xff\xff\x7fab", None, "not a pickle stream"),
    (b"\x80\x02h\x05.", None, "memo entry 5"),
    (b"\x80\x02t.", None, "no MARK"),
    (b"\x80\x09N.", None, "protocol"),
])
def test_hostile_sample_streams_fall_back_with_typed_reasons(pkl, storages, match):
    buf = _with_samples(pkl, storages)
    with pytest.warns(UserWarning, match=match):
        ep = exportir.load(buf)
    assert ep.example_inputs is None


def test_inputs_that_do_not_fit_the_program_are_skipped():
    buf = _with_samples(_inputs(_tensor(), _tensor()))  # the program takes one input
    with pytest.warns(UserWarning, match="do not fit the program's inputs"):
        ep = exportir.load(buf)
    assert ep.example_inputs is None


def test_a_global_is_never_imported(tmp_path, monkeypatch):
    canary = tmp_path / _CANARY
    (tmp_path / "exportir_canary_module.py").write_text(
        f"open({str(canary)!r}, 'w').close()\ndef f(*a): open({str(canary)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    buf = _with_samples(_inputs(_call("exportir_canary_module", "f", "x")))
    with pytest.warns(UserWarning, match="'exportir_canary_module.f' .* was not imported"):
        assert exportir.load(buf).example_inputs is None
    assert not canary.exists()
    assert "exportir_canary_module" not in __import__("sys").modules


# --------------------------------------------------------------------------- whole corpus


def _plain_tree(value) -> bool:
    if type(value) is torch.Tensor:
        return value.device.type == "cpu" and value.dtype not in (torch.uint16, torch.uint32,
                                                                  torch.uint64)
    if type(value) in (tuple, list):
        return all(_plain_tree(v) for v in value)
    if type(value) is dict:
        return all(type(k) in (str, int) and _plain_tree(v) for k, v in value.items())
    return value is None or type(value) in (bool, int, float, str)


def _dim0_auto(x):
    """Dim.AUTO on dim 0 of every tensor in ``x`` (torch specializes what the code fixes)."""
    import dataclasses

    if isinstance(x, torch.Tensor):
        return {0: texport.Dim.AUTO} if x.dim() else None
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*[_dim0_auto(v) for v in x])
    if dataclasses.is_dataclass(x):
        return [_dim0_auto(getattr(x, f.name)) for f in dataclasses.fields(x)]
    if isinstance(x, (list, tuple)):
        return type(x)(_dim0_auto(v) for v in x)
    if isinstance(x, dict):
        return {k: _dim0_auto(v) for k, v in x.items()}
    return None


class _QuietTorchSerde:
    """torch.export.load logs its weights_only fallback with a malformed format string, which
    pytest's log capture turns into a TypeError: silenced for the call, restored after."""

    def __enter__(self):
        import logging

        self.logger = logging.getLogger("torch._export.serde.serialize")
        self.disabled, self.logger.disabled = self.logger.disabled, True

    def __exit__(self, *exc):
        self.logger.disabled = self.disabled


def _corpus_names():
    from corpus import export_models as em

    return [e.name for e in em.ENTRIES]


@pytest.mark.slow  # ~2 min: torch exports, saves and loads every corpus model twice
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dim0_auto"])
@pytest.mark.parametrize("name", _corpus_names())
def test_whole_corpus_keeps_ranges_and_example_inputs(name, dynamic):
    """torch.export.save -> exportir.load: range_constraints and example inputs as torch loads
    them (inputs that are no plain tree: skipped with a warning); and back through
    save(format="torch") -> torch.export.load."""
    from corpus import export_models as em

    entry = next(e for e in em.ENTRIES if e.name == name)
    module, args, kwargs = em.build(entry)
    shapes = None
    params = list(__import__("inspect").signature(module.forward).parameters)
    if dynamic and not any(p in ("args", "kwargs") for p in params):
        shapes = {**dict(zip(params, map(_dim0_auto, args))),
                  **{k: _dim0_auto(v) for k, v in kwargs.items()}}
    tep = texport.export(module, args, kwargs, dynamic_shapes=shapes)
    buf = torch_saved(tep)
    with _QuietTorchSerde():  # torch unpickles what weights_only refuses (warning logged)
        theirs = texport.load(buf)
    buf.seek(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = exportir.load(buf)
    assert {str(k): str(v) for k, v in ours.range_constraints.items()} == \
        {str(k): str(v) for k, v in theirs.range_constraints.items()}
    if _plain_tree(theirs.example_inputs):
        _same_tree(ours.example_inputs, theirs.example_inputs)
    else:
        assert ours.example_inputs is None
        assert any("sample_inputs" in str(w.message) for w in caught)
    back_buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        exportir.save(ours, back_buf, format="torch")
    back_buf.seek(0)
    back = texport.load(back_buf)
    assert {str(k): str(v) for k, v in back.range_constraints.items()} == \
        {str(k): str(v) for k, v in theirs.range_constraints.items()}
    if ours.example_inputs is not None:
        _same_tree(back.example_inputs, ours.example_inputs)
