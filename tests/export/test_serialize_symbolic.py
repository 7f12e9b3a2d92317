"""save / load of ExportedPrograms with symbolic shapes (format 1.1: the ``shape_env`` section).

Round trips: Dims with min/max, derived dims (``2*T``), unbacked symbols of data-dependent ops
(nonzero, item) with their ranges and runtime asserts. The loaded program prints the same, has
equal ``range_constraints``, its ``module()`` equals eager at the smallest, a middle and the
largest size and refuses a size outside the range with the original's error, and it lowers to a
program file. Hostile ``shape_env`` sections and symbolic sizes fail with a SerializationError
naming the field.

Reproduce one test with ``PYTHONPATH=src .venv/bin/python -m pytest -p no:xdist
tests/export/test_serialize_symbolic.py -k <name>``.
"""

from __future__ import annotations

import copy
import io
import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import exportir
from exportir import Dim
from exportir.export.serialize import SerializationError, load, save

COMPAT_1_1 = Path(__file__).resolve().parents[1] / "compat" / "exported_program_1_1_dynamic.pt2"


def round_trip(ep: Any) -> Any:
    buf = io.BytesIO()
    save(ep, buf)
    return load(io.BytesIO(buf.getvalue()))


def _error(fn: Any, *args: Any) -> str | None:
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - the test compares whatever both raise
        return f"{type(e).__name__}: {e}"
    return None


def _first(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, (list, tuple)) else out


