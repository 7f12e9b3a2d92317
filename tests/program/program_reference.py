"""A minimal reference executor of schema.Program used to test emission and planning.

It runs every instruction with torch's out-variant kernels on views of the planned arenas (so a
bad memory plan corrupts results), and checks that kernels never resize their out tensors (so
emitted sizes and dim orders match what the kernels produce). It is a test oracle, not the
runtime (exportir.runtime).
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from exportir.format import schema

_PRIMS = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul,
    "floordiv": operator.floordiv, "truediv": operator.truediv, "mod": operator.mod,
    "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le,
    "gt": operator.gt, "ge": operator.ge,
}
_MEMORY_FORMATS = [torch.contiguous_format, torch.preserve_format, torch.channels_last,
                   torch.channels_last_3d]


def strides(sizes: tuple[int, ...], dim_order: tuple[int, ...]) -> list[int]:
    out = [0] * len(sizes)
    step = 1
    for d in reversed(dim_order):
        out[d] = step
        step *= max(sizes[d], 1)
    return out


def _dtype(st: schema.ScalarType) -> torch.dtype:
    return getattr(torch, schema.TORCH_DTYPE_NAME[st])


def _view(buf: torch.Tensor, offset: int, t: schema.Tensor) -> torch.Tensor:
    raw = buf[offset:offset + t.nbytes]
    flat = raw.view(_dtype(t.dtype)) if t.nbytes else torch.empty(0, dtype=_dtype(t.dtype))
    return flat.as_strided(t.sizes, strides(t.sizes, t.dim_order))


def _convert(arg: Any, value: Any) -> Any:
    real = str(arg.real_type)
    if value is None or not isinstance(value, int):
        return value
    if "ScalarType" in real:
        return _dtype(schema.ScalarType(value))
    if "MemoryFormat" in real:
        return _MEMORY_FORMATS[value]
    if "Layout" in real:
        return torch.strided
    return value


class Runner:
    def __init__(self, program: schema.Program, method: str = "forward") -> None:
        self.p = program
        self.m = program.method(method)
        self.arenas = [torch.zeros(n, dtype=torch.uint8) for n in self.m.plan.arenas]
        self.consts = [torch.frombuffer(bytearray(c.data), dtype=torch.uint8)
                       if c.nbytes else torch.empty(0, dtype=torch.uint8)
                       for c in program.constants]
        self.env: list[Any] = [None] * len(self.m.values)
        for i, v in enumerate(self.m.values):
            if isinstance(v, schema.Tensor):
                match v.storage:
                    case schema.Allocation(arena=a, offset=o):
                        self.env[i] = _view(self.arenas[a], o, v)
                        if v.initial is not None:
                            self.env[i].copy_(_view(self.consts[v.initial], 0, v))
                    case schema.ConstantData(buffer=b):
                        self.env[i] = _view(self.consts[b], 0, v)
                    case schema.DynamicStorage():
                        self.env[i] = torch.empty(v.sizes, dtype=_dtype(v.dtype))
            elif isinstance(v, (schema.Int, schema.Double, schema.Bool, schema.String)):
                self.env[i] = v.value
        self.build_views(input_views=False)

    def build_views(self, input_views: bool) -> None:
        """Views alias their base: built once, or (views of inputs) after binding inputs."""
        for i, v in enumerate(self.m.values):
            if isinstance(v, schema.Tensor) and isinstance(v.storage, schema.ViewOf):
                base = self.m.values[v.storage.base]
                if isinstance(base.storage, schema.InputStorage) == input_views:
                    b = self.env[v.storage.base]
                    self.env[i] = b.as_strided(v.sizes, v.storage.strides,
                                               b.storage_offset() + v.storage.offset)

    def get(self, i: int) -> Any:
        v = self.m.values[i]
        match v:
            case schema.Null():
                return None
            case schema.IntList(items=items) | schema.TensorList(items=items):
                return [self.get(k) for k in items]
            case schema.OptionalTensorList(items=items):
                return [self.get(k) for k in items]
            case schema.DoubleList(values=vals) | schema.BoolList(values=vals):
                return list(vals)
        return self.env[i]

    def kernel(self, ins: schema.KernelCall) -> None:
        op = self.m.operators[ins.op_index]
        if (op.name, op.overload) in schema.PRIM_OPERATORS:
            args = [self.get(a) for a in ins.args[:-1]]
            ns, name = op.name.split("::")
            if name == "sym_size":
                result = args[0].shape[args[1]]
            elif name == "sym_numel":
                result = args[0].numel()
            elif name == "neg":
                result = -args[0]
            else:
                result = _PRIMS[name](*args)
            self.env[ins.args[-1]] = result
            return
        ns, name = op.name.split("::")
        if op.is_functional_fallback:  # custom op: call it, copy the results into the outs
            overload = op.overload.removesuffix(schema.FUNCTIONAL_FALLBACK)
            fn = getattr(getattr(getattr(torch.ops, ns), name), overload)
            n = len(fn._schema.arguments)
            args = [_convert(a, self.get(k)) for a, k in zip(fn._schema.arguments, ins.args)]
            results = fn(*args)
            results = results if isinstance(results, (tuple, list)) else (results,)
            for k, value in zip(ins.args[n:], results):
                self.get(k).copy_(value)
            return
        fn = getattr(getattr(getattr(torch.ops, ns), name), op.overload or "default")
        pos, kw = [], {}
        outs = []
        for a, k in zip(fn._schema.arguments, ins.args):
            value = _convert(a, self.get(k))
            if a.is_out:
                outs.append(value)
            if a.kwarg_only:
                kw[a.name] = value
            else:
                pos.append(value)
        before = [(o.data_ptr(), o.shape) for o in _flat(outs)]
        fn(*pos, **kw)
        after = [(o.data_ptr(), o.shape) for o in _flat(outs)]
        # shrinking to no elements is harmless (batch norm's unused save_mean / save_invstd)
        changed = [(b, a) for b, a, o in zip(before, after, _flat(outs))
                   if b != a and o.numel() > 0]
        if changed:
            raise AssertionError(f"{op}: kernel resized its out tensors {before} -> {after}")

    def __call__(self, *inputs: Any) -> list[Any]:
        for i, x in zip(self.m.inputs, inputs):
            v = self.m.values[i]
            dense = isinstance(x, torch.Tensor) and v.dim_order == tuple(range(x.dim()))
            self.env[i] = x.contiguous() if dense else x
        self.build_views(input_views=True)
        pc = 0
        while pc < len(self.m.instructions):
            ins = self.m.instructions[pc]
            pc += 1
            match ins:
                case schema.KernelCall():
                    self.kernel(ins)
                case schema.MoveCall(src=s, dst=d):
                    if isinstance(self.env[d], torch.Tensor):
                        self.env[d].copy_(self.get(s))
                    else:
                        self.env[d] = self.get(s)
                case schema.JumpFalseCall(cond_value=c, dest=dest):
                    if not bool(self.get(c)):
                        pc = dest
                case schema.FreeCall():
                    pass
                case schema.DelegateCall():
                    raise NotImplementedError("delegates run in exportir.runtime")
        out = [self.get(o) for o in self.m.outputs]
        return [o.clone() if isinstance(o, torch.Tensor) else o for o in out]


def _flat(xs: list[Any]) -> list[torch.Tensor]:
    flat = []
    for x in xs:
        flat.extend(x if isinstance(x, list) else [x])
    return flat


def run(program: schema.Program, method: str, *inputs: Any) -> list[Any]:
    return Runner(program, method)(*inputs)
