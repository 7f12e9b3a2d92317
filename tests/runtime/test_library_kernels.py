"""The runtime's own kernels of library custom ops (exportir.runtime.library_kernels).

transformers' ``transformers::grouped_mm_fallback`` (its MoE experts' grouped GEMM under
export) is compared with transformers' own implementation, its ``offs`` checked against what a
hostile program could hand it, and a real MoE program (the corpus' Mixtral) run in a fresh
process that imports only the runtime.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from corpus import real_models as R
from real_models import _harness as H

from exportir.runtime import default_kernel_registry
from exportir.runtime.library_kernels import LIBRARY_KERNELS, grouped_mm_fallback

NAME = "transformers::grouped_mm_fallback.default@functional"


def _transformers_impl():
    R._tf()
    from transformers.integrations import moe

    return moe._grouped_mm_fallback


@pytest.mark.parametrize("offs", [[3, 3, 7, 10], [0, 0, 0, 10], [2, 5, 5, 6], [0, 0, 0, 0]],
                         ids=["empty-middle", "one-group", "trailing-rows", "no-rows"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_grouped_mm_fallback_equals_transformers(offs, dtype) -> None:
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(10, 6, generator=g), torch.randn(4, 6, 5, generator=g)
    o = torch.tensor(offs, dtype=dtype)
    out = torch.full((10, 5), float("nan"))  # stale planned memory: every row must be written
    grouped_mm_fallback(x, w, o, out)
    torch.testing.assert_close(out, _transformers_impl()(x, w, o), rtol=0, atol=0)


def test_grouped_mm_fallback_resizes_its_out() -> None:
    x, w = torch.randn(4, 3), torch.randn(2, 3, 2)
    out = torch.empty(0)
    grouped_mm_fallback(x, w, torch.tensor([1, 4]), out)
    torch.testing.assert_close(out, torch.cat([x[:1] @ w[0], x[1:] @ w[1]]))


@pytest.mark.parametrize(
    ("offs", "match"),
    [
        ([3, 2], r"offs\[1\] = 2 is outside \[3, 4\]"),
        ([1, 9], r"offs\[1\] = 9 is outside \[1, 4\]"),
        ([-1, 2], r"offs\[0\] = -1 is outside \[0, 4\]"),
        ([1, 2, 3], r"offs must be 2 int32 / int64"),
        ([1.0, 2.0], r"offs must be 2 int32 / int64.*torch.float32"),
    ],
    ids=["decreasing", "past-the-rows", "negative", "wrong-length", "float"],
)
def test_grouped_mm_fallback_refuses_bad_offsets(offs, match) -> None:
    out = torch.zeros(4, 2)
    with pytest.raises(ValueError, match=match):
        grouped_mm_fallback(torch.randn(4, 3), torch.randn(2, 3, 2), torch.tensor(offs), out)
    assert not out.any(), "nothing is written before the offsets are checked"


@pytest.mark.parametrize(
    ("x", "w", "match"),
    [
        (torch.randn(4, 3, 1), torch.randn(2, 3, 2), r"input \[S, K\].*got input \[4, 3, 1\]"),
        (torch.randn(4, 5), torch.randn(2, 3, 2), "input has 5 columns, weight 3 rows"),
        (torch.randn(4, 3, dtype=torch.float64), torch.randn(2, 3, 2), "input is torch.float64"),
    ],
    ids=["rank", "inner-size", "dtype"],
)
def test_grouped_mm_fallback_refuses_bad_operands(x, w, match) -> None:
    with pytest.raises(ValueError, match=match):
        grouped_mm_fallback(x, w, torch.tensor([1, 4]), torch.zeros(4, 2))


def test_the_default_registry_knows_the_library_ops_by_their_exact_names() -> None:
    registry = default_kernel_registry()
    for name in LIBRARY_KERNELS:
        kernel = registry.lookup(name)
        assert kernel is not None and kernel.writes == (3,) and kernel.params is not None
    # a name from a file selects only from the table: the same op without the fallback marker,
    # another overload or another namespace resolves to nothing
    for other in ("transformers::grouped_mm_fallback.default",
                  "transformers::grouped_mm_fallback.other@functional",
                  "transformerz::grouped_mm_fallback.default@functional"):
        assert registry.lookup(other) is None, other


def test_a_moe_program_runs_in_a_fresh_process_without_transformers(tmp_path) -> None:
    """Mixtral's portable program calls transformers::grouped_mm_fallback; a process that
    imports only the runtime runs it equal to eager, and never imports transformers."""
    case = H.case("mixtral")
    path = H.program_file("mixtral", "portable")
    inputs = tmp_path / "inputs.pt"
    torch.save({k: v for k, v in case.kwargs.items()}, inputs)
    expected = tmp_path / "expected.pt"
    torch.save(H.eager_example("mixtral").logits, expected)
    script = textwrap.dedent(f"""
        import sys, torch
        from exportir.runtime import Program
        kwargs = torch.load({str(inputs)!r})
        out = Program.load({str(path)!r}).method("forward")(**kwargs)
        logits = out[0] if isinstance(out, (list, tuple)) else out
        torch.testing.assert_close(logits, torch.load({str(expected)!r}), rtol=1e-4, atol=1e-4)
        assert "transformers" not in sys.modules, "the runtime imported transformers"
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
