"""``compare``: where a program's numbers first drift from eager PyTorch.

The program runs once in the runtime with every intermediate copied out
(:func:`exportir.runtime.instrument.capture_intermediates`: each instruction's results, and
each op's results inside delegates whose backend can be instrumented). The Edge graph it was
emitted from runs once in eager PyTorch, node by node (:mod:`._reference`). Intermediates are
matched to graph nodes through the program's debug tables (an instruction's ``DebugEntry``
names its node; a fused op names the nodes it replaced, and the one whose value has the op
result's shape and dtype is compared). Values are compared in execution order; the first one
beyond tolerance is the drift. The model itself runs eagerly too, and the program's outputs
are compared with its outputs.
"""

from __future__ import annotations

import copy
import operator
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from exportir import pytree
from exportir.debug._modules import (
    ModuleComparison,
    ModuleOutputs,
    compare_modules,
    last_nodes,
)
from exportir.debug._reference import ReferenceRun, run_reference
from exportir.format import schema
from exportir.program.kernels import source_line

__all__ = ["DriftReport", "ModuleComparison", "NodeComparison", "OutputComparison", "compare"]


@dataclass(frozen=True, slots=True)
class NodeComparison:
    """One program intermediate against the eager value of the graph node it came from:
    ``max_abs`` = max |got - want|, ``max_rel`` = max |got - want| / max(|want|, atol);
    ``within``: every element has |got - want| <= atol + rtol * |want|."""

    position: int
    pc: int
    op: str
    node: str
    source: str
    module: str
    module_type: str
    shape: tuple[int, ...]
    dtype: str
    max_abs: float
    max_rel: float
    within: bool
    delegate_op: int | None = None

    @property
    def where(self) -> str:
        site = f"instruction {self.pc}"
        if self.delegate_op is not None:
            site += f", delegate op {self.delegate_op}"
        return site


@dataclass(frozen=True, slots=True)
class OutputComparison:
    """One program output against the eager model's output at the same position."""

    index: int
    max_abs: float
    max_rel: float
    within: bool


@dataclass(slots=True)
class DriftReport:
    """The result of :func:`compare`: ``first_drift`` (None when every compared value is
    within tolerance), ``nodes`` (every comparison, in execution order), ``outputs``."""

    method: str
    rtol: float
    atol: float
    nodes: list[NodeComparison] = field(default_factory=list)
    outputs: list[OutputComparison] = field(default_factory=list)
    modules: list[ModuleComparison] = field(default_factory=list)
    unmatched: int = 0

    @property
    def first_drift(self) -> NodeComparison | None:
        return next((c for c in self.nodes if not c.within), None)

    @property
    def first_module_drift(self) -> ModuleComparison | None:
        """The first eager submodule (in the order their calls finished) whose output the
        program's value for it does not match."""
        return next((m for m in self.modules if not m.within), None)

    @property
    def drifted(self) -> list[NodeComparison]:
        return [c for c in self.nodes if not c.within]

    @property
    def ok(self) -> bool:
        return self.first_drift is None and all(o.within for o in self.outputs)

    def summary(self) -> str:
        first = self.first_drift
        head = (f"compared {len(self.nodes)} intermediate values of method {self.method!r} with "
                f"eager (rtol={self.rtol:g}, atol={self.atol:g})")
        if first is None:
            verdict = "no drift: every compared value is within tolerance"
        else:
            module = f" in module {first.module or '<root>'}" if first.module_type else ""
            verdict = (
                f"first drift: node {first.node!r} ({first.op}, {first.where}){module}\n"
                f"  from user code: {first.source or '<unknown>'}\n"
                f"  max abs error {first.max_abs:.3g}, max rel error {first.max_rel:.3g} "
                f"on {first.dtype}{list(first.shape)}; {len(self.drifted)} of "
                f"{len(self.nodes)} values beyond tolerance"
            )
        outs = ", ".join(
            f"{o.index}: {'ok' if o.within else 'DRIFT'} (max abs {o.max_abs:.3g})"
            for o in self.outputs
        )
        return (f"{head}\n{verdict}\noutputs vs the eager model: {outs or 'none'}\n"
                f"{self._module_summary()}")

    def _module_summary(self) -> str:
        first = self.first_module_drift
        if not self.modules:
            return "submodules vs the eager model: none compared"
        if first is None:
            return (f"submodules vs the eager model: {len(self.modules)} compared, all within "
                    "tolerance")
        kind = first.module_type.rsplit(".", 1)[-1]
        return (f"submodules vs the eager model: first beyond tolerance {first.module} ({kind}), "
                f"its output computed by node {first.node!r}: max abs error "
                f"{first.max_abs:.3g}, max rel error {first.max_rel:.3g}")

    def table(self, limit: int | None = 40) -> str:
        """Every comparison (the first ``limit``, and every drift after them) as text."""
        shown = [c for k, c in enumerate(self.nodes)
                 if limit is None or k < limit or not c.within]
        rows = [("#", "node", "op", "max abs", "max rel", "", "source", "module")]
        rows += [(str(c.position), c.node, c.op, f"{c.max_abs:.3g}", f"{c.max_rel:.3g}",
                  "ok" if c.within else "DRIFT", c.source, c.module) for c in shown]
        widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
        return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows)

    def __str__(self) -> str:
        return f"{self.summary()}\n\n{self.table()}"


