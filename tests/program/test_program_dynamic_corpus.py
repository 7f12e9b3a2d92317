"""The export corpus with a dynamic batch, as program files: each model exported with
``Dim.AUTO(min=1, max=64)`` on every batch-carrying input (as tests/export/
test_dynamic_corpus.py marks them), lowered on both roads, and run at batch 1, 32 and 64 (on the
inputs that stayed dynamic) against eager: the memory plan holds the whole range. Models whose
code fixes the batch are listed there (``STATIC_BATCH``) and skipped here.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from corpus import export_harness as h
from corpus import export_models as em
from export import test_dynamic_corpus as dc

import exportir
from exportir.backends.fused_cpu import FusedCpuPartitioner
from exportir.export.dynamic_shapes import Dim, ShapesCollection
from exportir.runtime import Program, default_kernel_registry

LOW, HIGH = 1, 64
RUN_BATCHES = (LOW, (LOW + HIGH) // 2, HIGH)
# models whose dynamic export is not a program (the Edge dialect refuses it, as ExecuTorch does)
NOT_A_PROGRAM = {"nested_mixed_static": "returns a size (a SymInt); Edge graph outputs are tensors"}
SKIP = {**dc.STATIC_BATCH, **dc.NOT_RESIZABLE, **dc.EXAMPLE_BATCH, **NOT_A_PROGRAM}


def _spec(mod, args, kwargs):
    leaves, marked, _, _ = dc._batched(args, kwargs)
    sc = ShapesCollection()
    for x, m in zip(leaves, marked):
        if m:
            sc[x] = {0: Dim.AUTO(min=LOW, max=HIGH)}
    return sc.dynamic_shapes(mod, args, kwargs)


def _entries() -> list:
    return [pytest.param(e, id=e.name) for e in em.ENTRIES if e.name not in SKIP]


@pytest.mark.parametrize("road", ["portable", "fused"])
@pytest.mark.parametrize("entry", _entries())
def test_corpus_program_runs_at_min_middle_and_max_batch(entry, road):
    mod, args0, kwargs0 = em.build(entry)
    leaves, marked, _, _ = dc._batched(args0, kwargs0)
    if not leaves or not any(marked):
        pytest.skip("no tensor input")
    args, kwargs = dc._inputs_at(args0, kwargs0, dc.EXPORT_BATCH, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = exportir.export(h.deepcopy_module(mod), args, kwargs,
                             dynamic_shapes=_spec(mod, args, kwargs))
        lowered = (exportir.to_edge(ep) if road == "portable" else
                   exportir.to_edge_transform_and_lower(ep, partitioner=[FusedCpuPartitioner()]))
        program = lowered.to_program()
    dynamic = dc._dynamic_inputs(ep)
    if not any(dynamic):
        pytest.skip("the batch specialized")
    kernels = default_kernel_registry()
    if "custom_op" in entry.tags:  # custom ops run only when registered on purpose
        kernels.register_op(torch.ops.exportir_test.scaled_tanh, torch.ops.exportir_test.split_stats)
    method = Program.load(program.buffer, kernels=kernels).method()
    eager = h.deepcopy_module(mod)  # state (buffers) evolves across the calls on both sides
    for b in RUN_BATCHES:
        run_args, run_kwargs = dc._inputs_at(args0, kwargs0, b, seed=b, only=dynamic)
        eager_args, eager_kwargs = dc._inputs_at(args0, kwargs0, b, seed=b, only=dynamic)
        expected = h.leaves(eager(*eager_args, **eager_kwargs))
        got = h.leaves(method(*run_args, **run_kwargs))  # namedtuples come back as tuples
        assert len(got) == len(expected), f"{entry.name} ({road}) at batch {b}"
        for k, (a, e) in enumerate(zip(got, expected)):
            torch.testing.assert_close(a, e, msg=lambda m, k=k, b=b: f"{entry.name} ({road}) at "
                                       f"batch {b}, output {k}: {m}")
