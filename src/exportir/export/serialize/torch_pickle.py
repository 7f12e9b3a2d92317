"""The example inputs of a torch .pt2 (``data/sample_inputs/<name>.pt``), read without unpickling.

torch.export.save writes ``(args, kwargs)`` with ``torch.save``: a zip holding ``data.pkl`` (a
pickle stream) and one member ``data/<key>`` of raw bytes per tensor storage. Unpickling runs
whatever the stream names, so the stream is never handed to :mod:`pickle`: its opcodes are
walked (``pickletools.genops`` decodes them without running anything) by a small stack machine
that accepts only what torch writes for a tree of plain tensors:

- values: ``None``, booleans, ints, floats, strings, and tuples / lists / dicts of them;
- ``GLOBAL`` only of the names in :data:`_GLOBALS`: ``torch._utils._rebuild_tensor_v2``, the
  typed storage classes (``torch FloatStorage``, ...), and ``collections OrderedDict``;
- ``BINPERSID`` only of ``('storage', <storage class>, key, 'cpu', numel)``: the member
  ``data/<key>`` must hold exactly ``numel`` elements, checked before it is read;
- ``REDUCE`` only of ``_rebuild_tensor_v2(storage, offset, size, stride, requires_grad,
  OrderedDict())`` (sizes and strides checked against the storage before a view is built) and
  of ``OrderedDict()`` with no arguments (the empty backward hooks torch writes).

Any other opcode, global or call is refused with a :class:`SerializationError` naming the member
and the opcode's byte offset; nothing named in the stream is ever imported or called.
"""

from __future__ import annotations

import pickletools
import re
from typing import Any

import torch

from exportir.export.serialize.common import LIMITS, SerializationError, fail

__all__ = ["pickle_inputs", "read_pickled_inputs"]

_STORAGES: dict[str, torch.dtype] = {
    "FloatStorage": torch.float32, "DoubleStorage": torch.float64, "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16, "LongStorage": torch.int64, "IntStorage": torch.int32,
    "ShortStorage": torch.int16, "CharStorage": torch.int8, "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool, "ComplexFloatStorage": torch.complex64,
    "ComplexDoubleStorage": torch.complex128,
}  # fmt: skip
_REBUILD = "torch._utils _rebuild_tensor_v2"
_ORDERED_DICT = "collections OrderedDict"
_GLOBALS = frozenset({_REBUILD, _ORDERED_DICT, *(f"torch {n}" for n in _STORAGES)})
_KEY = re.compile(r"[A-Za-z0-9_]{1,64}\Z")
_MAX_OPCODES = 1 << 20
_MAX_DEPTH = 32  # nesting of the inputs' containers
_MAX_VALUES = 1 << 16  # values in the inputs' tree (a memo can make a DAG exponential)
_SCALARS = (type(None), bool, int, float, str)


