"""Fake tensors: full tensor metadata, no data.

A :class:`FakeTensor` is a wrapper subclass of ``torch.Tensor`` that reports the real device,
dtype, shape and strides of the tensor it stands for, and keeps a twin tensor on the ``meta``
device. Every ATen op that reaches it runs on the meta twins (the meta kernels compute output
metadata) and the results are wrapped again. Sizes come from the twin, so once the twin carries
``torch.SymInt`` sizes (our SymNode) the fake does too without changes here.

:class:`FakeTensorMode` makes factory ops (``torch.zeros``, ``torch.arange``...) produce fakes
and converts real tensors met inside the mode, through a memo, so one real tensor always maps to
one fake.

Ops whose result depends on tensor *data* (``.item()``, ``nonzero``, ``unique``, a custom op's
``get_ctx().new_dynamic_size()``) produce *unbacked* symbols (``u0``) when the converter has a
:class:`~exportir.symbolic.ShapeEnv` (an export); without one they raise
:class:`DataDependentError`, naming the user's line and the way out.

:func:`fakify` makes the fake of an input whose dimensions are symbolic (sizes ``s0``, strides
computed from them), which is how dynamic input dimensions enter a capture.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Self

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves as pytree_leaves

from exportir.export.capture._device_layout import relayout
from exportir.export.capture._meta_memo import (
    STATIC_MEMO,
    memo_key,
    memoizable,
    rebuild,
    template_of,
)
from exportir.export.capture._unbacked import UNBACKED_RULES, custom_fake_impl, fake_impl_context
from exportir.symbolic import GuardOnDataDependentSymNode, ShapeEnv

aten = torch.ops.aten
_META = torch.device("meta")
_CPU = torch.device("cpu")


# An op or a Python decision needs the value of a tensor, which capture does not have. One class
# for both the static-capture error and the ShapeEnv's unbacked-guard error.
DataDependentError = GuardOnDataDependentSymNode


class MissingFakeImplError(RuntimeError):
    """An op has no meta / fake implementation."""


class FakeTensor(torch.Tensor):
    """A tensor with metadata only; ``_meta`` holds the meta-device twin."""

    _meta: torch.Tensor
    fake_device: torch.device

    @staticmethod
    def __new__(cls, meta: torch.Tensor, device: torch.device, requires_grad: bool = False) -> Self:
        out = torch.Tensor._make_wrapper_subclass(
            cls,
            meta.size(),
            strides=meta.stride(),
            storage_offset=meta.storage_offset(),
            dtype=meta.dtype,
            layout=meta.layout,
            device=device,
            requires_grad=requires_grad,
        )
        out._meta = meta
        out.fake_device = device
        return out

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        extra = "" if self.dtype == torch.get_default_dtype() else f", dtype={self.dtype}"
        where = "" if self.fake_device == _CPU else f", device='{self.fake_device}'"
        return f"FakeTensor(..., size={tuple(self.shape)}{extra}{where})"

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is aten.detach.default and not kwargs:  # (what autograd wrappers apply)
            x = args[0]
            with _no_modes():
                return FakeTensor(x._meta.detach(), x.fake_device)
        return run_fake(func, args, kwargs or {}, FakeConverter())

    # A fake has no data: these Python entry points read it op by op (each element an unbacked
    # symbol under an export) or fail loudly instead of reading memory.
    def tolist(self) -> Any:
        if self.dim() == 0:
            return self.item()
        return [self[i].tolist() for i in range(len(self))]

    def numpy(self, *args: Any, **kwargs: Any) -> Any:
        raise data_dependent("Tensor.numpy()")


def meta_of(t: torch.Tensor) -> torch.Tensor:
    """The meta twin of a fake tensor."""
    return t._meta


def user_frame() -> str:
    """``file:line`` of the innermost frame outside torch and exportir, for error messages."""
    for frame in reversed(traceback.extract_stack()):
        if not _is_internal_file(frame.filename):
            return (
                f'File "{frame.filename}", line {frame.lineno}, in {frame.name}\n    {frame.line}'
            )
    return "<unknown location>"


def _is_internal_file(filename: str) -> bool:
    norm = filename.replace("\\", "/")
    return "/torch/" in norm or "/exportir/" in norm or norm.startswith("<frozen")


def data_dependent(what: str) -> DataDependentError:
    return DataDependentError(
        f"{what} needs the value of a tensor, which is not known while exporting "
        f"(inputs are fake tensors: shapes and dtypes only).\n"
        f"  {user_frame()}\n"
        "Branching or computing on tensor data is not capturable: express data-dependent "
        "control flow with torch.cond(pred, true_fn, false_fn, operands), and assert facts about "
        "data-dependent sizes with torch._check(...). Full support for data-dependent values "
        "comes with dynamic shapes."
    )


# --- conversion --------------------------------------------------------------------------


class FakeConverter:
    """Memoized real -> fake conversion (one fake per real tensor, kept alive with it)."""

    __slots__ = ("_memo", "on_new_constant", "real_kernel", "shape_env")

    def __init__(
        self,
        on_new_constant: Callable[[torch.Tensor, FakeTensor], None] | None = None,
        shape_env: ShapeEnv | None = None,
    ) -> None:
        self._memo: dict[int, tuple[torch.Tensor, FakeTensor]] = {}
        self.on_new_constant = on_new_constant
        self.shape_env = shape_env
        # draft_export: (op, fake args, fake kwargs) -> meta outputs, for an op with no fake
        # kernel (capture/_draft_kernels.py); None: such an op raises MissingFakeImplError
        self.real_kernel: Callable[[Any, tuple, dict], Any] | None = None

    def register(self, real: torch.Tensor, fake: FakeTensor) -> None:
        self._memo[id(real)] = (real, fake)

    def lookup(self, real: torch.Tensor) -> FakeTensor | None:
        hit = self._memo.get(id(real))
        return hit[1] if hit is not None and hit[0] is real else None

    def from_real(self, real: torch.Tensor, *, requires_grad: bool | None = None) -> FakeTensor:
        if isinstance(real, FakeTensor):
            return real
        hit = self.lookup(real)
        if hit is not None:
            return hit
        fake = fake_like(real, requires_grad=requires_grad)
        self.register(real, fake)
        if self.on_new_constant is not None:
            self.on_new_constant(real, fake)
        return fake


def fake_like(real: torch.Tensor, *, requires_grad: bool | None = None) -> FakeTensor:
    """A fresh fake with ``real``'s device, dtype, shape and strides."""
    with _no_modes():
        meta = torch.empty_strided(real.size(), real.stride(), dtype=real.dtype, device=_META)
    grad = real.requires_grad if requires_grad is None else requires_grad
    return FakeTensor(meta, real.device, requires_grad=grad)


