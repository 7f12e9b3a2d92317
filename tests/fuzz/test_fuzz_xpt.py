"""Structure-aware fuzzing of program files: mutants of emitted programs, with valid checksums,
loaded and run in child processes under resource limits. Every outcome must be a typed error
or a correct run (checked against the reference interpreter, a fresh load, and a call after
another call): never a crash, a hang, a wrong value or an unbounded allocation.

``make test`` runs a fixed seed and a few cases; ``make fuzz`` runs many
(``EXPORTIR_FUZZ_CASES``, ``EXPORTIR_FUZZ_SEED``)."""

from __future__ import annotations

import os
import random

import pytest
from harness import findings, run_cases, summary, write_cases
from xpt_files import mutate

CASES = int(os.environ.get("EXPORTIR_FUZZ_CASES", "80"))
SEED = int(os.environ.get("EXPORTIR_FUZZ_SEED", "1729"))


@pytest.fixture(scope="module")
def xpt_seed_files() -> dict[str, bytes]:
    from seeds import xpt_seeds

    return xpt_seeds()


def test_mutated_program_files(tmp_path, xpt_seed_files):
    rng = random.Random(SEED)
    names = sorted(xpt_seed_files)
    files, notes = write_cases(tmp_path, xpt_seed_files, mutate, CASES, rng, ".xpt")
    results = run_cases("xpt", files, tmp_path)
    print(f"\nseed {SEED}, {CASES} mutants: {summary(results)}")
    for r in results[: len(names)]:
        assert r.outcome in ("ran", "ran-unchecked"), (notes[r.case], r.outcome, r.detail)
    found = findings("xpt", results, files, notes)
    assert not found, "\n\n".join(found)
    ran = sum(r.outcome.startswith("ran") for r in results[len(names):])
    assert ran > 0, "no mutant ran: the mutations only make files the loader refuses"
