"""A data-dependent error names the user expression that made each unbacked value (``t.item()``,
``x.nonzero().shape[0]``, ``x[m].shape[0]``) and its line, not just ``u0``; when the value has
no name at the decision, the fix names it first, and pasting that fix makes export succeed."""

import importlib.util
import re
import textwrap

import pytest
import torch

from exportir.export import draft_export, export
from exportir.symbolic import GuardOnDataDependentSymNode

MODELS = textwrap.dedent("""\
    import torch

    class Item(torch.nn.Module):
        def forward(self, x, t):
            n = t.item()
            if n > 2:
                return x + 1
            return x

    class Inline(torch.nn.Module):
        def forward(self, x):
            if x.nonzero().shape[0] > 2:
                return x + 1
            return x

    class Masked(torch.nn.Module):
        def forward(self, x, m):
            y = x[m]
            if y.shape[0] == 0:
                return x
            return y.sum() + x
""")


def _load(path, source):
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"origins_{abs(hash(source))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _line(text):
    return next(i for i, line in enumerate(MODELS.splitlines(), 1) if text in line)


CASES = {
    "Item": ((torch.randn(3), torch.tensor(4)), "t.item()", "n = t.item()"),
    "Inline": ((torch.tensor([1.0, 2.0, 0.0, 3.0, 4.0]),), "x.nonzero().shape[0]",
               "if x.nonzero().shape[0] > 2:"),
    "Masked": ((torch.randn(5), torch.tensor([True, False, True, True, False])),
               "x[m].shape[0]", "y = x[m]"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_error_names_the_expression_and_its_line(tmp_path, name):
    path = tmp_path / "models.py"
    module = _load(path, MODELS)
    args, expr, made_at = CASES[name]
    with pytest.raises(GuardOnDataDependentSymNode) as info:
        export(getattr(module, name)(), args)
    text = str(info.value)
    assert f"where u0 is `{expr}`, at\n    File \"{path}\", line {_line(made_at)}, in forward\n" \
        f"        {made_at}" in text
    # the draft report says it too, shortly
    report = str(draft_export(getattr(module, name)(), args)._report)
    assert f"where u0 is `{expr}` (models.py:{_line(made_at)})" in report


def test_a_value_without_a_name_is_named_by_the_fix_and_the_fix_works(tmp_path):
    path = tmp_path / "models.py"
    module = _load(path, MODELS)
    args = CASES["Inline"][0]
    with pytest.raises(GuardOnDataDependentSymNode) as info:
        export(module.Inline(), args)
    text = str(info.value)
    header = "Fix: tell export what holds, naming the value first. Replace the line"
    assert header in text
    block = text.split("\nwith\n", 1)[1].split("\nor, if both", 1)[0].splitlines()
    assert block == [
        "    u0 = x.nonzero().shape[0]",
        "    torch._check(u0 > 2)   # if it always holds",
        "    torch._check(u0 <= 2)   # or this, if it never holds",
        "    if u0 > 2:",
    ]
    # paste it (the "always" variant) in place of the line, with its indentation
    lineno = int(re.search(r'Replace the line\n  File ".+?", line (\d+)', text).group(1))
    lines = MODELS.splitlines()
    indent = re.match(r"\s*", lines[lineno - 1]).group(0)
    pasted = [block[0], block[1].split("   #")[0], block[3]]
    lines[lineno - 1:lineno] = [indent + line.strip() for line in pasted]
    fixed = _load(tmp_path / "fixed.py", "\n".join(lines) + "\n")
    ep = export(fixed.Inline(), args)
    torch.testing.assert_close(ep.module()(*args), module.Inline()(*args))
    # draft_export offers the same rewrite
    (failure,) = draft_export(module.Inline(), args)._report.failures
    assert failure.fix_how == "in place of the line"
    assert failure.fix.splitlines() == [block[0].strip(), "torch._check(u0 > 2)", "if u0 > 2:"]