def fakify(real: torch.Tensor, sizes: list[Any], *, requires_grad: bool | None = None) -> FakeTensor:
    """A fake of ``real`` whose sizes are ``sizes`` (ints / ``torch.SymInt``); strides follow the
    real tensor's dimension order (contiguous, channels-last, transposed...), symbolically.

    A size-1 dimension keeps its real stride unless that equals the dense stride at the example
    sizes (as torch's fakification does). The comparison is with the example value, never with
    the symbolic stride: comparing a SymInt guards, and ``80 == 16*s0`` would specialize ``s0``
    (a ``(1, 2, seq, 8)`` input with a dynamic ``seq``)."""
    order = sorted(range(real.dim()), key=lambda d: (real.stride(d), -d))
    strides: list[Any] = [0] * real.dim()
    running: Any = 1
    dense = 1  # ``running`` at the example sizes
    for d in order:
        strides[d] = running if real.size(d) != 1 or real.stride(d) == dense else real.stride(d)
        running = running * sizes[d]
        dense *= real.size(d)
    with _no_modes():
        meta = torch.empty_strided(sizes, strides, dtype=real.dtype, device=_META)
    grad = real.requires_grad if requires_grad is None else requires_grad
    return FakeTensor(meta, real.device, requires_grad=grad)


def fake_from_meta(meta: torch.Tensor, device: torch.device) -> FakeTensor:
    return FakeTensor(meta, device)


# ``with _no_modes():`` runs a block with no dispatch mode active (meta computations): torch's
# own guard, a C++ context manager
_no_modes = torch._C._DisableTorchDispatch


# --- running an op on fakes --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Unwrapped:
    args: Any
    kwargs: Any
    fakes: dict[int, FakeTensor]  # id(meta twin) -> fake, to give in-place results back
    device: torch.device | None


