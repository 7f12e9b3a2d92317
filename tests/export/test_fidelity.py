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
DEAD_NODE_NAME_GAPS = (
    "names only (ops agree): nodes one side makes and then drops as dead code use up name "
    "counters -- both functionalizations regenerate views of written tensors and drop the "
    "unused ones, not always the same ones; torch's drops views of a flatten input, of buffers "
    "written in place."
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
    "real:mixtral": (
        _names(
            "view_7 view_19 "
        ),
        _names(
            "view_22 view_23 "
        ),
        DEAD_NODE_NAME_GAPS,
    ),
    "real:speech_to_text": (_names("detach_3"), _names("detach_1"), DEAD_NODE_NAME_GAPS),
    "real:beit": (
        _names(
            "clone_15 clone_16 select_2 select_4 select_5 select_8 select_10 select_14 select_16 "
            "select_17 select_22 select_23 select_25 select_29 select_30 select_33 select_35 "
            "select_39 view_4 view_15 "
        ),
        _names(
            "select_3 select_7 select_13 select_15 select_28 select_32 select_34 select_40 "
            "select_43 select_44 select_46 select_49 select_52 select_57 select_58 select_59 "
            "view_21 view_22 "
        ),
        DEAD_NODE_NAME_GAPS + " " + ATTENTION_GRAD_LAYOUT,
    ),
    "real:timm_mobilenetv3": (_names("view"), _names("view_1"), DEAD_NODE_NAME_GAPS),
    "real:timm_ghostnet": (
        _names(
            "alias_65 alias_66 alias_67 alias_68 alias_70 alias_71 alias_72 alias_73 alias_75 "
            "alias_76 alias_77 alias_78 view "
        ),
        _names(
            "alias_4 alias_9 alias_14 alias_19 alias_24 alias_29 alias_34 alias_39 alias_44 "
            "alias_49 alias_54 alias_59 view_1 "
        ),
        DEAD_NODE_NAME_GAPS,
    ),
    "real:tv_convnext_tiny": (
        _names(
            "permute_8 permute_17 permute_38 "
        ),
        _names(
            "permute_46 permute_47 permute_48 "
        ),
        DEAD_NODE_NAME_GAPS,
    ),
    "real:tv_swin_t": (
        _names(
            "permute_8 slice_8 slice_9 slice_10 slice_14 slice_15 slice_18 slice_23 slice_24 "
            "slice_25 slice_30 slice_33 slice_34 slice_38 slice_39 slice_40 slice_48 slice_49 "
            "slice_50 slice_54 slice_55 slice_56 slice_57 slice_58 slice_62 slice_63 slice_64 "
            "slice_65 slice_66 slice_70 slice_71 view_7 view_8 "
        ),
        _names(
            "permute_51 slice_11 slice_12 slice_21 slice_27 slice_36 slice_37 slice_94 slice_95 "
            "slice_96 slice_97 slice_98 slice_99 slice_100 slice_101 slice_102 slice_103 slice_104 "
            "slice_105 slice_106 slice_107 slice_108 slice_109 slice_110 slice_111 slice_112 "
            "slice_113 slice_114 slice_115 slice_116 slice_117 view_72 view_73 "
        ),
        DEAD_NODE_NAME_GAPS,
    ),
    "export:gpt_kv_cache": (
        _names(
            "transpose_1 transpose_5 "
        ),
        _names(
            "transpose_6 transpose_7 "
        ),
        DEAD_NODE_NAME_GAPS,
    ),
    "export:buffer_slice_assign": (_names("slice_3"), _names("slice_4"), DEAD_NODE_NAME_GAPS),
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


# -- the corpus ---------------------------------------------------------------------------------


@pytest.mark.parametrize("key", COMPARABLE)
def test_kept_ops_match_torch(key: str) -> None:
    ours = _ours(key).graph
    _check(key, "ops", _diff(F.op_counts(ours), _torch(key)["kept"]), KEPT_DIFFERENCES.get(key))
    mutating = [n.name for n in ours.nodes if n.op == "call_function" and _mutates(n.target)]
    assert not mutating, f"{key}: the exported graph is not functional: {mutating}"


@pytest.mark.parametrize("key", COMPARABLE)
def test_node_names_match_torch(key: str) -> None:
    ours, theirs = _ours(key).graph, _torch(key)
    assert F.placeholder_digest(ours) == theirs["placeholders"], f"{key}: placeholder names differ"
    a, b = F.name_set(F.node_names(ours)), F.name_set(theirs["kept_names"])
    known = NAME_DIFFERENCES.get(key)
    diff = ({n: 1 for n in a - b}, {n: 1 for n in b - a})
    expected = ({n: 1 for n in known[0]}, {n: 1 for n in known[1]}, known[2]) if known else None
    _check(key, "node names", diff, expected)


@pytest.mark.parametrize("key", [k for k in COMPARABLE if k not in TORCH_CORE_FAILS])
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
