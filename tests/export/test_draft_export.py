"""draft_export reports every problem of one model in one run, each at the user's line with a fix;
applying the printed fixes makes export succeed; torch.export.draft_export finds the same kinds."""

import importlib.util
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import exportir
from exportir.export import draft_export, export
from exportir.export._draft import FailureType


@torch.library.custom_op("exportir_draft_test::scale", mutates_args=())
def _scale(x: torch.Tensor) -> torch.Tensor:
    return x * 2


# one model, four problems: a data-dependent branch, a Dim the code bounds, an op with no fake
# kernel, a plain tensor attribute assigned in forward
MANY = textwrap.dedent("""\
    import torch

    class Many(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.calls = torch.zeros(())

        def forward(self, x, t):
            n = t.item()
            if n > 2:
                x = x + 1
            y = torch.ops.exportir_draft_test.scale(x)
            if x.shape[0] > 3:
                y = y * 2
            self.calls = self.calls + 1
            return y
""")


def _load(path, source):
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"draft_{abs(hash(source))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _line(source: str, text: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if text in line)


def _apply_check(source: str, lineno: int, check: str) -> str:
    """Insert ``check`` before line ``lineno`` with its indentation (what the report says)."""
    lines = source.splitlines()
    indent = re.match(r"\s*", lines[lineno - 1]).group(0)
    lines.insert(lineno - 1, indent + check)
    return "\n".join(lines) + "\n"


def _args():
    return torch.randn(5, 3), torch.tensor(4)


def test_every_problem_reported_at_its_line_and_the_fixes_work(tmp_path):
    path = tmp_path / "many.py"
    module = _load(path, MANY)
    dynamic = {"x": {0: exportir.Dim("batch")}, "t": None}
    ep = draft_export(module.Many(), _args(), dynamic_shapes=dynamic)
    report = ep._report
    assert not report.successful()
    by_kind = {f.failure_type: f for f in report.failures}
    assert set(by_kind) == {
        FailureType.DATA_DEPENDENT_ERROR, FailureType.GUARD_ADDED,
        FailureType.MISSING_FAKE_KERNEL, FailureType.STATE_UPDATE,
    }
    assert len(report.failures) == 4
    expected_lines = {
        FailureType.DATA_DEPENDENT_ERROR: "if n > 2:",
        FailureType.GUARD_ADDED: "if x.shape[0] > 3:",
        FailureType.MISSING_FAKE_KERNEL: "y = torch.ops.exportir_draft_test.scale(x)",
        FailureType.STATE_UPDATE: "self.calls = self.calls + 1",
    }
    for kind, code in expected_lines.items():
        frame = by_kind[kind].frame
        assert frame.filename == str(path) and frame.lineno == _line(MANY, code), kind
        assert frame.code == code
    text = str(report)
    assert text.startswith("draft_export: 4 issue(s) found.")
    assert "torch._check(n > 2)" in text and "batch = Dim('batch', min=4)" in text
    assert '@torch.library.register_fake("exportir_draft_test::scale")' in text

    # the program runs like the model on the example inputs, and past them where it may
    args = _args()
    torch.testing.assert_close(ep.module()(*args), module.Many()(*args))
    other = (torch.randn(8, 3), torch.tensor(7))
    torch.testing.assert_close(ep.module()(*other), module.Many()(*other))
    with pytest.raises(RuntimeError, match="Runtime assertion failed"):
        ep.module()(torch.randn(5, 3), torch.tensor(1))

    # export stops on the model as it is
    with pytest.raises(Exception):  # noqa: B017  (the first problem, whichever it is)
        export(module.Many(), _args(), dynamic_shapes=dynamic)

    # apply every printed fix: the check line, the Dim, the fake kernel, the buffer
    decision = by_kind[FailureType.DATA_DEPENDENT_ERROR]
    assert decision.fix_how == "on the line before it"
    fixed = _apply_check(MANY, decision.frame.lineno, decision.fix)
    state = by_kind[FailureType.STATE_UPDATE]
    assert state.fix.startswith("self.register_buffer('calls', <value>)")
    fixed = re.sub(r"self\.calls = (torch\.zeros\(\(\)\))", r"self.register_buffer('calls', \1)", fixed)
    namespace = {"Dim": exportir.Dim}
    exec(by_kind[FailureType.GUARD_ADDED].fix, namespace)  # noqa: S102  (the printed fix)
    exec(by_kind[FailureType.MISSING_FAKE_KERNEL].fix, {"torch": torch})  # noqa: S102
    fixed_module = _load(tmp_path / "fixed.py", fixed)
    good = export(
        fixed_module.Many(), _args(), dynamic_shapes={"x": {0: namespace["batch"]}, "t": None}
    )
    torch.testing.assert_close(good.module()(*args), module.Many()(*args))
    assert draft_export(
        fixed_module.Many(), _args(), dynamic_shapes={"x": {0: namespace["batch"]}, "t": None}
    )._report.successful()


