"""Shared stage runners for the real-model tests (one cache per test process).

Each model is built once per process; its eager outputs, static export and lowered programs are
made on first use and reused by the tests of the other stages. The tests of one model run in one
xdist worker (``xdist_group`` marks), so nothing is built twice.
"""

from __future__ import annotations

import atexit
import copy
import functools
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
from corpus import real_models as R
from torch.utils import _pytree as torch_pytree

# fused kernels reassociate sums; numbers that match eager to ~1e-6 in float32 are typical, the
# bound leaves room for tiny-config models with large activations
ATOL = 1e-4
RTOL = 1e-4

# the programs written here (about 1.7 GB for the whole corpus) go when the process exits: CI
# machines share one disk, and a run that leaves them behind fills it within a few dozen runs
_TMP = Path(tempfile.mkdtemp(prefix="exportir-real-"))
atexit.register(shutil.rmtree, _TMP, ignore_errors=True)


def tensor_leaves(out: Any) -> list[torch.Tensor]:
    return [x for x in torch_pytree.tree_leaves(out) if isinstance(x, torch.Tensor)]


def assert_same(actual: Any, expected: Any, what: str) -> None:
    got, want = tensor_leaves(actual), tensor_leaves(expected)
    assert len(got) == len(want), f"{what}: {len(got)} output tensors, eager gives {len(want)}"
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.shape == b.shape, f"{what}: output {i} has shape {tuple(a.shape)}, eager {tuple(b.shape)}"
        assert a.dtype == b.dtype, f"{what}: output {i} has dtype {a.dtype}, eager {b.dtype}"
        torch.testing.assert_close(a, b, atol=ATOL, rtol=RTOL, msg=lambda m, i=i: f"{what}: output {i}: {m}")


@functools.cache
def case(name: str) -> R.RealCase:
    c = R.build(name)
    _PRISTINE[name] = copy.deepcopy(c.model)
    return c


# each model as built, before any call: a model may cache in eval mode (timm's LeViT keeps its
# attention biases after the first forward), and an export after an eager run would capture the
# cache, which the oracle's fresh torch.export never sees
_PRISTINE: dict[str, Any] = {}


def pristine(name: str) -> Any:
    """A copy of ``case(name).model`` as built (never run)."""
    case(name)
    return copy.deepcopy(_PRISTINE[name])


def eager(name: str, kwargs: dict[str, Any] | None = None) -> Any:
    c = case(name)
    with torch.no_grad():
        return c.model(**(c.kwargs if kwargs is None else kwargs))


@functools.cache
def eager_example(name: str) -> Any:
    return eager(name)


@functools.cache
def exported(name: str) -> Any:
    import exportir

    c = case(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return exportir.export(pristine(name), (), c.kwargs)


@functools.cache
def core(name: str) -> Any:
    """The static export decomposed to the core ATen op set (``run_decompositions()``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return exported(name).run_decompositions()


@functools.cache
def exported_dynamic(name: str) -> Any:
    import exportir

    c = case(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return exportir.export(pristine(name), (), c.kwargs, dynamic_shapes=c.dynamic_shapes())


def program_file(name: str, road: str) -> Path:
    """The model's program file on one road: ``portable`` (to_edge) or ``fused`` (fused_cpu)."""
    return _program_file(name, road)


@functools.cache
def _program_file(name: str, road: str) -> Path:
    import exportir

    ep = exported(name)
    if road == "portable":
        lowered = exportir.to_edge(ep)
    elif road == "fused":
        from exportir.backends.fused_cpu import FusedCpuPartitioner

        lowered = exportir.to_edge_transform_and_lower(ep, partitioner=[FusedCpuPartitioner()])
    else:
        raise ValueError(f"unknown road {road!r}")
    path = _TMP / f"{name}.{road}.xpt"
    lowered.to_program().save(path)
    return path


def run_program(path: Path, kwargs: dict[str, Any]) -> Any:
    from exportir.runtime import Program

    return Program.load(path).method("forward")(**kwargs)  # the default kernels: nothing registered
