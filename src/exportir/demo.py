"""``make demo``: the whole exportir road on small built-in models.

Part 1 traces a residual MLP with exportir.fx and prints its graph, generated code and table.
Part 2 (``exportir.demo_pipeline``) exports a small CNN, lowers it to the Edge dialect, emits a
program file, loads it in the runtime, runs it and compares with eager PyTorch. The files stay in
``./demo-out`` (``model.pt2``, ``model.xpt``) and the demo ends with three ``exportir`` commands
to try on them.
"""


import torch

from exportir import fx


class DemoBlock(torch.nn.Module):
    """A residual MLP block: linear -> layer norm -> GELU, plus a skip connection."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(width, width)
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.nn.functional.gelu(self.norm(self.linear(x)))


class DemoModel(torch.nn.Module):
    def __init__(self, width: int = 16, classes: int = 4) -> None:
        super().__init__()
        self.blocks = torch.nn.Sequential(DemoBlock(width), DemoBlock(width))
        self.head = torch.nn.Linear(width, classes)
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.blocks(x) * self.scale
        return self.head(h).softmax(dim=-1)


def _section(title: str) -> None:
    print(f"\n=== {title} " + "=" * max(0, 70 - len(title)))


def main() -> int:
    torch.manual_seed(0)
    model = DemoModel().eval()
    gm = fx.symbolic_trace(model)

    _section("graph (FX text format)")
    print(gm.graph)
    _section("generated code (gm.code)")
    print(gm.code)
    _section("tabular view")
    gm.graph.print_tabular()

    x = torch.randn(3, 16)
    expected, got = model(x), gm(x)
    same = torch.allclose(expected, got)
    _section("check against eager")
    print(f"traced module == eager module on a random input: {same}")
    if not same:
        return 1

    from exportir import demo_pipeline

    print("\n\n######## export -> edge -> program file -> runtime ########")
    return demo_pipeline.main()


if __name__ == "__main__":
    raise SystemExit(main())
