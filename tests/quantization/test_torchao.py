"""Differential test against torchao: its prepare_pt2e / convert_pt2e with ExecuTorch's
XNNPACKQuantizer (``torchao.testing.pt2e._xnnpack_quantizer``) on torch.export's graph, and ours
on ours, put the same quantize / dequantize ops in the same numbers and compute the same.

torchao runs in a separate interpreter: it imports ``torch.ao.quantization``, whose
``quantized_decomposed`` library may not be defined after ours (docs/quantization.md). The
interpreter is this one when torchao is installed here (``pip install -e .[test]``), else
``.venv-ao/bin/python`` of the checkout (``python3 -m venv .venv-ao &&
.venv-ao/bin/pip install torch==2.13.0 torchao``).
"""

from __future__ import annotations

import collections
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from quantization.ao_models import conv_net
from quantization.helpers import op_counts, quantize

REPO = Path(__file__).resolve().parents[2]
_PROBE = "import torchao.quantization.pt2e.quantize_pt2e, torchao.testing.pt2e._xnnpack_quantizer"


def _torchao_python() -> str:
    for python in (sys.executable, str(REPO / ".venv-ao" / "bin" / "python")):
        if Path(python).exists() and subprocess.run(
            [python, "-c", _PROBE], capture_output=True, timeout=300, check=False
        ).returncode == 0:
            return python
    pytest.skip("torchao is not installed (pip install -e .[test]); it is the oracle here")


_TORCHAO_SIDE = textwrap.dedent("""
    import collections, dataclasses, sys, torch
    sys.path.insert(0, {tests!r})
    from ao_models import conv_net
    from torchao.quantization.pt2e.observer import MinMaxObserver
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.testing.pt2e._xnnpack_quantizer import (
        XNNPACKQuantizer, get_symmetric_quantization_config)
    data = torch.load({data!r})
    config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic={dynamic})
    if not {dynamic}:  # ours observes activations by min / max (torchao's: histograms)
        act = dataclasses.replace(config.input_activation,
                                  observer_or_fake_quant_ctr=MinMaxObserver.with_args(eps=2**-12))
        config = dataclasses.replace(config, input_activation=act, output_activation=act)
    gm = torch.export.export(conv_net(), (data["calibration"][0],)).module()
    prepared = prepare_pt2e(gm, XNNPACKQuantizer().set_global(config))
    for x in data["calibration"]:
        prepared(x)
    converted = convert_pt2e(prepared)
    counts = collections.Counter(str(n.target) for n in converted.graph.nodes
                                 if str(n.target).startswith("quantized_decomposed"))
    with torch.no_grad():
        out = [converted(x) for x in data["eval"]]
    torch.save({{"counts": dict(counts), "out": out}}, {result!r})
""")


@pytest.mark.parametrize("dynamic", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["static", "dynamic"])  # ~12 s each: dynamic in `make test-slow`
def test_same_quantize_dequantize_placement_and_numerics_as_torchao(tmp_path, dynamic):
    python = _torchao_python()
    g = torch.Generator().manual_seed(5)
    calibration = [torch.randn(2, 3, 8, 8, generator=g) for _ in range(3)]
    evaluation = [torch.randn(2, 3, 8, 8, generator=g) for _ in range(3)]
    data, result = tmp_path / "data.pt", tmp_path / "result.pt"
    torch.save({"calibration": calibration, "eval": evaluation}, data)
    code = _TORCHAO_SIDE.format(tests=str(Path(__file__).parent), data=str(data),
                                result=str(result), dynamic=dynamic)
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = torch.load(result)

    ours = quantize(conv_net(), (calibration[0],), [(x,) for x in calibration], dynamic=dynamic)
    counts = collections.Counter({k: v for k, v in op_counts(ours).items()
                                  if k.startswith("quantized_decomposed")})
    assert counts == collections.Counter(theirs["counts"])
    for x, expected in zip(evaluation, theirs["out"]):
        torch.testing.assert_close(ours(x), expected, rtol=0, atol=1e-5)
