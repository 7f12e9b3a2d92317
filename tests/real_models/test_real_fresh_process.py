"""One model of every family exported, lowered and run in processes that did nothing else.

A warmed-up process hides bugs (lazy imports, registrations made by the first eager call), so
each family's program files run in a fresh interpreter that imports nothing but the runtime,
loads each program file (portable and fused_cpu) and runs it; this process only compares the
saved tensors. The files are written, before any eager call of their model, by a fresh
interpreter too: in `make test` one process exports every family's model in turn (its imports,
~6 s for transformers, paid once), in `make test-slow` one process per family.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from corpus import real_models as R

REPRESENTATIVES = {
    R.DECODER: "llama",
    R.ENCODER: "bert",
    R.SEQ2SEQ: "t5",
    R.SPEECH: "whisper",
    R.AUDIO: "wav2vec2",
    R.VIT: "vit",
    R.CONVNET: "hf_resnet",
    R.SEGMENTATION: "segformer",
    R.TIMM: "timm_efficientnet_b0",
    R.TORCHVISION: "tv_convnext_tiny",
}

_TESTS = Path(__file__).resolve().parent.parent
_SRC = _TESTS.parent / "src"

_EXPORT = """
import sys, warnings
sys.path[:0] = [{tests!r}, {src!r}]
warnings.simplefilter("ignore")
import torch
import exportir
from corpus import real_models as R
from exportir.backends.fused_cpu import FusedCpuPartitioner
cases = {{}}
for name, out in {jobs!r}:  # every program file before any eager call
    case = cases[out] = R.build(name)
    ep = exportir.export(case.model, (), case.kwargs)
    exportir.to_edge(ep).to_program().save(out + "/portable.xpt")
    lowered = exportir.to_edge_transform_and_lower(ep, partitioner=[FusedCpuPartitioner()])
    lowered.to_program().save(out + "/fused.xpt")
from torch.utils import _pytree
for out, case in cases.items():
    with torch.no_grad():
        expected = case.model(**case.kwargs)
    leaves = [x for x in _pytree.tree_leaves(expected) if isinstance(x, torch.Tensor)]
    torch.save({{"kwargs": case.kwargs, "expected": leaves}}, out + "/io.pt")
"""

_RUN = """
import sys
sys.path[:0] = [{src!r}]
import torch
from exportir.runtime import Program
io = torch.load({out!r} + "/io.pt", weights_only=True)
results = {{}}
for road in ("portable", "fused"):
    out = Program.load({out!r} + f"/{{road}}.xpt").method("forward")(**io["kwargs"])
    flat = []
    stack = [out]
    while stack:  # outputs come back as tuples / lists / dicts of tensors
        item = stack.pop(0)
        if isinstance(item, torch.Tensor):
            flat.append(item)
        elif isinstance(item, dict):
            stack[:0] = list(item.values())
        elif isinstance(item, (list, tuple)):
            stack[:0] = list(item)
    results[road] = flat
torch.save(results, {out!r} + "/results.pt")
"""


def _python(code: str, what: str) -> None:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, check=False,
                          text=True, timeout=600)
    assert done.returncode == 0, f"{what} failed in a fresh process:\n{done.stderr[-4000:]}"


def _export(jobs: list[tuple[str, Path]]) -> None:
    code = _EXPORT.format(tests=str(_TESTS), src=str(_SRC),
                          jobs=[(name, str(out)) for name, out in jobs])
    _python(code, f"exporting {', '.join(name for name, _ in jobs)}")


def _run_and_compare(name: str, out: Path) -> None:
    _python(_RUN.format(src=str(_SRC), out=str(out)), f"running {name}'s program files")
    io = torch.load(out / "io.pt", weights_only=True)
    results = torch.load(out / "results.pt", weights_only=True)
    for road, got in results.items():
        assert len(got) == len(io["expected"]), f"{road}: {len(got)} outputs, eager {len(io['expected'])}"
        for i, (a, b) in enumerate(zip(got, io["expected"])):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4,
                                       msg=lambda m, i=i, road=road: f"{name} {road} output {i}: {m}")


def test_every_family_exports_in_one_process_and_runs_in_fresh_ones(tmp_path: Path) -> None:
    jobs = [(name, tmp_path / name) for name in REPRESENTATIVES.values()]
    for _, out in jobs:
        out.mkdir()
    _export(jobs)
    for name, out in jobs:
        _run_and_compare(name, out)


@pytest.mark.slow  # an export process per family: ~6 s of imports each
@pytest.mark.parametrize(
    "family,name",
    [pytest.param(f, n, id=f"{f}-{n}", marks=pytest.mark.xdist_group(f"fresh-{n}"))
     for f, n in REPRESENTATIVES.items()],
)
def test_family_exports_and_runs_in_fresh_processes(family: str, name: str, tmp_path: Path) -> None:
    _export([(name, tmp_path)])
    _run_and_compare(name, tmp_path)


def test_every_family_has_a_fresh_process_run() -> None:
    assert set(REPRESENTATIVES) == set(R.families())
