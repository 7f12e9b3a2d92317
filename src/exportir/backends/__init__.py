"""Backends shipped with exportir (one package each).

- ``fused_cpu``: fused ATen subgraphs on CPU; its device side,
  ``exportir.backends.fused_cpu.runtime``, imports nothing of the compiler.
"""
