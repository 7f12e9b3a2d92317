"""Data-dependent values: the error on a Python branch over an unbacked value names the line and
suggests a torch._check in the user's names (pasting it makes export succeed); draft_export takes
the example's branch under a runtime assert; assume_constant_result burns values in."""

import importlib.util
import re
import sys
import textwrap

import pytest
import torch

from exportir.export import draft_export, export
from exportir.symbolic import GuardOnDataDependentSymNode


class Branch(torch.nn.Module):
    def forward(self, x):
        n = x.sum().int().item()
        if n > 2:  # data-dependent branch
            return x * 2
        return x


class BranchChecked(torch.nn.Module):
    def forward(self, x):
        n = x.sum().int().item()
        torch._check(n > 2)
        if n > 2:
            return x * 2
        return x


def test_branch_on_item_raises_with_line_and_fix():
    with pytest.raises(GuardOnDataDependentSymNode) as info:
        export(Branch(), (torch.ones(4),))
    text = str(info.value)
    assert "Could not guard on data-dependent expression u0 > 2" in text
    assert __file__ in text and "if n > 2:  # data-dependent branch" in text
    assert "torch._check(n > 2)" in text and "torch._check(n <= 2)" in text


def test_applying_the_fix_exports_with_a_runtime_assert():
    ep = export(BranchChecked(), (torch.ones(4),))
    msgs = [n.args[1] for n in ep.graph.nodes if n.target is torch.ops.aten._assert_scalar.default]
    assert any("u0 >= 3" in m or "u0 > 2" in m for m in msgs)
    torch.testing.assert_close(ep.module()(torch.ones(4)), torch.ones(4) * 2)


def test_tolist_gives_unbacked_values():
    class M(torch.nn.Module):
        def forward(self, x, t):
            a, b = t.tolist()
            torch._check(a >= 0)
            torch._check(b >= 0)
            return x.new_zeros(a + b)

    ep = export(M(), (torch.ones(2), torch.tensor([1, 2])))
    assert str(ep.range_constraints) == "{u0: VR[0, int_oo], u1: VR[0, int_oo]}"
    assert ep.module()(torch.ones(2), torch.tensor([3, 4])).shape == (7,)


# ---------------------------------------------------------------------------- the fix, pasted

def _load(path, source):
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"m_{abs(hash(source))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _paste_fix(source: str, message: str, which: str) -> str:
    """Insert the suggested torch._check (the "always" or "never" one) before the line the
    message names, with that line's indentation: what the user is told to do."""
    lineno = int(re.search(r'Before this line\n  File ".+?", line (\d+)', message).group(1))
    (check,) = re.findall(rf"^    (torch\._check\(.*\))   # if it {which} holds$", message, re.MULTILINE)
    lines = source.splitlines()
    target = lines[lineno - 1]
    lines.insert(lineno - 1, target[: len(target) - len(target.lstrip())] + check)
    return "\n".join(lines) + "\n"


DETECT = textwrap.dedent('''
    import torch
    from corpus import _torchvision_ops  # noqa: F401  (before torchvision)
    from torchvision.ops import boxes as box_ops


    class Detect(torch.nn.Module):
        def forward(self, boxes, scores):
            boxes = box_ops.clip_boxes_to_image(boxes, (32, 48))
            keep = box_ops.remove_small_boxes(boxes, 1.0)
            boxes, scores = boxes[keep], scores[keep]
            if boxes.shape[0] == 0:
                return boxes, scores
            iou = box_ops.box_iou(boxes, boxes)
            return boxes, scores * iou.max(dim=1).values * box_ops.box_area(boxes)
''')


