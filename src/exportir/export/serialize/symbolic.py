"""Symbolic shapes in the saved program (format 1.1): expressions and the shape environment.

An expression is JSON without any text to parse: an integer, a symbol name (``"s0"``), ``true``
/ ``false``, or ``[head, operand...]`` with a head from a fixed table (``"+"``, ``"*"``,
``"//"``, ``"%"``, ``"max"``, ``"=="``, ``"and"``, ...). Loading builds the sympy expression from
the table's constructors only; a symbol must be one the ``shape_env`` section declares.

The ``shape_env`` section holds what the exported program knows about its symbols: each
symbol's kind (backed input size, unbacked int / float), example value (hint), range, sources
(``L['x'].size()[0]``) and ``Dim`` name; the replacements (``s1 -> 2*s0``), the guards export
recorded (with their user frames) and the runtime asserts. :func:`decode_shape_env` rebuilds an
:class:`exportir.symbolic.ShapeEnv` with the same knowledge, so the loaded program's fake
tensors, ``range_constraints`` and ``module()`` input checks behave as the saved ones.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import sympy

from exportir.export.serialize.common import (
    as_bool,
    as_dict,
    as_int,
    as_list,
    as_str,
    check_keys,
    fail,
    guarded,
)
from exportir.symbolic import (
    FloorDiv,
    Guard,
    IntTrueDiv,
    PyMod,
    RoundToInt,
    RuntimeAssert,
    ShapeEnv,
    ToFloat,
    TruncToInt,
    UserFrame,
    ValueRanges,
)

__all__ = ["Symbols", "decode_expr", "decode_shape_env", "encode_expr", "encode_shape_env",
           "shape_env_of"]

_NAME = re.compile(r"(s|u|zuf)[0-9]{1,9}\Z")

# head -> sympy constructor; every compound expression a saved program may hold
_HEADS: dict[str, Callable[..., sympy.Basic]] = {
    "+": sympy.Add, "*": sympy.Mul, "**": sympy.Pow, "//": FloorDiv, "%": PyMod,
    "/": IntTrueDiv, "float": ToFloat, "trunc": TruncToInt, "round": RoundToInt,
    "max": sympy.Max, "min": sympy.Min,
    "==": sympy.Eq, "!=": sympy.Ne, "<": sympy.Lt, "<=": sympy.Le, ">": sympy.Gt, ">=": sympy.Ge,
    "and": sympy.And, "or": sympy.Or, "not": sympy.Not,
}  # fmt: skip
_HEAD_OF: dict[type, str] = {
    sympy.Add: "+", sympy.Mul: "*", sympy.Pow: "**", FloorDiv: "//", PyMod: "%",
    IntTrueDiv: "/", ToFloat: "float", TruncToInt: "trunc", RoundToInt: "round",
    sympy.Max: "max", sympy.Min: "min",
    sympy.Eq: "==", sympy.Ne: "!=", sympy.StrictLessThan: "<", sympy.LessThan: "<=",
    sympy.StrictGreaterThan: ">", sympy.GreaterThan: ">=",
    sympy.And: "and", sympy.Or: "or", sympy.Not: "not",
}  # fmt: skip
# torch's own sympy classes (torch.utils._sympy.functions), met in exportir.from_torch
_HEAD_BY_NAME: dict[str, str] = {
    "FloorDiv": "//", "PythonMod": "%", "Mod": "%", "IntTrueDiv": "/", "ToFloat": "float",
    "TruncToInt": "trunc", "RoundToInt": "round", "IntInfinity": "oo",
    "NegativeIntInfinity": "-oo",
}  # fmt: skip
_ASSUMPTIONS: dict[str, dict[str, bool]] = {  # as ShapeEnv creates them, by name prefix
    "s": {"integer": True, "positive": True},
    "u": {"integer": True},
    "zuf": {"real": True},
}


# --------------------------------------------------------------------------- expressions


def encode_expr(expr: Any, where: str) -> Any:
    """JSON for a sympy expression over the shape environment's symbols."""
    if expr is sympy.true or expr is sympy.false:
        return bool(expr)
    if isinstance(expr, sympy.Integer):
        return int(expr)
    if isinstance(expr, sympy.Rational):
        return ["q", int(expr.p), int(expr.q)]
    if isinstance(expr, sympy.Float):
        return ["f", float(expr)]
    if expr in (sympy.oo, -sympy.oo):
        return "oo" if expr == sympy.oo else "-oo"
    if isinstance(expr, sympy.Symbol):
        if not _NAME.match(expr.name):
            fail(where, f"cannot save symbol {expr.name!r:.40} (not a shape symbol)")
        return expr.name
    head = _HEAD_OF.get(type(expr)) or _HEAD_BY_NAME.get(type(expr).__name__)
    if head in ("oo", "-oo"):
        return head
    if head is None:
        fail(where, f"cannot save symbolic expression {expr!s:.80} ({type(expr).__name__} is "
                    f"not one of the saved heads {sorted(_HEADS)})")
    return [head, *(encode_expr(a, where) for a in expr.args)]


