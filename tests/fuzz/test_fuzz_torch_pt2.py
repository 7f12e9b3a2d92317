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
import warnings

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


def _torch_saved_inputs() -> bytes:
    import io

    import torch

    x = torch.arange(12.0).reshape(3, 4)
    example = ((x, x[1:, ::2], torch.tensor([1, 2], dtype=torch.int64), None, [3, 4.5, "s"]),
               {"k": torch.ones(2, dtype=torch.bool), "d": {"a": (True, x.t())}})
    buffer = io.BytesIO()
    torch.save(example, buffer, pickle_protocol=2)
    return buffer.getvalue()


def test_mutated_sample_input_streams(tmp_path):
    """In process, many cheap mutants of the stream torch.save writes for example inputs,
    straight into the restricted reader: a value or a SerializationError, nothing else, and
    no injected call ever runs (a few seconds; ``EXPORTIR_FUZZ_CASES`` scales it)."""
    import io
    import zipfile

    from torch_pt2_files import m_pickle, m_samples

    from exportir.export.serialize.archive import DEFAULT_ARCHIVE_LIMITS
    from exportir.export.serialize.torch_archive import _sample_inputs, _Zip

    rng = random.Random(SEED)
    canary = tmp_path / "canary"
    seed = _torch_saved_inputs()
    outcomes = {"read": 0, "refused": 0}
    for i in range(CASES * 5):
        members = {"archive/data/sample_inputs/model.pt": seed, "archive/archive_format": b"pt2"}
        m_samples(members, rng, canary)
        if i % 3 == 0:  # stack a second edit on the stream
            members["archive/data/sample_inputs/model.pt"] = _restack(
                members["archive/data/sample_inputs/model.pt"], rng, canary, m_pickle)
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as zf:
            for name, data in members.items():
                zf.writestr(name, data)
        z = _Zip(io.BytesIO(out.getvalue()), DEFAULT_ARCHIVE_LIMITS)
        try:  # a refusal is a warning (from a SerializationError); anything raised fails
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                value = _sample_inputs(z, "data/sample_inputs/model.pt")
        finally:
            z.close()
        outcomes["read" if value is not None else "refused"] += 1
        assert value is not None or any("skipped" in str(w.message) for w in caught), i
    print(f"\nsample-input streams: {outcomes}")
    assert not canary.exists(), "a call named in a pickled sample input ran"
    assert outcomes["refused"] and outcomes["read"]


def _restack(torch_zip: bytes, rng: random.Random, canary, m_pickle) -> bytes:
    from torch_pt2_files import assemble, disassemble

    inner = disassemble(torch_zip)
    name = next(n for n in inner if n.endswith("/data.pkl"))
    try:
        inner[name], _ = m_pickle(inner[name], rng, canary)
    except ValueError:  # the first edit broke the stream: genops cannot list its opcodes
        return torch_zip
    return assemble(inner)
