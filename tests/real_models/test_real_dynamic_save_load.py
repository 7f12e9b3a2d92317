"""Real models exported with dynamic batch (and sequence) sizes survive ``exportir.save`` /
``exportir.load`` (format 1.1): equal ``range_constraints``, and the loaded ``module()`` equals
eager at the smallest, a middle and the largest size of the Dim ranges and refuses a batch above
the range as the original does.

Reproduce one model: ``PYTHONPATH=src .venv/bin/python -m pytest -p no:xdist
tests/real_models/test_real_dynamic_save_load.py -k <name>``.
"""

from __future__ import annotations

import io

import pytest
from real_models import _harness as H
from real_models.test_real_dynamic_programs import BATCH_RANGE, _sizes

MODELS = ["bert", "llama", "vit", "whisper", "t5", "timm_resnet18", "tv_swin_t"]


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xdist_group(f"real-{n}"), id=n)
                                  for n in MODELS])
def test_dynamic_real_model_round_trips(name: str) -> None:
    import exportir

    ep = H.exported_dynamic(name)
    buf = io.BytesIO()
    exportir.save(ep, buf)
    loaded = exportir.load(io.BytesIO(buf.getvalue()))
    assert loaded.range_constraints == ep.range_constraints
    module, case = loaded.module(), H.case(name)
    for batch, seq in _sizes(name):
        kwargs = case.inputs(batch, seq, 3)
        H.assert_same(module(**kwargs), H.eager(name, kwargs), f"loaded at batch {batch}, seq {seq}")
    too_big = case.inputs(BATCH_RANGE[1] + 1, _sizes(name)[0][1], 3)
    with pytest.raises(RuntimeError, match=f"to be <= {BATCH_RANGE[1]}"):
        module(**too_big)
    with pytest.raises(RuntimeError, match=f"to be <= {BATCH_RANGE[1]}"):
        ep.module()(**too_big)
