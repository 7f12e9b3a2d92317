"""The files the fuzz suite mutates: small programs exportir emits (every value, storage and
instruction kind, jumps, loops (format 3.0: map, while_loop), runtime primitives, state, views,
a fused_cpu delegate, symbolic input sizes) and saved ExportedPrograms (.pt2, with symbolic
shapes: format 1.1), built once per test session."""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import torch
from torch import nn

import exportir
from exportir import Dim


class _MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.fc2(torch.relu(self.fc1(x))), -1)


class _Cond(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda a, b: a.sin() + b, lambda a, b: a.cos() * b, (x, y))


class _Dynamic(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = x.shape[0]
        return x.reshape(n * 3).relu(), x.new_ones(n, 2) * n


class _StateAndViews(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.zeros(3))
        self.w = nn.Parameter(torch.arange(6.0).reshape(2, 3))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.total.add_(x.sum(0))
        y = x.t()[1:] + self.w.t()[1:]
        return y.expand(2, 2, 2).sum(0), self.total * 1


class _Indexing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(5, 3)

    def forward(self, idx: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        picked = torch.index_select(x, 0, idx.clamp(0, 1))
        return self.emb(idx) + picked.gather(1, torch.zeros_like(picked, dtype=torch.long))


class _Conv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 4, 3, padding=1), nn.Linear(4 * 6 * 6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.max_pool2d(torch.relu(self.conv(x)), 2)
        return self.fc(h.flatten(1)).tanh()


class _Map(nn.Module):
    """``map`` over the leading dim: a format 3.0 loop (a jump back)."""

    def forward(self, xs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        from torch._higher_order_ops.map import map as torch_map

        return torch_map(lambda x, b: (x * b).relu() + 1, xs, y)


class _WhileLoop(nn.Module):
    """``while_loop`` with a data-dependent trip count: a format 3.0 loop."""

    def forward(self, i: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from torch._higher_order_ops.while_loop import while_loop

        return while_loop(lambda j, a: j < 4, lambda j, a: (j + 1, a * 2 + 1), (i, x))


class _Unbacked(nn.Module):
    """Data-dependent sizes: unbacked symbols with ranges and runtime asserts (.pt2 1.1)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = (x > 0).sum().item()
        torch._check(n <= 8)
        return torch.nonzero(x > 0).float().sum() + torch.zeros(n).sum() + x.sum()


class _Derived(nn.Module):
    """A derived size (``d + 1``): its range is a ``range_constraints`` key torch writes as
    ``s0 + 1``."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x[1:] * y


def _models() -> dict[str, tuple[nn.Module, tuple, dict | None]]:
    torch.manual_seed(0)
    return {
        "mlp": (_MLP().eval(), (torch.randn(2, 4),), None),
        "cond": (_Cond(), (torch.randn(3), torch.randn(3)), None),
        "dynamic": (_Dynamic(), (torch.randn(4, 3),), {"x": {0: Dim("n", min=1, max=8)}}),
        "state_views": (_StateAndViews(), (torch.randn(2, 3),), None),
        "indexing": (_Indexing().eval(), (torch.tensor([0, 3, 1]), torch.randn(2, 3)), None),
        "conv": (_Conv().eval(), (torch.randn(1, 3, 12, 12),), None),
        "map": (_Map(), (torch.randn(3, 2), torch.randn(2)), {"xs": {0: Dim("m", min=1, max=6)},
                                                             "y": None}),
        "while_loop": (_WhileLoop(), (torch.tensor(0), torch.randn(3)), None),
    }


def _pt2_models() -> dict[str, tuple[nn.Module, tuple, dict | None]]:
    models = _models()
    models["unbacked"] = (_Unbacked(), (torch.randn(6),), {"x": {0: Dim("k", min=2, max=8)}})
    return models


def xpt_seeds() -> dict[str, bytes]:
    """Program files: each model on the portable road, and the conv net delegated to
    fused_cpu."""
    from exportir.backends.fused_cpu import FusedCpuPartitioner

    seeds = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, (model, args, shapes) in _models().items():
            ep = exportir.export(model, args, dynamic_shapes=shapes)
            seeds[name] = exportir.to_edge(ep).to_program().buffer
            if name == "conv":
                lowered = exportir.to_edge_transform_and_lower(
                    ep, partitioner=[FusedCpuPartitioner()])
                seeds["conv_fused"] = lowered.to_program().buffer
    return seeds


def pte_seeds() -> dict[str, bytes]:
    """ExecuTorch .pte files exportir writes: each model of :func:`xpt_seeds` on the portable
    road that the .pte format carries (a model it refuses is no seed); and ExecuTorch's own
    (tests/format/data: views and buffer state it leaves to memory offsets)."""
    from exportir.format.pte_write import PteEncodeError

    data = Path(__file__).resolve().parents[1] / "format" / "data"
    seeds = {p.stem: p.read_bytes() for p in sorted(data.glob("executorch_*.pte"))}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, (model, args, shapes) in _models().items():
            ep = exportir.export(model, args, dynamic_shapes=shapes)
            try:
                seeds[name] = exportir.to_edge(ep).to_program().pte_buffer()
            except PteEncodeError:
                continue
    return seeds


def pt2_seeds() -> dict[str, bytes]:
    """Saved ExportedPrograms (``exportir.save``): static ones (format 1.0 content) and, with
    a ``shape_env`` section (1.1), the dynamic, map and data-dependent ones."""
    seeds = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, (model, args, shapes) in _pt2_models().items():
            buffer = io.BytesIO()
            exportir.save(exportir.export(model, args, dynamic_shapes=shapes), buffer)
            seeds[name] = buffer.getvalue()
    return seeds


def _torch_dims(shapes: dict | None) -> dict | None:
    """The same ``dynamic_shapes`` with torch.export's ``Dim`` objects."""
    import torch.export as texport

    if shapes is None:
        return None
    return {k: None if v is None else
            {d: texport.Dim(dim.__name__, min=dim.min, max=dim.max) for d, dim in v.items()}
            for k, v in shapes.items()}


def torch_pt2_seeds() -> dict[str, bytes]:
    """The same models exported and saved by torch (torch.export.export / save: training IR,
    pickled sample inputs), for the .pt2 reader."""
    import torch.export as texport

    seeds = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, (model, args, shapes) in _pt2_models().items():
            buffer = io.BytesIO()
            texport.save(texport.export(model, args, dynamic_shapes=_torch_dims(shapes)), buffer)
            seeds[name] = buffer.getvalue()
        d = texport.Dim("d", min=2, max=16)
        buffer = io.BytesIO()
        texport.save(texport.export(_Derived(), (torch.randn(5, 2), torch.randn(4, 2)),
                                    dynamic_shapes={"x": {0: d + 1}, "y": {0: d}}), buffer)
        seeds["derived"] = buffer.getvalue()
    return seeds