# ------------------------------------------------------------------------------ errors


def _errors(got: torch.Tensor, want: torch.Tensor, rtol: float, atol: float
            ) -> tuple[float, float, bool]:
    """Max absolute and relative errors and whether ``got`` is within tolerance of ``want``."""
    if got.numel() == 0:
        return 0.0, 0.0, True
    if not (got.is_floating_point() or got.is_complex()):
        diff = (got.to(torch.float64) - want.to(torch.float64)).abs()
        max_abs = float(diff.max())
        return max_abs, max_abs, max_abs == 0
    a, b = got.to(torch.float64), want.to(torch.float64)
    diff = (a - b).abs()
    same = (a == b) | (a.isnan() & b.isnan())  # equal infinities and NaNs are no error
    diff = torch.where(same, torch.zeros_like(diff), diff)
    diff = torch.nan_to_num(diff, nan=float("inf"))
    # relative to the reference's magnitude, and to atol where the reference is about zero
    rel = diff / b.abs().clamp_min(max(atol, torch.finfo(torch.float64).tiny))
    rel = torch.where(diff == 0, torch.zeros_like(rel), rel)
    within = bool(torch.all(diff <= atol + rtol * b.abs().nan_to_num(nan=0.0, posinf=0.0)))
    return float(diff.max()), float(rel.max()), within


# ------------------------------------------------------------------------------ matching


def _items(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _same_kind(a: Any, b: Any) -> bool:
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
            and tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype)


def _instruction_pairs(nodes: Sequence[str], values: Sequence[Any], ref: ReferenceRun
                       ) -> list[tuple[str, Any, Any]]:
    """An instruction's results against its node's results (item ``k`` of a multi-result
    node only when something reads it: an unread out may be left unwritten)."""
    if len(nodes) != 1 or nodes[0] not in ref.values:
        return []
    name = nodes[0]
    items = _items(ref.values[name])
    read = ref.items_read.get(name, set()) | {0}
    multi = isinstance(ref.values[name], (tuple, list))
    return [
        (name, got, want)
        for k, (got, want) in enumerate(zip(values, items))
        if (not multi or k in read) and _same_kind(got, want)
    ]


# Ops that only move or alias data. Inside a delegate they are not compared: they cannot
# change a value, and a rewritten layout chain computes intermediates no single graph node had
# (a view / permute / view standing for five nodes); a wrong one shows at the next op computing.
_DATA_MOVEMENT = frozenset({
    "view_copy", "view", "reshape", "permute_copy", "permute", "expand_copy", "expand",
    "unsqueeze_copy", "unsqueeze", "squeeze_copy", "squeeze", "transpose_copy", "transpose",
    "t_copy", "select_copy", "select", "slice_copy", "slice", "split_with_sizes_copy",
    "split_copy", "unbind_copy", "unbind", "unfold_copy", "alias_copy", "clone", "cat",
})


def _moves_data(op: str) -> bool:
    """Whether a delegate op (``aten.permute_copy.default``) only moves data."""
    parts = op.split(".")
    return len(parts) >= 2 and parts[1] in _DATA_MOVEMENT


def _fused_pairs(nodes: Sequence[str], values: Sequence[Any], ref: ReferenceRun
                 ) -> list[tuple[str, Any, Any]]:
    """A fused op's results against the nodes it replaced: each result against the last node
    (in graph order) with a value of the same shape and dtype, the end of the fused chain
    (``relu`` of convolution + batch norm + relu; the ``view`` back after a linear's
    ``addmm``)."""
    pairs = []
    order = sorted((n for n in nodes if n in ref.values), key=ref.order.__getitem__,
                   reverse=True)
    for j, got in enumerate(values):
        for name in order:
            want = ref.values[name]
            candidates = _items(want) if isinstance(want, (tuple, list)) else [want]
            if len(candidates) == len(values) > 1:  # results of a multi-result node: by position
                candidates = [candidates[j]]
            match = next((w for w in candidates if _same_kind(got, w)), None)
            if match is not None:
                pairs.append((name, got, match))
                break
    return pairs


