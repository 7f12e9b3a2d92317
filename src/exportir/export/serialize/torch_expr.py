"""Symbolic expressions in torch.export's .pt2 files: ``sympy.srepr`` text both ways, and the
``str`` text of ``range_constraints`` keys one way.

torch stores every symbolic size as ``srepr`` text (``Mul(Integer(2), Symbol('s0', ...))``) and
reads it back with ``sympy.sympify``, which evaluates Python. We never evaluate it: a small
parser accepts only calls of the heads in :data:`_HEADS` (and ``Symbol`` / ``Integer`` /
``Rational`` / ``Float`` leaves) and turns them into the JSON expression form of our own format
(serialize/symbolic.py), which :func:`~exportir.export.serialize.symbolic.decode_expr` builds
from its constructor table. :func:`print_expr` writes that JSON form back as ``srepr`` text
torch reads.
"""

from __future__ import annotations

import re
from typing import Any

from exportir.export.serialize.common import fail

__all__ = ["parse_expr", "parse_range_key", "print_expr"]

# srepr head -> our JSON head (serialize/symbolic.py _HEADS)
_HEADS: dict[str, str] = {
    "Add": "+", "Mul": "*", "Pow": "**", "FloorDiv": "//", "PythonMod": "%", "Mod": "%",
    "IntTrueDiv": "/", "ToFloat": "float", "TruncToInt": "trunc", "RoundToInt": "round",
    "Max": "max", "Min": "min", "Equality": "==", "Unequality": "!=", "StrictLessThan": "<",
    "LessThan": "<=", "StrictGreaterThan": ">", "GreaterThan": ">=", "And": "and", "Or": "or",
    "Not": "not",
}  # fmt: skip
_NAMES = {head: name for name, head in _HEADS.items() if name != "Mod"}
_CONSTANTS: dict[str, Any] = {
    "true": True, "false": False, "oo": "oo", "int_oo": "oo", "IntInfinity": "oo",
    "NegativeInfinity": "-oo", "NegativeIntInfinity": "-oo", "Infinity": "oo",
}  # fmt: skip
_ASSUMPTIONS = {"s": "integer=True, positive=True", "u": "integer=True", "zuf": "real=True"}
_TOKEN = re.compile(r"\s*(?:([A-Za-z_][A-Za-z0-9_]*)|(-?[0-9]+)|'([^'\\]{0,256})'|([(),=]))")
_MAX_TEXT = 1 << 16
_MAX_DEPTH = 64


class _Parser:
    __slots__ = ("_depth", "pos", "text", "where")

    def __init__(self, text: str, where: str) -> None:
        self.text, self.where, self.pos, self._depth = text, where, 0, 0

    def _fail(self, what: str) -> None:
        fail(self.where, f"{what} at character {self.pos} of {self.text[:120]!r}")

    def token(self) -> tuple[str, str]:
        m = _TOKEN.match(self.text, self.pos)
        if m is None:
            self._fail("unexpected text in a symbolic expression")
        self.pos = m.end()
        kind = ("name", "int", "str", "punct")[m.lastindex - 1]
        return kind, m.group(m.lastindex)

    def expect(self, punct: str) -> None:
        if self.token() != ("punct", punct):
            self._fail(f"expected {punct!r}")

    def args(self) -> list[tuple[str, Any]]:
        """``(name-or-'', value)`` pairs up to the closing parenthesis."""
        out: list[tuple[str, Any]] = []
        while True:
            save = self.pos
            kind, text = self.token()
            if (kind, text) == ("punct", ")") and not out:
                return out
            if kind == "name" and self.token() == ("punct", "="):
                out.append((text, self.token()[1]))
            else:
                self.pos = save
                out.append(("", self.expr(self._depth + 1)))
            kind, text = self.token()
            if text == ")":
                return out
            if text != ",":
                self._fail("expected ',' or ')'")


    def expr(self, depth: int = 0) -> Any:
        if depth > _MAX_DEPTH:
            self._fail("expression nested too deeply")
        kind, text = self.token()
        if kind == "int":
            return int(text)
        if kind == "str":
            return ("str", text)
        if kind != "name":
            self._fail(f"unexpected {text!r}")
        if text in _CONSTANTS and not self.text.startswith("(", self.pos):
            return _CONSTANTS[text]
        self.expect("(")
        old, self._depth = self._depth, depth
        args = self.args()
        self._depth = old
        return self.build(text, args)

    def build(self, name: str, args: list[tuple[str, Any]]) -> Any:
        values = [v for k, v in args if not k]
        if name in _CONSTANTS and not values:
            return _CONSTANTS[name]
        if name == "Symbol" and values and isinstance(values[0], tuple):
            return values[0][1]
        if name == "Integer" and len(values) == 1 and isinstance(values[0], int):
            return values[0]
        if name == "Rational" and len(values) == 2 and all(isinstance(v, int) for v in values):
            return ["q", values[0], values[1]]
        if name == "Float" and values and isinstance(values[0], tuple):
            try:
                return ["f", float(values[0][1])]
            except ValueError:
                self._fail(f"bad float {values[0][1]!r}")
        head = _HEADS.get(name)
        if head is None or any(isinstance(v, tuple) for v in values):
            self._fail(f"{name!r} is not an expression head a .pt2 file may use "
                       f"({sorted(_HEADS)})")
        return [head, *values]


