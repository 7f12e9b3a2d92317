"""exportir.viewer without a browser: what the page holds for every stage object and file, that
nothing from a graph can become markup, and the errors for what cannot be shown.
(tests/viewer/test_viewer_browser.py loads the pages in headless Chromium.)"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch

import exportir
from exportir import fx
from exportir.backends.fused_cpu import FusedCpuPartitioner
from exportir.cli import main as cli_main
from exportir.format.validate import ProgramLoadError
from exportir.viewer import ViewerError, load_file, page_model, to_html, view

PAYLOAD = '</script><script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.norm(self.proj(x)))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = Block()
        self.b = Block()
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.b(self.a(x)) + x).softmax(-1)


@pytest.fixture(scope="module")
def ep():
    torch.manual_seed(0)
    return exportir.export(Net().eval(), (torch.randn(2, 8),))


@pytest.fixture(scope="module")
def lowered(ep):
    return exportir.to_edge_transform_and_lower(ep, partitioner=[FusedCpuPartitioner()])


def page_data(html: str) -> dict:
    """The JSON the page embeds (as the page's script reads it)."""
    match = re.search(r'<script type="application/json" id="exportir-data">(.*?)</script>', html,
                      re.DOTALL)
    assert match, "the page has no data block"
    return json.loads(match.group(1))


def test_exported_program_page_has_every_node_with_modules_and_details(ep):
    data = page_data(to_html(ep))
    graph = data["graphs"][0]
    assert [n["name"] for n in graph["nodes"]] == [n.name for n in ep.graph.nodes]
    by_name = {n["name"]: n for n in graph["nodes"]}
    linear = by_name["linear"]
    details = dict(linear["details"])
    assert details["target"] == "aten.linear.default"
    assert details["shape"] == "[2, 8]" and details["dtype"] == "float32"
    assert details["source"].startswith(__file__ + ":")  # the user's line, not torch's
    assert [m[0] for m in linear["module"]] == ["a", "a.proj"]
    # lifted weights are typed by the signature and sit in the module that owns them
    weight = by_name["p_a_proj_weight"]
    assert weight["kind"] == "param" and dict(weight["details"])["state"] == "a.proj.weight"
    assert [m[0] for m in weight["module"]] == ["a", "a.proj"]
    assert by_name["x"]["kind"] == "input" and by_name["output"]["kind"] == "output"
    notes = dict(graph["notes"])
    assert notes["user inputs"] == "x" and notes["other inputs"] == "10 parameter"
    ids = {n["id"]: n["name"] for n in graph["nodes"]}
    assert {ids[i] for i in linear["inputs"]} == {"x", "p_a_proj_weight", "p_a_proj_bias"}


def test_lowered_program_opens_the_delegate_edge_subgraph_and_its_blob(lowered):
    page = page_model(lowered)
    top = page.graphs[0]
    delegates = [n for n in top.nodes if n.kind == "delegate"]
    assert len(delegates) == 1
    node = delegates[0]
    assert dict(node.details)["backend"] == "FusedCpuBackend"
    opened = {caption: next(g for g in page.graphs if g.id == gid) for caption, gid in node.opens}
    assert set(opened) == {"Edge subgraph", "blob program"}
    lowered_module = lowered.exported_program().graph_module.lowered_module_0
    edge = opened["Edge subgraph"]
    assert edge.parent == top.id
    assert [n.name for n in edge.nodes] == [n.name for n in lowered_module.original_module.graph.nodes]
    blob_ops = [n for n in opened["blob program"].nodes if n.kind == "op"]
    assert blob_ops and all(dict(n.details)["op"].startswith("aten.") for n in blob_ops)


def test_program_page_has_instructions_and_a_consistent_memory_plan(ep):
    manager = exportir.to_edge(ep).to_program()
    page = page_model(manager)
    titles = [g.title for g in page.graphs]
    assert titles == ["forward (Edge)", "program: forward"]
    program_graph = page.graphs[1]
    method = manager.program.method("forward")
    ops = [n for n in program_graph.nodes if n.kind == "op"]
    assert len(ops) == len(method.instructions)
    # instructions are grouped by the module of the Edge node they came from
    assert [m[0] for m in ops[0].module] == ["a", "a.proj"]
    memory = program_graph.memory
    assert memory is not None and memory.arenas == list(method.plan.arenas)
    assert len(memory.instructions) == len(method.instructions)
    assert [program_graph.nodes[i] for i in memory.nodes] == ops  # instruction -> its box
    assert memory.buffers
    for b in memory.buffers:
        assert 0 <= b.first <= b.last < len(method.instructions)
        assert b.offset + b.nbytes <= memory.arenas[b.arena]
    # two tensors live at the same instruction never share bytes (what the planner promised)
    for i, p in enumerate(memory.buffers):
        for q in memory.buffers[i + 1:]:
            same_time = p.first <= q.last and q.first <= p.last
            same_bytes = p.offset < q.offset + q.nbytes and q.offset < p.offset + p.nbytes
            assert not (p.arena == q.arena and same_time and same_bytes), (p, q)


def test_delegated_program_file_opens_the_blob(lowered, tmp_path):
    path = tmp_path / "delegated.xpt"
    lowered.to_program().save(path)
    page = page_model(path)
    top = page.graphs[0]
    delegate = next(n for n in top.nodes if n.kind == "delegate")
    assert delegate.opens and delegate.opens[0][0] == "blob program"
    assert dict(delegate.details)["backend"] == "FusedCpuBackend"


def test_a_blob_that_does_not_decode_is_a_note_not_an_error(lowered):
    program = lowered.to_program().program
    bad = dataclasses.replace(program.delegates[0], data=b"XFC1 not a blob")
    page = page_model(dataclasses.replace(program, delegates=(bad,)))
    blob_graph = page.graphs[1]
    assert blob_graph.nodes == []
    assert blob_graph.notes[0][0] == "cannot decode"


def test_every_stage_object_and_file_gives_a_page(ep, lowered, tmp_path):
    exportir.save(ep, tmp_path / "m.pt2")
    exportir.to_edge(ep).to_program().save(tmp_path / "m.xpt")
    from exportir.runtime import Program

    gm = fx.symbolic_trace(Net())
    objects = {
        "ExportedProgram": ep, "EdgeProgramManager": exportir.to_edge(ep), "lowered": lowered,
        "ProgramManager": lowered.to_program(), "module()": ep.module(), "symbolic_trace": gm,
        "Graph": gm.graph, "LoweredBackendModule": lowered.exported_program().graph_module.lowered_module_0,
        "runtime Program": Program.load(tmp_path / "m.xpt"), ".pt2": tmp_path / "m.pt2",
        ".xpt": str(tmp_path / "m.xpt"),
    }  # fmt: skip
    for what, obj in objects.items():
        data = page_data(to_html(obj))
        assert data["graphs"] and data["graphs"][0]["nodes"], what
    assert [n["name"] for n in page_data(to_html(gm))["graphs"][0]["nodes"]] == [
        n.name for n in gm.graph.nodes]
    out = view(ep, tmp_path / "page.html", title="my model")
    assert out.read_text(encoding="utf-8").count("<title>my model</title>") == 1


def test_page_is_self_contained():
    html = to_html(fx.symbolic_trace(Net()))
    assert "default-src 'none'" in html  # the page's CSP: no network at all
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert html.count("<script") == 3  # data, dagre, viewer
    assert "dagre" in html and "sourceMappingURL" not in html


def hostile_graph() -> fx.GraphModule:
    """A graph whose names, targets, modules and source lines all carry markup."""
    g = fx.Graph()
    x = g.placeholder("x")
    y = g.call_function(torch.relu, (x,))
    y.name = PAYLOAD
    y.meta["stack_trace"] = f'File "{PAYLOAD}", line 1, in forward\n    {PAYLOAD}'
    y.meta["nn_module_stack"] = {"L__self__": ("", "M"), "L__self__p": (PAYLOAD, PAYLOAD)}
    g.output(y)
    return fx.GraphModule(torch.nn.Module(), g)


def test_markup_in_a_graph_stays_text():
    html = to_html(hostile_graph(), title=PAYLOAD)
    assert html.count("<script") == 3 and html.count("</script>") == 3
    assert "<img" not in html and "window.__pwned" in html  # only inside escaped JSON
    assert page_data(html)["graphs"][0]["nodes"][1]["name"] == PAYLOAD
    assert "<title>&lt;/script&gt;" in html


def test_what_cannot_be_shown_says_what_can(tmp_path):
    with pytest.raises(ViewerError, match="cannot view a int: pass an ExportedProgram"):
        to_html(42)
    (tmp_path / "m.onnx").write_bytes(b"x")
    with pytest.raises(ViewerError, match=r"suffix '\.onnx'; expected one of \.pt2, \.xpt, \.pte"):
        load_file(tmp_path / "m.onnx")
    (tmp_path / "m.pte").write_bytes(b"x")
    with pytest.raises(ProgramLoadError, match="ET12"):
        load_file(tmp_path / "m.pte")
    (tmp_path / "bad.xpt").write_bytes(b"not a program")
    with pytest.raises(ProgramLoadError):
        load_file(tmp_path / "bad.xpt")


def test_cli_view_writes_the_page_and_reports_bad_input(ep, tmp_path, capsys):
    exportir.to_edge(ep).to_program().save(tmp_path / "m.xpt")
    assert cli_main(["view", str(tmp_path / "m.xpt")]) == 0
    page = tmp_path / "m.xpt.html"
    assert page_data(page.read_text(encoding="utf-8"))["graphs"][0]["title"] == "program: forward"
    assert "wrote" in capsys.readouterr().out
    assert cli_main(["view", str(tmp_path / "missing.pt2")]) == 2
    assert "missing.pt2: no such file" in capsys.readouterr().err
    assert cli_main(["view", str(tmp_path / "m.xpt"), "-o", str(tmp_path / "m.png")]) == 2
    assert "name the output file .html" in capsys.readouterr().err
    (tmp_path / "m.pte").write_bytes(b"x")
    assert cli_main(["view", str(tmp_path / "m.pte")]) == 1
    assert "ET12" in capsys.readouterr().err
    (tmp_path / "bad.xpt").write_bytes(b"not a program")
    assert cli_main(["view", str(tmp_path / "bad.xpt")]) == 1
    assert "not a valid program file" in capsys.readouterr().err


def test_control_flow_branches_open_as_subgraphs_with_symbolic_shapes():
    class Branchy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cond(x.sum() > 0, lambda x: self.lin(x).relu(), lambda x: x * 2, (x,))

    batch = exportir.Dim("batch", min=2, max=16)
    ep = exportir.export(Branchy(), (torch.randn(3, 4),), dynamic_shapes={"x": {0: batch}})
    page = page_model(ep)
    top = page.graphs[0]
    opened = {o[0]: o[1] for n in top.nodes for o in n.opens}
    assert set(opened) == {"graph true_graph_0", "graph false_graph_0"}
    true_graph = next(g for g in page.graphs if g.id == opened["graph true_graph_0"])
    assert true_graph.parent == top.id
    assert [n.name for n in true_graph.nodes] == [
        n.name for n in ep.graph_module.true_graph_0.graph.nodes]
    x = next(n for n in top.nodes if n.name == "x")
    assert dict(x.details)["value"] == "float32[s0, 4]"



def test_an_executorch_pte_file_is_shown_like_the_program_it_encodes(ep, tmp_path, capsys):
    manager = exportir.to_edge(ep).to_program()
    manager.save(tmp_path / "m.pte")
    manager.save(tmp_path / "m.xpt")
    assert cli_main(["view", str(tmp_path / "m.pte")]) == 0
    pte = page_data((tmp_path / "m.pte.html").read_text(encoding="utf-8"))
    xpt = page_data(to_html(load_file(tmp_path / "m.xpt")))
    assert pte["graphs"][0]["title"] == "program: forward"
    assert len(pte["graphs"][0]["nodes"]) == len(xpt["graphs"][0]["nodes"]) > 0
