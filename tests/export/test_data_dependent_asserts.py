"""``assert`` statements on tensor data: exported as runtime asserts, as torch.export (non-strict)
exports them, instead of stopping on a data-dependent guard (transformers' XLM and Flaubert
assert ``lengths.max().item() <= slen`` in ``forward``)."""

from __future__ import annotations

import pytest
import torch
from _assert_models import Asserted, AssertedWithMessage, Branched

from exportir.export import export
from exportir.symbolic import GuardOnDataDependentSymNode


def _asserts(ep) -> list[str]:
    return [str(n.args[1]) for n in ep.graph.nodes
            if n.op == "call_function" and "_assert_scalar" in str(n.target)]


def _ranges(ep) -> dict[str, tuple[str, str]]:
    """Range constraints as text, torch's ``int_oo`` spelled as sympy's ``oo``."""
    return {str(k): (str(v.lower).replace("int_oo", "oo"), str(v.upper).replace("int_oo", "oo"))
            for k, v in ep.range_constraints.items()}


def test_an_assert_on_tensor_data_becomes_a_runtime_assert_as_in_torch() -> None:
    x = torch.tensor([1, 5, 3])
    ep = export(Asserted(), (x,))
    theirs = torch.export.export(Asserted(), (x,), strict=False)
    assert len(_asserts(ep)) == 1 and "u0 <= 8" in _asserts(ep)[0]
    assert _ranges(ep) == _ranges(theirs)
    torch.testing.assert_close(ep.module()(torch.tensor([2, 8, 0])), torch.tensor([4, 16, 0]))
    with pytest.raises(RuntimeError, match="u0 <= 8"):
        ep.module()(torch.tensor([2, 9, 0]))


def test_an_assert_with_a_message_too() -> None:
    """torch 2.13 recognizes only ``assert cond`` (a message changes the bytecode it matches)
    and stops on this one; the condition is the same, so exportir exports it."""
    with pytest.raises(Exception, match="data-dependent"):
        torch.export.export(AssertedWithMessage(), (torch.tensor([1, 5, 3]),), strict=False)
    ep = export(AssertedWithMessage(), (torch.tensor([1, 5, 3]),))
    assert len(_asserts(ep)) == 1
    with pytest.raises(RuntimeError, match="u0 <= 8"):
        ep.module()(torch.tensor([9, 0, 1]))


def test_a_branch_on_tensor_data_still_stops_with_the_fix() -> None:
    """Only ``assert`` is taken as a check: an ``if`` needs one of its branches chosen."""
    with pytest.raises(GuardOnDataDependentSymNode, match="u0 <= 8"):
        export(Branched(), (torch.tensor([1, 5, 3]),))


@pytest.mark.parametrize("name", ["XLM", "Flaubert"])
def test_transformers_models_asserting_on_lengths_export_and_run(name: str) -> None:
    from corpus import _torchvision_ops  # noqa: F401 - before transformers imports torchvision

    import exportir

    transformers = pytest.importorskip("transformers")
    config = getattr(transformers, f"{name}Config")(
        vocab_size=100, emb_dim=32, n_layers=2, n_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = getattr(transformers, f"{name}ForSequenceClassification")(config).eval()
    tokens = torch.randint(0, 100, (2, 8))
    ep = export(model, (tokens,))
    assert len(_asserts(ep)) == 2
    assert _ranges(ep) == _ranges(torch.export.export(model, (tokens,), strict=False))
    fresh = torch.randint(0, 100, (2, 8))
    torch.testing.assert_close(ep.module()(fresh).logits, model(fresh).logits)
    program = exportir.to_edge(ep).to_program()
    from exportir.runtime import Program

    (logits,) = Program.load(program.buffer).method("forward").execute([fresh])
    torch.testing.assert_close(logits, model(fresh).logits, rtol=1e-5, atol=1e-5)
