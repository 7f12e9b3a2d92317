"""Structure-aware fuzzing of saved ExportedPrograms (.pt2): mutants of saved programs, with the
manifest's sizes and SHA-256 recomputed, loaded with ``exportir.load`` and run through
``ep.module()`` in child processes under resource limits. Every outcome must be a
SerializationError, or a program that runs (or fails while running, as eager would): never a
crash, a hang, another exception type while loading, or an unbounded allocation.

``make test`` runs a fixed seed and a few cases; ``make fuzz`` runs many
(``EXPORTIR_FUZZ_CASES``, ``EXPORTIR_FUZZ_SEED``)."""

from __future__ import annotations

import os
import random

import pytest
from harness import findings, run_cases, summary, write_cases
from pt2_files import mutate

CASES = int(os.environ.get("EXPORTIR_FUZZ_CASES", "40"))
SEED = int(os.environ.get("EXPORTIR_FUZZ_SEED", "1729"))


@pytest.fixture(scope="module")
def pt2_seed_files() -> dict[str, bytes]:
    from seeds import pt2_seeds

    return pt2_seeds()


def test_mutated_exported_program_files(tmp_path, pt2_seed_files):
    rng = random.Random(SEED)
    names = sorted(pt2_seed_files)
    files, notes = write_cases(tmp_path, pt2_seed_files, mutate, CASES, rng, ".pt2")
    results = run_cases("pt2", files, tmp_path)
    print(f"\nseed {SEED}, {CASES} mutants: {summary(results)}")
    for r in results[: len(names)]:
        assert r.outcome == "ran", (notes[r.case], r.outcome, r.detail)
    found = findings("pt2", results, files, notes)
    assert not found, "\n\n".join(found)
    assert any(r.outcome == "ran" for r in results[len(names):]), "no mutant ran"
