"""exportir.export's graphs against torch.export's, op for op, on both corpora.

For every model of tests/corpus/real_models.py and tests/corpus/export_models.py:

- ``exportir.export(...).graph`` holds the op multiset of torch's
  ``export(..., strict=False).run_decompositions({})`` -- composite ops such as ``linear``,
  ``conv2d``, ``layer_norm``, ``scaled_dot_product_attention`` kept whole -- with the same node
  names and placeholder names, and no op that mutates;
- ``run_decompositions()`` holds the op multiset of torch's ``run_decompositions()``.

torch's side comes from tests/export/fidelity_oracle.json (tests/corpus/fidelity.py; torch
needs ~6 s per model), and ``test_oracle_file_is_what_torch_says`` re-derives a few entries
live. Every known difference is listed below with its reason and asserted exactly: a fix on
either side fails the test until the entry goes. Numerics of every stage against eager are
tests/real_models' (this module shares its cached programs) and test_corpus.py's.
"""

from __future__ import annotations

import functools
import warnings
from collections import Counter
from typing import Any

import pytest
from corpus import fidelity as F

import exportir

ORACLE = F.load()
KEYS = F.keys()

# -- known differences, asserted exactly ---------------------------------------------------------

ATTENTION_GRAD_LAYOUT = (
    "an attention mask computed from parameters requires grad in forward, and "
    "scaled_dot_product_attention then takes its math path (contiguous result), so the reshape "
    "after it is clone + view. torch.export computes kept ops' values in a no-grad re-trace "
    "(flash path, result laid out like the query) and records a view there -- which fails when "
    "its module() runs with grad enabled (test_attention_with_a_grad_mask_runs_with_grad). "
    "exportir keeps the layout of the run it captured."
)


def _names(text: str) -> set[str]:
    return set(text.split())


# key -> (ours-only ops, torch-only ops, reason)
KEPT_DIFFERENCES: dict[str, tuple[dict[str, int], dict[str, int], str]] = {
    "real:t5_encoder": ({"aten.clone.default": 2}, {}, ATTENTION_GRAD_LAYOUT),
    "real:t5": ({"aten.clone.default": 4}, {}, ATTENTION_GRAD_LAYOUT),
    "real:swin": ({"aten.clone.default": 2}, {}, ATTENTION_GRAD_LAYOUT),
    "real:beit": ({"aten.clone.default": 2}, {}, ATTENTION_GRAD_LAYOUT),
}
CORE_DIFFERENCES: dict[str, tuple[dict[str, int], dict[str, int], str]] = {}
# key -> (ours-only names, torch-only names, reason)
NAME_DIFFERENCES: dict[str, tuple[set[str], set[str], str]] = {
    "real:t5_encoder": (_names("clone_10 clone_11"), set(), ATTENTION_GRAD_LAYOUT),
    "real:t5": (_names("clone_22 clone_23 clone_24 clone_25"), set(), ATTENTION_GRAD_LAYOUT),
    "real:swin": (_names("clone_6 clone_12 clone_13"), _names("clone_7"), ATTENTION_GRAD_LAYOUT),
    "real:beit": (_names("clone_15 clone_16"), set(), ATTENTION_GRAD_LAYOUT),
}


# -- ours, shared with tests/real_models within a process -----------------------------------------


def _quiet(fn: Any, *args: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args)


@functools.cache
def _ours(key: str) -> Any:
    kind, name = key.split(":", 1)
    if kind == "real":
        from real_models import _harness as H

        return H.exported(name)
    module, args, kwargs = F.build(key)
    return _quiet(exportir.export, module, args, kwargs)


@functools.cache
def _ours_core(key: str) -> Any:
    kind, name = key.split(":", 1)
    if kind == "real":
        from real_models import _harness as H

        return H.core(name)
    return _quiet(_ours(key).run_decompositions)


def _diff(ours: dict, theirs: dict) -> tuple[dict, dict]:
    a, b = Counter(ours), Counter(theirs)
    return dict(a - b), dict(b - a)


def _check(
    key: str, what: str, diff: tuple[dict, dict], expected: tuple[Any, Any, str] | None
) -> None:
    want = (dict(expected[0]), dict(expected[1])) if expected else ({}, {})
    assert diff == want, (
        f"{key}: {what} differ from torch.export's\n  only in exportir: {diff[0]}\n"
        f"  only in torch: {diff[1]}\n  listed as known: {want}\n"
        f"  reproduce: scripts/survey_real_models.py / python -m pytest -k '{key}'"
    )


