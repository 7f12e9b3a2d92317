"""Backends shipped with exportir (one package each).

- ``fused_cpu``: fused ATen subgraphs on CPU; its device side ships with the runtime
  (``exportir.runtime.backends.fused_cpu``, in the default delegate registry).
"""
