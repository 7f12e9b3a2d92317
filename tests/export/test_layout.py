"""The rooms of ``exportir.export`` (docs/export.md, "Layout") import only rooms below them.

Every import of an ``exportir.export`` module is read from the source, wherever it stands: at
the top of a module, inside a function, or under ``if TYPE_CHECKING``. Three rules:

- a room imports only itself and the rooms below it (type-only imports included);
- no function-local import crosses rooms, except the few listed in ``LOCAL_IMPORTS_ALLOWED``;
- the modules have no import cycle (imports that run: top-level and function-local ones).
"""

from __future__ import annotations

import ast
import importlib
import pathlib
from dataclasses import dataclass

import pytest

EXPORT = pathlib.Path(__file__).resolve().parents[2] / "src" / "exportir" / "export"
PACKAGE = "exportir.export"

# bottom to top; a room may import the rooms before it in this list
ROOM_ORDER = ("signature", "dynamic", "capture", "control_flow", "program", "serialize", "api")

# top-level modules of exportir/export/ that are not rooms themselves
_TOP_MODULES = {
    "signature": "signature",
    "_export": "api",
    "_draft": "api",
    "__init__": "api",
    "exported_program": "api",  # public facade of program/ (torch.export.exported_program)
    "dynamic_shapes": "api",  # public facade of dynamic/ (torch.export.dynamic_shapes)
}

# (importing module, imported module) -> why the import has to wait until the function runs
LOCAL_IMPORTS_ALLOWED: dict[tuple[str, str], str] = {}


@dataclass(frozen=True, slots=True)
class Import:
    source: str  # dotted name of the importing module
    target: str  # dotted name of the imported module (or package)
    line: int
    where: str  # "top", "local" (inside a function) or "typing" (under TYPE_CHECKING)


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(EXPORT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([PACKAGE, *parts])


def _where(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> str:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return "local"
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return "typing"
    return "top"


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _targets(node: ast.AST, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        base = _resolve(module, node, is_package)
        # `from pkg import name`: name may be a submodule; the room check handles both
        return [base, *(f"{base}.{alias.name}" for alias in node.names)]
    return []


def imports_of(path: pathlib.Path, module: str | None = None) -> list[Import]:
    module = module or _module_name(path)
    tree = ast.parse(path.read_text(), filename=str(path))
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    found = []
    for node in ast.walk(tree):
        for target in _targets(node, module, path.name == "__init__.py"):
            if target == PACKAGE or target.startswith(PACKAGE + "."):
                found.append(Import(module, target, node.lineno, _where(node, parents)))
    return found


def room_of(dotted: str) -> str:
    """The room of ``exportir.export[.x[.y]]``; names of the package itself are the api room."""
    rest = dotted.removeprefix(PACKAGE).lstrip(".").split(".")
    head = rest[0] if rest[0] else "__init__"
    if head in _TOP_MODULES:
        return _TOP_MODULES[head]
    if (EXPORT / head).is_dir():
        return head
    return "api"  # a name defined by exportir/export/__init__.py


def _all_imports() -> list[Import]:
    return [imp for path in _modules() for imp in imports_of(path)]


def _module_of(target: str, modules: set[str]) -> str | None:
    """The module an import loads last (`from pkg.mod import name` -> pkg.mod)."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def test_every_module_is_in_a_room():
    for path in _modules():
        assert room_of(_module_name(path)) in ROOM_ORDER, path


def _modules() -> list[pathlib.Path]:
    return sorted(EXPORT.rglob("*.py"))


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(EXPORT)))
def test_rooms_import_only_rooms_below(path):
    room = ROOM_ORDER.index(room_of(_module_name(path)))
    upward = sorted(
        {f"line {i.line}: {i.target} ({room_of(i.target)})" for i in imports_of(path)
         if ROOM_ORDER.index(room_of(i.target)) > room}
    )
    assert not upward, (
        f"{path.relative_to(EXPORT)} ({ROOM_ORDER[room]}) imports rooms above it "
        f"(order: {' < '.join(ROOM_ORDER)}): {upward}"
    )


def test_no_function_local_imports_across_rooms():
    modules = {_module_name(p) for p in _modules()}
    unlisted = sorted({
        (imp.source, _module_of(imp.target, modules), imp.line)
        for imp in _all_imports()
        if imp.where == "local" and room_of(imp.source) != room_of(imp.target)
        and (imp.source, _module_of(imp.target, modules)) not in LOCAL_IMPORTS_ALLOWED
    })
    assert not unlisted, f"function-local imports across rooms: {unlisted}"


def _runtime_graph() -> dict[str, set[str]]:
    modules = {_module_name(p) for p in _modules()}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for imp in _all_imports():
        target = _module_of(imp.target, modules)
        if imp.where != "typing" and target not in (None, imp.source):
            graph[imp.source].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (as a path that returns to its start), or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycles():
    cycle = find_cycle(_runtime_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_checker_sees_what_it_checks(tmp_path):
    fake = tmp_path / "m.py"
    fake.write_text(
        "from typing import TYPE_CHECKING\n"
        "from exportir.export.signature import InputKind\n"
        "if TYPE_CHECKING:\n    from exportir.export.program.exported_program import X\n"
        "def f():\n    from . import rules\n"
    )
    found = {(i.target, i.where) for i in imports_of(fake, "exportir.export.capture.m")}
    assert ("exportir.export.signature", "top") in found
    assert ("exportir.export.program.exported_program", "typing") in found
    assert ("exportir.export.capture.rules", "local") in found
    assert room_of("exportir.export.program.exported_program.ExportedProgram") == "program"
    assert room_of("exportir.export.export") == "api"
    assert room_of("exportir.export.signature.InputKind") == "signature"
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


# torch's public module -> (our module, names it must offer)
PUBLIC_MODULES = {
    "torch.export.exported_program": (
        "exportir.export.exported_program",
        ("ExportedProgram", "ModuleCallEntry", "ModuleCallSignature", "default_decompositions"),
    ),
    "torch.export.dynamic_shapes": ("exportir.export.dynamic_shapes", ("Dim", "ShapesCollection", "dims")),
    "torch.export.graph_signature": (
        "exportir.export.signature",
        ("ExportGraphSignature", "InputKind", "InputSpec", "OutputKind", "OutputSpec", "TensorArgument"),
    ),
}


@pytest.mark.parametrize("theirs", sorted(PUBLIC_MODULES))
def test_torch_public_module_paths_exist(theirs):
    ours, names = PUBLIC_MODULES[theirs]
    torch_module, our_module = importlib.import_module(theirs), importlib.import_module(ours)
    export = importlib.import_module(PACKAGE)
    for name in names:
        assert hasattr(torch_module, name), f"{theirs} has no {name}: the table is stale"
        assert getattr(our_module, name) is getattr(export, name, getattr(our_module, name))
