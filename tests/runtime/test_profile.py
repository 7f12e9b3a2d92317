"""Profiles of a program run: ``method.profile(...)``, its tables and Chrome trace, and
``exportir run --profile`` in a fresh process."""

import dataclasses
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from corpus.debug_models import Net, source_line

import exportir
from exportir.backends.fused_cpu import FusedCpuPartitioner
from exportir.format import serialize
from exportir.runtime import Program
from exportir.runtime.instrument import Session, instrumented_state

SRC = Path(__file__).resolve().parents[2] / "src"



@pytest.fixture(scope="module")
def programs():
    torch.manual_seed(0)
    model = Net().eval()
    x = torch.randn(2, 4)
    ep = exportir.export(model, (x,))
    portable = exportir.to_edge(ep).to_program().buffer
    fused = exportir.to_edge_transform_and_lower(
        ep, partitioner=[FusedCpuPartitioner()]).to_program().buffer
    return model, x, portable, fused


def test_every_instruction_is_timed_with_node_source_and_module(programs):
    _, x, portable, _ = programs
    method = Program.load(portable).method()
    profile = method.profile(x, repeat=3)
    rows = profile.rows()
    timed = {r.pc: r for r in rows if r.pc is not None}
    assert sorted(timed) == list(range(method.num_instructions))
    assert all(r.calls == 3 and r.total_ns >= 0 for r in rows)
    assert all(r.min_ns is not None and r.min_ns <= r.mean_ns for r in rows if r.pc is not None)
    assert "min us" in profile.table()
    assert abs(sum(profile.percent(r) for r in rows) - 100.0) < 1e-6
    norm = next(r for r in rows if r.op == "aten::native_layer_norm.out")
    assert (norm.node, norm.module, norm.module_type) == (
        "native_layer_norm", "block.ln", "torch.nn.modules.normalization.LayerNorm")
    assert norm.source.endswith(source_line("# BLOCK_LINE"))
    mul = next(r for r in rows if r.op == "aten::mul.out")
    assert mul.source.endswith(source_line("# NET_LINE")) and mul.module == ""
    table = profile.table()
    assert "native_layer_norm" in table and "block.ln (LayerNorm)" in table


def test_ops_inside_a_fused_delegate_are_timed(programs):
    _, x, _, fused = programs
    profile = Program.load(fused).method().profile(x, repeat=2)
    ops = [r for r in profile.rows() if r.delegate_op is not None]
    assert {r.op for r in ops} >= {"aten.linear.default", "aten.layer_norm.default"}
    linear = next(r for r in ops if r.node.startswith("addmm,"))
    assert linear.module == "block.lin" and linear.source.endswith(source_line("# BLOCK_LINE"))
    assert any(r.op.endswith("(outside its ops)") for r in profile.rows())
    by_op = {r.key: r for r in profile.rows(by="op")}
    assert by_op["aten.linear.default"].calls == 4  # two linears, two runs
    by_module = {r.key: r for r in profile.rows(by="module")}
    assert {"block.lin", "block.ln", "head"} <= set(by_module)
    assert len(profile.rows(by="op", top=2)) == 2
    tree = {r.module: r for r in profile.rows(by="module_tree") if r.module or r.module_type}
    assert tree["block"].total_ns == sum(tree[m].total_ns for m in ("block.lin", "block.ln")) + (
        by_module["block"].total_ns)  # block's own relu plus its submodules'
    assert tree[""].key == "<root>" and tree["block.lin"].key == "    lin"


def test_chrome_trace_nests_runs_instructions_and_delegate_ops(programs, tmp_path):
    _, x, _, fused = programs
    profile = Program.load(fused).method().profile(x, repeat=2)
    path = tmp_path / "trace.json"
    profile.save_chrome_trace(path)
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    assert isinstance(events, list)
    complete = [e for e in events if e["ph"] == "X"]
    for e in events:
        assert e["ph"] in ("X", "M") and isinstance(e["name"], str)
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
    for e in complete:
        assert isinstance(e["ts"], float) and e["ts"] >= 0 and e["dur"] >= 0
        assert e["cat"] in ("run", "instruction", "delegate_op") and isinstance(e["args"], dict)
    runs = [e for e in complete if e["cat"] == "run"]
    inner = [e for e in complete if e["cat"] != "run"]
    assert len(runs) == 2 and any(e["cat"] == "delegate_op" for e in inner)

    def within(e, outer):
        return outer["ts"] - 1e-3 <= e["ts"] and e["ts"] + e["dur"] <= outer["ts"] + outer["dur"] + 1e-3

    for e in inner:  # every span lies inside a run; every delegate op inside its instruction
        assert any(within(e, r) for r in runs)
    calls = [e for e in inner if e["cat"] == "instruction"]
    for e in inner:
        if e["cat"] == "delegate_op":
            assert any(within(e, c) and c["args"]["pc"] == e["args"]["pc"] for c in calls)
            assert e["args"]["nodes"] and "module" in e["args"]