# ops that read tensor data: the message names what the user wrote
DATA_DEPENDENT_OPS: dict[Any, str] = {
    aten._local_scalar_dense.default: "Tensor.item() / int(t) / float(t) / bool(t)",
    aten.is_nonzero.default: "bool(tensor)",
    aten.equal.default: "torch.equal",
    aten.nonzero.default: "torch.nonzero",
    aten.masked_select.default: "torch.masked_select",
    aten._unique2.default: "torch.unique",
    aten.unique_dim.default: "torch.unique",
    aten.unique_consecutive.default: "torch.unique_consecutive",
    aten.repeat_interleave.Tensor: "torch.repeat_interleave with a tensor of repeats",
    aten.bincount.default: "torch.bincount",
    aten.allclose.default: "torch.allclose",
}


def _data_dependent_use(func: Any, args: tuple) -> str | None:
    """A data-dependent use of an op that is not always data-dependent (``x[mask]``)."""
    if func is aten.index.Tensor and len(args) > 1:
        masks = (torch.bool, torch.uint8, torch.int8)
        if any(isinstance(i, torch.Tensor) and i.dtype in masks for i in args[1]):
            return "boolean-mask indexing x[mask]"
    return None


def run_fake(func: Any, args: tuple, kwargs: dict, converter: FakeConverter) -> Any:
    """Run ``func`` on the meta twins of its fake arguments and wrap the results."""
    env = converter.shape_env
    what = DATA_DEPENDENT_OPS.get(func) or _data_dependent_use(func, args)
    if what is not None and (env is None or func not in UNBACKED_RULES):
        raise data_dependent(what)
    unwrapped = _unwrap(args, kwargs, converter)
    if env is None:  # a pass (functionalize) re-running an op on symbolic values
        env = _shape_env_of(unwrapped)
    out_device = _result_device(func, kwargs, unwrapped.device)
    try:
        if env is None:
            meta_out = _relayout(func, unwrapped, _call_meta_static(func, unwrapped), out_device)
            return _wrap(meta_out, unwrapped.fakes, out_device)
        # sizes computed inside kernels (and by the wrapper's numel / contiguity) are not user
        # arithmetic: the recorder does not hear of them
        env.listener_paused += 1
        try:
            meta_out = _call_meta_symbolic(func, unwrapped, env)
            meta_out = _relayout(func, unwrapped, meta_out, out_device)
            return _wrap(meta_out, unwrapped.fakes, out_device)
        finally:
            env.listener_paused -= 1
    except MissingFakeImplError:
        # draft_export: the real kernel on the example values gives the output's metadata
        meta_out = None if converter.real_kernel is None else converter.real_kernel(func, args, kwargs)
        if meta_out is None:
            raise
        return _wrap(meta_out, unwrapped.fakes, out_device)


def _relayout(func: Any, u: _Unwrapped, meta_out: Any, device: torch.device) -> Any:
    """The meta result laid out as the device's kernel lays it out (_device_layout.py)."""
    with _no_modes():
        return relayout(func, u.args, u.kwargs, meta_out, device, lambda m: FakeTensor(m, device))


def _shape_env_of(u: _Unwrapped) -> ShapeEnv | None:
    return shape_env_of((u.args, u.kwargs))


def shape_env_of(values: Any) -> ShapeEnv | None:
    """The ShapeEnv of the first symbolic size or scalar in ``values`` (a pytree), if any."""
    for x in pytree_leaves(values):
        if isinstance(x, torch.Tensor):
            for s in x.shape:
                if isinstance(s, torch.SymInt):
                    return s.node.shape_env
        elif isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return x.node.shape_env
    return None


def _call_meta_symbolic(func: Any, u: _Unwrapped, env: ShapeEnv) -> Any:
    key, static = memo_key(func, u.args, u.kwargs) if memoizable(func) else (None, False)
    memo = STATIC_MEMO if static else env.op_memo
    if key is not None:
        template = memo.get(key)
        if template is not None:
            with _no_modes():
                return rebuild(template)
    # Python meta kernels and decompositions (torch._meta_registrations, torch._refs) handle
    # symbolic sizes where some C++ CompositeExplicitAutograd kernels want concrete ints; the
    # Python dispatcher routes to them, as it does during capture.
    try:
        with torch._C._EnablePythonDispatcher():
            out = _call_meta_symbolic_kernel(func, u, env)
    except RuntimeError as err:
        if type(err) is not RuntimeError or _is_missing_kernel(err):
            raise
        raise _symbolic_kernel_error(err, env) from err
    template = _template_to_keep(out, u, env) if key is not None else None
    if template is not None:
        memo[key] = template
    return out


