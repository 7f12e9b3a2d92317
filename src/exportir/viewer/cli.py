"""``exportir view FILE``: write the graph page of a ``.pt2`` or ``.xpt`` file.

::

    exportir view model.xpt                 # writes model.xpt.html next to it
    exportir view model.pt2 -o graph.html
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from typing import Any

__all__ = ["add_parser", "cmd_view"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("view", help="write a self-contained HTML picture of a .pt2 / .xpt file's "
                                    "graphs (module groups, delegates, memory plan)")
    p.add_argument("path", help="a .pt2 (ExportedProgram) or .xpt (program) file")
    p.add_argument("-o", "--output", help="page to write (default: PATH.html)")
    p.add_argument("--title", help="page title (default: the file's path)")
    p.set_defaults(func=cmd_view)


def _usage_error(message: str) -> int:
    print(f"exportir: error: {message}", file=sys.stderr)
    return 2


def cmd_view(ns: argparse.Namespace) -> int:
    """Exit status 2 for what the user can fix (missing file, unknown kind);
    a malformed file raises the loader's error, which ``exportir.cli.main`` reports."""
    from exportir.viewer import ViewerError, view

    source = pathlib.Path(ns.path)
    out = pathlib.Path(ns.output) if ns.output else source.with_name(source.name + ".html")
    if not source.is_file():
        return _usage_error(f"{source}: no such file")
    if out.suffix.lower() not in (".html", ".htm"):
        return _usage_error(f"{out}: the page is HTML; name the output file .html")
    try:
        written = view(source, out, title=ns.title)
    except (ViewerError, NotImplementedError) as exc:
        return _usage_error(str(exc))
    print(f"wrote {written} ({written.stat().st_size} bytes); open it in a browser")
    return 0