def parse_expr(text: Any, where: str) -> Any:
    """Our JSON expression for torch's ``srepr`` text (never evaluated)."""
    if not isinstance(text, str):
        fail(where, f"expected srepr text, got {type(text).__name__}")
    if len(text) > _MAX_TEXT:
        fail(where, f"expression of {len(text)} characters exceeds {_MAX_TEXT}")
    p = _Parser(text, where)
    out = p.expr()
    if text[p.pos:].strip():
        p._fail("trailing text after the expression")
    return out


def print_expr(expr: Any) -> str:
    """``srepr`` text torch's ``sympify`` reads, for our JSON expression form."""
    if isinstance(expr, bool):
        return "true" if expr else "false"
    if isinstance(expr, int):
        return f"Integer({expr})"
    if isinstance(expr, str):
        if expr in ("oo", "-oo"):
            return expr
        prefix = expr.rstrip("0123456789")
        return f"Symbol('{expr}', {_ASSUMPTIONS.get(prefix, 'integer=True')})"
    head, *args = expr
    if head == "q":
        return f"Rational({args[0]}, {args[1]})"
    if head == "f":
        return f"Float('{args[0]!r}', precision=53)"
    return f"{_NAMES[head]}({', '.join(print_expr(a) for a in args)})"


# --------------------------------------------------------------------------- str() text

# sympy's str() names of the calls a range key may hold -> our JSON head
_CALLS: dict[str, str] = {"Max": "max", "Min": "min", "FloorDiv": "//", "Mod": "%",
                          "PythonMod": "%"}
_INFIX = re.compile(r"\s*(?:([A-Za-z_][A-Za-z0-9_]*)|([0-9]+)|(\*\*|//|[-+*/%(),]))")
_MAX_KEY = 4096


class _Infix:
    """Recursive descent over sympy's ``str`` printing of an integer expression::

        sum     := ['-'] product (('+' | '-') product)*
        product := power (('*' | '/' | '//' | '%') power)*
        power   := atom ['**' ['-'] atom]
        atom    := INT | SYMBOL | CALL '(' sum (',' sum)* ')' | '(' sum ')'
    """

    __slots__ = ("pos", "text", "where")

    def __init__(self, text: str, where: str) -> None:
        self.text, self.where, self.pos = text, where, 0

    def _fail(self, what: str) -> None:
        fail(self.where, f"{what} at character {self.pos} of the range key {self.text[:120]!r}")

    def peek(self) -> tuple[str, str] | None:
        m = _INFIX.match(self.text, self.pos)
        if m is None:
            if self.text[self.pos:].strip():
                self._fail("unexpected text")
            return None
        return ("name", "int", "op")[m.lastindex - 1], m.group(m.lastindex)

    def take(self) -> tuple[str, str]:
        m = _INFIX.match(self.text, self.pos)
        if m is None:
            self._fail("unexpected end or text")
        self.pos = m.end()
        return ("name", "int", "op")[m.lastindex - 1], m.group(m.lastindex)

    def sum(self, depth: int) -> Any:
        if depth > _MAX_DEPTH:
            self._fail("expression nested too deeply")
        terms = []
        sign = 1
        if self.peek() == ("op", "-"):
            self.take()
            sign = -1
        while True:
            term = self.product(depth)
            terms.append(term if sign > 0 else ["*", -1, term])
            nxt = self.peek()
            if nxt not in (("op", "+"), ("op", "-")):
                return terms[0] if len(terms) == 1 else ["+", *terms]
            sign = 1 if self.take()[1] == "+" else -1

    def product(self, depth: int) -> Any:
        out = self.power(depth)
        while self.peek() in (("op", "*"), ("op", "/"), ("op", "//"), ("op", "%")):
            op = self.take()[1]
            right = self.power(depth)
            if op == "/":
                if not isinstance(right, int) or right == 0:
                    self._fail("'/' is read only with a nonzero integer divisor")
                out = ["*", out, ["q", 1, right]]
            else:
                out = [op, out, right]
        return out

    def power(self, depth: int) -> Any:
        base = self.atom(depth)
        if self.peek() != ("op", "**"):
            return base
        self.take()
        negative = self.peek() == ("op", "-")
        if negative:
            self.take()
        exponent = self.atom(depth)
        return ["**", base, ["*", -1, exponent] if negative else exponent]

    def atom(self, depth: int) -> Any:
        kind, text = self.take()
        if kind == "int":
            if len(text) > 40:
                self._fail("integer too long")
            return int(text)
        if (kind, text) == ("op", "("):
            inner = self.sum(depth + 1)
            if self.take() != ("op", ")"):
                self._fail("expected ')'")
            return inner
        if kind != "name":
            self._fail(f"unexpected {text!r}")
        if self.peek() != ("op", "("):
            if text in _CONSTANTS:
                return _CONSTANTS[text]
            return text
        head = _CALLS.get(text)
        if head is None:
            self._fail(f"{text!r:.40} is not a call a range key may hold ({sorted(_CALLS)})")
        self.take()
        args = [self.sum(depth + 1)]
        while (sep := self.take()) == ("op", ","):
            args.append(self.sum(depth + 1))
        if sep != ("op", ")"):
            self._fail("expected ',' or ')'")
        return [head, *args]


def parse_range_key(text: Any, where: str) -> Any:
    """Our JSON expression for a ``range_constraints`` key (sympy ``str`` text, never
    evaluated)."""
    if not isinstance(text, str):
        fail(where, f"expected expression text, got {type(text).__name__}")
    if len(text) > _MAX_KEY:
        fail(where, f"range key of {len(text)} characters exceeds {_MAX_KEY}")
    p = _Infix(text, where)
    out = p.sum(0)
    if p.peek() is not None:
        p._fail("trailing text after the expression")
    return out