@torch.library.custom_op("exportir_draft_test::scale_for_torch", mutates_args=())
def _scale_for_torch(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def test_torch_draft_export_finds_the_same_kinds(tmp_path):
    """torch.export.draft_export as the oracle on the same model (its own custom op: each
    draft_export here leaves it without a fake kernel): the same kinds, with torch's numbers,
    but for the attribute assignment, which torch only warns about."""
    source = MANY.replace("exportir_draft_test.scale(x)", "exportir_draft_test.scale_for_torch(x)")
    module = _load(tmp_path / "two.py", source)
    ours = draft_export(
        module.Many(), _args(), dynamic_shapes={"x": {0: exportir.Dim("batch")}, "t": None}
    )._report
    theirs = torch.export.draft_export(
        module.Many(), _args(), dynamic_shapes={"x": {0: torch.export.Dim("batch")}, "t": None}
    )._report
    their_kinds = {int(f.failure_type) for f in theirs.failures}
    our_kinds = {int(f.failure_type) for f in ours.failures}
    assert their_kinds == {int(FailureType.DATA_DEPENDENT_ERROR), int(FailureType.GUARD_ADDED),
                           int(FailureType.MISSING_FAKE_KERNEL)}
    assert our_kinds == their_kinds | {int(FailureType.STATE_UPDATE)}


def test_constraint_violation_alone_gives_a_program_over_the_relaxed_dims():
    class Bounded(torch.nn.Module):
        def forward(self, x):
            if x.shape[0] > 3:
                return x * 2
            return x

    dims = {"x": {0: exportir.Dim("b", max=64)}}
    ep = draft_export(Bounded(), (torch.randn(5, 2),), dynamic_shapes=dims)
    (failure,) = ep._report.failures
    assert failure.failure_type is FailureType.GUARD_ADDED
    assert failure.fix == "b = Dim('b', min=4, max=64)"
    assert failure.data["new_dynamic_shapes"]["x"][0].max == 64
    torch.testing.assert_close(ep.module()(torch.ones(9, 2)), torch.ones(9, 2) * 2)


def test_a_clean_model_reports_nothing():
    class Clean(torch.nn.Module):
        def forward(self, x):
            return x.relu()

    ep = draft_export(Clean(), (torch.randn(3),))
    assert ep._report.successful() and str(ep._report).startswith("draft_export: no issues")


def test_draft_export_strict_is_not_supported():
    with pytest.raises(NotImplementedError, match="strict=True"):
        draft_export(torch.nn.ReLU(), (torch.randn(2),), strict=True)


def test_draft_export_and_unflatten_in_a_fresh_process(tmp_path):
    """The two entry points, run once each in a new interpreter."""
    (tmp_path / "many.py").write_text(MANY.replace(
        "y = torch.ops.exportir_draft_test.scale(x)", "y = x * 2"))
    script = textwrap.dedent(f"""
        import sys, torch, exportir
        sys.path.insert(0, {str(tmp_path)!r})
        from many import Many
        ep = exportir.draft_export(Many(), (torch.randn(5, 3), torch.tensor(4)))
        print(ep._report)
        assert len(ep._report.failures) == 2
        m = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
        x = torch.randn(2, 3)
        flat = exportir.unflatten(exportir.export(m, (x,)))
        assert [n for n, _ in flat.named_parameters()] == [n for n, _ in m.named_parameters()]
        torch.testing.assert_close(flat(x), m(x))
        print(sorted(n for n, _ in flat.named_children()))
    """)
    src = str(pathlib.Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=False
    )
    assert out.returncode == 0, out.stderr
    assert "draft_export: 2 issue(s) found" in out.stdout
    assert out.stdout.strip().endswith("['0', '1', '2']")


def test_a_specialized_dim_is_reported_with_its_value():
    class Flat(torch.nn.Module):
        def forward(self, x):
            return x.reshape(20) * 2  # only a batch of 5 fits

    dims = {"x": {0: exportir.Dim("batch")}}
    ep = draft_export(Flat(), (torch.randn(5, 4),), dynamic_shapes=dims)
    (failure,) = ep._report.failures
    assert failure.failure_type is FailureType.GUARD_ADDED
    assert "specialized it to be a constant (5)" in failure.what
    assert failure.frame.code == "return x.reshape(20) * 2  # only a batch of 5 fits"
    assert failure.fix == "batch = 5"
    namespace = {}
    exec(failure.fix, namespace)  # noqa: S102  (the printed fix: the dim is the constant 5)
    export(Flat(), (torch.randn(5, 4),), dynamic_shapes={"x": {0: namespace["batch"]}})