def test_a_program_without_the_debug_node_table_still_profiles_by_op(programs):
    _, x, portable, _ = programs
    program = serialize.deserialize_program(portable)
    bare = dataclasses.replace(
        program, methods=tuple(dataclasses.replace(m, nodes=()) for m in program.methods))
    profile = Program.from_schema(bare).method().profile(x, repeat=1)
    norm = next(r for r in profile.rows() if r.op == "aten::native_layer_norm.out")
    assert norm.node == "native_layer_norm" and norm.module == ""
    assert norm.source.endswith(source_line("# BLOCK_LINE"))  # from the per-instruction debug entry
    assert "aten::addmm.out" in profile.table(by="op")


def test_an_instrumented_state_without_observers_runs_like_the_method(programs):
    _, x, _, fused = programs
    method = Program.load(fused).method()
    state = instrumented_state(method, Session())
    for _ in range(2):  # checked, then trusted
        torch.testing.assert_close(state.execute((x,))[0], method(x), rtol=0, atol=0)


def test_bad_profile_arguments_are_refused_clearly(programs):
    _, x, portable, _ = programs
    method = Program.load(portable).method()
    with pytest.raises(ValueError, match="repeat must be an integer >= 1; got 0"):
        method.profile(x, repeat=0)
    profile = method.profile(x, repeat=1)
    with pytest.raises(ValueError, match="grouped by one of"):
        profile.rows(by="layer")
    with pytest.raises(ValueError, match="top must be a positive integer"):
        profile.table(top=0)


def test_print_uses_rich_on_a_terminal_and_plain_text_otherwise(programs):
    _, x, portable, _ = programs
    profile = Program.load(portable).method().profile(x, repeat=1)
    plain = io.StringIO()
    profile.print(file=plain)
    assert plain.getvalue().strip() == profile.table().strip()

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    tty = Terminal()
    profile.print(by="module", file=tty)
    assert "block.ln" in tty.getvalue() and "─" in tty.getvalue()  # a rich box


def test_cli_run_profile_prints_the_table_and_writes_a_trace(programs, tmp_path):
    _, _, _, fused = programs
    path = tmp_path / "model.xpt"
    path.write_bytes(fused)
    trace = tmp_path / "trace.json"
    done = subprocess.run(
        [sys.executable, "-m", "exportir.cli", "run", str(path), "--profile", "--repeat", "2",
         "--profile-by", "op", "--profile-by", "module", "--top", "50", "--trace", str(trace)],
        env=dict(os.environ, PYTHONPATH=str(SRC)), capture_output=True, text=True, timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("profile of method 'forward': 2 runs") == 2
    assert "aten.linear.default" in done.stdout and "block.lin" in done.stdout
    assert json.loads(trace.read_text())["traceEvents"]


def test_cli_refuses_a_bad_top_clearly(tmp_path, capsys):
    from exportir import cli

    with pytest.raises(SystemExit) as info:
        cli.main(["run", str(tmp_path / "model.xpt"), "--profile", "--top", "0"])
    assert info.value.code == 2
    assert "--top: expected a positive integer, got 0" in capsys.readouterr().err


class Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(1))

    def forward(self, x):
        self.count.add_(1)
        out = torch.cond(x.sum() > 0, lambda x: x.relu() * 2, lambda x: x.sigmoid(), (x,))
        return out + self.count


def test_a_method_with_jumps_and_state_profiles_on_its_own_state():
    x = torch.randn(3, 4).abs()
    program = Program.load(exportir.to_edge(exportir.export(Branchy(), (x,))).to_program().buffer)
    method = program.method()
    profile = method.profile(x, repeat=3)
    timed = [r for r in profile.rows() if r.pc is not None]
    assert timed and all(r.calls == 3 for r in timed)
    assert any("relu" in r.op for r in timed) and not any("sigmoid" in r.op for r in timed)
    assert {e["cat"] for e in profile.chrome_trace()["traceEvents"] if e["ph"] == "X"} == {
        "run", "instruction"}
    # the method's own buffer was not advanced by the profile's four runs
    torch.testing.assert_close(method(x), Branchy()(x))
