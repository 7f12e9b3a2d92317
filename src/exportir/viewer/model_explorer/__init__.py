"""Our graphs in Google's Model Explorer (``pip install "exportir[model-explorer]"``).

::

    import model_explorer
    from exportir.viewer import model_explorer as me

    me.visualize(ep)                                  # any stage object exportir.viewer takes
    model_explorer.visualize("model.xpt", extensions=["exportir.viewer.model_explorer"])

The extension (``main.Adapter``) converts ``.xpt`` and ``.pt2`` files; :func:`to_graphs` converts
any stage object. Graphs are the same as the HTML viewer's (:func:`exportir.viewer.page_model`):
modules become Model Explorer namespaces (``model/layers.0/self_attn``), delegate and
control-flow subgraphs become subgraphs, details become node attributes. Model Explorer is
imported only when these functions run.
"""

from __future__ import annotations

from typing import Any

from exportir.viewer.model import GraphView

__all__ = ["add_to_config", "to_graphs", "visualize"]

_COLORS = {"input": "#e3f5e6", "param": "#f1f1f4", "output": "#fde8e6", "delegate": "#fff1dc"}


def _namespace(module: list[tuple[str, str]]) -> str:
    """``model/layers.0/self_attn`` from the module paths ``model``, ``model.layers.0``, ..."""
    parts, parent = [], ""
    for path, _ in module:
        parts.append(path[len(parent) + 1:] if parent and path.startswith(parent + ".") else path)
        parent = path
    return "/".join(p.replace("/", "_") for p in parts)


def _graph(gb: Any, view: GraphView) -> Any:
    nodes = []
    for n in view.nodes:
        value = dict(n.details).get("value", "")
        node = gb.GraphNode(
            id=str(n.id), label=n.label, namespace=_namespace(n.module),
            subgraphIds=[gid for _, gid in n.opens],
            attrs=[gb.KeyValue(key=k, value=v) for k, v in n.details] + [
                gb.KeyValue(key="kind", value=n.kind)],
            incomingEdges=[gb.IncomingEdge(sourceNodeId=str(i), targetNodeInputId=str(k))
                           for k, i in enumerate(n.inputs)],
            outputsMetadata=[gb.MetadataItem(id="0", attrs=[
                gb.KeyValue(key="tensor_shape", value=value)])] if value else [],
        )
        if n.kind in _COLORS:
            node.style = gb.GraphNodeStyle(backgroundColor=_COLORS[n.kind])
        nodes.append(node)
    return gb.Graph(id=view.id, nodes=nodes)


def to_graphs(obj: Any, title: str | None = None) -> dict[str, Any]:
    """Model Explorer graphs (``{"graphs": [...]}``) of anything :func:`exportir.viewer.to_html`
    takes; graph ids are the HTML viewer's (``g0``, ``g1``, ...)."""
    from model_explorer import graph_builder as gb

    from exportir.viewer import page_model

    page = page_model(obj, title)
    return {"graphs": [_graph(gb, g) for g in page.graphs]}


def add_to_config(config: Any, name: str, obj: Any) -> Any:
    """Add ``obj``'s graphs to a ``model_explorer.config()`` under ``name`` (as Model Explorer's
    own ``add_model_from_pytorch`` does) and return the config."""
    index = len(config.graphs_list)
    config.graphs_list.append(to_graphs(obj, name))
    config.model_sources.append({"url": f"graphs://{name}/{index}"})
    return config


def visualize(obj: Any, name: str = "exportir", **kwargs: Any) -> None:
    """Start Model Explorer on ``obj``'s graphs (``kwargs`` go to
    ``model_explorer.visualize_from_config``: host, port, ...)."""
    import model_explorer

    model_explorer.visualize_from_config(add_to_config(model_explorer.config(), name, obj),
                                         **kwargs)