class Masked(torch.nn.Module):
    """``mask[:T]`` on a 128-row buffer, a derived dim ``2*T`` and a dynamic batch."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mask", torch.randn(128, 128))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        return (x @ self.mask[:t, :t]).sum(-1) + y[:, ::2].sum(-1)


def masked_program() -> Any:
    b, t = Dim("B", min=1, max=16), Dim("T", min=2, max=128)
    args = (torch.randn(3, 10), torch.randn(3, 20))
    return exportir.export(Masked(), args, dynamic_shapes={"x": {0: b, 1: t}, "y": {0: b, 1: 2 * t}})


class DataDependent(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        idx = torch.nonzero(x > 0)
        n = (x > 0).sum().item()
        torch._check(n <= 64)
        return idx.float().sum() + torch.zeros(n).sum() + x.sum()


def data_dependent_program() -> Any:
    return exportir.export(DataDependent(), (torch.randn(8),),
                           dynamic_shapes={"x": {0: Dim("n", min=2, max=64)}})


@pytest.fixture(scope="module")
def masked() -> tuple[Any, Any]:
    ep = masked_program()
    return ep, round_trip(ep)


def test_dims_and_derived_dims_round_trip(masked: tuple[Any, Any]) -> None:
    ep, loaded = masked
    assert str(loaded) == str(ep)
    assert loaded.range_constraints == ep.range_constraints
    assert {str(k) for k in loaded.range_constraints} == {"s0", "s1", "2*s1"}


@pytest.mark.parametrize("batch,t", [(1, 2), (8, 65), (16, 128)])
def test_loaded_module_equals_eager_over_the_range(masked: tuple[Any, Any], batch: int,
                                                   t: int) -> None:
    ep, loaded = masked
    args = (torch.randn(batch, t), torch.randn(batch, 2 * t))
    torch.testing.assert_close(loaded.module()(*args), ep.module()(*args))
    eager = Masked()
    eager.mask = ep.state_dict["mask"]
    torch.testing.assert_close(loaded.module()(*args), eager(*args), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("shapes", [((17, 4), (17, 8)), ((2, 129), (2, 258)), ((2, 1), (2, 2)),
                                    ((2, 4), (2, 9))], ids=["batch>max", "T>max", "T<min",
                                                            "not-2T"])
def test_loaded_module_refuses_sizes_as_the_original(masked: tuple[Any, Any],
                                                     shapes: Any) -> None:
    ep, loaded = masked
    args = tuple(torch.randn(*s) for s in shapes)
    want = _error(ep.module(), *args)
    assert want is not None and want.startswith("RuntimeError")
    assert _error(loaded.module(), *args) == want


def test_loaded_dynamic_program_lowers_and_runs(masked: tuple[Any, Any]) -> None:
    from exportir.runtime import Program

    _, loaded = masked
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data = exportir.to_edge(loaded).to_program().buffer
    method = Program.load(data).method("forward")
    for batch, t in [(1, 2), (8, 65), (16, 128)]:
        args = (torch.randn(batch, t), torch.randn(batch, 2 * t))
        torch.testing.assert_close(_first(method(*args)), loaded.module()(*args), atol=1e-4, rtol=1e-4)


def test_unbacked_symbols_ranges_and_runtime_asserts_round_trip() -> None:
    from exportir.export.serialize.symbolic import shape_env_of

    ep = data_dependent_program()
    loaded = round_trip(ep)
    assert str(loaded) == str(ep)
    assert loaded.range_constraints == ep.range_constraints
    assert {str(k) for k in loaded.range_constraints} == {"s0", "u0", "u1"}
    env = shape_env_of(n.meta.get("val") for n in ep.graph.nodes)
    env2 = shape_env_of(n.meta.get("val") for n in loaded.graph.nodes)
    assert [(str(a.expr), a.frame) for a in env2.deferred_runtime_asserts] == \
           [(str(a.expr), a.frame) for a in env.deferred_runtime_asserts]
    assert "u1 <= 64" in {str(a.expr) for a in env2.deferred_runtime_asserts}
    for n in (2, 30, 64):
        x = torch.randn(n)
        torch.testing.assert_close(loaded.module()(x), DataDependent()(x))


def test_nonzero_program_lowers_after_load() -> None:
    from exportir.runtime import Program

    class Idx(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nonzero(x > 0).float().sum(0) + x.sum()

    ep = exportir.export(Idx(), (torch.randn(8),), dynamic_shapes={"x": {0: Dim("n", min=2, max=64)}})
    program = exportir.to_edge(round_trip(ep)).to_program()
    method = Program.load(program.buffer).method("forward")
    for n in (2, 33, 64):
        x = torch.randn(n)
        torch.testing.assert_close(_first(method(x)), Idx()(x))


def test_unbounded_dim_round_trips() -> None:
    class Add(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    ep = exportir.export(Add(), (torch.randn(4, 3),), dynamic_shapes={"x": {0: Dim("b")}})
    loaded = round_trip(ep)
    assert loaded.range_constraints == ep.range_constraints
    x = torch.randn(1000, 3)
    torch.testing.assert_close(loaded.module()(x), x * 2)


def test_static_programs_need_no_shape_env_section() -> None:
    class Add(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1

    buf = io.BytesIO()
    save(exportir.export(Add(), (torch.randn(2),)), buf)
    assert "shape_env" not in _program_json(buf.getvalue())


# --------------------------------------------------------------------------- compatibility


def test_format_1_1_fixture_still_loads() -> None:
    """A committed 1.1 file (``Masked`` with its buffer) loads and checks sizes as it did."""
    extra: dict[str, Any] = {"expected.safetensors": b""}
    loaded = load(COMPAT_1_1, extra_files=extra)
    assert {str(k): (int(v.lower), int(v.upper)) for k, v in loaded.range_constraints.items()} == \
           {"s0": (1, 16), "s1": (2, 128), "2*s1": (4, 256)}
    from exportir.export.serialize.tensors import decode_tensors

    expected, _ = decode_tensors(extra["expected.safetensors"], "expected")
    got = loaded.module()(expected["x"], expected["y"])
    # recorded on another CPU: float kernels round differently across instruction sets
    torch.testing.assert_close(got, expected["out"], rtol=1e-5, atol=1e-6)
    assert "to be <= 16" in str(_error(loaded.module(), torch.randn(17, 4), torch.randn(17, 8)))


def write_compat_1_1(path: Path = COMPAT_1_1) -> None:
    """Regenerate the 1.1 fixture (only when the format version changes on purpose)."""
    from exportir.export.serialize.tensors import encode_tensors

    torch.manual_seed(0)
    ep = masked_program()
    x, y = torch.randn(5, 7), torch.randn(5, 14)
    out = ep.module()(x, y)
    save(ep, path, extra_files={"expected.safetensors":
                                encode_tensors({"x": x, "y": y, "out": out})})


# --------------------------------------------------------------------------- hostile files


def _program_json(data: bytes) -> dict[str, Any]:
    import zipfile

    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return json.loads(zf.read("program.json"))


def _with_program(data: bytes, program: dict[str, Any]) -> bytes:
    """The archive with ``program.json`` replaced and the manifest's digests recomputed (an
    attacker can always do that: checksums detect damage, not malice)."""
    import hashlib
    import zipfile

    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        parts = {n: zf.read(n) for n in zf.namelist()}
    parts["program.json"] = json.dumps(program).encode()
    manifest = json.loads(parts["manifest.json"])
    manifest["entries"] = {n: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()}
                           for n, d in parts.items() if n != "manifest.json"}
    parts["manifest.json"] = json.dumps(manifest).encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for name, blob in parts.items():
            zf.writestr(name, blob)
    return out.getvalue()


@pytest.fixture(scope="module")
def saved_masked(masked: tuple[Any, Any]) -> bytes:
    buf = io.BytesIO()
    save(masked[0], buf)
    return buf.getvalue()


def _y_shape(p: dict[str, Any]) -> list[Any]:
    node = next(n for n in p["graph_module"]["nodes"] if n["name"] == "y")
    return node["meta"]["val"]["fake"]["shape"]


def _set_y_dim(value: Any) -> Any:
    def edit(p: dict[str, Any]) -> None:
        _y_shape(p)[1] = {"sym": value}
    return edit


def _nest(depth: int) -> Any:
    expr: Any = "s1"
    for _ in range(depth):
        expr = ["+", 1, expr]
    return expr


def _edit_symbol(key: str, value: Any) -> Any:
    def edit(p: dict[str, Any]) -> None:
        p["shape_env"]["symbols"][0][key] = value
    return edit


def _drop_shape_env(p: dict[str, Any]) -> None:
    del p["shape_env"]


def _add_guard(expr: Any) -> Any:
    def edit(p: dict[str, Any]) -> None:
        p["shape_env"]["guards"].append([expr, None])
    return edit


HOSTILE: dict[str, tuple[Any, str]] = {
    "undeclared symbol": (_set_y_dim(["*", 2, "s7"]),
                          r"nodes/\d+/meta/val/fake/shape/1/sym.*'s7' is not declared"),
    "not a symbol name": (_set_y_dim("__import__"),
                          r"shape/1/sym.*'__import__' is not declared"),
    "unknown head": (_set_y_dim(["eval", "s1"]), r"shape/1/sym.*unknown expression head 'eval'"),
    "head is not a string": (_set_y_dim([7, "s1"]), r"shape/1/sym.*expected an integer"),
    "huge integer": (_set_y_dim(["*", 10 ** 400, "s1"]), r"shape/1/sym/1.*outside"),
    "huge power": (_set_y_dim(["**", "s1", 10 ** 9]), r"shape/1/sym.*exponent"),
    "huge rational": (_set_y_dim(["q", 1, 10 ** 400]), r"shape/1/sym/2.*outside"),
    "deep nesting": (_set_y_dim(_nest(100)), r"shape/1/sym.*nested deeper"),
    "float size": (_set_y_dim(["f", 1.5]), r"shape/1/sym.*not an integer size"),
    "symbolic size without shape_env": (_drop_shape_env,
                                        r"shape/0.*without a shape_env section"),
    "bad symbol name": (_edit_symbol("name", "x; import os"), r"shape_env/symbols/0/name"),
    "huge hint": (_edit_symbol("hint", 10 ** 400), r"shape_env/symbols/0/hint.*outside"),
    "symbolic range bound": (_edit_symbol("range", ["s0", 5]),
                             r"shape_env/symbols/0/range/0.*integer or"),
    "range upside down": (_edit_symbol("range", [9, 2]), r"shape_env/symbols/0/range"),
    "unknown symbol key": (_edit_symbol("code", "print(1)"), r"shape_env/symbols/0.*code"),
    "guard head": (_add_guard(["exec", 1]), r"shape_env/guards/\d+/0.*unknown expression head"),
    "false guard": (_add_guard(False), r"shape_env/guards/\d+.*"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_symbolic_fields_are_typed_errors(saved_masked: bytes, case: str) -> None:
    edit, pattern = HOSTILE[case]
    program = copy.deepcopy(_program_json(saved_masked))
    edit(program)
    with pytest.raises(SerializationError, match=pattern):
        load(io.BytesIO(_with_program(saved_masked, program)))


def test_format_1_0_files_may_not_hold_a_shape_env(saved_masked: bytes) -> None:
    """A 1.0 manifest promises no symbolic sizes; a shape_env section there is refused."""
    import hashlib
    import zipfile

    with zipfile.ZipFile(io.BytesIO(saved_masked)) as zf:
        parts = {n: zf.read(n) for n in zf.namelist()}
    manifest = json.loads(parts["manifest.json"])
    manifest["version"] = [1, 0]
    manifest["entries"] = {n: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()}
                           for n, d in parts.items() if n != "manifest.json"}
    parts["manifest.json"] = json.dumps(manifest).encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for name, blob in parts.items():
            zf.writestr(name, blob)
    with pytest.raises(SerializationError, match="shape_env.*1.1"):
        load(io.BytesIO(out.getvalue()))