def _boxes(n=12, big=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * 30
    wh = (torch.rand(n, 2, generator=g) * 10 + 1.5) if big else torch.rand(n, 2, generator=g) * 0.5
    return torch.cat([xy, xy + wh], 1), torch.rand(n, generator=g)


def test_pasting_the_suggested_fix_makes_export_succeed(tmp_path):
    model = _load(tmp_path / "detect.py", DETECT).Detect()
    args = _boxes()
    with pytest.raises(Exception, match="Could not guard on data-dependent"):
        torch.export.export(model, args, strict=False)  # torch stops here too
    with pytest.raises(GuardOnDataDependentSymNode) as info:
        export(model, args)
    text = str(info.value)
    assert f'File "{tmp_path / "detect.py"}", line 12, in forward' in text
    assert "here u0 is `boxes.shape[0]`" in text
    fixed = _paste_fix(DETECT, text, "never")
    assert "        torch._check(boxes.shape[0] != 0)\n        if boxes.shape[0] == 0:" in fixed
    model = _load(tmp_path / "detect_fixed.py", fixed).Detect()
    module = export(model, args).module()
    for big in (True, False):
        other = _boxes(big=big, seed=3)
        if big:
            torch.testing.assert_close(module(*other), model(*other))
        else:  # every box removed: the checked fact fails at run time
            with pytest.raises(RuntimeError, match="Runtime assertion failed"):
                module(*other)


def test_library_branch_fix_goes_in_the_users_code(tmp_path):
    """torchvision's batched_nms branches on boxes.numel() == 0 (torch stops there); the error
    names torchvision's line and puts the fix before the user's call, in the user's names.
    With it, export goes on to nms (whose C++ kernel this machine does not have)."""
    source = textwrap.dedent('''
        import torch
        from corpus import _torchvision_ops  # noqa: F401
        from torchvision.ops import boxes as box_ops


        class Nms(torch.nn.Module):
            def forward(self, boxes, scores, labels):
                keep = box_ops.remove_small_boxes(boxes, min_size=1.0)
                boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
                keep = box_ops.batched_nms(boxes, scores, labels, 0.5)
                return boxes[keep], scores[keep]
    ''')
    boxes, scores = _boxes()
    args = (boxes, scores, torch.randint(0, 3, (12,)))
    model = _load(tmp_path / "nms.py", source).Nms()
    with pytest.raises(GuardOnDataDependentSymNode) as info:
        export(model, args)
    text = str(info.value)
    assert re.search(r'torchvision/ops/boxes.py", line \d+, in _batched_nms_coordinate_trick\n'
                     r"    if boxes.numel\(\) == 0:", text)
    assert f'Before this line\n  File "{tmp_path / "nms.py"}", line 11, in forward' in text
    assert "torch._check(boxes.shape[0] != 0)   # if it never holds" in text
    fixed = _load(tmp_path / "nms_fixed.py", _paste_fix(source, text, "never")).Nms()
    with pytest.raises(RuntimeError, match="Couldn't load custom C\\+\\+ ops") as info:
        export(fixed, args)
    assert "torchvision/extension.py" in info.traceback[-1].path.as_posix()


# ---------------------------------------------------------------------------- draft_export


def test_draft_export_keeps_the_example_branch_under_a_runtime_assert(tmp_path):
    model = _load(tmp_path / "detect.py", DETECT).Detect()
    ep = draft_export(model, _boxes())
    assert not ep._report.successful()
    (decision,) = ep._report.failures
    assert str(decision.data["expr"]) == "Eq(u0, 0)" and decision.data["value"] is False
    assert decision.fix == "torch._check(boxes.shape[0] != 0)"
    report = str(ep._report)
    assert "1. Data-dependent decision: `boxes.shape[0] != 0` held on the example inputs (Eq(u0, 0) was False)" in report
    assert "fix (on the line before it):\n     torch._check(boxes.shape[0] != 0)" in report
    other = _boxes(seed=5)
    torch.testing.assert_close(ep.module()(*other), model(*other))
    asserts = [n.args[1] for n in ep.graph.nodes if n.target is torch.ops.aten._assert_scalar.default]
    assert any("expression Ne(u0, 0)" in a for a in asserts)
    with pytest.raises(RuntimeError, match="Runtime assertion failed for expression"):
        ep.module()(*_boxes(big=False))  # no box left: the other branch


def test_draft_export_of_the_other_branch():
    ep = draft_export(Branch(), (torch.zeros(4),))  # n = 0: the `return x` branch
    assert [str(a.data["expr"]) for a in ep._report.failures] == ["u0 > 2"]
    assert ep._report.failures[0].fix == "torch._check(n <= 2)"
    torch.testing.assert_close(ep.module()(torch.zeros(4)), torch.zeros(4))
    with pytest.raises(RuntimeError, match="Runtime assertion failed for expression u0 <= 2"):
        ep.module()(torch.ones(4))


def test_draft_export_specializes_an_int_decision():
    class Loop(torch.nn.Module):
        def forward(self, x, n):
            out = x
            for _ in range(n.item()):  # int(u0): the trip count of the example, asserted
                out = out * 2
            return out

    x = torch.ones(3)
    with pytest.raises(GuardOnDataDependentSymNode):
        export(Loop(), (x, torch.tensor(3)))
    ep = draft_export(Loop(), (x, torch.tensor(3)))
    assert [(str(a.data["expr"]), a.data["value"]) for a in ep._report.failures] == [("u0", 3)]
    torch.testing.assert_close(ep.module()(x, torch.tensor(3)), x * 8)
    asserts = [n.args[1] for n in ep.graph.nodes if n.target is torch.ops.aten._assert_scalar.default]
    assert any("expression Eq(u0, 3)" in a for a in asserts)
    with pytest.raises(RuntimeError, match="Runtime assertion failed for expression u0 >= 3"):
        ep.module()(x, torch.tensor(2))


def test_draft_export_without_decisions_is_export():
    ep = draft_export(BranchChecked(), (torch.ones(4),))
    assert ep._report.successful() and "no issues found" in str(ep._report)
    assert ep.graph_module.code == export(BranchChecked(), (torch.ones(4),)).graph_module.code


# ---------------------------------------------------------------------------- constant results


@torch.compiler.assume_constant_result
def _count_positive(t):
    return int((t > 0).sum().item())


@torch.compiler.assume_constant_result
def _lookup_table(t):
    return t[t > 0] * 10


class ConstantResults(torch.nn.Module):
    def forward(self, x, ref):
        n = _count_positive(ref)  # a module-level marked function
        return x[:n] + _lookup_table(ref).sum()


def test_assume_constant_result_scalar_and_tensor_become_constants():
    ref = torch.tensor([1.0, -1.0, 2.0, 3.0])
    ep = export(ConstantResults(), (torch.randn(5), ref))
    kinds = [s.kind.name for s in ep.graph_signature.input_specs]
    assert kinds == ["CONSTANT_TENSOR", "USER_INPUT", "USER_INPUT"]  # the table, lifted
    assert ep.range_constraints == {}
    targets = {str(n.target) for n in ep.graph.nodes}
    assert not {"aten._local_scalar_dense.default", "aten.index.Tensor"} & targets
    x = torch.randn(5)
    torch.testing.assert_close(ep.module()(x, torch.zeros(4)), x[:3] + 60.0)  # ref ignored


@torch.library.custom_op("exportir_test::fake_only", mutates_args=())
def _fake_only(t: torch.Tensor) -> torch.Tensor:
    raise NotImplementedError("no real kernel on this machine")


@_fake_only.register_fake
def _(t):
    return torch.empty_like(t)


@torch.compiler.assume_constant_result
def _threshold(t):
    return int(torch.ops.exportir_test.fake_only(t).sum().item())


class NeedsRealKernel(torch.nn.Module):
    def forward(self, x, t):
        return x[: _threshold(t)]


class ThresholdPassedIn(torch.nn.Module):
    def forward(self, x, k: int):
        return x[:k]


def test_constant_result_without_a_real_kernel_names_the_function_and_the_fix():
    x, t = torch.randn(6), torch.ones(3)
    with pytest.raises(RuntimeError) as info:
        export(NeedsRealKernel(), (x, t))
    text = str(info.value)
    assert "assume_constant_result: the value of zuf0 on the example inputs could not be " in text
    assert f'File "{__file__}", line {_threshold.__code__.co_firstlineno}, in _threshold' in text
    assert "Compute the value outside the model and pass it in" in text
    # the fix: the value computed outside, passed in (a Python int input is a constant)
    ep = export(ThresholdPassedIn(), (x, 3))
    torch.testing.assert_close(ep.module()(x, 3), x[:3])


def test_marked_functions_are_restored_after_export_and_after_a_failure():
    module = sys.modules[__name__]
    originals = (module._count_positive, module._threshold)
    export(ConstantResults(), (torch.randn(5), torch.tensor([1.0, -1.0, 2.0, 3.0])))
    with pytest.raises(RuntimeError):
        export(NeedsRealKernel(), (torch.randn(6), torch.ones(3)))
    assert (module._count_positive, module._threshold) == originals
    assert _count_positive(torch.tensor([1.0, 2.0])) == 2  # the plain function again
