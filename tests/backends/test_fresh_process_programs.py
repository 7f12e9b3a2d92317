"""Every kind of program runs in a fresh process (:mod:`fresh_process`): plain kernel programs
and fused delegates, over convolution, normalization, recurrent, attention, indexing and
mixed-dtype models, mutable buffers, ``torch.cond``, several methods and dynamic shapes at
other sizes. Each program is saved here, loaded and run as the first thing its process does,
and compared with eager."""

from __future__ import annotations

import copy

import pytest
import torch
from corpus.export_models import BY_NAME, build, clone_inputs
from fresh_process import Failure, Job, run_fresh
from torch.utils import _pytree as tree

from exportir import Dim, export, to_edge, to_edge_transform_and_lower
from exportir.backends.fused_cpu import FusedCpuPartitioner

CORPUS = [
    "cnn_bn_eval", "conv_transpose", "pooling", "upsample", "depthwise_conv1d_groupnorm",
    "norm_zoo", "lstm", "embedding_mha", "sdpa_attention", "buffer_inplace",
    "int_and_bool_ops", "elementwise_zoo", "mixed_dtypes",
]  # fmt: skip


def _roads(ep):
    return {
        "program": to_edge(ep),
        "fused": to_edge_transform_and_lower(ep, partitioner=[FusedCpuPartitioner()]),
    }


def _leaves(x):
    return [v for v in tree.tree_leaves(x) if isinstance(v, torch.Tensor)]


def _check(label, got, expected):
    assert not isinstance(got, Failure), f"{label}: {got.error}"
    expected = _leaves(expected)
    assert len(got) == len(expected), f"{label}: {len(got)} outputs, eager {len(expected)}"
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5, msg=lambda m: f"{label}: {m}")


@pytest.mark.slow  # ~80 s: the whole corpus; make test keeps the cond, multi-method and real-model runs
def test_corpus_programs_run_in_fresh_processes(tmp_path):
    jobs, labels, expected = [], [], []
    for name in CORPUS:
        module, args, kwargs = build(BY_NAME[name])
        assert not kwargs and all(isinstance(a, torch.Tensor) for a in args), name
        with torch.no_grad():
            eager = copy.deepcopy(module)(*clone_inputs(args, kwargs)[0])
        for road, lowered in _roads(export(module, args)).items():
            path = tmp_path / f"{name}-{road}.xpt"
            lowered.to_program().save(path)
            jobs.append(Job(path, args=args))
            labels.append(f"{name} ({road})")
            expected.append(eager)
    for label, got, want in zip(labels, run_fresh(jobs, tmp_path), expected):
        _check(label, got, want)


class Branchy(torch.nn.Module):
    """``torch.cond`` on a data-dependent predicate; each branch has float arguments."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(6)

    def forward(self, x):
        def big(x):
            return torch.clamp(self.norm(x), -0.5, 0.5) * 2.5

        def small(x):
            return torch.nn.functional.leaky_relu(x, 0.1) + 1.5

        return torch.cond(x.sum() > 0, big, small, (x,))


@pytest.mark.slow  # ~25 s; make test keeps a multi-method LLM program's fresh-process run (tests/llm)
def test_cond_program_runs_both_branches_in_fresh_processes(tmp_path):
    model = Branchy().eval()
    x = torch.randn(3, 6)
    inputs = [x.abs() + 0.1, -x.abs() - 0.1]
    jobs, expected = [], []
    for road, lowered in _roads(export(model, (x,))).items():
        path = tmp_path / f"cond-{road}.xpt"
        lowered.to_program().save(path)
        for inp in inputs:
            jobs.append(Job(path, args=(inp,)))
            with torch.no_grad():
                expected.append(model(inp))
    for i, (got, want) in enumerate(zip(run_fresh(jobs, tmp_path), expected)):
        _check(f"cond job {i}", got, want)


class TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Linear(6, 8)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.head(torch.nn.functional.gelu(self.encoder(x)))

    def encode(self, x):
        return torch.nn.functional.layer_norm(self.encoder(x), (8,), eps=1e-3)


class _Encode(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model.encode(x)


@pytest.mark.slow  # ~16 s; tests/llm/test_shared_state.py runs a two-method program fresh in make test
def test_multi_method_program_runs_each_method_in_a_fresh_process(tmp_path):
    model = TwoHeads().eval()
    x = torch.randn(4, 6)
    methods = {"forward": export(model, (x,)), "encode": export(_Encode(model), (x,))}
    jobs = []
    for road, lowered in {
        "program": to_edge(methods),
        "fused": to_edge_transform_and_lower(methods, partitioner=[FusedCpuPartitioner()]),
    }.items():
        path = tmp_path / f"methods-{road}.xpt"
        lowered.to_program().save(path)
        jobs += [Job(path, args=(x,), method="forward"), Job(path, args=(x,), method="encode")]
    with torch.no_grad():
        expected = [model(x), model.encode(x)] * 2
    for i, (got, want) in enumerate(zip(run_fresh(jobs, tmp_path), expected)):
        _check(f"method job {i}", got, want)


@pytest.mark.slow  # ~25 s each; tests/real_models runs dynamic programs at other sizes in-process
@pytest.mark.parametrize("name", ["transformer_encoder_layer", "resnet_tiny"])
def test_dynamic_batch_programs_run_at_other_sizes_in_fresh_processes(name, tmp_path):
    module, args, _ = build(BY_NAME[name])
    example = torch.randn(3, *args[0].shape[1:])  # a batch of 1 would specialize
    ep = export(module, (example,), dynamic_shapes=({0: Dim("batch", min=1, max=16)},))
    jobs, expected = [], []
    for road, lowered in _roads(ep).items():
        path = tmp_path / f"{name}-dynamic-{road}.xpt"
        lowered.to_program().save(path)
        for batch in (1, 5, 16):
            x = torch.randn(batch, *args[0].shape[1:])
            jobs.append(Job(path, args=(x,)))
            with torch.no_grad():
                expected.append(module(x))
    for i, (got, want) in enumerate(zip(run_fresh(jobs, tmp_path), expected)):
        _check(f"{name} dynamic job {i}", got, want)
