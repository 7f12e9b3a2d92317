"""The whole road on the export corpus: export -> to_edge -> to_program -> bytes/file -> load ->
run, compared with eager PyTorch (twice, so state kept across calls is checked too).

Every corpus model compiles, delegated and not: a compiler error fails the test.
"""

from __future__ import annotations

import pytest
import torch
from corpus.export_models import BY_NAME, ENTRIES, build

from exportir import pytree
from exportir.format import schema
from exportir.runtime import MethodInputError, Program, default_kernel_registry
from exportir.runtime.kernel_table import KERNEL_TABLE


def _compile(name: str, delegate: bool = False) -> bytes:
    from exportir.export import export
    from exportir.program.manager import to_edge

    module, args, kwargs = build(BY_NAME[name])
    edge = to_edge(export(module, args, kwargs))
    if delegate:
        from exportir.backends.fused_cpu import FusedCpuPartitioner

        edge = edge.to_backend(FusedCpuPartitioner())
    return edge.to_program().buffer


def _kernels(name: str):
    """The kernel registry for corpus model ``name``: its custom ops registered on purpose."""
    kernels = default_kernel_registry()
    if "custom_op" in BY_NAME[name].tags:
        kernels.register_op(torch.ops.exportir_test.scaled_tanh, torch.ops.exportir_test.split_stats)
    return kernels


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _assert_same(got, expected) -> None:
    got_t, expected_t = _tensors(got), _tensors(expected)
    assert len(got_t) == len(expected_t)
    for g, e in zip(got_t, expected_t):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("delegate", [False, True], ids=["portable", "fused_cpu"])
@pytest.mark.parametrize("name", [e.name for e in ENTRIES])
def test_corpus_model_runs_like_eager(name, delegate):
    data = _compile(name, delegate)
    # the default delegate registry runs the fused CPU backend
    program = Program.load(data, kernels=_kernels(name))
    for meta in program.schema.methods:  # every operator the emitter names is in the table
        for op in meta.operators:
            name_ = f"{op.name}.{op.overload or 'default'}"
            assert name_ in KERNEL_TABLE or op.is_functional_fallback or (
                (op.name, op.overload) in schema.PRIM_OPERATORS), name_
    if delegate:
        assert program.schema.delegates, "the partitioner claimed nothing"
    method = program.method("forward")
    eager, args, kwargs = build(BY_NAME[name])
    _, args_ours, kwargs_ours = build(BY_NAME[name])
    for _ in range(2):  # the second call sees the state (buffers) the first one left
        expected = eager(*args, **kwargs)
        got = method(*args_ours, **kwargs_ours)
        _assert_same(got, expected)
        if isinstance(expected, torch.Tensor):
            assert isinstance(got, torch.Tensor)  # a single output is not wrapped in a tuple


def test_file_on_disk_and_structured_outputs(tmp_path):
    data = _compile("dict_io")
    path = tmp_path / "dict_io.xpt"
    path.write_bytes(data)
    method = Program.load(path).method()
    eager, args, kwargs = build(BY_NAME["dict_io"])
    expected = eager(*args, **kwargs)
    got = method(*args, **kwargs)
    assert isinstance(got, dict) and set(got) == set(expected)
    _assert_same(got, expected)


def test_multi_method_program():
    from exportir.export import export
    from exportir.program.manager import to_edge

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4, 8)

        def forward(self, x):
            return torch.tanh(self.proj(x))

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(8, 2)

        def forward(self, h):
            return self.head(h).softmax(-1)

    torch.manual_seed(0)
    enc, dec = Encoder().eval(), Decoder().eval()
    x = torch.randn(3, 4)
    programs = {"encode": export(enc, (x,)), "decode": export(dec, (enc(x),))}
    edge = to_edge(programs, constant_methods={"hidden_size": 8})
    program = Program.load(edge.to_program().buffer)
    assert set(program.method_names) == {"encode", "decode", "hidden_size"}
    h = program.method("encode")(x)
    torch.testing.assert_close(h, enc(x))
    torch.testing.assert_close(program.method("decode")(h), dec(enc(x)))
    assert program.method("hidden_size")() in (8, (8,))


def test_same_model_same_bytes_and_outputs_do_not_alias():
    first, second = _compile("mlp"), _compile("mlp")
    assert first == second
    method = Program.load(first).method()
    _, args, kwargs = build(BY_NAME["mlp"])
    a = method(*args, **kwargs)
    b = method(*[x + 1 for x in args], **kwargs)
    assert not torch.equal(_tensors(a)[0], _tensors(b)[0])


