"""Every real-model corpus model through every stage, each compared with eager.

Models come from transformers, timm and torchvision's own code (tests/corpus/real_models.py).
Stages: static export (``ep.module()`` on the example), dynamic export (batch and sequence
length; ``ep.module()`` on inputs of other sizes), the core-ATen decomposition, the program file
on the portable road (to_edge -> to_program -> save -> load -> run) and on the fused_cpu road.
The fresh-process runs are in test_real_fresh_process.py.

Reproduce one model: ``PYTHONPATH=src .venv/bin/python -m pytest -p no:xdist
tests/real_models -k <name>``; ``scripts/survey_real_models.py <name>`` prints every stage.
"""

from __future__ import annotations

import pytest
from corpus import real_models as R
from real_models import _harness as H


def _params() -> list:
    return R.params()


@pytest.mark.parametrize("name", _params())
def test_static_export_module_matches_eager(name: str) -> None:
    ep = H.exported(name)
    H.assert_same(ep.module()(**H.case(name).kwargs), H.eager_example(name), "ep.module()")


@pytest.mark.parametrize("name", _params())
def test_static_export_module_matches_eager_on_fresh_values(name: str) -> None:
    c = H.case(name)
    fresh = c.inputs(R.BATCH, R.SEQ, seed=5)  # same sizes, other values
    H.assert_same(H.exported(name).module()(**fresh), H.eager(name, fresh), "ep.module()")


@pytest.mark.parametrize("name", _params())
def test_dynamic_export_runs_other_sizes(name: str) -> None:
    c = H.case(name)
    assert c.dynamic_shapes() is not None, f"{name}: the corpus entry marks no dynamic dim"
    ep = H.exported_dynamic(name)
    fresh = c.fresh_inputs()
    H.assert_same(ep.module()(**fresh), H.eager(name, fresh), "dynamic ep.module()")
    H.assert_same(ep.module()(**c.kwargs), H.eager_example(name), "dynamic ep.module() on the example")


@pytest.mark.parametrize("name", _params())
def test_core_decomposition_matches_eager(name: str) -> None:
    core = H.core(name)
    H.assert_same(core.module()(**H.case(name).kwargs), H.eager_example(name), "core ATen module()")


@pytest.mark.parametrize("name", _params())
def test_portable_program_file_matches_eager(name: str) -> None:
    out = H.run_program(H.program_file(name, "portable"), H.case(name).kwargs)
    H.assert_same(out, H.eager_example(name), "portable program")


@pytest.mark.parametrize("name", _params())
def test_fused_cpu_program_file_matches_eager(name: str) -> None:
    out = H.run_program(H.program_file(name, "fused"), H.case(name).kwargs)
    H.assert_same(out, H.eager_example(name), "fused_cpu program")


@pytest.mark.parametrize("road", ["portable", "fused"])
@pytest.mark.parametrize("name", _params())
def test_program_operators_are_in_the_runtime_kernel_table(name: str, road: str) -> None:
    """The runtime loads only the operators of its kernel table (plus its primitives and custom
    ops registered on purpose): every one the emitter named for the model must be there."""
    from exportir.program import schema, serialize
    from exportir.runtime.kernel_table import KERNEL_TABLE

    program = serialize.load(H.program_file(name, road))
    named = {
        f"{op.name}.{op.overload or 'default'}"
        for m in program.methods for op in m.operators
        if not op.is_functional_fallback and (op.name, op.overload) not in schema.PRIM_OPERATORS
    }
    assert named <= KERNEL_TABLE.keys(), sorted(named - KERNEL_TABLE.keys())


def test_make_test_takes_the_whole_corpus_through_every_stage() -> None:
    """No corpus model is left to ``make test-slow``: at least 40 architectures besides timm's
    and 15 timm nets, of every family, all through every stage above."""
    params = R.params()
    assert not [p.id for p in params if any(m.name == "slow" for m in p.marks)]
    timm = [n for n in R.NAMES if R.SPECS[n].family == R.TIMM]
    assert len(timm) >= 15 and len(R.NAMES) - len(timm) >= 40, (len(timm), len(R.NAMES))