class Symbols:
    """The symbols a program declares: name -> sympy Symbol (with ShapeEnv's assumptions)."""

    def __init__(self) -> None:
        self.by_name: dict[str, sympy.Symbol] = {}

    def declare(self, name: str, where: str) -> sympy.Symbol:
        m = _NAME.match(name)
        if not m:
            fail(where, f"{name!r:.40} is not a symbol name (s0, u0, zuf0, ...)")
        symbol = sympy.Symbol(name, **_ASSUMPTIONS[m.group(1)])
        self.by_name[name] = symbol
        return symbol

    def get(self, name: str, where: str) -> sympy.Symbol:
        found = self.by_name.get(name)
        if found is None:
            fail(where, f"symbol {name!r:.40} is not declared in the shape_env section")
        return found


_MAX_INT = 1 << 64  # |integer| in an expression (sizes, bounds and hints are int64)
_MAX_DEPTH = 64  # nesting of one expression
_MAX_OPERANDS = 256  # operands of one head
_MAX_EXPONENT = 64  # |n| in ["**", base, n]


def _int(raw: Any, where: str) -> int:
    number = as_int(raw, where)
    if abs(number) > _MAX_INT:
        fail(where, f"integer with {len(str(abs(number)))} digits is outside +-2**64")
    return number


def _atom(raw: Any, where: str, symbols: Symbols) -> sympy.Basic | None:
    """A leaf (bool, integer, infinity, symbol), or None for a compound expression."""
    if isinstance(raw, bool):
        return sympy.true if raw else sympy.false
    if isinstance(raw, int):
        return sympy.Integer(_int(raw, where))
    if isinstance(raw, str):
        if raw in ("oo", "-oo"):
            return sympy.oo if raw == "oo" else -sympy.oo
        return symbols.get(raw, where)
    return None


def _literal(head: str, args: list[Any], where: str) -> sympy.Basic | None:
    """``["q", p, q]`` (a rational) and ``["f", x]`` (a float), else None."""
    if head == "q" and len(args) == 2:
        p, q = (_int(a, f"{where}/{i + 1}") for i, a in enumerate(args))
        return guarded(where, lambda: sympy.Rational(p, q), "invalid rational")
    if head == "f" and len(args) == 1 and isinstance(args[0], (int, float)) \
            and not isinstance(args[0], bool):
        return guarded(where, lambda: sympy.Float(float(args[0])), "invalid float")
    return None


def _check_power(operands: list[sympy.Basic], where: str) -> None:
    """``**`` only with a small integer exponent (``2**(10**9)`` would not finish)."""
    if len(operands) != 2 or not (isinstance(operands[1], sympy.Integer)
                                  and abs(int(operands[1])) <= _MAX_EXPONENT):
        fail(where, f"exponent must be an integer within +-{_MAX_EXPONENT}")


