"""The Model Explorer adapter (exportir.viewer.model_explorer), run through Model Explorer's own
extension manager (no server). Skipped unless ``ai-edge-model-explorer`` is installed
(``pip install "exportir[model-explorer]"``); the project's test environment does not install
it."""

from __future__ import annotations

import json

import pytest
import torch
from viewer.test_viewer import Net

import exportir
from exportir.backends.fused_cpu import FusedCpuPartitioner

model_explorer = pytest.importorskip(
    "model_explorer", reason="ai-edge-model-explorer is not installed (the model-explorer extra)")
from model_explorer.extension_manager import ExtensionManager

from exportir.viewer.model_explorer import add_to_config, to_graphs


@pytest.fixture(scope="module")
def ep():
    torch.manual_seed(0)
    return exportir.export(Net().eval(), (torch.randn(2, 8),))


def test_model_explorer_loads_the_extension_and_converts_our_files(ep, tmp_path):
    exportir.save(ep, tmp_path / "m.pt2")
    exportir.to_edge(ep).to_program().save(tmp_path / "m.xpt")
    manager = ExtensionManager(["exportir.viewer.model_explorer"])
    manager.load_extensions()
    assert "exportir" in [e.metadata.id for e in manager.extensions]
    for name in ("m.pt2", "m.xpt"):
        result = manager.run_cmd({"extensionId": "exportir", "cmdId": "convert",
                                  "modelPath": str(tmp_path / name), "settings": {}})
        json.dumps(result)  # what the server sends to the page
        assert result["graphs"] and result["graphs"][0]["nodes"]
    pt2 = manager.run_cmd({"extensionId": "exportir", "cmdId": "convert",
                           "modelPath": str(tmp_path / "m.pt2"), "settings": {}})
    assert len(pt2["graphs"][0]["nodes"]) == len(ep.graph.nodes)


def test_modules_become_namespaces_and_delegates_subgraphs(ep):
    graphs = to_graphs(ep)["graphs"]
    names = [n.name for n in ep.graph.nodes]
    linear = graphs[0].nodes[names.index("linear")]  # the first Linear, of block `a`
    assert linear.namespace == "a/proj"
    assert str(names.index("x")) in {e.sourceNodeId for e in linear.incomingEdges}
    lowered = exportir.to_edge_transform_and_lower(ep, partitioner=[FusedCpuPartitioner()])
    graphs = to_graphs(lowered)["graphs"]
    delegate = next(n for n in graphs[0].nodes if n.label.startswith("delegate"))
    assert delegate.subgraphIds and set(delegate.subgraphIds) <= {g.id for g in graphs}
    config = add_to_config(model_explorer.config(), "net", ep)
    assert config.model_sources[-1]["url"].startswith("graphs://net/")
