"""Hostile files through the viewer: mutants of real .xpt and .pt2 files (the fuzz suite's
structure-aware mutators, tests/fuzz) either are refused by their loader or give a page; the
viewer itself never fails on what a loader accepted."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from exportir.export.serialize.common import SerializationError
from exportir.format.validate import ProgramLoadError
from exportir.viewer import to_html

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fuzz"))  # its modules import flat
import pt2_files
import seeds
import xpt_files

CASES = 100
REFUSED = (ProgramLoadError, SerializationError)  # what the loaders raise for a bad file


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["xpt", "pt2"])
def test_mutated_files_are_refused_or_shown(kind, tmp_path):
    seed_files = seeds.xpt_seeds() if kind == "xpt" else seeds.pt2_seeds()
    mutate = xpt_files.mutate if kind == "xpt" else pt2_files.mutate
    rng = random.Random(1234)
    shown = 0
    for i in range(CASES):
        name = rng.choice(sorted(seed_files))
        data, what = mutate(seed_files[name], rng)
        path = tmp_path / f"case{i}.{kind}"
        path.write_bytes(data)
        try:
            html = to_html(path)
        except REFUSED:
            continue
        except Exception as exc:  # noqa: BLE001 (anything else is the viewer's bug)
            pytest.fail(f"case {i} (seed {name}: {what}): {type(exc).__name__}: {exc}")
        shown += 1
        assert html.count("<script") == 3
    assert shown > 0, "every mutant was refused: the test shows nothing about the viewer"
