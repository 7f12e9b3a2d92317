"""exportir.export.program: see docs/export.md, "Layout"."""
