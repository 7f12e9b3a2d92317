"""Real models (built by transformers / timm from tiny configs) through the stages after capture:
``to_edge -> to_program`` and the fused road (``to_edge_transform_and_lower`` with
``FusedCpuPartitioner``), each program saved, then loaded and run in a fresh process
(:mod:`fresh_process`) and compared with eager.

The models are the ones these stages once failed on: a mixture-of-experts decoder (``histc`` and
``empty_like`` in the experts code), wav2vec2 (weight norm: ``linalg_vector_norm``), SigLIP
(``Conv2d(padding="valid")`` on the fused road), BEiT (fused partitions depending on each other),
and a plain convolutional network. Reproduce one with
``pytest tests/backends/test_real_model_programs.py -k <name>``.
"""

from __future__ import annotations

import pytest
import torch
from corpus import real_models as R
from fresh_process import Failure, Job, run_fresh
from torch.utils import _pytree as tree

import exportir
from exportir.backends.fused_cpu import FusedCpuPartitioner

MODELS = ["mixtral", "wav2vec2", "siglip_vision", "beit", "timm_resnet18"]

def _leaves(x):
    return [v for v in tree.tree_leaves(x) if isinstance(v, torch.Tensor)]


def _check(label, got, expected):
    assert not isinstance(got, Failure), f"{label}: {got.error}"
    expected = _leaves(expected)
    assert len(got) == len(expected), f"{label}: {len(got)} outputs, eager {len(expected)}"
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4, msg=lambda m: f"{label}: {m}")


# make test runs one (its mixture-of-experts custom op included); the others in make test-slow
@pytest.mark.parametrize("name", [MODELS[0], *(pytest.param(m, marks=pytest.mark.slow)
                                              for m in MODELS[1:])])
def test_real_model_programs_run_in_a_fresh_process(name, tmp_path):
    case = R.build(name)
    with torch.no_grad():
        expected = case.model(**case.kwargs)
    ep = exportir.export(case.model, (), case.kwargs)
    roads = {
        "program": exportir.to_edge(ep),
        "fused": exportir.to_edge_transform_and_lower(ep, partitioner=[FusedCpuPartitioner()]),
    }
    jobs = []
    for road, lowered in roads.items():
        path = tmp_path / f"{road}.xpt"
        lowered.to_program().save(path)
        # no preload, no custom op registered: the child imports only the runtime (mixtral's
        # transformers::grouped_mm_fallback runs on the runtime's own kernel)
        jobs.append(Job(path, kwargs=dict(case.kwargs)))
    fused_ep = roads["fused"].exported_program()
    assert any(n.name.startswith("executorch_call_delegate") for n in fused_ep.graph.nodes)
    for road, got in zip(roads, run_fresh(jobs, tmp_path)):
        _check(f"{name} ({road})", got, expected)
