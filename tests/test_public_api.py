"""The public surface of ``exportir``: ``__all__`` is pinned, every name resolves, and importing
the package (or a leaf like ``exportir.pytree``) loads nothing heavy until a name is used."""

import inspect
import os
import pathlib
import subprocess
import sys

import exportir

EXPECTED_ALL = {
    "__version__",
    "export",
    "draft_export",
    "unflatten",
    "save",
    "load",
    "from_torch",
    "register_dataclass",
    "ExportedProgram",
    "ExportGraphSignature",
    "ExportBackwardSignature",
    "ModuleCallEntry",
    "ModuleCallSignature",
    "default_decompositions",
    "SpecViolationError",
    "Dim",
    "dims",
    "ShapesCollection",
    "to_edge",
    "to_edge_transform_and_lower",
    "EdgeProgramManager",
    "ProgramManager",
    "EdgeCompileConfig",
}


def test_all_is_pinned():
    assert set(exportir.__all__) == EXPECTED_ALL
    assert len(exportir.__all__) == len(set(exportir.__all__))


def test_every_public_name_resolves():
    for name in exportir.__all__:
        assert getattr(exportir, name) is not None, name


def test_unknown_attribute_is_an_attribute_error():
    try:
        exportir.no_such_thing  # noqa: B018
    except AttributeError as e:
        assert "no_such_thing" in str(e)
    else:
        raise AssertionError("expected AttributeError")


def test_export_signature_matches_torch():
    import torch.export

    ours = inspect.signature(exportir.export)
    theirs = inspect.signature(torch.export.export)
    assert list(ours.parameters) == list(theirs.parameters)
    for name, p in ours.parameters.items():
        assert p.kind == theirs.parameters[name].kind, name


def test_draft_export_and_unflatten_signatures_match_torch():
    import torch.export

    for ours, theirs in [(exportir.draft_export, torch.export.draft_export),
                         (exportir.unflatten, torch.export.unflatten)]:
        ours_p, theirs_p = inspect.signature(ours).parameters, inspect.signature(theirs).parameters
        assert list(ours_p) == list(theirs_p), ours.__name__
        for name, p in ours_p.items():
            assert p.kind == theirs_p[name].kind, name


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print('\\n'.join(sorted(sys.modules)))"
    src = str(pathlib.Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    return set(out.stdout.split())


def test_importing_the_package_is_lazy():
    loaded = _loaded_after("import exportir")
    assert "exportir.export" not in loaded and "exportir.fx" not in loaded


def test_importing_pytree_does_not_load_capture():
    loaded = _loaded_after("import exportir.pytree")
    assert "exportir.export" not in loaded and "exportir.fx" not in loaded


def test_unsupported_export_flag_is_refused_clearly():
    import pytest
    import torch

    with pytest.raises(NotImplementedError, match="prefer_deferred_runtime_asserts_over_guards"):
        exportir.export(torch.nn.ReLU(), (torch.ones(2),), prefer_deferred_runtime_asserts_over_guards=True)


def test_export_is_callable_after_the_subpackage_is_imported():
    # Importing exportir.export binds the package as exportir.export; it must still be the
    # export function to call, whatever was imported first.
    code = (
        "import torch, exportir, exportir.export, inspect\n"
        "ep = exportir.export(torch.nn.ReLU(), (torch.ones(2),))\n"
        "assert type(ep).__name__ == 'ExportedProgram'\n"
        "assert 'dynamic_shapes' in inspect.signature(exportir.export).parameters\n"
        "assert exportir.export.ExportedProgram is type(ep)\n"
        "print('ok')\n"
    )
    src = str(pathlib.Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
