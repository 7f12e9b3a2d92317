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
from exportir.export.dynamic_shapes import Dim, ShapesCollection

EXPORT_BATCH = 3
RUN_BATCHES = (1, 7, 64)

# models whose batch dimension the program itself fixes (torch specializes them too)
STATIC_BATCH: dict[str, str] = {
    "gpt_kv_cache": "the KV cache buffers have batch 1",
    "slice_kv_cache": "the cache buffer has batch 1",
    "buffer_slice_assign": "the input is written into a fixed-size buffer slice",
}


# capture bugs with symbolic sizes (ShapeEnv / fake tensors, owner "sym"); strict: a fix
# makes the test fail until the entry is removed
SYMBOLIC_CAPTURE_GAPS: dict[str, str] = {
    "cnn_bn_train": "batch_norm training meta: SymIntArrayRef expected to contain only concrete integers",
    "resnet_tiny_train": "batch_norm training meta: SymIntArrayRef expected to contain only concrete integers",
    "gru_bidirectional": "IndexError in fx/graph_module.py while building the graph",
    "gpt_kv_cache": "index_copy_ meta check on s0 vs 1 raises instead of specializing (guard Eq(s0, 1))",
    "slice_kv_cache": "expand meta check on s0 vs 1 raises instead of specializing",
    "buffer_slice_assign": "expand meta check on s0 vs 2 raises instead of specializing",
    "view_ops": "view meta check 12*s0 vs 24 raises instead of specializing (guard Eq(s0, 2))",
    "aliasing_outputs": "view meta check 3*s1 vs 6 raises instead of specializing",
}
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


def _inputs_at(args: Any, kwargs: Any, b: int, seed: int) -> tuple[tuple, dict]:
    torch.manual_seed(seed)
    leaves, marked, spec, _ = _batched(args, kwargs)
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


def _dynamic_inputs(ep: Any) -> bool:
    for node in ep.graph.nodes:
        val = node.meta.get("val") if node.op == "placeholder" else None
        if isinstance(val, torch.Tensor) and val.dim() and isinstance(val.shape[0], torch.SymInt):
            return True
    return False


@pytest.mark.parametrize("entry", em.ENTRIES, ids=lambda e: e.name)
def test_corpus_dynamic_batch(entry, request):
    if entry.name in NOT_RESIZABLE:
        pytest.skip(NOT_RESIZABLE[entry.name])
    if entry.name in SYMBOLIC_CAPTURE_GAPS:
        request.applymarker(pytest.mark.xfail(reason=SYMBOLIC_CAPTURE_GAPS[entry.name], strict=True))
    mod, args0, kwargs0 = em.build(entry)
    if not _batched(args0, kwargs0)[0] or not any(_batched(args0, kwargs0)[1]):
        pytest.skip("no tensor input")
    args, kwargs = _inputs_at(args0, kwargs0, EXPORT_BATCH, seed=1)
    spec = _spec(mod, args, kwargs, ShapesCollection, Dim)
    ep = ours.export(h.deepcopy_module(mod), args, kwargs, dynamic_shapes=spec)
    dynamic = _dynamic_inputs(ep)
    assert dynamic == (entry.name not in STATIC_BATCH), f"{entry.name}: dynamic batch = {dynamic}"
    if not dynamic:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tep = texport.export(h.deepcopy_module(mod), args, kwargs, dynamic_shapes=_spec(mod, args, kwargs, texport.ShapesCollection, texport.Dim))
        assert not _dynamic_inputs(tep), f"{entry.name}: torch keeps the batch dynamic"
        return
    module = ep.module()
    eager = h.deepcopy_module(mod)  # state (buffers) evolves across the calls on both sides
    for b in RUN_BATCHES:
        run_args, run_kwargs = _inputs_at(args0, kwargs0, b, seed=b)
        eager_args, eager_kwargs = _inputs_at(args0, kwargs0, b, seed=b)  # inputs may be mutated
        expected = eager(*eager_args, **eager_kwargs)
        got = module(*run_args, **run_kwargs)
        h.assert_same_tree(got, expected, f"{entry.name} at batch {b}")
