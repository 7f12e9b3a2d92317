"""``_LazyGraphModule``: a GraphModule that generates its code when something needs it.

As ``torch.fx._lazy_graph_module._LazyGraphModule``: ``recompile()`` only marks the code as
out of date (and returns None); the code is generated on first use -- a call, ``forward``,
``code``, ``str()``, pickling -- or by :meth:`real_recompile`. Graph modules that are built and
handed on without ever running (export's intermediate modules, an ``ExportedProgram``'s module
until it is printed or run) skip code generation that nobody reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch.package import sys_importer

from exportir.fx.graph_module import (
    GraphModule,
    _format_import_block,
    reduce_graph_module,
    reduce_package_graph_module,
)

if TYPE_CHECKING:
    from torch.package import PackageExporter

    from exportir.fx.codegen import PythonCode

__all__ = ["_LazyGraphModule"]


class _LazyGraphModule(GraphModule):
    """A GraphModule whose ``recompile()`` is deferred until the code is used."""

    @classmethod
    def from_graphmodule(cls, gm: GraphModule) -> GraphModule:
        return gm if isinstance(gm, _LazyGraphModule) else _LazyGraphModule(gm, gm.graph)

    @staticmethod
    def force_recompile(gm: GraphModule) -> None:
        if isinstance(gm, _LazyGraphModule):
            gm.real_recompile()

    def real_recompile(self) -> None:
        """Generate the code now if it is out of date."""
        if self._needs_recompile():
            self._real_recompile()

    @classmethod
    def _needs_recompile(cls) -> bool:
        # (the class dict: looking ``forward`` up would compile a generated one)
        return vars(cls).get("forward") is _LazyGraphModule._lazy_forward

    def _lazy_forward(self, *args: Any, **kwargs: Any) -> Any:
        self.real_recompile()
        if self._needs_recompile():
            raise AssertionError("Recompilation required after real_recompile()")
        return self(*args, **kwargs)

    forward = _lazy_forward

    def _real_recompile(self) -> PythonCode:
        return super().recompile()

    @classmethod
    def recompile(cls) -> None:  # type: ignore[override]  # torch's lazy recompile returns None
        cls.forward = cls._lazy_forward

    @property
    def code(self) -> str:
        self.real_recompile()
        return super().code

    def __str__(self) -> str:
        self.real_recompile()
        return super().__str__()

    # (GraphModule's versions read what ``recompile()`` returns, None here)
    def __reduce__(self) -> tuple[Any, ...]:
        python_code = self._real_recompile()
        state = self.__dict__.copy()
        del state["_graph"]
        import_block = _format_import_block(python_code.globals, sys_importer)
        return (reduce_graph_module, (state, import_block))

    def __reduce_package__(self, exporter: PackageExporter) -> tuple[Any, ...]:
        python_code = self._real_recompile()
        state = self.__dict__.copy()
        state["_graphmodule_cls_name"] = self.__class__.__name__
        del state["_graph"]
        state["_graphmodule_graph_node_meta_stack_trace"] = {
            node.name: node.meta["stack_trace"]
            for node in self.graph.nodes
            if "stack_trace" in node.meta
        }
        generated_module_name = f"fx-generated._{exporter.get_unique_id()}"
        import_block = _format_import_block(python_code.globals, exporter.importer)
        exporter.save_source_string(generated_module_name, import_block + self.code)
        return (reduce_package_graph_module, (state, generated_module_name))
