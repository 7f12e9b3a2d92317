"""Real models whose fused_cpu lowering once broke, found by scripts/survey_transformers.py."""

from __future__ import annotations

import pytest
import torch
from corpus import real_models as R
from real_models import _harness as H

import exportir
from exportir.backends.fused_cpu import FusedCpuPartitioner


@pytest.mark.slow
def test_hf_efficientnet_lowers_and_matches_eager(tmp_path) -> None:
    """transformers' EfficientNet (its default config at 64 x 64, batch 1): the rules rewrite
    ops' arguments in place, and the graph's reader index missed it once; lowering then read
    a batch norm's result that no op produced any more (KeyError in the blob writer)."""
    tf = R._tf()
    cfg = tf.EfficientNetConfig(image_size=64, num_labels=10)
    torch.manual_seed(0)
    model = tf.EfficientNetForImageClassification(cfg).eval()
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(pixel_values=x).logits
    ep = exportir.export(model, (), {"pixel_values": x})
    lowered = exportir.to_edge_transform_and_lower(ep, partitioner=[FusedCpuPartitioner()])
    path = tmp_path / "m.xpt"
    lowered.to_program().save(path)
    out = H.run_program(path, {"pixel_values": x})
    torch.testing.assert_close(out[0], expected, rtol=1e-4, atol=1e-4)