def _torch(key: str) -> dict[str, Any]:
    entry = ORACLE[key]
    if "error" in entry:
        pytest.fail(f"{key}: torch.export fails here ({entry['error']}); see test_torch_failures")
    return entry


TORCH_EXPORT_FAILS = sorted(k for k in KEYS if "error" in ORACLE[k])
TORCH_CORE_FAILS = sorted(k for k in KEYS if "core_error" in ORACLE[k])
COMPARABLE = [k for k in KEYS if k not in TORCH_EXPORT_FAILS]


def _params(keys: list[str]) -> list[Any]:
    return [pytest.param(k, id=k) for k in keys]


# -- the corpus ---------------------------------------------------------------------------------


@pytest.mark.parametrize("key", _params(COMPARABLE))
def test_kept_ops_match_torch(key: str) -> None:
    ours = _ours(key).graph
    _check(key, "ops", _diff(F.op_counts(ours), _torch(key)["kept"]), KEPT_DIFFERENCES.get(key))
    mutating = [n.name for n in ours.nodes if n.op == "call_function" and _mutates(n.target)]
    assert not mutating, f"{key}: the exported graph is not functional: {mutating}"


@pytest.mark.parametrize("key", _params(COMPARABLE))
def test_node_names_match_torch(key: str) -> None:
    ours, theirs = _ours(key).graph, _torch(key)
    assert F.placeholder_digest(ours) == theirs["placeholders"], f"{key}: placeholder names differ"
    a, b = F.name_set(F.node_names(ours)), F.name_set(theirs["kept_names"])
    known = NAME_DIFFERENCES.get(key)
    diff = ({n: 1 for n in a - b}, {n: 1 for n in b - a})
    expected = ({n: 1 for n in known[0]}, {n: 1 for n in known[1]}, known[2]) if known else None
    _check(key, "node names", diff, expected)


@pytest.mark.parametrize("key", _params([k for k in COMPARABLE if k not in TORCH_CORE_FAILS]))
def test_core_ops_match_torch(key: str) -> None:
    ours = F.op_counts(_ours_core(key).graph)
    _check(key, "core ATen ops", _diff(ours, _torch(key)["core"]), CORE_DIFFERENCES.get(key))


def _mutates(target: Any) -> bool:
    schema = getattr(target, "_schema", None)
    return schema is not None and schema.is_mutable


def test_torch_failures_are_known() -> None:
    """Where torch.export itself fails, the oracle says so; exportir exports (and decomposes)
    those models -- their numerics against eager are tests/real_models'."""
    assert TORCH_EXPORT_FAILS == ["real:llama_static_cache"]
    assert TORCH_CORE_FAILS == ["real:gpt2"]
    assert "Cannot view a tensor" in ORACLE["real:gpt2"]["core_error"]
    from real_models import _harness as H

    for key in TORCH_EXPORT_FAILS + TORCH_CORE_FAILS:
        name = key.split(":", 1)[1]
        core = _ours_core(key)
        kept = [n for n in core.graph.nodes if n.op == "call_function" and _is_composite(n.target)]
        assert not kept, f"{key}: composite ops left in the core graph: {kept}"
        H.assert_same(core.module()(**H.case(name).kwargs), H.eager_example(name), f"{key} core")


def _is_composite(target: Any) -> bool:
    from exportir.export.capture._composite import kept_cia_ops

    return target in kept_cia_ops()


@pytest.mark.parametrize("name", ["t5_encoder", "swin"])
def test_attention_with_a_grad_mask_runs_with_grad(name: str) -> None:
    """ATTENTION_GRAD_LAYOUT: the program's module() matches eager with grad enabled (the
    mask then requires grad, as in the captured run) and under no_grad (flash path)."""
    import torch
    from real_models import _harness as H

    module = _ours(f"real:{name}").module()
    kwargs = H.case(name).kwargs
    assert torch.is_grad_enabled()
    H.assert_same(module(**kwargs), H.eager_example(name), f"{name} module() with grad")
    with torch.no_grad():
        H.assert_same(module(**kwargs), H.eager_example(name), f"{name} module() without grad")


def test_known_differences_name_corpus_models() -> None:
    for table in (KEPT_DIFFERENCES, CORE_DIFFERENCES, NAME_DIFFERENCES):
        for key, (_, _, reason) in table.items():
            assert key in ORACLE and reason


@pytest.mark.parametrize("key", ["export:mlp", "export:matmul_zoo", "real:tv_resnet18"])
def test_oracle_file_is_what_torch_says(key: str) -> None:
    assert F.torch_summary(key) == ORACLE[key], f"regenerate: {F.GENERATED_BY} {key}"
