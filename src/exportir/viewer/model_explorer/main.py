"""The Model Explorer extension module (Model Explorer loads ``<extension>.main``)."""

from __future__ import annotations

from typing import Any

from model_explorer import Adapter, AdapterMetadata

from exportir.viewer.model_explorer import to_graphs


class ExportirAdapter(Adapter):
    """``.xpt`` program files and ``.pt2`` exported programs, read by exportir's loaders."""

    metadata = AdapterMetadata(
        id="exportir",
        name="exportir adapter",
        description="exportir program files (.xpt) and exported programs (.pt2)",
        fileExts=["xpt", "pt2"],
    )

    def __init__(self) -> None:
        super().__init__()

    def convert(self, model_path: str, settings: dict[str, Any]) -> dict[str, Any]:
        return to_graphs(model_path)
