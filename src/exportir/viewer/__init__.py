"""Graph pictures of every stage, as one self-contained HTML page (``docs/viewer.md``).

::

    exportir.viewer.view(ep, "model.html")      # write the page; returns its path
    html = exportir.viewer.to_html(edge)        # or take the text

Accepted: an ``ExportedProgram``; an ``EdgeProgramManager`` (also what
``to_edge_transform_and_lower`` returns, delegates included); a ``ProgramManager`` (the
``to_program()`` result: its Edge graphs and its instructions with the memory plan); a
``GraphModule`` or an FX ``Graph``; a ``LoweredBackendModule``; a program (``schema.Program``
or a loaded ``exportir.runtime.Program``); or the path of a ``.pt2`` / ``.xpt`` / ``.pte`` file.

The page lays the graph out top to bottom (dagre, inlined), groups nodes by the module that ran
them (``nn_module_stack``) in groups that fold and unfold, shows a node's op, shapes, dtypes and
source line on click, opens delegates (their Edge subgraph and, for backends whose blob format
is known, the blob's program) and draws a program's memory plan as buffers over instructions.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable
from typing import Any

from exportir.viewer.model import PageModel

__all__ = ["LOADERS", "ViewerError", "load_file", "page_model", "to_html", "view"]


def _load_pt2(path: str) -> Any:
    from exportir.export import load

    return load(path)


def _load_xpt(path: str) -> Any:
    from exportir.format.serialize import load as load_program

    return load_program(path)


def _load_pte(path: str) -> Any:
    """An ExecuTorch ``.pte`` (what ``to_program().save("m.pte")`` or ExecuTorch's own
    ``to_executorch()`` writes), decoded and validated as the runtime loads it."""
    from exportir.format import pte_read
    from exportir.format.validate import validate_program

    with open(path, "rb") as f:
        data = f.read()
    program = pte_read.read_pte(data)
    validate_program(program)
    return program


# file suffix -> the project's validating loader for it
LOADERS: dict[str, Callable[[str], Any]] = {
    ".pt2": _load_pt2, ".xpt": _load_xpt, ".pte": _load_pte,
}
SUFFIXES = tuple(LOADERS)


class ViewerError(ValueError):
    """The object or file cannot be shown; the message says what is accepted."""


def load_file(path: str | os.PathLike[str]) -> Any:
    """The stage object a file holds, read with the project's validating loaders
    (:data:`LOADERS`): ``.pt2`` -> ``ExportedProgram`` (``exportir.load``), ``.xpt`` ->
    ``schema.Program`` (the program-file loader the runtime uses). Never runs code from the
    file."""
    p = pathlib.Path(path)
    loader = LOADERS.get(p.suffix.lower())
    if loader is None:
        raise ViewerError(f"{p}: cannot tell what the file holds from its suffix "
                          f"{p.suffix.lower()!r}; expected one of {', '.join(SUFFIXES)}")
    return loader(str(p))


def _title(obj: Any) -> str:
    return type(obj).__name__


def _fill(page: PageModel, obj: Any) -> None:
    """Add ``obj``'s graphs to ``page`` (dispatch on what the object has, not on its class, so
    this module imports no compiler stage it does not need)."""
    from exportir.viewer.fx_view import add_exported_program, add_fx_graph, add_lowered_module
    from exportir.viewer.program_view import add_program

    if hasattr(obj, "schema") and hasattr(obj.schema, "methods"):  # runtime Program
        obj = obj.schema
    if hasattr(obj, "methods") and hasattr(obj, "delegates") and hasattr(obj, "constants"):
        add_program(page, obj, "program")
    elif hasattr(obj, "program") and hasattr(obj, "exported_program") and hasattr(obj, "buffer"):
        modules = {}
        for name in sorted(obj.methods):
            graph = add_exported_program(page, f"{name} (Edge)", obj.exported_program(name))
            modules[name] = {n.name: n.module for n in graph.nodes}
        add_program(page, obj.program, "program", modules=modules)
    elif hasattr(obj, "exported_program") and hasattr(obj, "methods"):  # EdgeProgramManager
        for name in sorted(obj.methods):
            add_exported_program(page, f"{name} (Edge)", obj.exported_program(name))
    elif hasattr(obj, "graph_signature") and hasattr(obj, "graph_module"):  # ExportedProgram
        add_exported_program(page, "ExportedProgram", obj)
    elif hasattr(obj, "backend_id") and hasattr(obj, "processed_bytes"):  # LoweredBackendModule
        graph = page.new_graph(f"lowered module ({obj.backend_id})")
        node = graph.add("lowered_module", f"delegate {obj.backend_id}", "delegate",
                         details=[("name", "lowered_module"), ("op", "delegate")])
        add_lowered_module(page, graph.id, node, obj, "lowered_module")
    elif hasattr(obj, "graph") and hasattr(obj.graph, "nodes"):  # GraphModule
        add_fx_graph(page, page.new_graph(type(obj).__name__), obj.graph, obj)
    elif hasattr(obj, "nodes") and hasattr(obj, "owning_module"):  # fx Graph
        add_fx_graph(page, page.new_graph("Graph"), obj, obj.owning_module)
    else:
        raise ViewerError(
            f"cannot view a {type(obj).__name__}: pass an ExportedProgram, an "
            "EdgeProgramManager, a ProgramManager (to_program()), a GraphModule or Graph, a "
            "LoweredBackendModule, a program (schema or runtime Program), or the path of a "
            f"{' / '.join(SUFFIXES)} file")


def page_model(obj: Any, title: str | None = None) -> PageModel:
    """The view model of ``obj`` (see the module docstring for what ``obj`` may be)."""
    name = title
    if isinstance(obj, (str, os.PathLike)):
        name = name or os.fspath(obj)
        obj = load_file(obj)
    page = PageModel(name or _title(obj))
    _fill(page, obj)
    return page


def to_html(obj: Any, *, title: str | None = None) -> str:
    """The self-contained HTML page showing ``obj``."""
    from exportir.viewer.page import render_page

    return render_page(page_model(obj, title).to_json())


def view(obj: Any, path: str | os.PathLike[str], *, title: str | None = None) -> pathlib.Path:
    """Write the page showing ``obj`` to ``path`` (UTF-8) and return the path."""
    out = pathlib.Path(path)
    out.write_text(to_html(obj, title=title), encoding="utf-8")
    return out
