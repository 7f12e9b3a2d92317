"""exportir.export.control_flow: see docs/export.md, "Layout"."""
