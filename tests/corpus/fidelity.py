"""torch.export's graphs of both corpora, summarized: the oracle of tests/export/test_fidelity.py.

For every model of tests/corpus/real_models.py (``real:<name>``) and export_models.py
(``export:<name>``) the oracle file holds what ``torch.export.export(..., strict=False)`` gives:

- ``kept``: the op multiset of ``.run_decompositions({})`` (every composite op it keeps whole);
- ``kept_names``: its call_function node names, as ``{base: "ranges of suffixes"}`` (``view``,
  ``view_1`` ... ``view_7`` -> ``{"view": "-,1-7"}``; ``-`` is the name without a suffix);
- ``placeholders``: the sha1 of its sorted placeholder names;
- ``core``: the op multiset of ``.run_decompositions()`` (torch's core ATen graph), or
  ``core_error`` when torch fails there; ``error`` when torch cannot export the model at all.

torch 2.13 takes ~6 s per model for the three traces, so the summaries are computed once by
``scripts/gen_fidelity_oracle.py`` and committed; the test re-derives a few of them live on
every run, which fails if the file no longer says what torch says.
"""

from __future__ import annotations

import hashlib
import json
import re
import warnings
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

ORACLE_PATH = Path(__file__).resolve().parent.parent / "export" / "fidelity_oracle.json"
GENERATED_BY = "scripts/gen_fidelity_oracle.py"

_SUFFIX = re.compile(r"^(.*?)(?:_(\d+))?$")


def keys() -> list[str]:
    from corpus import export_models as em
    from corpus import real_models as R

    return [f"real:{n}" for n in R.NAMES] + [f"export:{e.name}" for e in em.ENTRIES]


def build(key: str) -> tuple[torch.nn.Module, tuple, dict]:
    """A fresh ``(module, args, kwargs)`` of a corpus model (deterministic)."""
    from corpus import export_models as em
    from corpus import real_models as R

    kind, name = key.split(":", 1)
    if kind == "export":
        return em.build(em.BY_NAME[name])
    case = R.build(name)
    return case.model, (), case.kwargs


def op_counts(graph: Any) -> dict[str, int]:
    return dict(Counter(str(n.target) for n in graph.nodes if n.op == "call_function"))


def node_names(graph: Any) -> dict[str, str]:
    """call_function node names as ``{base: ranges}`` (see the module docstring)."""
    by_base: dict[str, list[int]] = {}
    for n in graph.nodes:
        if n.op != "call_function":
            continue
        base, num = _SUFFIX.match(n.name).groups()
        by_base.setdefault(base, []).append(-1 if num is None else int(num))
    return {base: _ranges(sorted(nums)) for base, nums in sorted(by_base.items())}


def name_set(encoded: dict[str, str]) -> set[str]:
    """The node names an encoding stands for (for readable differences)."""
    out = set()
    for base, text in encoded.items():
        for part in text.split(","):
            if part == "-":
                out.add(base)
                continue
            lo, _, hi = part.partition("-")
            out.update(f"{base}_{i}" for i in range(int(lo), int(hi or lo) + 1))
    return out


def placeholder_digest(graph: Any) -> str:
    names = sorted(n.name for n in graph.nodes if n.op == "placeholder")
    return hashlib.sha1("\n".join(names).encode()).hexdigest()


def _ranges(nums: Iterable[int]) -> str:
    parts: list[str] = []
    run: list[int] = []
    for i in nums:
        if i == -1:
            parts.append("-")
        elif run and i == run[-1] + 1:
            run.append(i)
        else:
            if run:
                parts.append(_run_text(run))
            run = [i]
    if run:
        parts.append(_run_text(run))
    return ",".join(parts)


def _run_text(run: list[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"


def _first_line(err: BaseException) -> str:
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text}"[:200]


def torch_summary(key: str) -> dict[str, Any]:
    """What torch.export gives for one model (the oracle entry)."""
    import torch.export as te

    module, args, kwargs = build(key)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            ep = te.export(module, args, kwargs, strict=False)
            kept = ep.run_decompositions({})
        except Exception as err:  # noqa: BLE001  (the oracle records torch's failures)
            return {"error": _first_line(err)}
        out: dict[str, Any] = {
            "kept": op_counts(kept.graph),
            "kept_names": node_names(kept.graph),
            "placeholders": placeholder_digest(kept.graph),
        }
        try:
            out["core"] = op_counts(ep.run_decompositions().graph)
        except Exception as err:  # noqa: BLE001
            out["core_error"] = _first_line(err)
    return out


def load() -> dict[str, dict[str, Any]]:
    data = json.loads(ORACLE_PATH.read_text())
    return data["models"]


def write(models: dict[str, dict[str, Any]], progress: Callable[[str], None] = print) -> None:
    header = f"@generated by {GENERATED_BY} with torch {torch.__version__}; do not edit"
    lines = [f"{json.dumps(k)}: {json.dumps(models[k], sort_keys=True)}" for k in sorted(models)]
    body = ",\n  ".join(lines)
    text = f'{{"_generated": {json.dumps(header)},\n "models": {{\n  {body}\n}}}}\n'
    json.loads(text)  # well-formed
    ORACLE_PATH.write_text(text)
    progress(f"wrote {ORACLE_PATH} ({len(models)} models)")
