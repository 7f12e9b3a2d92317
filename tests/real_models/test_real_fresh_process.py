"""One model of every family exported, lowered and run in processes that did nothing else.

A warmed-up process hides bugs (lazy imports, registrations made by the first eager call), so
each family gets two fresh interpreters: the first builds the model and, before any eager call,
exports it and writes both program files (portable and fused_cpu); only then does it run eager
and save the inputs and expected outputs. The second imports nothing but the runtime, loads each
program file and runs it. This process only compares the saved tensors.
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
case = R.build({name!r})
ep = exportir.export(case.model, (), case.kwargs)
exportir.to_edge(ep).to_program().save({out!r} + "/portable.xpt")
lowered = exportir.to_edge_transform_and_lower(ep, partitioner=[FusedCpuPartitioner()])
lowered.to_program().save({out!r} + "/fused.xpt")
with torch.no_grad():
    expected = case.model(**case.kwargs)
from torch.utils import _pytree
leaves = [x for x in _pytree.tree_leaves(expected) if isinstance(x, torch.Tensor)]
torch.save({{"kwargs": case.kwargs, "expected": leaves}}, {out!r} + "/io.pt")
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


@pytest.mark.parametrize(
    "family,name",
    [pytest.param(f, n, id=f"{f}-{n}", marks=pytest.mark.xdist_group(f"fresh-{n}"))
     for f, n in REPRESENTATIVES.items()],
)
def test_family_exports_and_runs_in_fresh_processes(family: str, name: str, tmp_path: Path) -> None:
    paths = {"tests": str(_TESTS), "src": str(_SRC), "out": str(tmp_path), "name": name}
    _python(_EXPORT.format(**paths), f"exporting {name}")
    _python(_RUN.format(**paths), f"running {name}'s program files")
    io = torch.load(tmp_path / "io.pt", weights_only=True)
    results = torch.load(tmp_path / "results.pt", weights_only=True)
    for road, got in results.items():
        assert len(got) == len(io["expected"]), f"{road}: {len(got)} outputs, eager {len(io['expected'])}"
        for i, (a, b) in enumerate(zip(got, io["expected"])):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4,
                                       msg=lambda m, i=i, road=road: f"{name} {road} output {i}: {m}")


def test_every_family_has_a_fresh_process_run() -> None:
    assert set(REPRESENTATIVES) == set(R.families())
