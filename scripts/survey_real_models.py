"""Every stage on every real-model corpus model (or the names given), one line per model.

    PYTHONPATH=src .venv/bin/python scripts/survey_real_models.py [name ...]

Stages: export (module() == eager), fidelity (op multiset == torch.export(...)
.run_decompositions({})), core (run_decompositions() == eager and == torch's core op multiset),
dynamic (batch/seq dynamic export, module() on inputs of other sizes), program (to_edge ->
to_program -> save -> load -> run == eager), fused (FusedCpuPartitioner road == eager).
A developer's survey, not a test: tests/real_models/ holds the assertions.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
warnings.filterwarnings("ignore")

import torch
from corpus import real_models as R
from torch.utils import _pytree as tpt

import exportir
from exportir.runtime import Program


def _leaves(o: Any) -> list[torch.Tensor]:
    return [x for x in tpt.tree_leaves(o) if isinstance(x, torch.Tensor)]


def mismatch(a: Any, b: Any) -> str | None:
    la, lb = _leaves(a), _leaves(b)
    if len(la) != len(lb):
        return f"{len(la)} vs {len(lb)} tensors"
    for x, y in zip(la, lb):
        if x.shape != y.shape:
            return f"shape {tuple(x.shape)} vs {tuple(y.shape)}"
        if not torch.allclose(x.float(), y.float(), atol=1e-4, rtol=1e-4):
            return f"max diff {(x.float() - y.float()).abs().max():.3g}"
    return None


def ops(graph: Any) -> Counter:
    return Counter(str(n.target) for n in graph.nodes if n.op == "call_function")


def op_diff(ours: Any, theirs: Any) -> str | None:
    a, b = ops(ours), ops(theirs)
    if a == b:
        return None
    return f"ours-torch {dict(a - b)} torch-ours {dict(b - a)}"[:300]


def _run_file(lowered: Any, kwargs: dict) -> Any:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.xpt")
        lowered.to_program().save(path)
        return Program.load(path).method("forward")(**kwargs)


def survey(name: str) -> str:
    case = R.build(name)
    kw = case.kwargs
    with torch.no_grad():
        ref = case.model(**kw)
    st: dict[str, Any] = {}
    results: list[str] = []

    def stage(label: str, fn: Callable[[], str | None], *needs: str) -> None:
        if any(n not in st for n in needs):
            return
        try:
            bad = fn()
        except Exception as e:  # noqa: BLE001  (a survey reports every failure and goes on)
            first = str(e).splitlines()[0][:120] if str(e) else ""
            results.append(f"{label}:FAIL({type(e).__name__}: {first})")
            return
        results.append(f"{label}:ok" if bad is None else f"{label}:BAD({bad})")

    def export() -> str | None:
        st["ep"] = exportir.export(case.model, (), kw)
        return mismatch(st["ep"].module()(**kw), ref)

    def fidelity() -> str | None:
        st["tep"] = torch.export.export(case.model, (), kw, strict=False).run_decompositions({})
        return op_diff(st["ep"].graph, st["tep"].graph)

    def core() -> str | None:
        ours = st["ep"].run_decompositions()
        return mismatch(ours.module()(**kw), ref) or op_diff(
            ours.graph, st["tep"].run_decompositions().graph
        )

    def dynamic() -> str | None:
        spec = case.dynamic_shapes()
        if spec is None:
            return "no dynamic dims"
        ep = exportir.export(case.model, (), kw, dynamic_shapes=spec)
        fresh = case.fresh_inputs()
        with torch.no_grad():
            fresh_ref = case.model(**fresh)
        return mismatch(ep.module()(**fresh), fresh_ref)

    def program() -> str | None:
        return mismatch(_run_file(exportir.to_edge(st["ep"]), kw), ref)

    def fused() -> str | None:
        from exportir.backends.fused_cpu import FusedCpuPartitioner

        lowered = exportir.to_edge_transform_and_lower(
            st["ep"], partitioner=[FusedCpuPartitioner()]
        )
        return mismatch(_run_file(lowered, kw), ref)

    stage("export", export)
    stage("fidelity", fidelity, "ep")
    stage("core", core, "tep")
    stage("dynamic", dynamic)
    stage("program", program, "ep")
    stage("fused", fused, "ep")
    return f"{name:30s} " + " ".join(results)


if __name__ == "__main__":
    for n in sys.argv[1:] or R.NAMES:
        print(survey(n), flush=True)