# ------------------------------------------------------------------------------ compare


def _as_program(program_or_ep: Any, partitioner: Any) -> Any:
    """The ``ProgramManager`` (program and the Edge programs it came from) to compare."""
    from exportir.export import ExportedProgram
    from exportir.program.manager import EdgeProgramManager, ProgramManager, to_edge

    if isinstance(program_or_ep, ProgramManager):
        return program_or_ep
    if isinstance(program_or_ep, EdgeProgramManager):
        return program_or_ep.to_program()
    if isinstance(program_or_ep, ExportedProgram):
        if partitioner is not None:
            from exportir.program.transform_and_lower import to_edge_transform_and_lower

            return to_edge_transform_and_lower(program_or_ep, partitioner=partitioner).to_program()
        return to_edge(program_or_ep).to_program()
    raise TypeError(
        "compare takes an ExportedProgram (exportir.export), an EdgeProgramManager "
        "(to_edge / to_edge_transform_and_lower), a ProgramManager (.to_program()), or a "
        f"program file's path or bytes with etrecord=...; got {type(program_or_ep).__name__}. "
        "A program file alone has no graph to compare with: pass the ETRecord of the program "
        "(program_manager.get_etrecord().save(path)) as etrecord="
    )


def _program_and_reference(program_or_ep: Any, etrecord: Any, method: str, partitioner: Any
                           ) -> tuple[bytes | memoryview, Any, set[str]]:
    """The program's bytes, the graph of ``method`` to run as the reference, and the methods."""
    if etrecord is None:
        manager = _as_program(program_or_ep, partitioner)
        methods = set(manager.methods)
        if method not in methods:
            raise ValueError(f"the program has no method {method!r}; it has {sorted(methods)}")
        return manager.buffer, manager.exported_program(method), methods
    from exportir.program.etrecord import ETRecord, load_etrecord

    record = etrecord if isinstance(etrecord, ETRecord) else load_etrecord(etrecord)
    if isinstance(program_or_ep, (bytes, bytearray, memoryview)):
        data = program_or_ep
    elif isinstance(program_or_ep, (str, os.PathLike)):
        with open(program_or_ep, "rb") as f:
            data = f.read()
    else:
        data = _as_program(program_or_ep, partitioner).buffer
    if not record.belongs_to(data):
        raise ValueError("the ETRecord was made for another program (its program_sha256 differs "
                         "from this program's): save the ETRecord of the program you compare")
    methods = set(record.reference_programs)
    if method not in methods:
        raise ValueError(f"the program has no method {method!r}; it has {sorted(methods)}")
    return data, record.reference_programs[method], methods


def _node_info(meta: schema.Method, ref: ReferenceRun, name: str, delegate: int | None
               ) -> tuple[str, str, str]:
    """(source, module, module_type) of a node: the program's debug node table first."""
    scope = schema.DEBUG_METHOD_SCOPE if delegate is None else delegate
    table = ref.tables.get(id(meta))
    if table is None:
        table = ref.tables[id(meta)] = {(n.scope, n.name): n for n in meta.nodes}
    found = table.get((scope, name)) or table.get((schema.DEBUG_METHOD_SCOPE, name))
    if found is not None:
        return found.source, found.module, found.module_type
    node = ref.nodes.get(name)
    if node is None:
        return "", "", ""
    stack = node.meta.get("nn_module_stack") or {}
    path, kind = list(stack.values())[-1] if stack else ("", "")
    return source_line(node), str(path), str(getattr(kind, "__qualname__", kind))


def _check_tolerance(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"{name} must be a number >= 0; got {value!r}")
    return float(value)