def _template_to_keep(out: Any, u: _Unwrapped, env: ShapeEnv | None) -> Any:
    """What a memo keeps of a meta result, or None: not rebuildable, or aliasing an input."""
    template = template_of(out, env)
    if template is None or any(id(o) in u.fakes for o in _leaves(out)):
        return None
    return template


def _call_meta_static(func: Any, u: _Unwrapped) -> Any:
    """``_call_meta`` on concrete sizes (a pass re-running ops outside capture, without the
    Python dispatcher), through the process-wide memo: some meta kernels are Python
    references (``relu``'s is ``torch._refs``: a millisecond a call)."""
    key, static = memo_key(func, u.args, u.kwargs) if memoizable(func) else (None, False)
    if key is None or not static:
        return _call_meta(func, u)
    key = (_PLAIN_DISPATCH, key)  # the kernels run here are not the capture's (see above)
    template = STATIC_MEMO.get(key)
    if template is not None:
        with _no_modes():
            return rebuild(template)
    out = _call_meta(func, u)
    template = _template_to_keep(out, u, None)
    if template is not None:
        STATIC_MEMO[key] = template
    return out


_PLAIN_DISPATCH = "without the Python dispatcher"


class SymbolicKernelError(RuntimeError):
    """A kernel's check failed on symbolic sizes (so it fails at the example inputs too)."""


def _symbolic_kernel_error(err: RuntimeError, env: ShapeEnv) -> RuntimeError:
    """The kernel's message, plus the user's line and what its symbols stand for."""
    if isinstance(err, SymbolicKernelError):
        return err
    text = str(err)
    mentioned = set(re.findall(r"\bs\d+\b", text))
    where = ", ".join(
        f"{s} = {env.var_to_sources.get(s, ['?'])[0]} ({env.var_to_hint[s]} in the example inputs)"
        for s in sorted(env.var_to_hint, key=str)
        if str(s) in mentioned
    )
    extra = f"\n  {user_frame()}"
    if where:
        extra += (
            f"\nwhere {where}. The check fails at the example inputs' sizes: export traces the "
            "program on them, so they must be valid inputs of the model."
        )
    return SymbolicKernelError(text + extra)


def _call_meta_symbolic_kernel(func: Any, u: _Unwrapped, env: ShapeEnv) -> Any:
    rule = UNBACKED_RULES.get(func)
    if rule is not None:
        with _no_modes():
            out = rule(env, *u.args, **u.kwargs)
        if out is not NotImplemented:  # (a rule may decline: x[long_index] is not data-dependent)
            return out
    kernel = custom_fake_impl(func)
    if kernel is not None:
        try:
            with _no_modes(), fake_impl_context(env, func):
                return kernel(*u.args, **u.kwargs)
        except RuntimeError as err:
            if not _is_missing_kernel(err):
                raise
    return _call_meta(func, u)


def _map(fn: Callable[[Any], Any], x: Any) -> Any:
    """``fn`` over the leaves of op arguments / results: (nested) tuples, lists and dicts. (A
    hand-rolled tree_map: ops' arguments hold no other containers, and this runs per op.)"""
    kind = type(x)
    if kind is tuple or kind is list:
        return kind(_map(fn, a) for a in x)
    if kind is dict:
        return {k: _map(fn, v) for k, v in x.items()}
    if isinstance(x, tuple):  # namedtuple / torch.return_types structseq
        items = [_map(fn, a) for a in x]
        return kind(*items) if hasattr(x, "_fields") else kind(items)
    return fn(x)


