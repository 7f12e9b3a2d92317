"""The whole export corpus through ExecuTorch's .pte format, both ways (slow: ExecuTorch's own
compiler runs for every model). Models that do not make it are listed with the reason, and the
test checks they still fail that way: a fix shows up as a failing test to update."""

from __future__ import annotations

import pytest
import torch
from corpus.export_models import ENTRIES
from pte_helpers import (
    assert_same,
    executorch_pte,
    our_pte,
    run_in_executorch,
    run_in_exportir,
    tensors,
)

from exportir.format.pte_write import PteKernelCoverageError

pytestmark = pytest.mark.slow

# exportir -> .pte: refused before writing, naming the operators ExecuTorch's portable kernels
# lack (or refuse: batch norm in training mode, which instance norm also uses)
REFUSED = {
    "pooling": "aten::adaptive_max_pool2d.out",
    "int_and_bool_ops": "aten::sort.values",
    "custom_op": "exportir_test::scaled_tanh.default@functional",
    "cnn_bn_train": "training=True",
    "resnet_tiny_train": "training=True",
    "norm_zoo": "training=True",
}

# ExecuTorch's own compiler (torch.export -> to_edge -> to_executorch) cannot write these
EXECUTORCH_CANNOT_COMPILE = {
    "cnn_bn_train", "resnet_tiny_train", "pooling", "custom_op", "gpt_kv_cache",
    "slice_kv_cache",
}

# ExecuTorch's .pte files its own runtime cannot run (a kernel its portable runtime does not
# register): exportir's runtime runs them and is compared with eager only
EXECUTORCH_CANNOT_RUN = {"int_and_bool_ops": "aten::sort.values"}

# ExecuTorch's .pte files that compute something other than eager (both runtimes agree)
NOT_EAGER = {
    # the non-persistent buffer 'scratch' starts as ones in eager; ExecuTorch writes no initial
    # value for a mutated buffer, so both runtimes start it at zero (docs/format/pte.md)
    "buffer_reassign",
}


@pytest.mark.parametrize("name", [e.name for e in ENTRIES])
def test_our_pte_in_executorch(name):
    if name in REFUSED:
        with pytest.raises(PteKernelCoverageError, match=REFUSED[name].replace(".", r"\.")):
            our_pte(name)
        return
    run_in_executorch(our_pte(name), name)


@pytest.mark.parametrize("name", [e.name for e in ENTRIES if e.name not in REFUSED])
def test_our_pte_in_exportir(name):
    """exportir's .pte files read back by exportir's runtime (views its writer aliases at an
    offset into their source's memory included), equal to eager."""
    run_in_exportir(our_pte(name), name)


@pytest.mark.parametrize("name", [e.name for e in ENTRIES if e.name not in
                                  EXECUTORCH_CANNOT_COMPILE | set(REFUSED)])
def test_our_pte_is_no_larger_than_executorchs(name):
    """Issue 11's size target: the .pte exportir writes for a model is no bigger than the one
    ExecuTorch's own compiler writes for it."""
    ours, theirs = len(our_pte(name)), len(executorch_pte(name))
    assert ours <= theirs, f"{name}: ours {ours} bytes, ExecuTorch's {theirs}"


@pytest.mark.parametrize("name", [e.name for e in ENTRIES if e.name not in
                                  EXECUTORCH_CANNOT_COMPILE])
def test_executorch_pte_in_exportir(name):
    """exportir's runtime against ExecuTorch's runtime on ExecuTorch's file, two calls (the same
    outputs, mutated-input results and state included), and against eager where ExecuTorch's
    file returns what eager does (``NOT_EAGER``: where it computes something else)."""
    from corpus.export_models import BY_NAME, build
    from executorch.runtime import Runtime

    from exportir import pytree
    from exportir.runtime import Program

    def flat_inputs(args, kwargs):  # ExecuTorch keeps a str input as a None input
        return [None if isinstance(x, str) else x for x in pytree.tree_leaves((args, kwargs))]

    data = executorch_pte(name)
    ours = Program.load(data).method("forward")
    theirs = None
    if name in EXECUTORCH_CANNOT_RUN:
        with pytest.raises(RuntimeError, match="Failed to load method"):
            Runtime.get().load_program(data).load_method("forward")
    else:
        theirs = Runtime.get().load_program(data).load_method("forward")
    eager = build(BY_NAME[name])[0]
    for _ in range(2):  # the second call sees the state the first left
        _, a1, k1 = build(BY_NAME[name], seed=0)
        got = tensors(ours.execute(flat_inputs(a1, k1)))
        if theirs is not None:
            _, a2, k2 = build(BY_NAME[name], seed=0)
            expected = [t for t in theirs.execute(flat_inputs(a2, k2))
                        if isinstance(t, torch.Tensor)]
            assert_same(got, expected)
        _, a3, k3 = build(BY_NAME[name], seed=0)
        eager_out = tensors(eager(*a3, **k3))
        if len(eager_out) == len(got) and name not in NOT_EAGER:
            assert_same(got, eager_out)
    if name in NOT_EAGER:
        with pytest.raises(AssertionError):
            assert_same(got, eager_out)


def _dynamic_entries() -> list:
    from corpus.export_models import ENTRIES as entries
    from program import test_program_dynamic_corpus as pdc

    return [e.name for e in entries if e.name not in pdc.SKIP]


@pytest.mark.parametrize("name", _dynamic_entries())
def test_our_dynamic_pte_in_executorch(name):
    """The corpus with a dynamic batch (as tests/program/test_program_dynamic_corpus.py
    exports it) as .pte files, run by ExecuTorch at batch 1, 32 and 64 against eager."""
    import warnings

    from corpus import export_harness as h
    from corpus import export_models as em
    from executorch.runtime import Runtime
    from export import test_dynamic_corpus as dc
    from program import test_program_dynamic_corpus as pdc

    import exportir

    mod, args0, kwargs0 = em.build(em.BY_NAME[name])
    leaves, marked, _, _ = dc._batched(args0, kwargs0)
    assert leaves and any(marked)
    args, kwargs = dc._inputs_at(args0, kwargs0, dc.EXPORT_BATCH, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = exportir.export(h.deepcopy_module(mod), args, kwargs,
                             dynamic_shapes=pdc._spec(mod, args, kwargs))
        pm = exportir.to_edge(ep).to_program()
    if name in REFUSED:
        with pytest.raises(PteKernelCoverageError, match=REFUSED[name].replace(".", r"\.")):
            pm.pte_buffer()
        return
    dynamic = dc._dynamic_inputs(ep)
    data = pm.pte_buffer()  # ExecuTorch's runtime reads the bytes in place: keep them alive
    method = Runtime.get().load_program(data).load_method("forward")
    eager = h.deepcopy_module(mod)
    for b in pdc.RUN_BATCHES:
        run_args, run_kwargs = dc._inputs_at(args0, kwargs0, b, seed=b, only=dynamic)
        eager_args, eager_kwargs = dc._inputs_at(args0, kwargs0, b, seed=b, only=dynamic)
        expected = tensors(eager(*eager_args, **eager_kwargs))
        flat = [x for x in exportir.pytree.tree_leaves((run_args, run_kwargs))
                if not isinstance(x, str)]
        assert_same(tensors(method.execute(flat)), expected)
