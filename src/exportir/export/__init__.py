"""exportir.export: capture nn.Modules into ExportedPrograms (ATen dialect)."""
