"""The whole pipeline on a built-in model, stage by stage.

export -> to_edge -> to_program -> program file -> load -> run -> compare with eager PyTorch.
Each stage prints what it produced and how long it took. The files stay in ``out_dir``
(``./demo-out`` by default): ``model.pt2`` (the ExportedProgram) and ``model.xpt`` (the program
file), for the ``exportir`` command to try next. ``main()`` returns 0 when the runtime's outputs
match eager's (and on a second input, so the method is reusable), 1 otherwise.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch


class PipelineDemoModel(torch.nn.Module):
    """A small image classifier: conv -> batch norm -> ReLU -> pool -> MLP head -> softmax."""

    def __init__(self, classes: int = 5) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, kernel_size=3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Sequential(
            torch.nn.Linear(8 * 4 * 4, 32), torch.nn.GELU(), torch.nn.Linear(32, classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.adaptive_avg_pool2d(self.bn(self.conv(x)).relu(), 4)
        return self.head(h.flatten(1)).softmax(dim=-1)


def _section(title: str, seconds: float | None = None) -> None:
    timing = f" ({1000 * seconds:.1f} ms)" if seconds is not None else ""
    print(f"\n=== {title}{timing} " + "=" * max(0, 66 - len(title) - len(timing)))


def _timed(fn: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def _op_name(target: Any) -> str:
    aten = getattr(target, "aten_op", None)  # edge ops wrap the ATen op
    if aten is not None:
        return f"edge.{aten}"
    return str(target) if isinstance(target, torch._ops.OpOverload) else target.__name__


def _op_histogram(graph: Any, limit: int = 8) -> str:
    counts = Counter(
        _op_name(n.target) for n in graph.nodes if n.op == "call_function"
    )
    shown = ", ".join(f"{name} x{k}" for name, k in counts.most_common(limit))
    more = f", ... ({len(counts) - limit} more kinds)" if len(counts) > limit else ""
    return f"{sum(counts.values())} op calls: {shown}{more}"


def _next_steps(out_dir: Path) -> None:
    _section(f"files written to {out_dir}/")
    print(f"  {out_dir / 'model.pt2'}   the ExportedProgram (exportir.save; exportir.load reads it)")
    print(f"  {out_dir / 'model.xpt'}   the program file the runtime ran above")
    print("\nNext, try (in a shell with the environment active: . .venv/bin/activate):")
    for command in next_commands(out_dir):
        print(f"  {command}")


def next_commands(out_dir: Path) -> list[str]:
    """The three commands the demo suggests on the files it wrote."""
    return [
        f"exportir inspect --summary {out_dir / 'model.xpt'}",
        f"exportir run {out_dir / 'model.xpt'}",
        f"exportir view {out_dir / 'model.xpt'}",
    ]


def main(out_dir: str | Path = "demo-out") -> int:
    import exportir
    from exportir.cli_progress import ImportClock
    from exportir.export import export
    from exportir.program import printer
    from exportir.program.manager import to_edge
    from exportir.runtime import Program

    torch.manual_seed(0)
    model = PipelineDemoModel().eval()
    x = torch.randn(2, 3, 16, 16)

    ep, t = _timed(lambda: export(model, (x,)))
    _section("1. export (ATen dialect)", t)
    print(_op_histogram(ep.graph))
    print(f"signature: {len(ep.graph_signature.input_specs)} inputs "
          f"({sum(1 for s in ep.graph_signature.input_specs if s.kind.name == 'USER_INPUT')} "
          "user), "
          f"{len(ep.graph_signature.output_specs)} output(s)")

    edge, t = _timed(lambda: to_edge(ep))
    _section("2. to_edge (Edge dialect, verified)", t)
    print(_op_histogram(edge.exported_program().graph))

    manager, t = _timed(edge.to_program)
    _section("3. to_program (out variants, memory plan, emission)", t)
    method_meta = manager.program.method("forward")
    plan = method_meta.plan
    print(f"{len(method_meta.instructions)} instructions over {len(method_meta.operators)} "
          f"kernels; arena {sum(plan.arenas)} B (lower bound {plan.lower_bound} B)")
    for op in method_meta.operators:
        print(f"  {op}")

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    exportir.save(ep, out_dir / "model.pt2")
    path = out_dir / "model.xpt"
    data, t = _timed(lambda: manager.buffer)
    path.write_bytes(data)
    _section("4. program file", t)
    weights = sum(c.nbytes for c in manager.program.constants)
    print(f"{path}: {len(data)} bytes ({weights} bytes of weights, "
          f"{len(data) / max(weights, 1):.4f}x)")
    print("\n".join(printer.format_program(manager.program).splitlines()[:1]))

    program, t = _timed(lambda: Program.load(path))
    _section("5. load (mmap + full validation)", t)
    print(program)
    with ImportClock("torch._dynamo") as clock:
        method, t = _timed(lambda: program.method("forward"))
    torch_part = (f" ({1000 * clock.seconds:.0f} ms of it: torch importing torch._dynamo for "
                  "its Python meta kernels, once per process)" if clock.seconds > 0.05 else "")
    print(f"prepared {method!r} in {1000 * t:.1f} ms{torch_part}")

    got, t = _timed(lambda: method(x))
    _section("6. run (first call: torch warms up each kernel)", t)
    print(f"output: {tuple(got.shape)} {got.dtype}\n{got}")

    _section("7. compare with eager")
    ok = True
    for label, inp in (("example input", x), ("new input", torch.randn(2, 3, 16, 16))):
        expected = model(inp)
        ours = method(inp)
        diff = (expected - ours).abs().max().item()
        same = torch.allclose(expected, ours, atol=1e-5, rtol=1e-5)
        ok &= same
        print(f"{label}: max |eager - runtime| = {diff:.2e} -> {'OK' if same else 'MISMATCH'}")
    if ok:
        _next_steps(out_dir)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
