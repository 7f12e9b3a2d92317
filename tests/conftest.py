"""Shared pytest setup: make ``corpus`` and ``exportir`` importable from a plain checkout.

``EXPORTIR_FX_IMPL`` names the module the parity tests treat as "ours" (default
``exportir.fx``). Setting it to ``torch.fx`` runs the harness against the oracle itself,
which is how the harness is sanity-checked: every test under tests/fx must pass in that mode
(``make test-fx-sanity``, part of CI's ``make check``). Passes are taken from the same
implementation (:func:`import_ours_pass`).
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parent
_SRC = _TESTS.parent / "src"

if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))
# first on the path: a checkout (a git worktree, a fresh clone) tests its own src/, even when the
# venv holds an editable install of another checkout
if _SRC.is_dir() and str(_SRC) not in sys.path[:1]:
    sys.path.insert(0, str(_SRC))

# `make test` runs two xdist workers on two cores: each worker's torch (and every process it
# starts) computes on one thread, or the workers' OpenMP threads oversubscribe the cores and spin
# on each other (measured: the real-model suite ran 2-7x slower per test). Tests that need more
# threads set them themselves.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)

OURS_ENV = "EXPORTIR_FX_IMPL"


def ours_fx_name() -> str:
    return os.environ.get(OURS_ENV, "exportir.fx")


def import_ours_fx():
    """The FX implementation under test (``exportir.fx`` unless overridden)."""
    return importlib.import_module(ours_fx_name())


def import_ours_pass(name: str):
    """``<fx implementation under test>.passes.<name>``: exportir.fx's pass, or torch.fx's own in
    the sanity mode, so a pass's parity test compares torch with itself there."""
    return importlib.import_module(f"{ours_fx_name()}.passes.{name}")


@pytest.fixture(scope="session")
def ours_fx():
    return import_ours_fx()


# The one intended difference between our generated code and torch.fx's: the line that
# re-registers a wrapped function. torch.fx writes ``torch.fx._symbolic_trace.wrap("f")``, which
# would register ``f`` with torch.fx's tracer when the code runs; we write ``exportir.fx.wrap("f")``.
TORCH_WRAP_CALL = "torch.fx._symbolic_trace.wrap("
OUR_WRAP_CALL = "exportir.fx.wrap("


def torch_code_as_ours(text: str) -> str:
    """torch.fx's generated code with its wrap lines spelled the way exportir.fx spells them.

    In torch.fx-vs-torch.fx sanity mode (EXPORTIR_FX_IMPL=torch.fx) the text is unchanged.
    """
    if ours_fx_name() == "torch.fx":
        return text
    return text.replace(TORCH_WRAP_CALL, OUR_WRAP_CALL)


# -- one scratch directory per test run ---------------------------------------------------------
# Everything a test run writes through tempfile (programs, fuzz cases, browser profiles, pytest's
# tmp_path, files of the subprocesses it starts) goes under one directory, made by the controlling
# process before any worker starts (workers and subprocesses inherit TMPDIR) and removed when the
# run ends. Leaked scratch files once filled the shared CI disk; what a run leaves behind is now
# listed at its end and removed, except fuzz findings, which are kept for their rerun commands.
_SCRATCH_ENV = "EXPORTIR_TEST_SCRATCH"


def pytest_configure(config):
    if hasattr(config, "workerinput") or os.environ.get(_SCRATCH_ENV):
        return  # an xdist worker, or a pytest started by a test: the outer run owns the scratch
    import tempfile

    outer = tempfile.gettempdir()
    root = tempfile.mkdtemp(prefix="exportir-tests-", dir=outer)
    os.environ["TMPDIR"] = root
    os.environ[_SCRATCH_ENV] = root
    tempfile.tempdir = root
    config._exportir_scratch = (root, outer)


def pytest_unconfigure(config):
    scratch = getattr(config, "_exportir_scratch", None)
    if scratch is None:
        return
    import shutil
    import tempfile

    root, outer = scratch
    tempfile.tempdir = None
    os.environ["TMPDIR"] = outer
    os.environ.pop(_SCRATCH_ENV, None)
    # pytest's own tmp_path roots, torch's compile cache and the real-model harness's programs
    # (removed when its process exits, which for an xdist worker may be after this) are expected
    expected = ("pytest-of-", "torchinductor_", "exportir-real-")
    left = sorted(p for p in os.listdir(root) if not p.startswith(expected))
    for name in left:
        if name.startswith("exportir-fuzz-"):
            kept = shutil.move(os.path.join(root, name), outer)
            print(f"\nfuzz findings kept in {kept}")
    shutil.rmtree(root, ignore_errors=True)
    leaked = [n for n in left if not n.startswith("exportir-fuzz-")]
    if leaked:
        print(f"\ntests left {len(leaked)} scratch entries behind (removed): {', '.join(leaked[:20])}")


# -- tests of one corpus model run in one xdist worker --------------------------------------------
# `make test` runs `pytest -n 2 --dist loadgroup`: tests carrying the same xdist_group mark run in
# one worker, so what they cache per process for a model (our export, its decomposition, its
# program files, torch.export's result as the oracle) is made once, not once per worker. The real
# model suites mark their parameters themselves (group "real-<name>"); these files get a mark from
# the model parameter named here.
_MODEL_PARAMS = {  # test file (under tests/) -> the parameter naming a corpus model
    "export/test_fidelity.py": "key",  # "real:<name>" / "export:<name>"
    "export/test_oracle.py": "name",
    "export/test_exported_program.py": "name",
    "export/test_corpus.py": "name",
    "export/test_inplace_views.py": "name",
}


def _model_group(path: str, value: str) -> str:
    if ":" in value:  # a fidelity key: join the real-model suites' groups
        return value.replace(":", "-", 1)
    return f"{path.split('/')[-1].removesuffix('.py')}-{value}"


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = item.path.relative_to(_TESTS).as_posix()
        param = _MODEL_PARAMS.get(path)
        if param is None or item.get_closest_marker("xdist_group") is not None:
            continue
        value = getattr(item, "callspec", None) and item.callspec.params.get(param)
        if isinstance(value, str):
            item.add_marker(pytest.mark.xdist_group(_model_group(path, value)))


# -- which int8 kernels the fused CPU backend runs (runtime/backends/fused_cpu/int8_float.py) ----


def _int8_askers():
    """The modules that ask ``int8_float.exact_int8_products()`` which kernels to run."""
    from exportir.runtime.backends.fused_cpu import dynamic_int8, int8_float, quantized

    return int8_float, dynamic_int8, quantized


@pytest.fixture
def saturating_cpu(monkeypatch):
    """Run the test as on a CPU without VNNI, where oneDNN's and fbgemm's uint8 x int8
    products saturate and the backend computes int8 ops in float32 (any CPU can run that)."""
    for module in _int8_askers():
        monkeypatch.setattr(module, "exact_int8_products", lambda: False)


@pytest.fixture
def exact_cpu():
    """The test checks oneDNN's / fbgemm's own int8 kernels: it needs a CPU where their
    products are exact (AVX-512 VNNI or AMX)."""
    if not _int8_askers()[0].exact_int8_products():
        pytest.skip("this CPU has no AVX-512 VNNI / AMX: oneDNN's and fbgemm's int8 products "
                    "saturate, so the backend does not run them (the saturating_cpu tests "
                    "cover what runs instead)")
