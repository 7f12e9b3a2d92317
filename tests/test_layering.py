"""Import boundaries of DESIGN.md: src/ never imports torch's own capture/FX stack, and the
packages only import downwards (fx sees nothing of exportir but pytree)."""

import ast
import pathlib

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "exportir"

FORBIDDEN_TORCH = (
    "torch.fx",
    "torch.export",
    "torch._export",
    "torch._dynamo",
    "torch._functorch",
    "torch._subclasses",
    "torch.ao",  # imports torch.fx
    "torchao",
)

# package -> exportir packages it may import (besides itself)
_CAPTURE = {"pytree", "fx", "symbolic", "export"}
ALLOWED_INTERNAL = {
    "pytree": set(),
    "symbolic": set(),
    "fx": {"pytree"},
    "export": {"pytree", "fx", "symbolic"},
    "dialects": _CAPTURE,
    "passes": _CAPTURE | {"dialects"},
    # the program file formats: shared by the emitter and the runtime, import nothing else
    "format": set(),
    "program": _CAPTURE | {"dialects", "passes", "backends", "format"},
    "backends": _CAPTURE | {"dialects", "passes", "program", "runtime", "format"},
    # the runtime sees only the program format (finer rule: tests/runtime/test_imports.py)
    "runtime": {"format"},
    "quantization": _CAPTURE | {"program", "format"},
    # graph pictures of every stage: reads them all, nothing imports it but the CLI
    "viewer": _CAPTURE | {"dialects", "passes", "program", "backends", "runtime", "format"},
}


def _imports(path: pathlib.Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return found


def _source_files() -> list[pathlib.Path]:
    return sorted(SRC.rglob("*.py"))


def _is_forbidden(name: str) -> bool:
    return any(name == f or name.startswith(f + ".") for f in FORBIDDEN_TORCH)


@pytest.mark.parametrize("path", _source_files(), ids=lambda p: str(p.relative_to(SRC)))
def test_no_torch_export_stack_imports(path):
    bad = [(line, name) for line, name in _imports(path) if _is_forbidden(name)]
    assert not bad, f"{path}: imports torch's own export stack: {bad}"


def _package_of(path: pathlib.Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0].removesuffix(".py")


@pytest.mark.parametrize("path", _source_files(), ids=lambda p: str(p.relative_to(SRC)))
def test_imports_point_down(path):
    package = _package_of(path)
    allowed = ALLOWED_INTERNAL.get(package)
    if allowed is None:
        return  # packages not listed yet are checked once they exist in ALLOWED_INTERNAL
    for line, name in _imports(path):
        if not name.startswith("exportir."):
            continue
        target = name.split(".")[1]
        assert target == package or target in allowed, (
            f"{path}:{line}: {package} may not import exportir.{target}"
        )


def test_checker_sees_forbidden_imports(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch.fx\nfrom torch._subclasses import FakeTensor\n")
    names = [n for _, n in _imports(bad)]
    assert _is_forbidden(names[0]) and any(_is_forbidden(n) for n in names[1:])


# Modules of the forbidden stacks that src/ loads by name (importlib), each with its reason.
NAMED_IMPORTS = {
    "format/quantized_ops.py": {
        # torch's own quantized_decomposed op definitions (no tracing): importing them first lets
        # exportir and torch.ao / torchao define the ops in one process (DEF library clash)
        "torch.ao.quantization.fx._decomposed",
    },
}


def _loaded_by_name(tree: ast.Module) -> set[str]:
    """Module names passed to importlib.import_module / __import__ (literals, or module-level
    string constants)."""
    constants = {
        t.id: node.value.value
        for node in tree.body if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        for t in node.targets if isinstance(t, ast.Name)
    }
    names = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if called not in ("import_module", "__import__"):
            continue
        arg = node.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            names.add(arg.value)
        elif isinstance(arg, ast.Name) and arg.id in constants:
            names.add(constants[arg.id])
    return names


@pytest.mark.parametrize("path", _source_files(), ids=lambda p: str(p.relative_to(SRC)))
def test_forbidden_modules_loaded_by_name_are_the_listed_ones(path):
    rel = str(path.relative_to(SRC))
    tree = ast.parse(path.read_text(), filename=str(path))
    named = {name for name in _loaded_by_name(tree) if _is_forbidden(name)}
    assert named == NAMED_IMPORTS.get(rel, set()), (
        f"{rel} loads {sorted(named)} by name; NAMED_IMPORTS lists "
        f"{sorted(NAMED_IMPORTS.get(rel, set()))}: list each with its reason, or do not load it"
    )
