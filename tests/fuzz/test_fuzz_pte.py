"""Fuzzing of ExecuTorch .pte files read by exportir's runtime: mutants of the .pte files
exportir writes, loaded and run in child processes under resource limits. Every outcome must be
a typed error or a correct run (the reference interpreter, a fresh load, a call after another
call): never a crash, a hang, a wrong value or an unbounded allocation.

``make test`` runs a fixed seed and a few cases; ``make fuzz`` runs many
(``EXPORTIR_FUZZ_CASES``, ``EXPORTIR_FUZZ_SEED``)."""

from __future__ import annotations

import os
import random

import pytest
from harness import findings, run_cases, summary, write_cases
from pte_files import mutate

CASES = int(os.environ.get("EXPORTIR_FUZZ_CASES", "40"))
SEED = int(os.environ.get("EXPORTIR_FUZZ_SEED", "1729"))


@pytest.fixture(scope="module")
def pte_seed_files() -> dict[str, bytes]:
    from seeds import pte_seeds

    return pte_seeds()


def test_mutated_pte_files(tmp_path, pte_seed_files):
    rng = random.Random(SEED)
    names = sorted(pte_seed_files)
    assert len(names) >= 3, names
    files, notes = write_cases(tmp_path, pte_seed_files, mutate, CASES, rng, ".pte")
    results = run_cases("pte", files, tmp_path)
    print(f"\nseed {SEED}, {CASES} mutants: {summary(results)}")
    for r in results[: len(names)]:
        assert r.outcome in ("ran", "ran-unchecked"), (notes[r.case], r.outcome, r.detail)
    found = findings("pte", results, files, notes)
    assert not found, "\n\n".join(found)
