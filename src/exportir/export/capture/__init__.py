"""exportir.export.capture: see docs/export.md, "Layout"."""
