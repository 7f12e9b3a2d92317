"""Helpers shared by passes: subgraph matching."""
