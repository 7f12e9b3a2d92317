"""exportir.export.capture.fake: meta-backed fake tensors that report the real device and metadata."""

import pytest
import torch

from exportir.export.capture.fake import (
    DataDependentError,
    FakeConverter,
    FakeTensor,
    FakeTensorMode,
    fake_like,
)


def test_fake_reports_real_metadata():
    real = torch.randn(2, 3).t()
    fake = fake_like(real)
    assert isinstance(fake, FakeTensor)
    assert fake.shape == real.shape and fake.stride() == real.stride()
    assert fake.dtype == real.dtype and fake.device == real.device
    assert fake._meta.device.type == "meta"
    assert repr(fake) == "FakeTensor(..., size=(3, 2))"
    assert repr(fake_like(torch.zeros(2, dtype=torch.int64))) == (
        "FakeTensor(..., size=(2,), dtype=torch.int64)"
    )


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x + 1,
        lambda x: x.sum(dim=0, keepdim=True),
        lambda x: x.t().contiguous(),
        lambda x: x.to(torch.float64),
        lambda x: x[1:, ::2],
        lambda x: torch.cat([x, x], 1),
        lambda x: x.unsqueeze(0).expand(4, 3, 5),
        lambda x: torch.nn.functional.linear(x, torch.ones(2, 5)),
    ],
)
def test_ops_on_fakes_match_eager_metadata(fn):
    real = torch.randn(3, 5)
    expect = fn(real)
    got = fn(fake_like(real))
    assert isinstance(got, FakeTensor)
    assert (got.shape, got.dtype, got.stride()) == (expect.shape, expect.dtype, expect.stride())


def test_multi_output_and_inplace_identity():
    x = fake_like(torch.randn(3, 4))
    values, indices = x.max(dim=1)
    assert values.shape == (3,) and indices.dtype == torch.int64
    assert x.add_(1) is x  # in-place ops hand back their argument


def test_mode_makes_factory_ops_fake_and_memoizes_real_tensors():
    mode = FakeTensorMode()
    real = torch.randn(2)
    with mode:
        z = torch.zeros(3, dtype=torch.int32)
        a = torch.arange(5)
        t = torch.tensor([1.0, 2.0])
        s = real + 1
    assert all(isinstance(v, FakeTensor) for v in (z, a, t, s))
    assert z.dtype == torch.int32 and a.shape == (5,) and t.shape == (2,)
    assert mode.from_tensor(real) is mode.from_tensor(real)


def test_converter_hands_out_one_fake_per_real_tensor():
    seen = []
    conv = FakeConverter(on_new_constant=lambda real, fake: seen.append(real))
    real = torch.ones(2)
    assert conv.from_real(real) is conv.from_real(real)
    assert len(seen) == 1


@pytest.mark.parametrize(
    "fn, what",
    [
        (lambda x: x.sum().item(), "item()"),
        (lambda x: bool(x.sum() > 0), "bool"),
        (lambda x: x.tolist(), "tolist"),
        (lambda x: torch.nonzero(x), "nonzero"),
    ],
)
def test_data_dependent_ops_raise_with_the_way_out(fn, what):
    x = fake_like(torch.randn(3))
    with pytest.raises(DataDependentError) as info:
        fn(x)
    message = str(info.value)
    assert what in message
    assert "torch.cond" in message and "torch._check" in message
    assert "test_fake.py" in message  # the user's line
