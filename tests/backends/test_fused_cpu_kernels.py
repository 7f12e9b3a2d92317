"""Every entry of the fused CPU kernel table computes exactly what its ATen op computes.

Each op runs through the whole executor path (a one-op blob: schema check, binding, generated
source) and is compared bit for bit with ``torch.ops.aten.<op>`` on the same arguments; ops
with an in-place form are run in place too. Reproduce one with
``pytest tests/backends/test_fused_cpu_kernels.py -k <op>``.
"""

from __future__ import annotations

import pytest
import torch
from fused_kernel_samples import REFERENCES, ROUNDING, SAMPLES, assert_same

from exportir.runtime.backends.fused_cpu.executor import build, run
from exportir.runtime.backends.fused_cpu.format import Blob, OpRow
from exportir.runtime.backends.fused_cpu.kernels import INPLACE, KERNELS, Ref, op_schema


def _encode(x, inputs):
    if isinstance(x, torch.Tensor):
        inputs.append(x)
        return Ref(len(inputs) - 1)
    if isinstance(x, list):
        return [_encode(v, inputs) for v in x]
    return x


def _one_op_program(name, args, kwargs, inplace=False):
    inputs: list[torch.Tensor] = []
    enc_args = tuple(_encode(a, inputs) for a in args)
    enc_kwargs = {k: _encode(v, inputs) for k, v in kwargs.items()}
    returns = [str(r.type) for r in op_schema(name).returns]
    expected = (REFERENCES[name] if name in REFERENCES else _aten(name))(*args, **kwargs)
    multi = returns != ["Tensor"]
    n_out = len(expected) if multi else 1
    outs = tuple(range(len(inputs), len(inputs) + n_out))
    row = OpRow(name, "node", enc_args, enc_kwargs, outs, multi, inplace)
    blob = Blob(len(inputs) + n_out, tuple(range(len(inputs))), outs, (), (row,))
    return build(blob), inputs, expected


def _aten(name):
    namespace, packet, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload)


def _same(got, expected, exact=True):
    got = list(got) if isinstance(got, (list, tuple)) else [got]
    expected = list(expected) if isinstance(expected, (list, tuple)) else [expected]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
        assert_same(g, e, exact)


def test_every_kernel_has_samples():
    assert sorted(set(KERNELS) - set(SAMPLES)) == []


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_matches_the_aten_op(name):
    torch.manual_seed(0)
    for args, kwargs in SAMPLES[name]:
        program, inputs, expected = _one_op_program(name, args, kwargs)
        got = run(program, inputs)
        _same(got if program.ops[0].multi else got[0], expected, name not in ROUNDING)


@pytest.mark.parametrize("name", sorted(INPLACE))
def test_inplace_form_matches_the_aten_op(name):
    for args, kwargs in SAMPLES[name]:
        _, inputs, expected = _one_op_program(name, args, kwargs)
        # in place on a fresh copy of the first argument (the executor only ever does this on
        # an intermediate it owns; here the "input" is ours to overwrite)
        first = inputs[0].clone()
        fn = KERNELS[name].inplace
        if expected.shape != first.shape or expected.dtype != first.dtype:
            continue  # the compile side never asks for these
        rest = [inputs[1]] if len(inputs) > 1 else []
        result = fn(first, *rest, *args[len(rest) + 1 :], **kwargs)
        assert result is first
        _same(result, expected)


def test_onednn_fallbacks_compute_the_same():
    from exportir.runtime.backends.fused_cpu import kernels

    torch.manual_seed(0)
    for args, _ in SAMPLES["mkldnn._convolution_pointwise.default"]:
        expected = torch.ops.mkldnn._convolution_pointwise.default(*args)
        torch.testing.assert_close(kernels._conv_pointwise(*args), expected, atol=1e-5, rtol=1e-5)
    for args, _ in SAMPLES["mkldnn._convolution_pointwise.binary"]:
        expected = torch.ops.mkldnn._convolution_pointwise.binary(*args)
        torch.testing.assert_close(kernels._conv_binary(*args), expected, atol=1e-5, rtol=1e-5)