class _Global:
    """A name a ``GLOBAL`` pushed (one of :data:`_GLOBALS`): data, never imported."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class _Hooks:
    """``OrderedDict()``: the empty backward hooks torch writes for every tensor."""

    __slots__ = ()


class _Storage:
    __slots__ = ("dtype", "flat", "key")

    def __init__(self, key: str, dtype: torch.dtype, flat: torch.Tensor) -> None:
        self.key, self.dtype, self.flat = key, dtype, flat


class _Machine:
    """The stack machine over one ``data.pkl``: ``members`` is the torch.save zip (has / size
    / read by member name)."""

    def __init__(self, members: Any, where: str) -> None:
        self.members, self.where = members, where
        self.stack: list[Any] = []
        self.marks: list[list[Any]] = []
        self.memo: dict[int, Any] = {}
        self.storages: dict[str, _Storage] = {}
        self.pos = 0

    def fail(self, what: str) -> None:
        fail(self.where, f"{what} (opcode at byte {self.pos})")

    def pop(self) -> Any:
        if not self.stack:
            self.fail("the pickle stack is empty")
        return self.stack.pop()

    def pop_mark(self) -> list[Any]:
        if not self.marks:
            self.fail("no MARK to pop")
        items, self.stack = self.stack, self.marks.pop()
        return items

    def push_marked(self, kind: type) -> None:
        items = self.pop_mark()  # before reading self.stack, which pop_mark replaces
        self.stack.append(kind(items))

    def top(self, kind: type) -> Any:
        if not self.stack or type(self.stack[-1]) is not kind:
            self.fail(f"expected a {kind.__name__} on the stack")
        return self.stack[-1]

    # -- opcodes ----------------------------------------------------------------------------

    def global_(self, name: str) -> None:
        if name not in _GLOBALS:
            self.fail(f"GLOBAL {name.replace(' ', '.')!r:.120} is not one torch writes for "
                      "plain tensors; it was not imported")
        self.stack.append(_Global(name))

    def stack_global(self) -> None:
        name, module = self.pop(), self.pop()
        if not (isinstance(module, str) and isinstance(name, str)):
            self.fail("STACK_GLOBAL of a non-string")
        self.global_(f"{module} {name}")

    def setitems(self, target: Any, items: list[Any]) -> None:
        if type(target) is not dict or len(items) % 2:
            self.fail("SETITEM(S) on something that is not a dict")
        for k, v in zip(items[::2], items[1::2]):
            if type(k) not in (str, int, bool, type(None)):
                self.fail(f"a dict key of type {type(k).__name__}")
            target[k] = v

    def persistent(self) -> None:
        pid = self.pop()
        if not (type(pid) is tuple and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _Global) and pid[1].name.split(" ")[0] == "torch"
                and pid[1].name.split(" ")[1] in _STORAGES):
            self.fail("a persistent id that is not ('storage', <storage class>, key, device, "
                      "numel)")
        _, kind, key, location, numel = pid
        dtype = _STORAGES[kind.name.split(" ")[1]]
        if not (isinstance(key, str) and _KEY.match(key)):
            self.fail(f"storage key {key!r:.40} is not a member name")
        if location != "cpu":
            self.fail(f"storage on device {location!r:.40}; only cpu tensors are read")
        if type(numel) is not int or not 0 <= numel <= LIMITS.max_dim:
            self.fail(f"storage size {numel!r:.40}")
        known = self.storages.get(key)
        if known is not None:
            if known.dtype != dtype or known.flat.numel() != numel:
                self.fail(f"storage {key} is named with two types or sizes")
            self.stack.append(known)
            return
        self.stack.append(self._load_storage(key, dtype, numel))

    def _load_storage(self, key: str, dtype: torch.dtype, numel: int) -> _Storage:
        member = f"data/{key}"
        if not self.members.has(member):
            self.fail(f"storage member {member} is missing")
        size = numel * torch.empty((), dtype=dtype).element_size()
        data = self.members.read(member, size)  # the zip entry's size is checked first
        flat = torch.frombuffer(bytearray(data), dtype=dtype) if data else torch.empty(
            0, dtype=dtype)
        storage = _Storage(key, dtype, flat)
        self.storages[key] = storage
        return storage

    def reduce(self) -> None:
        args, fn = self.pop(), self.pop()
        if not isinstance(fn, _Global) or type(args) is not tuple:
            self.fail("REDUCE of something that is not a global and an argument tuple")
        if fn.name == _ORDERED_DICT and not args:
            self.stack.append(_Hooks())
        elif fn.name == _REBUILD:
            self.stack.append(self._tensor(args))
        else:
            self.fail(f"REDUCE calls {fn.name.replace(' ', '.')}{'(...)' if args else '()'}, "
                      "which torch does not write for plain tensors; it was not called")

    def _ints(self, raw: Any, what: str) -> list[int]:
        if type(raw) is not tuple or len(raw) > LIMITS.max_rank or any(
                type(v) is not int or not 0 <= v <= LIMITS.max_dim for v in raw):
            self.fail(f"tensor {what} {str(raw)[:60]} are not non-negative integers")
        return list(raw)

    def _tensor(self, args: tuple) -> torch.Tensor:
        if len(args) not in (6, 7) or not isinstance(args[0], _Storage) or not isinstance(
                args[5], _Hooks) or (len(args) == 7 and args[6] not in ({}, None)):
            self.fail("_rebuild_tensor_v2 takes (storage, offset, size, stride, requires_grad, "
                      "OrderedDict()) here (tensor metadata such as conj / neg bits is not read)")
        storage, offset, grad = args[0], args[1], args[4]
        sizes, strides = self._ints(args[2], "sizes"), self._ints(args[3], "strides")
        if len(sizes) != len(strides) or type(offset) is not int or offset < 0 or type(
                grad) is not bool:
            self.fail("tensor sizes, strides, offset or requires_grad malformed")
        numel = 1
        for s in sizes:
            numel *= s
        extent = 0 if numel == 0 else offset + 1 + sum((s - 1) * st for s, st in
                                                        zip(sizes, strides))
        if extent > storage.flat.numel():
            self.fail(f"a tensor of sizes {sizes[:8]} strides {strides[:8]} offset {offset} "
                      f"needs {extent} elements, storage {storage.key} has "
                      f"{storage.flat.numel()}")
        if grad and not (storage.dtype.is_floating_point or storage.dtype.is_complex):
            self.fail(f"a {storage.dtype} tensor cannot require grad")
        tensor = (torch.as_strided(storage.flat, sizes, strides, offset) if numel
                  else torch.empty(sizes, dtype=storage.dtype))
        return tensor.requires_grad_(grad) if grad else tensor

    # -- the walk ---------------------------------------------------------------------------

    def run(self, data: bytes) -> Any:
        try:
            for count, (op, arg, pos) in enumerate(pickletools.genops(data)):
                self.pos = pos or 0
                if count > _MAX_OPCODES:
                    self.fail(f"more than {_MAX_OPCODES} opcodes")
                if op.name == "STOP":
                    return self.finish()
                handler = _OPS.get(op.name)
                if handler is None:
                    self.fail(f"opcode {op.name} is not one torch writes for plain tensors")
                handler(self, arg)
        except SerializationError:
            raise
        except (ValueError, IndexError, OverflowError) as e:  # genops on a broken stream
            self.fail(f"not a pickle stream ({type(e).__name__}: {str(e)[:120]})")
        self.fail("the stream ends without STOP")

    def finish(self) -> Any:
        if len(self.stack) != 1 or self.marks:
            self.fail("the stream leaves more than one value")
        value = self.stack[0]
        if not (type(value) is tuple and len(value) == 2 and type(value[0]) is tuple
                and type(value[1]) is dict and all(type(k) is str for k in value[1])):
            self.fail("the example inputs are not (args tuple, kwargs dict with str keys)")
        _check_tree(value, self)
        return value


def _check_tree(value: Any, machine: _Machine) -> None:
    """Every leaf is a tensor or a scalar; depth and size bounded (memo references may form
    cycles or exponential DAGs)."""
    todo, seen = [(value, 0)], 0
    while todo:
        item, depth = todo.pop()
        seen += 1
        if depth > _MAX_DEPTH or seen > _MAX_VALUES:
            machine.fail(f"the inputs nest deeper than {_MAX_DEPTH} or hold more than "
                         f"{_MAX_VALUES} values")
        if type(item) in (tuple, list):
            todo.extend((v, depth + 1) for v in item)
        elif type(item) is dict:
            todo.extend((v, depth + 1) for v in item.values())
        elif not (type(item) is torch.Tensor or type(item) in _SCALARS):
            machine.fail(f"an input of kind {type(item).__name__.lstrip('_')}")


def _push(value_of: Any) -> Any:
    return lambda m, arg: m.stack.append(value_of(arg))


def _memo_put(m: _Machine, arg: Any) -> None:
    if not m.stack:
        m.fail("memoizing an empty stack")
    m.memo[len(m.memo) if arg is None else arg] = m.stack[-1]


def _memo_get(m: _Machine, arg: int) -> None:
    if arg not in m.memo:
        m.fail(f"memo entry {arg} was never stored")
    m.stack.append(m.memo[arg])


def _proto(m: _Machine, arg: int) -> None:
    if not 2 <= arg <= 5:
        m.fail(f"pickle protocol {arg}")


def _tuple_n(n: int) -> Any:
    def op(m: _Machine, arg: Any) -> None:
        items = [m.pop() for _ in range(n)][::-1]
        m.stack.append(tuple(items))
    return op


def _append(m: _Machine, arg: Any) -> None:
    value = m.pop()
    m.top(list).append(value)


def _appends(m: _Machine, arg: Any) -> None:
    items = m.pop_mark()
    m.top(list).extend(items)


def _setitem(m: _Machine, arg: Any) -> None:
    value, key = m.pop(), m.pop()
    m.setitems(m.top(dict), [key, value])


def _setitems(m: _Machine, arg: Any) -> None:
    items = m.pop_mark()
    m.setitems(m.top(dict), items)


def _dict(m: _Machine, arg: Any) -> None:
    out: dict[Any, Any] = {}
    m.setitems(out, m.pop_mark())  # pops first: pop_mark replaces m.stack
    m.stack.append(out)


_OPS: dict[str, Any] = {
    "PROTO": _proto, "FRAME": lambda m, arg: None,
    "MARK": lambda m, arg: (m.marks.append(m.stack), setattr(m, "stack", [])),
    "NONE": _push(lambda a: None), "NEWTRUE": _push(lambda a: True),
    "NEWFALSE": _push(lambda a: False),
    "BININT": _push(int), "BININT1": _push(int), "BININT2": _push(int), "LONG1": _push(int),
    "BINFLOAT": _push(float),
    "BINUNICODE": _push(str), "SHORT_BINUNICODE": _push(str), "BINUNICODE8": _push(str),
    "EMPTY_TUPLE": _push(lambda a: ()), "TUPLE1": _tuple_n(1), "TUPLE2": _tuple_n(2),
    "TUPLE3": _tuple_n(3), "TUPLE": lambda m, arg: m.push_marked(tuple),
    "EMPTY_LIST": _push(lambda a: []), "LIST": lambda m, arg: m.push_marked(list),
    "APPEND": _append, "APPENDS": _appends,
    "EMPTY_DICT": _push(lambda a: {}), "DICT": _dict, "SETITEM": _setitem,
    "SETITEMS": _setitems,
    "BINPUT": _memo_put, "LONG_BINPUT": _memo_put, "MEMOIZE": _memo_put,
    "BINGET": _memo_get, "LONG_BINGET": _memo_get,
    "GLOBAL": lambda m, arg: m.global_(arg), "STACK_GLOBAL": lambda m, arg: m.stack_global(),
    "BINPERSID": lambda m, arg: m.persistent(), "REDUCE": lambda m, arg: m.reduce(),
}  # fmt: skip


def read_pickled_inputs(pickle_bytes: bytes, members: Any, where: str) -> Any:
    """``(args, kwargs)`` of torch.save's ``data.pkl`` ``pickle_bytes`` whose storages are the
    members ``data/<key>`` of ``members`` (``has(name)``, ``read(name, size)``). Raises
    :class:`SerializationError` naming ``where`` and the opcode offset for anything else."""
    return _Machine(members, where).run(pickle_bytes)


# --------------------------------------------------------------------------- writing


def _unwritable(value: Any, depth: int = 0) -> str | None:
    """Why ``value`` is not a tree :func:`read_pickled_inputs` reads back, or None."""
    if depth > _MAX_DEPTH:
        return f"containers nested deeper than {_MAX_DEPTH}"
    if isinstance(value, torch.Tensor):
        if type(value) not in (torch.Tensor, torch.nn.Parameter):
            return f"a tensor subclass ({type(value).__name__})"
        if value.device.type != "cpu" or value.layout != torch.strided:
            return f"a {value.device.type} / {value.layout} tensor (only cpu strided ones)"
        if value.dtype not in _STORAGES.values() or value.is_conj() or value.is_neg():
            return f"a {value.dtype} tensor"
        return None
    if type(value) in _SCALARS:
        return None
    if type(value) in (tuple, list):
        return next((r for v in value if (r := _unwritable(v, depth + 1))), None)
    if type(value) is dict:
        if any(type(k) not in (str, int, bool, type(None)) for k in value):
            return "a dict key that is not a string or a number"
        return next((r for v in value.values() if (r := _unwritable(v, depth + 1))), None)
    return f"a {type(value).__qualname__}"


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):  # detached (a Parameter becomes a plain tensor)
        out = value.detach()
        return out.requires_grad_() if value.requires_grad else out
    if type(value) in (tuple, list):
        return type(value)(_plain(v) for v in value)
    if type(value) is dict:
        return {k: _plain(v) for k, v in value.items()}
    return value


def pickle_inputs(example: Any, where: str) -> bytes:
    """``torch.save`` bytes of ``(args, kwargs)`` (protocol 2, as torch.export.save writes
    them), b"" when there are none; only trees :func:`read_pickled_inputs` reads back are
    written (anything else: b"" and a warning)."""
    if example is None:
        return b""
    reason = _unwritable(example)
    if reason is not None:
        import warnings

        warnings.warn(f"{where}: the example inputs hold {reason}; they are not written "
                      "(torch.export.load will see none)", stacklevel=4)
        return b""
    import io

    buffer = io.BytesIO()
    torch.save(_plain(example), buffer, pickle_protocol=2)
    return buffer.getvalue()