def decode_expr(raw: Any, where: str, symbols: Symbols, depth: int = 0) -> sympy.Basic:
    """The sympy expression of :func:`encode_expr` JSON (constructors from a fixed table)."""
    if depth > _MAX_DEPTH:
        fail(where, f"expression nested deeper than {_MAX_DEPTH}")
    atom = _atom(raw, where, symbols)
    if atom is not None:
        return atom
    items = as_list(raw, where)
    if not items or not isinstance(items[0], str):
        fail(where, "expected an integer, a symbol name or [head, operand...]")
    head, args = items[0], items[1:]
    literal = _literal(head, args, where)
    if literal is not None:
        return literal
    build = _HEADS.get(head)
    if build is None:
        fail(where, f"unknown expression head {head!r:.20}; known: {sorted(_HEADS)}")
    if len(args) > _MAX_OPERANDS:
        fail(where, f"{len(args)} operands exceed {_MAX_OPERANDS}")
    operands = [decode_expr(a, f"{where}/{i + 1}", symbols, depth + 1) for i, a in enumerate(args)]
    if head == "**":
        _check_power(operands, where)
    return guarded(where, lambda: build(*operands), f"invalid {head} expression")


# --------------------------------------------------------------------------- shape environment


def shape_env_of(values: Any) -> ShapeEnv | None:
    """The ShapeEnv behind the first symbolic size among ``values`` (node ``val`` s)."""
    import torch

    for v in values:
        items = v.shape if isinstance(v, torch.Tensor) else (v,)
        for s in items:
            node = getattr(s, "node", None)
            env = getattr(node, "shape_env", None)
            if isinstance(env, ShapeEnv):
                return env
    return None


def _frame(frame: UserFrame | None) -> Any:
    if frame is None:
        return None
    return [str(frame.filename), int(frame.lineno), str(frame.name), str(frame.code)]


def _dec_frame(raw: Any, where: str) -> UserFrame | None:
    if raw is None:
        return None
    items = as_list(raw, where)
    if len(items) != 4:
        fail(where, "expected [filename, line, function, code]")
    return UserFrame(as_str(items[0], f"{where}/0"), as_int(items[1], f"{where}/1"),
                     as_str(items[2], f"{where}/2"), as_str(items[3], f"{where}/3"))


def _symbol_entry(env: ShapeEnv, sym: sympy.Symbol, where: str) -> dict[str, Any]:
    r = env.var_to_range.get(sym, ValueRanges.unknown())
    return {
        "name": encode_expr(sym, where),
        "hint": env.var_to_hint.get(sym),
        "range": [encode_expr(r.lower, where), encode_expr(r.upper, where)],
        "sources": [str(s) for s in env.var_to_sources.get(sym, ())],
        "dim": env.var_to_name.get(sym),
        "size_like": sym in env.size_like,
    }


def encode_shape_env(env: ShapeEnv, where: str) -> dict[str, Any]:
    symbols = sorted(set(env.var_to_range) | set(env.var_to_hint), key=lambda s: s.name)
    return {
        "symbols": [_symbol_entry(env, s, f"{where}/symbols/{s.name}") for s in symbols
                    if _NAME.match(s.name)],
        "replacements": [[encode_expr(s, where), encode_expr(e, f"{where}/replacements/{s}")]
                         for s, e in env.replacements.items()],
        "guards": [[encode_expr(g.expr, f"{where}/guards/{i}"), _frame(g.frame)]
                   for i, g in enumerate(env.guards)],
        "runtime_asserts": [[encode_expr(a.expr, f"{where}/runtime_asserts/{i}"),
                             _frame(a.frame)]
                            for i, a in enumerate(env.deferred_runtime_asserts)],
    }