def test_batch_norm_eval_runs_without_resize_warnings(capfd):
    method = Program.load(_compile("cnn_bn_eval")).method()
    _, args, kwargs = build(BY_NAME["cnn_bn_eval"])
    capfd.readouterr()
    method(*args, **kwargs)
    method(*args, **kwargs)
    assert "resized" not in capfd.readouterr().err


def test_dynamic_shapes_run_at_every_size_within_the_bounds():
    from exportir.export import Dim, export
    from exportir.program.manager import to_edge

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)

        def forward(self, x, y):
            h = self.fc(x).relu()
            return torch.cat([h, y], dim=0).sum(0), h.reshape(-1), x.new_ones(x.shape[0], 2)

    torch.manual_seed(0)
    model = Net().eval()
    shapes = {"x": {0: Dim("b", min=1, max=16)}, "y": {0: Dim("c", min=1, max=8)}}
    ep = export(model, (torch.randn(5, 4), torch.randn(3, 3)), dynamic_shapes=shapes)
    method = Program.load(to_edge(ep).to_program().buffer).method()
    for n, k in ((1, 1), (16, 8), (5, 3), (7, 2)):
        x, y = torch.randn(n, 4), torch.randn(k, 3)
        _assert_same(method(x, y), model(x, y))
    with pytest.raises(MethodInputError, match=r"input 0 \(x\) has size 17 at dim 0; it is b, "
                       r"which the method accepts in \[1, 16\]"):
        method(torch.randn(17, 4), torch.randn(2, 3))
    _assert_same(method(x, y), model(x, y))  # still usable after the failure


def test_symbolic_size_used_as_a_tensor_operand():
    from exportir.export import Dim, export
    from exportir.program.manager import to_edge

    class Scale(torch.nn.Module):
        def forward(self, x, h, n):
            return h * x.shape[0], n + x.shape[0], (x.sum(0) / x.shape[0])

    model = Scale().eval()
    x, h, n = torch.randn(4, 3), torch.randn(3), torch.arange(3, dtype=torch.int32)
    ep = export(model, (x, h, n), dynamic_shapes={"x": {0: Dim("b", min=2, max=10)}, "h": None,
                                                  "n": None})
    method = Program.load(to_edge(ep).to_program().buffer).method()
    for b in (2, 4, 9):
        x = torch.randn(b, 3)
        got, expected = method(x, h, n), model(x, h, n)
        _assert_same(got, expected)
        assert [t.dtype for t in got] == [t.dtype for t in expected]  # int32 stays int32


def test_training_batch_norm_updates_running_stats_like_eager():
    from exportir.export import export
    from exportir.program.manager import to_edge

    class BN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = torch.nn.BatchNorm2d(3, momentum=0.3)

        def forward(self, x):
            y = self.bn(x)
            stats = (self.bn.running_mean * 1, self.bn.running_var * 1)
            return y, *stats, self.bn.num_batches_tracked + 0

    torch.manual_seed(0)
    ours, eager = BN().train(), BN().train()
    eager.load_state_dict(ours.state_dict())
    manager = to_edge(export(ours, (torch.randn(2, 3, 4, 4),))).to_program()
    ops = {str(o) for m in manager.program.methods for o in m.operators}
    assert any("_native_batch_norm_legit" in o and "functional" not in o for o in ops), ops
    method = Program.load(manager.buffer).method()
    for i in range(3):  # the running statistics are method state, updated on every call
        x = torch.randn(2, 3, 4, 4) * (i + 1) + i
        _assert_same(method(x), eager(x))


def test_custom_op_program_names_the_library_when_it_is_not_imported(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    path = tmp_path / "custom.xpt"
    path.write_bytes(_compile("custom_op"))
    code = (
        "from exportir.runtime import Program, MissingKernelError\n"
        "try:\n"
        f"    Program.load({str(path)!r})\n"
        "except MissingKernelError as e:\n"
        "    print(e)\n"
    )
    src = Path(__file__).resolve().parents[2] / "src"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PYTHONPATH": str(src), "PATH": ""}, timeout=120, check=True)
    message = done.stdout
    assert "custom operator exportir_test::scaled_tanh.default" in message, message
    assert "torch.library namespace 'exportir_test'" in message
    assert "node 'scaled_tanh'" in message and "export_models.py:" in message
