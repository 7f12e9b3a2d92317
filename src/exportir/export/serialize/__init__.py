"""exportir.export.serialize: see docs/export.md, "Layout"."""
