"""The HTML page: one self-contained file, every script and style inline, no network.

Data goes into a ``<script type="application/json">`` block with ``<``, ``>``, ``&`` and the JS
line separators escaped, so no text from a graph (node names, source lines, file contents) can
close the block or become markup; the viewer script puts it on the page only as text. The
page's Content-Security-Policy allows no network access and only the page's own two scripts
(by hash), so a script smuggled into the page would not run either.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
from functools import cache
from importlib import resources
from typing import Any

__all__ = ["DAGRE_VERSION", "render_page", "script_json"]

DAGRE_VERSION = "3.1.3"
_JSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028",
                 "\u2029": "\\u2029"}

_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="exportir viewer (layout: dagre {dagre_version})">
<title>{title}</title>
<style>{css}</style>
</head>
<body>
<header>
<h1 id="title">{title}</h1>
<span class="stats" id="stats"></span>
<div class="tools">
<input id="search" type="search" placeholder="find node by name" aria-label="find node by name">
<button id="fit" type="button">fit</button>
<button id="expand-all" type="button">expand all</button>
<button id="collapse-all" type="button">collapse all</button>
<button id="memory-toggle" type="button">memory plan</button>
</div>
</header>
<nav id="tabs"></nav>
<main>
<div id="stage"><svg id="canvas" xmlns="http://www.w3.org/2000/svg"></svg><div id="memory"></div></div>
<aside id="details"></aside>
</main>
<script type="application/json" id="exportir-data">{data}</script>
<script>{dagre}</script>
<script>{viewer}</script>
</body>
</html>
"""


def script_json(value: Any) -> str:
    """JSON text safe inside a ``<script>`` element (cannot end it or start a comment)."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return "".join(_JSON_ESCAPES.get(c, c) for c in text)


@cache
def _static(name: str) -> str:
    text = resources.files("exportir.viewer").joinpath("static", name).read_text("utf-8")
    # a source-map comment would make developer tools look for a file next to the page
    return "\n".join(line for line in text.splitlines() if not line.startswith("//# sourceMappingURL"))


def _hash(script: str) -> str:
    digest = hashlib.sha256(script.encode("utf-8")).digest()
    return f"'sha256-{base64.b64encode(digest).decode()}'"


def render_page(model: dict[str, Any]) -> str:
    """The page for a view model (``PageModel.to_json()``)."""
    dagre, viewer = _static("dagre.min.js"), _static("viewer.js")
    for name, script in (("dagre.min.js", dagre), ("viewer.js", viewer)):
        if "</script" in script.lower():
            raise RuntimeError(f"exportir/viewer/static/{name} contains '</script'; it cannot "
                               "be inlined into the page")
    csp = (f"default-src 'none'; script-src {_hash(dagre)} {_hash(viewer)}; "
           "style-src 'unsafe-inline'; img-src data:")
    return _TEMPLATE.format(
        csp=csp, dagre_version=DAGRE_VERSION, title=html.escape(model["title"]),
        css=_static("viewer.css"), data=script_json(model), dagre=dagre, viewer=viewer,
    )