def _decode_range(raw: Any, where: str, symbols: Symbols) -> ValueRanges:
    bounds = as_list(raw, where)
    if len(bounds) != 2:
        fail(where, "expected [lower, upper]")
    lower, upper = (decode_expr(b, f"{where}/{k}", symbols) for k, b in enumerate(bounds))
    for k, bound in enumerate((lower, upper)):
        if not (isinstance(bound, sympy.Integer) or bound in (sympy.oo, -sympy.oo)):
            fail(f"{where}/{k}", f"bound {bound!s:.40} is not an integer or +-oo")
    if lower > upper:
        fail(where, f"lower bound {lower} is above the upper bound {upper}")
    return guarded(where, lambda: ValueRanges(lower, upper), "invalid range")


def _declare_symbols(env: ShapeEnv, raw: Any, where: str, symbols: Symbols) -> None:
    keys = {"name", "hint", "range", "sources", "dim", "size_like"}
    for i, entry in enumerate(as_list(raw, where)):
        at = f"{where}/{i}"
        spec = as_dict(entry, at)
        check_keys(spec, keys, set(), at)
        sym = symbols.declare(as_str(spec["name"], f"{at}/name"), f"{at}/name")
        if spec["hint"] is not None:
            env.var_to_hint[sym] = _int(spec["hint"], f"{at}/hint")
        env._set_range(sym, _decode_range(spec["range"], f"{at}/range", symbols))
        env.var_to_sources[sym] = [as_str(s, f"{at}/sources") for s in
                                   as_list(spec["sources"], f"{at}/sources")]
        if spec["dim"] is not None:
            env.var_to_name[sym] = as_str(spec["dim"], f"{at}/dim")
        if as_bool(spec["size_like"], f"{at}/size_like"):
            env.size_like.add(sym)


def _counters(env: ShapeEnv, symbols: Symbols) -> None:
    """New symbols (a later re-trace) continue the numbering after the loaded ones."""
    for name in symbols.by_name:
        prefix = name.rstrip("0123456789")
        index = int(name[len(prefix):]) + 1
        if prefix == "s":
            env._backed = max(env._backed, index)
        else:
            env._unbacked = max(env._unbacked, index)


def decode_shape_env(raw: Any, where: str) -> tuple[ShapeEnv, Symbols]:
    """A ShapeEnv with the saved symbols, replacements, guards and runtime asserts."""
    spec = as_dict(raw, where)
    check_keys(spec, {"symbols", "replacements", "guards", "runtime_asserts"}, set(), where)
    env, symbols = ShapeEnv(), Symbols()
    _declare_symbols(env, spec["symbols"], f"{where}/symbols", symbols)
    for i, pair in enumerate(as_list(spec["replacements"], f"{where}/replacements")):
        at = f"{where}/replacements/{i}"
        items = as_list(pair, at)
        if len(items) != 2:
            fail(at, "expected [symbol, expression]")
        env._set_replacement(decode_expr(items[0], f"{at}/0", symbols),
                             decode_expr(items[1], f"{at}/1", symbols))
    for key, cls, target in (("guards", Guard, env.guards),
                             ("runtime_asserts", RuntimeAssert, env.deferred_runtime_asserts)):
        for i, pair in enumerate(as_list(spec[key], f"{where}/{key}")):
            at = f"{where}/{key}/{i}"
            items = as_list(pair, at)
            if len(items) != 2:
                fail(at, "expected [expression, frame]")
            expr = decode_expr(items[0], f"{at}/0", symbols)
            if expr is sympy.false:
                fail(f"{at}/0", f"a {key[:-1].replace('_', ' ')} that is always false")
            target.append(cls(expr, _dec_frame(items[1], f"{at}/1")))
            if key == "guards":  # the facts export knew (Ne(s0, 128), ...)
                guarded(at, lambda e=expr: env._learn(e), "cannot use the guard")
    _counters(env, symbols)
    return env, symbols
