"""Every real-model corpus model exported with dynamic batch (and sequence) sizes, written as a
program file on both roads, and run at the smallest, a middle and the largest size its ``Dim``
ranges allow, compared with eager: the memory plan holds the whole declared range.

Reproduce one model: ``PYTHONPATH=src .venv/bin/python -m pytest -p no:xdist
tests/real_models/test_real_dynamic_programs.py -k <name>``.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

import pytest
from corpus import real_models as R
from real_models import _harness as H

BATCH_RANGE = (1, 16)  # real_models.RealCase.dynamic_shapes: Dim("batch", min=1, max=16)


def _params() -> list:
    """Every model with dynamic dims; the first of each family runs in ``make test``, the others
    in ``make test-slow`` (CI runs both)."""
    firsts = {next(n for n in names if R.SPECS[n].dims)
              for names in R.families().values() if any(R.SPECS[n].dims for n in names)}
    return [pytest.param(n, marks=[pytest.mark.xdist_group(f"real-{n}")]
                         + ([] if n in firsts else [pytest.mark.slow]),
                         id=n)
            for n in R.NAMES if R.SPECS[n].dims]


@functools.cache
def _dynamic_program(name: str, road: str) -> Path:
    import exportir

    ep = H.exported_dynamic(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if road == "portable":
            lowered = exportir.to_edge(ep)
        else:
            from exportir.backends.fused_cpu import FusedCpuPartitioner

            lowered = exportir.to_edge_transform_and_lower(ep, partitioner=[FusedCpuPartitioner()])
        path = H._TMP / f"{name}.{road}.dynamic.xpt"
        lowered.to_program().save(path)
    return path


def _sizes(name: str) -> list[tuple[int, int]]:
    """(batch, seq) at the ranges' minimum, middle and maximum (seq fixed when not dynamic)."""
    spec = R.SPECS[name]
    uses_seq = any(k in ("seq", "dseq") for dims in spec.dims.values() for k in dims.values())
    lo, hi = spec.seq_range if uses_seq else (R.SEQ, R.SEQ)
    b_lo, b_hi = BATCH_RANGE
    return [(b_lo, lo), ((b_lo + b_hi) // 2, (lo + hi) // 2), (b_hi, hi)]


@pytest.mark.parametrize("road", ["portable", "fused"])
@pytest.mark.parametrize("name", _params())
def test_dynamic_program_runs_at_min_middle_and_max(name: str, road: str) -> None:
    from exportir.runtime import Program

    method = Program.load(_dynamic_program(name, road)).method("forward")
    case = H.case(name)
    for batch, seq in _sizes(name):
        kwargs = case.inputs(batch, seq, 3)
        H.assert_same(method(**kwargs), H.eager(name, kwargs),
                      f"{road} program at batch {batch}, seq {seq}")
