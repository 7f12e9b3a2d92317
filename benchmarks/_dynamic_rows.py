"""Dynamic-shape rows of export_bench.py.

- ``run_dynamic``: per corpus model, ``export`` with ``Dim.AUTO`` on the batch dim of every
  batch-carrying input (example batch 3), exportir vs torch.export with the same spec; the
  result is checked at batch 7 against eager, so a program that specialized shows as an ERROR.
- ``transformer_report``: a 48-layer TransformerEncoder exported with dynamic batch and sequence
  dims: guard count, time spent in the ShapeEnv's simplification (replace / evaluate_static /
  bound / simplify, from cProfile), total export time, and torch's export time.
"""

from __future__ import annotations

import copy
import cProfile
import pstats
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from _timing import Workload, WrongResult
from torch import nn

EXPORT_BATCH, CHECK_BATCH = 3, 7


def _quiet(fn: Callable, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def _marked(args: Any, kwargs: Any) -> tuple[list, list, Any]:
    from exportir import pytree

    leaves, spec = pytree.tree_flatten((args, kwargs))
    tensors = [x for x in leaves if isinstance(x, torch.Tensor) and x.dim() >= 1]
    batch = tensors[0].shape[0] if tensors else -1
    marked = [isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[0] == batch for x in leaves]
    return leaves, marked, spec


def _at_batch(args: Any, kwargs: Any, b: int, seed: int) -> tuple[tuple, dict]:
    from exportir import pytree

    torch.manual_seed(seed)
    leaves, marked, spec = _marked(args, kwargs)

    def resize(x: torch.Tensor) -> torch.Tensor:
        shape = (b, *x.shape[1:])
        if x.dtype == torch.bool:
            return torch.rand(shape) > 0.5
        if not x.dtype.is_floating_point:
            return torch.randint(int(x.min()), int(x.max()) + 1, shape, dtype=x.dtype)
        return torch.randn(shape, dtype=x.dtype)

    return pytree.tree_unflatten([resize(x) if m else x for x, m in zip(leaves, marked)], spec)


def _spec(mod: nn.Module, args: tuple, kwargs: dict, collection: Any, dim: Any) -> Any:
    leaves, marked, _ = _marked(args, kwargs)
    sc = collection()
    for x, m in zip(leaves, marked):
        if m:
            sc[x] = {0: dim.AUTO}
    return sc.dynamic_shapes(mod, args, kwargs)


def _exporters() -> dict[str, Callable]:
    import torch.export as te

    import exportir.export as ours
    from exportir.export.dynamic.dims import Dim, ShapesCollection

    def theirs(mod, args, kwargs):
        spec = _spec(mod, args, kwargs, te.ShapesCollection, te.Dim)
        return te.export(mod, args, kwargs, dynamic_shapes=spec, strict=False)

    def mine(mod, args, kwargs):
        return ours.export(mod, args, kwargs, dynamic_shapes=_spec(mod, args, kwargs, ShapesCollection, Dim))

    return {"exportir": mine, "torch": theirs}


def _maker(entry: Any, export: Callable) -> Callable[[], Workload]:
    from corpus import export_harness as h
    from corpus import export_models as em

    def build():
        mod, args, kwargs = em.build(entry)
        args, kwargs = _at_batch(args, kwargs, EXPORT_BATCH, seed=1)
        return mod, args, kwargs

    def check(case: Any, ep: Any) -> None:
        mod, args0, kwargs0 = em.build(entry)
        a1, k1 = _at_batch(args0, kwargs0, CHECK_BATCH, seed=2)
        a2, k2 = _at_batch(args0, kwargs0, CHECK_BATCH, seed=2)
        try:
            h.assert_same_tree(_quiet(ep.module(), *a1, **k1), _quiet(copy.deepcopy(mod), *a2, **k2), "batch 7")
        except Exception as exc:
            raise WrongResult(f"at batch {CHECK_BATCH}: {str(exc).splitlines()[0]}") from exc

    def make() -> Workload:
        return Workload(run=lambda case: _quiet(export, *case), setup=build, check=check)

    return make


def dynamic_entries(only: list[str]) -> list[Any]:
    from corpus import export_models as em

    return [e for e in em.ENTRIES if (not only or e.name in only) and any(_marked(*em.build(e)[1:])[1])]


def run_dynamic(args: Any, compare: Callable, clock: Any, print_line: Callable) -> dict[str, dict]:
    exporters = _exporters()
    results: dict[str, dict] = {}
    for entry in dynamic_entries(args.only):
        makers = {side: _maker(entry, fn) for side, fn in exporters.items()}
        results[entry.name] = {"dynamic export": compare(
            makers, rounds=args.rounds, budget=args.budget, timeout=args.timeout, clock=clock
        )}
        print_line(entry.name, results[entry.name])
    return results


# ---------------------------------------------------------------------------- 48 layers

_SIMPLIFY = ("replace", "simplify", "evaluate_static", "bound", "_maybe_evaluate_static", "_learn")


def _transformer(layers: int = 48) -> nn.Module:
    layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).eval()


def transformer_report(layers: int = 48) -> list[str]:
    """Guard count and simplification time of a dynamic batch x seq export of ``layers`` layers."""
    import torch.export as te

    from exportir.export.capture.recorder import capture
    from exportir.export.dynamic import _constraints
    from exportir.export.dynamic._symbols import make_sizes
    from exportir.export.dynamic.dims import Dim, plan_dims
    from exportir.symbolic import ShapeEnv

    torch.manual_seed(0)
    mod, x = _transformer(layers), torch.randn(3, 5, 16)
    spec = ({0: Dim("batch"), 1: Dim("seq")},)
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.enable()
    plan = plan_dims(mod, (x,), {}, spec)
    env = ShapeEnv()
    sizes, table = make_sizes(plan, env)
    capture(mod, (x,), {}, shape_env=env, symbolic_sizes=sizes)
    _constraints.solve(table, env.guards, env.replacements)
    profile.disable()
    ours_s = time.perf_counter() - start
    stats = pstats.Stats(profile)
    simplify_s = sum(
        row[3] for (file, _, name), row in stats.stats.items()  # row[3]: cumulative time
        if "exportir/symbolic/shape_env.py" in file and name in _SIMPLIFY
    )
    from exportir.export import export

    start = time.perf_counter()  # unprofiled, as torch's is timed
    _quiet(export, mod, (x,), dynamic_shapes=spec)
    plain_s = time.perf_counter() - start
    start = time.perf_counter()
    _quiet(te.export, mod, (x,), dynamic_shapes=({0: te.Dim("batch"), 1: te.Dim("seq")},), strict=False)
    torch_s = time.perf_counter() - start
    return [
        f"{layers}-layer TransformerEncoder, dynamic batch x seq:",
        (
            f"  guards recorded {len(env.guards)}, runtime asserts "
            f"{len(env.deferred_runtime_asserts)}, replacements {len(env.replacements)}"
        ),
        f"  ShapeEnv simplification (cumulative, profiled; may overlap) {simplify_s:.3f}s",
        (
            f"  export (profiled) {ours_s:.3f}s; export {plain_s:.3f}s; "
            f"torch.export {torch_s:.3f}s (ratio {plain_s / torch_s:.2f}, target <= 0.33)"
        ),
    ]
