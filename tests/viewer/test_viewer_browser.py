"""The viewer's pages in headless Chromium: they load with no console error, show every node,
open details, module groups, delegates and the memory plan on click, render a ResNet-18 and a
2-layer transformer in reasonable time, and run nothing a graph smuggles in.

Screenshots go to each test's tmp dir. ``EXPORTIR_UPDATE_SCREENSHOT=1`` also rewrites the
pictures in README.md and docs/viewer.md (docs/img/viewer.png, viewer-memory.png). Skipped
when no Chromium is installed."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
import torch
from viewer._chromium import Browser, BrowserError, find_chromium
from viewer.test_viewer import PAYLOAD, Net, hostile_graph

import exportir
from exportir.backends.fused_cpu import FusedCpuPartitioner
from exportir.viewer import page_model, view

CHROMIUM = find_chromium()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="no Chromium found (apt-get install chromium, "
                                                "or set EXPORTIR_CHROMIUM to its path)"),
]
DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"


@pytest.fixture(scope="module")
def browser():
    try:
        b = Browser(CHROMIUM)
    except (BrowserError, OSError) as exc:  # the machine's browser, not the viewer, is broken
        pytest.skip(f"{CHROMIUM} did not start: {exc}")
    with b:
        yield b


@pytest.fixture
def page(browser):
    """Open a page; after the test, no console error, exception or CSP violation was seen."""
    def open_page(path: Path) -> Browser:
        browser.open(path)
        assert browser.evaluate("document.body.dataset.ready") == "1"
        return browser

    browser.errors.clear()
    yield open_page
    assert browser.errors == []


def js(value: object) -> str:
    return json.dumps(value)


def body(b: Browser, key: str) -> str:
    return b.evaluate(f"document.body.dataset.{key}")


def details(b: Browser) -> str:
    return b.evaluate("document.getElementById('details').innerText")


@pytest.fixture(scope="module")
def ep():
    torch.manual_seed(0)
    return exportir.export(Net().eval(), (torch.randn(2, 8),))


def test_exported_program_nodes_details_and_module_groups(ep, page, tmp_path):
    b = page(view(ep, tmp_path / "ep.html"))
    assert int(body(b, "nodeCount")) == len(ep.graph.nodes)
    assert int(body(b, "visibleCount")) == len(ep.graph.nodes)  # small: everything open
    b.click('.node[data-name="linear"]')
    assert body(b, "selected") == "linear"
    text = details(b)
    for expected in ("aten.linear.default", "[2, 8]", "float32", "test_viewer.py:", "a.proj"):
        assert expected in text
    # fold module `a` with its title, open it again by clicking its box
    b.click('.group[data-cluster="a"] text')
    assert b.evaluate("document.querySelectorAll('.node.cluster[data-cluster=\"a\"]').length") == 1
    folded = int(body(b, "visibleCount"))
    assert folded < len(ep.graph.nodes)
    b.click('.node.cluster[data-cluster="a"]')
    assert int(body(b, "visibleCount")) == len(ep.graph.nodes)
    b.screenshot(tmp_path / "exported_program.png")


def test_lowered_program_delegate_subgraph_and_memory_plan(ep, page, tmp_path):
    lowered = exportir.to_edge_transform_and_lower(ep, partitioner=[FusedCpuPartitioner()])
    manager = lowered.to_program()
    edge = lowered.exported_program()
    b = page(view(manager, tmp_path / "lowered.html"))
    assert int(body(b, "nodeCount")) == len(edge.graph.nodes)
    b.click('.node.delegate')
    assert "FusedCpuBackend" in details(b)
    b.click('button[data-opens]')  # the delegate's Edge subgraph
    original = edge.graph_module.lowered_module_0.original_module
    assert int(body(b, "nodeCount")) == len(original.graph.nodes)
    first_op = next(n for n in original.graph.nodes if n.op == "call_function")
    b.click(f'.node[data-name="{first_op.name}"]')
    assert first_op.target.__name__ in details(b)  # aten.permute_copy.default
    b.screenshot(tmp_path / "delegate_subgraph.png")
    b.click("#back")
    b.click('nav button[data-graph]:last-child')  # the program's instructions
    method = manager.program.method("forward")
    assert int(body(b, "nodeCount")) == len(method.instructions) + len(method.inputs) + 1
    b.click("#memory-toggle")
    buffers = b.evaluate("document.querySelectorAll('#memory-plan rect.buffer').length")
    assert buffers > 0
    b.click("#memory-plan rect.buffer")
    assert "arena" in details(b) and "first use" in details(b)
    b.click('button[data-node]')  # from the buffer to the instruction that first uses it
    assert body(b, "selected") != ""
    b.screenshot(tmp_path / "program_memory.png")


def test_markup_in_names_never_runs(page, tmp_path):
    b = page(view(hostile_graph(), tmp_path / "hostile.html", title=PAYLOAD))
    assert b.evaluate("document.querySelectorAll('img').length") == 0
    assert b.evaluate(f"exportirViewer.find({js(PAYLOAD)})") is True
    assert b.evaluate("document.querySelector('#details h2').textContent") == PAYLOAD
    assert b.evaluate("document.title") == PAYLOAD
    assert b.evaluate("window.__pwned === undefined") is True


@pytest.fixture(scope="module")
def real():
    import corpus._torchvision_ops  # noqa: F401  (before transformers / timm / torchvision)
    from corpus import real_models

    def export(name: str):
        case = real_models.build(name)
        return exportir.export(case.model, (), case.kwargs)

    return export


@pytest.mark.parametrize("name", ["tv_resnet18", "llama"])
def test_large_graphs_render_folded_then_whole(name, real, page, tmp_path):
    ep = real(name)
    path = view(ep, tmp_path / f"{name}.html", title=f"{name} (ExportedProgram)")
    start = time.perf_counter()
    b = page(path)
    load_s = time.perf_counter() - start
    assert int(body(b, "nodeCount")) == len(ep.graph.nodes)
    assert int(body(b, "visibleCount")) <= 120, "large graphs open folded by module"
    assert load_s < 60, f"{name}: page took {load_s:.1f} s to load and lay out"
    b.screenshot(tmp_path / f"{name}_folded.png")
    b.evaluate("exportirViewer.expandAll()")
    assert int(body(b, "visibleCount")) == len(ep.graph.nodes)
    b.screenshot(tmp_path / f"{name}_whole.png")


def test_readme_screenshot(real, page, tmp_path):
    """The pictures in README.md and docs/viewer.md: a 2-layer Llama folded by module, its first
    decoder layer open, the residual add of that layer selected; its program's memory plan."""
    ep = real("llama")
    residual = next(
        n for n in ep.graph.nodes if n.op == "call_function"
        and [p for p, _ in (n.meta.get("nn_module_stack") or {}).values()][-1] == "model.layers.0")
    b = page(view(ep, tmp_path / "llama.html", title="llama, 2 layers (ExportedProgram)"))
    b.evaluate("exportirViewer.collapseAll()")
    assert b.evaluate("exportirViewer.expand('model.layers.0')") is True
    assert b.evaluate(f"exportirViewer.find({js(residual.name)})") is True
    assert residual.name in details(b) and "LlamaDecoderLayer" in details(b)
    shot = b.screenshot(tmp_path / "viewer.png")
    assert shot.stat().st_size > 10_000
    # the same model's program: instructions by module, and its memory plan
    manager = exportir.to_edge(ep).to_program()
    b = page(view(manager, tmp_path / "llama_program.html", title="llama, 2 layers (program)"))
    b.click('nav button[data-graph]:last-child')
    b.click("#memory-toggle")
    planned = b.evaluate("document.querySelectorAll('#memory-plan rect.buffer').length")
    assert planned == len(page_model(manager).graphs[-1].memory.buffers)
    memory_shot = b.screenshot(tmp_path / "viewer-memory.png")
    if os.environ.get("EXPORTIR_UPDATE_SCREENSHOT") == "1":
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, DOCS_IMG / "viewer.png")
        shutil.copyfile(memory_shot, DOCS_IMG / "viewer-memory.png")