def _leaves(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _unwrap(args: tuple, kwargs: dict, converter: FakeConverter) -> _Unwrapped:
    fakes: dict[int, FakeTensor] = {}
    devices: list[torch.device] = []

    def to_meta(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            fake = x if isinstance(x, FakeTensor) else converter.from_real(x)
            fakes[id(fake._meta)] = fake
            if fake.dim() > 0 or not devices:
                devices.append(fake.fake_device)
            return fake._meta
        if isinstance(x, torch.device):
            return _META
        return x

    margs = _map(to_meta, args)
    mkwargs = _map(to_meta, kwargs)
    device = next((d for d in devices if d.type != "cpu"), devices[0] if devices else None)
    return _Unwrapped(margs, mkwargs, fakes, device)


def _result_device(func: Any, kwargs: dict, input_device: torch.device | None) -> torch.device:
    requested = kwargs.get("device")
    if requested is not None:
        return torch.device(requested)
    if input_device is not None:
        return input_device
    return _CPU


def _call_meta(func: Any, u: _Unwrapped) -> Any:
    with _no_modes():
        try:
            return func(*u.args, **u.kwargs)
        except (NotImplementedError, RuntimeError) as err:
            if not _is_missing_kernel(err):
                raise
            return _fallback_meta(func, u, err)


def _is_missing_kernel(err: Exception) -> bool:
    if isinstance(err, NotImplementedError):
        return True
    text = str(err).lower()
    return "no fake impl" in text or ("could not run" in text and "meta" in text)


def _fallback_meta(func: Any, u: _Unwrapped, err: Exception) -> Any:
    """No meta kernel: try the op's decomposition on meta, else say which fake impl is missing."""
    from torch._decomp import decomposition_table

    decomp = decomposition_table.get(func)
    if decomp is not None:
        return decomp(*u.args, **u.kwargs)
    name = func.name() if hasattr(func, "name") else str(func)
    raise MissingFakeImplError(
        f"operator {name} has no fake (meta) implementation, so it cannot be exported.\n"
        f"  {user_frame()}\n"
        f'If it is a custom op, register one with @torch.library.register_fake("{name}") '
        "(a function computing the output's shape/dtype from the inputs').\n"
        f"(underlying error: {str(err).splitlines()[0] if str(err) else type(err).__name__})"
    ) from err


def _wrap(meta_out: Any, fakes: dict[int, FakeTensor], device: torch.device) -> Any:
    def wrap(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        same = fakes.get(id(x))  # in-place / out= ops hand back their argument
        if same is not None:
            _follow_twin(same)
            return same
        return FakeTensor(x, device)

    return _map(wrap, meta_out)


def layout_of(t: torch.Tensor) -> tuple:
    """Sizes, strides and storage offset as comparable values (symbols as expressions, so
    comparing two layouts records no guard)."""

    def key(s: Any) -> Any:
        return s.node.expr if isinstance(s, torch.SymInt) else s

    return (
        tuple(key(s) for s in t.shape),
        tuple(key(s) for s in t.stride()),
        key(t.storage_offset()),
    )


def _follow_twin(fake: FakeTensor) -> None:
    """An in-place op changed the twin's layout (``y.unsqueeze_(0)``, ``as_strided_``, an
    ``out=`` tensor resized by its op): the wrapper reports the new layout, as the tensor would.
    The wrapper's own (dataless) storage is re-set with the meta kernel of ``set_``, which takes
    symbolic sizes and grows the storage's byte count when needed."""
    meta = fake._meta
    if layout_of(fake) == layout_of(meta):
        return
    size, stride, offset = meta.size(), meta.stride(), meta.storage_offset()
    with _no_modes(), torch._C._IncludeDispatchKeyGuard(torch._C.DispatchKey.Meta):
        aten.set_.source_Storage_storage_offset(
            fake, fake.untyped_storage(), offset, size, stride
        )


# --- the mode ----------------------------------------------------------------------------


class FakeTensorMode(TorchDispatchMode):
    """Inside this mode every op produces fakes; real tensors met are converted (memoized)."""

    def __init__(self, converter: FakeConverter | None = None) -> None:
        super().__init__()
        self.converter = converter or FakeConverter()

    def from_tensor(self, t: torch.Tensor, *, requires_grad: bool | None = None) -> FakeTensor:
        return self.converter.from_real(t, requires_grad=requires_grad)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in (aten.lift_fresh.default, aten.lift_fresh_copy.default):
            return self.converter.from_real(args[0])
        return run_fake(func, args, kwargs, self.converter)
