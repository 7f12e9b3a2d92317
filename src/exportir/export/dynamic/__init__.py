"""exportir.export.dynamic: see docs/export.md, "Layout"."""
