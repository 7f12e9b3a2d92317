"""Structure-aware fuzzing of torch.export's .pt2 archives (``torch.export.save``): mutants of
torch-written files (torch_pt2_files.py) loaded with ``exportir.load`` and run through
``ep.module()`` in child processes under resource limits. Every outcome must be a
SerializationError, or a program that loads and runs on its example inputs (read from torch's
pickled sample inputs without unpickling; mutated ones that are refused fall back to none, and
the mutant is not run): never a crash, a hang, another exception type or an unbounded
allocation. Mutants inject ``os.system`` / ``eval`` calls into the pickled inputs that would
create a canary file: it must never appear. The unmutated seeds include cond, map, while_loop,
dynamic (also derived, ``d + 1``) and unbacked sizes, and every one must load and run.

``make test`` runs a fixed seed and a few cases; ``make fuzz`` runs many
(``EXPORTIR_FUZZ_CASES``, ``EXPORTIR_FUZZ_SEED``)."""

from __future__ import annotations

import functools
import os
import random

import pytest
from harness import findings, run_cases, summary, write_cases
from torch_pt2_files import mutate

CASES = int(os.environ.get("EXPORTIR_FUZZ_CASES", "24"))
SEED = int(os.environ.get("EXPORTIR_FUZZ_SEED", "1729"))


@pytest.fixture(scope="module")
def torch_seed_files() -> dict[str, bytes]:
    from seeds import torch_pt2_seeds

    return torch_pt2_seeds()


@pytest.mark.slow  # ~90 s: torch exports and saves the seeds, children import torch
def test_mutated_torch_pt2_files(tmp_path, torch_seed_files):
    rng = random.Random(SEED)
    names = sorted(torch_seed_files)
    canary = tmp_path / "canary"
    files, notes = write_cases(tmp_path, torch_seed_files,
                               functools.partial(mutate, canary=canary), CASES, rng, ".pt2")
    results = run_cases("pt2", files, tmp_path)
    print(f"\nseed {SEED}, {CASES} mutants: {summary(results)}")
    assert not canary.exists(), "a call named in a pickled sample input ran"
    for r in results[: len(names)]:
        assert r.outcome == "ran", (notes[r.case], r.outcome, r.detail)
    found = findings("pt2", results, files, notes)
    assert not found, "\n\n".join(found)
    assert any(r.outcome == "refused" for r in results[len(names):]), "no mutant was refused"