def compare(
    program_or_ep: Any,
    model: Any,
    inputs: Any,
    *,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    method: str = "forward",
    partitioner: Any = None,
    kernels: Any = None,
    etrecord: Any = None,
) -> DriftReport:
    """Run the program and ``model`` on ``inputs`` (a tuple of positional arguments, or a dict
    of keyword arguments) and report where the program's intermediate values first drift from
    eager.

    ``program_or_ep``: an ``ExportedProgram`` (lowered here with ``to_edge``, or with
    ``to_edge_transform_and_lower(partitioner=...)`` when ``partitioner`` is given), an
    ``EdgeProgramManager`` or a ``ProgramManager``; or a program file (path or bytes) with
    ``etrecord``, its ETRecord (``ProgramManager.get_etrecord()``, or the path it was saved
    to), which holds the graph the program was emitted from. ``kernels``: the runtime
    ``KernelRegistry`` to load the program with (your own kernels). Returns a
    :class:`DriftReport`; ``print(report)`` shows the first drift with its source line and
    every comparison with its max abs / rel error.
    """
    from exportir.runtime import Program
    from exportir.runtime.instrument import capture_intermediates

    rtol, atol = _check_tolerance("rtol", rtol), _check_tolerance("atol", atol)
    args, kwargs = _split_inputs(inputs)
    data, edge, _ = _program_and_reference(program_or_ep, etrecord, method, partitioner)
    loaded = Program.load(data, kernels=kernels).method(method)
    flat_inputs = loaded._state._flatten_inputs(args, kwargs)  # the program's input order
    outputs, found = capture_intermediates(loaded, [_copy(x) for x in flat_inputs])
    ref = run_reference(edge, [_copy(x) for x in flat_inputs])
    report = DriftReport(method, rtol, atol)
    computed = _compare_nodes(report, found, ref, loaded.meta)
    with ModuleOutputs(model) as recorded:
        report.outputs = _compare_outputs(outputs, model, args, kwargs, rtol, atol)
    modules = {name: _node_info(loaded.meta, ref, name, None)[1] for name, node in
               ref.nodes.items() if node.target is not operator.getitem}
    report.modules = compare_modules(recorded, computed, last_nodes(modules, ref.order), _errors,
                                     rtol, atol)
    return report


def _compare_nodes(report: DriftReport, found: Sequence[Any], ref: ReferenceRun,
                   meta: schema.Method) -> list[tuple[str, str, torch.Tensor]]:
    """Fill ``report.nodes`` (and ``unmatched``) from the program's intermediates; returns
    (node, module, value) of every tensor the program computed, in order (for the modules)."""
    computed = []
    for item in found:
        name = _main_node(item.nodes, ref)
        if name:
            module = _node_info(meta, ref, name, item.delegate)[1]
            computed += [(name, module, v) for v in item.values if isinstance(v, torch.Tensor)]
        if item.delegate is not None and _moves_data(item.op):
            continue
        pairs = (_instruction_pairs if item.delegate is None else _fused_pairs)(
            item.nodes, item.values, ref)
        if not pairs:
            report.unmatched += 1
        for name, got, want in pairs:
            max_abs, max_rel, within = _errors(got, want, report.rtol, report.atol)
            source, module, module_type = _node_info(meta, ref, name, item.delegate)
            report.nodes.append(NodeComparison(
                len(report.nodes), item.pc, item.op, name, source, module, module_type,
                tuple(got.shape), str(got.dtype).removeprefix("torch."), max_abs, max_rel,
                within, item.op_index,
            ))
    return computed


def _main_node(nodes: Sequence[str], ref: ReferenceRun) -> str:
    """The node an intermediate stands for: its only node, or the last of a fused op's."""
    known = [n for n in nodes if n in ref.order]
    return max(known, key=ref.order.__getitem__) if known else ""


def _copy(x: Any) -> Any:
    return x.clone() if isinstance(x, torch.Tensor) else x


def _split_inputs(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``inputs`` as (args, kwargs): a tuple or list of positional arguments, a dict of keyword
    arguments, or one tensor."""
    if isinstance(inputs, dict):
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    return (inputs,), {}


def _run_model(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``model(*args, **kwargs)`` without autograd, on copies of the inputs, leaving the
    model's buffers as they were (a KV cache it updates is restored)."""
    buffers = list(model.named_buffers()) if isinstance(model, torch.nn.Module) else []
    saved = [b.detach().clone() for _, b in buffers]
    try:
        with torch.no_grad():
            return model(*copy.deepcopy(args), **copy.deepcopy(kwargs))
    finally:
        with torch.no_grad():
            for (_, b), before in zip(buffers, saved):
                if b.shape == before.shape:
                    b.copy_(before)


def _compare_outputs(outputs: Sequence[Any], model: Any, args: tuple[Any, ...],
                     kwargs: dict[str, Any], rtol: float, atol: float) -> list[OutputComparison]:
    expected = pytree.tree_leaves(_run_model(model, args, kwargs))
    found = []
    for k, (got, want) in enumerate(zip(outputs, expected)):
        if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor) and (
            got.shape == want.shape
        ):
            found.append(OutputComparison(k, *_errors(got, want.to(got.dtype), rtol, atol)))
    return found
