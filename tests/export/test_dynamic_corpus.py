"""The capture corpus re-exported with a dynamic batch dimension.

Every corpus model is exported once at batch 3 with ``Dim.AUTO`` on dim 0 of each tensor input
that carries the batch (its size 0 equals the first tensor input's), then run through
``ep.module()`` at batch 1, 7 and 64 against eager. Models whose code fixes the batch (a buffer
of batch 1, a hard-coded view) specialize it; they are listed in ``STATIC_BATCH`` with the reason,
and torch.export must specialize the same ones.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.export as texport
from corpus import export_harness as h
from corpus import export_models as em

import exportir.export as ours
from exportir import pytree
from exportir.export.dynamic.dims import Dim, ShapesCollection

EXPORT_BATCH = 3
RUN_BATCHES = (1, 7, 64)

# models whose batch dimension the program itself fixes (torch specializes them too)
STATIC_BATCH: dict[str, str] = {
    "gpt_kv_cache": "the KV cache buffers have batch 1",
    "slice_kv_cache": "the cache buffer has batch 1",
    "buffer_slice_assign": "the input is written into a fixed-size buffer slice",
    "view_ops": "x.reshape(4, 6) fixes the batch to 2 (guard Eq(12*s0, 24))",
    "gru_bidirectional": "dim 0 is the sequence, which the GRU unrolls (unbind: guard Eq(s0, 3))",
}
# models that only run at their example's batch (eager fails at EXPORT_BATCH, so does export):
# exported there, they specialize the inputs whose batch the code fixes and keep the others
EXAMPLE_BATCH: dict[str, str] = {
    "gpt_kv_cache": "batch 1 (cache buffers)",
    "slice_kv_cache": "batch 1 (cache buffer)",
    "buffer_slice_assign": "batch 2 (buffer slice)",
    "view_ops": "batch 2 (reshape(4, 6))",
    "aliasing_outputs": "y batch 2 (y.view(3, 2)); x stays dynamic",
}
# capture bugs with symbolic sizes (ShapeEnv / fake tensors, owner "sym"); strict: a fix
# makes the test fail until the entry is removed
SYMBOLIC_CAPTURE_GAPS: dict[str, str] = {}
# example inputs that cannot be resized generically (their values address fixed rows)
NOT_RESIZABLE = {"indexing_ops": "index tensors address rows 0..2"}


def _batched(args: Any, kwargs: Any) -> tuple[list, list, Any, int]:
    leaves, spec = pytree.tree_flatten((args, kwargs))
    tensors = [x for x in leaves if isinstance(x, torch.Tensor) and x.dim() >= 1]
    batch = tensors[0].shape[0] if tensors else 0
    marked = [isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[0] == batch for x in leaves]
    return leaves, marked, spec, batch


def _resize(x: torch.Tensor, b: int) -> torch.Tensor:
    shape = (b, *x.shape[1:])
    if x.dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if not x.dtype.is_floating_point:
        return torch.randint(int(x.min()), int(x.max()) + 1, shape, dtype=x.dtype)
    return torch.randn(shape, dtype=x.dtype)


def _inputs_at(
    args: Any, kwargs: Any, b: int, seed: int, only: list[bool] | None = None
) -> tuple[tuple, dict]:
    """The inputs with every batch-carrying tensor (or those flagged in ``only``) at batch b."""
    torch.manual_seed(seed)
    leaves, marked, spec, _ = _batched(args, kwargs)
    marked = marked if only is None else only
    new = [_resize(x, b) if m else x for x, m in zip(leaves, marked)]
    return pytree.tree_unflatten(new, spec)


def _spec(mod: Any, args: tuple, kwargs: dict, collection_cls: Any, dim_cls: Any) -> Any:
    """AUTO on dim 0 of every batch-carrying tensor, laid out like the inputs by a
    ShapesCollection (ours or torch's)."""
    leaves, marked, _, _ = _batched(args, kwargs)
    sc = collection_cls()
    for x, m in zip(leaves, marked):
        if m:
            sc[x] = {0: dim_cls.AUTO}
    return sc.dynamic_shapes(mod, args, kwargs)


def _dynamic_inputs(ep: Any) -> list[bool]:
    """Per user input placeholder: whether its dim 0 is still symbolic (not specialized)."""
    user = {spec.arg.name for spec in ep.graph_signature.input_specs if spec.kind.name == "USER_INPUT"}
    flags = []
    for node in ep.graph.nodes:
        if node.op != "placeholder" or node.name not in user:
            continue
        val = node.meta.get("val")
        size = val.shape[0] if isinstance(val, torch.Tensor) and val.dim() else None
        flags.append(isinstance(size, torch.SymInt) and not size.node.expr.is_number)
    return flags


@pytest.mark.parametrize("entry", em.ENTRIES, ids=lambda e: e.name)
def test_corpus_dynamic_batch(entry, request):
    if entry.name in NOT_RESIZABLE:
        pytest.skip(NOT_RESIZABLE[entry.name])
    if entry.name in SYMBOLIC_CAPTURE_GAPS:
        request.applymarker(pytest.mark.xfail(reason=SYMBOLIC_CAPTURE_GAPS[entry.name], strict=True))
    mod, args0, kwargs0 = em.build(entry)
    leaves, marked, _, batch0 = _batched(args0, kwargs0)
    if not leaves or not any(marked):
        pytest.skip("no tensor input")
    export_batch = batch0 if entry.name in EXAMPLE_BATCH else EXPORT_BATCH
    args, kwargs = _inputs_at(args0, kwargs0, export_batch, seed=1)
    spec = _spec(mod, args, kwargs, ShapesCollection, Dim)
    ep = ours.export(h.deepcopy_module(mod), args, kwargs, dynamic_shapes=spec)
    dynamic = _dynamic_inputs(ep)  # one flag per flat input, like ``marked``
    assert any(dynamic) == (entry.name not in STATIC_BATCH), f"{entry.name}: dynamic = {dynamic}"
    if dynamic != marked:  # something specialized
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tspec = _spec(mod, args, kwargs, texport.ShapesCollection, texport.Dim)
            tep = texport.export(h.deepcopy_module(mod), args, kwargs, dynamic_shapes=tspec)
        assert _dynamic_inputs(tep) == dynamic, f"{entry.name}: torch specializes differently"
    if not any(dynamic):
        return
    module = ep.module()
    eager = h.deepcopy_module(mod)  # state (buffers) evolves across the calls on both sides
    for b in RUN_BATCHES:
        run_args, run_kwargs = _inputs_at(args0, kwargs0, b, seed=b, only=dynamic)
        eager_args, eager_kwargs = _inputs_at(args0, kwargs0, b, seed=b, only=dynamic)
        expected = eager(*eager_args, **eager_kwargs)
        got = module(*run_args, **run_kwargs)
        h.assert_same_tree(got, expected, f"{entry.name} at batch {b}")


def test_specialized_dim_is_checked_at_run_time():
    """A Dim.AUTO dim the program specialized (GRU unrolled over dim 0) is checked by module()."""
    mod, (x, h0), _ = em.build(next(e for e in em.ENTRIES if e.name == "gru_bidirectional"))
    ep = ours.export(mod, (x, h0), dynamic_shapes=({0: Dim.AUTO}, None))
    assert ep.range_constraints == {}
    with pytest.raises(RuntimeError, match=r"Expected input at \*args\[0\]\.shape\[0\] to be equal to 3, but got 1"):
        ep.module()(torch.randn(1, *x.shape[1:]), h0)


def test_size_check_in_meta_kernel_specializes():
    """view's size check on a symbolic batch records Eq(12*s0, 24) and specializes, like torch."""
    mod, (x,), _ = em.build(next(e for e in em.ENTRIES if e.name == "view_ops"))
    ep = ours.export(mod, (x,), dynamic_shapes={"x": {0: Dim.AUTO}})
    assert ep.range_constraints == {} and _dynamic_inputs(ep) == [False]
    with pytest.raises(Exception, match=r"specialized it to be a constant \(2\)"):
        ours.export(mod, (x,), dynamic_shapes={"x": {0: Dim("b")}})


def test_meta_check_failing_at_the_example_names_line_and_symbols():
    """At batch 3 ``reshape(4, 6)`` is invalid for the example itself (torch fails too); the error
    keeps the kernel's text and adds the user's line and what ``s0`` stands for."""
    mod, _, _ = em.build(next(e for e in em.ENTRIES if e.name == "view_ops"))
    with pytest.raises(RuntimeError) as info:
        ours.export(mod, (torch.randn(3, 6, 2),), dynamic_shapes={"x": {0: Dim.AUTO}})
    text = str(info.value)
    assert text.startswith("shape '[4, 6]' is invalid for input of size 12*s0")
    assert "export_models.py" in text and "x.reshape(4, 6)" in text
    assert "s0 = L['x'].size()[0] (3 in the example inputs)" in text
