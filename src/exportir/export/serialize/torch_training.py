"""torch's training IR -> the ATen dialect, for programs read from torch (torch_decode.py).

torch 2.13's ``torch.export.export`` (and its .pt2) hold the training IR: in-place ops, buffers
updated without mutation outputs, ``batch_norm`` updating running stats silently. Our
ExportedProgram is the functional ATen dialect; :func:`to_aten_dialect` converts as
``run_decompositions`` does (docs/export.md, "torch .pt2 interop").
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch._ops import OpOverload

from exportir.export.capture.functionalize import REWRITES, functionalize
from exportir.export.program.exported_program import ExportedProgram
from exportir.export.program.verifier import SpecViolationError, TrainingIRVerifier, Verifier
from exportir.export.serialize.common import SerializationError
from exportir.export.serialize.values import make_fake
from exportir.export.signature import (
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputKind,
    OutputSpec,
    make_argument_spec,
)
from exportir.fx import GraphModule

__all__ = ["to_aten_dialect"]


def to_aten_dialect(gm: GraphModule, signature: ExportGraphSignature, state: dict,
                    ranges: dict, call_graph: list, constants: dict, where: str,
                    example_inputs: Any) -> ExportedProgram:
    """The ExportedProgram (ATen dialect, verified) of a decoded graph, training IR or not."""
    _expose_batch_norm_updates(gm)
    if any(isinstance(n.target, OpOverload) and (n.target._schema.is_mutable
                                                  or n.target in REWRITES)
           for n in gm.graph.nodes if n.op == "call_function"):
        functional = _functionalize(gm, signature)
        if functional is None:  # only intermediates are written: re-trace (ours, as export)
            return _retraced(gm, signature, state, ranges, call_graph, constants, where,
                             example_inputs)
        gm, signature = functional
    try:
        return ExportedProgram(root=gm, graph=gm.graph, graph_signature=signature,
                               state_dict=state, range_constraints=ranges,
                               module_call_graph=call_graph, example_inputs=example_inputs,
                               constants=constants, verifiers=[Verifier])
    except SpecViolationError as e:
        raise SerializationError(f"{where}: the program is not valid Export IR: {e}") from e
    except (TypeError, ValueError, KeyError, RuntimeError, AttributeError) as e:
        raise SerializationError(f"{where}: cannot rebuild the ExportedProgram "
                                 f"({type(e).__name__}: {e})") from e


def _retraced(gm: GraphModule, signature: ExportGraphSignature, state: dict, ranges: dict,
              call_graph: list, constants: dict, where: str, example_inputs: Any
              ) -> ExportedProgram:
    """A training-IR program whose in-place ops write only its own intermediates: re-traced
    through our capture (``run_decompositions({})``), which functionalizes them as export
    does (views of written tensors regenerated from their bases)."""
    try:
        training = ExportedProgram(root=gm, graph=gm.graph, graph_signature=signature,
                                   state_dict=state, range_constraints=ranges,
                                   module_call_graph=call_graph, example_inputs=None,
                                   constants=constants, verifiers=[TrainingIRVerifier])
        functional = training.run_decompositions({})
        return ExportedProgram(root=functional.graph_module, graph=functional.graph,
                               graph_signature=functional.graph_signature, state_dict=state,
                               range_constraints=ranges,
                               module_call_graph=functional.module_call_graph,
                               example_inputs=example_inputs, constants=constants,
                               verifiers=[Verifier])
    except SpecViolationError as e:
        raise SerializationError(f"{where}: the program is not valid Export IR: {e}") from e
    except (TypeError, ValueError, KeyError, RuntimeError, AttributeError) as e:
        raise SerializationError(f"{where}: cannot functionalize the program "
                                 f"({type(e).__name__}: {e})") from e


def _expose_batch_norm_updates(gm: GraphModule) -> None:
    """torch's training IR keeps ``batch_norm(..., training=True)``, which updates the running
    stats without its schema saying so (torch finds the writes when it re-traces). Made
    ``native_batch_norm`` + ``getitem``, the functionalizer's rule for it exposes the writes."""
    graph = gm.graph
    for n in list(graph.find_nodes(op="call_function", target=torch.ops.aten.batch_norm.default)):
        x, w, b, mean, var, training, momentum, eps = (list(n.args) + [None] * 8)[:8]
        val = n.meta.get("val")
        if not training or mean is None or var is None or not isinstance(val, torch.Tensor):
            continue
        channels = val.shape[1] if val.dim() > 1 else 0
        stat = make_fake([channels], [1], 0, val.dtype, val.device, False)
        with graph.inserting_before(n):
            native = graph.call_function(torch.ops.aten.native_batch_norm.default,
                                         (x, w, b, mean, var, True, momentum, eps))
            native.meta.update({**n.meta, "val": (val, stat, stat)})
            out = graph.call_function(operator.getitem, (native, 0))
            out.meta.update(n.meta)
        n.replace_all_uses_with(out)
        graph.erase_node(n)


def _functionalize(gm: GraphModule, signature: ExportGraphSignature
                   ) -> tuple[GraphModule, ExportGraphSignature] | None:
    """torch's training IR writes buffers / inputs in place: give each write a mutation output
    (``None`` when no input is written, or the pass cannot: the caller re-traces)."""
    kinds = {s.arg.name: s for s in signature.input_specs}
    inputs = list(signature.input_specs)
    try:
        fz, old_out = functionalize(gm.graph)
    except RuntimeError:
        return None  # (an in-place op the graph-level pass has no rule for): re-traced
    if not any(fz.version.get(old, 0) for old in fz.placeholders):
        return None
    mutations, specs = [], []
    for old in fz.placeholders:
        if fz.version.get(old, 0) == 0:
            continue
        spec = kinds.get(old.name)
        value = fz.read(old)
        if spec is not None and spec.kind is InputKind.CONSTANT_TENSOR:
            # a tensor attribute the program updates (transformers' StaticCache): torch lifts
            # it as a constant; state that changes is a (non-persistent) buffer
            spec = InputSpec(InputKind.BUFFER, spec.arg, spec.target, False)
            inputs[inputs.index(kinds[old.name])] = spec
        if spec is None or spec.kind not in (InputKind.BUFFER, InputKind.USER_INPUT):
            raise SerializationError(f"the program writes input {old.name!r}, which is not a "
                                     "buffer, tensor constant or user input")
        kind = OutputKind.BUFFER_MUTATION if spec.kind is InputKind.BUFFER else \
            OutputKind.USER_INPUT_MUTATION
        target = spec.target if spec.kind is InputKind.BUFFER else old.name
        mutations.append(value)
        specs.append((kind, value, target))
    old_values = list(old_out.args[0])
    user = [fz.map_arg(a) for a in old_values]
    out = fz.output(tuple(mutations) + tuple(user))
    out.meta["val"] = tuple(a.meta.get("val") if hasattr(a, "meta") else a for a in out.args[0])
    fz.new.eliminate_dead_code()
    outputs = [OutputSpec(k, make_argument_spec(v), t) for k, v, t in specs]
    for spec, value in zip(signature.output_specs, user):
        outputs.append(OutputSpec(spec.kind, make_argument_spec(value) if hasattr(value, "meta")
                                  else spec.arg, spec.target))
    new_gm = GraphModule(gm, fz.new)
    return new_gm, ExportGraphSignature(inputs, outputs)
