"""Backend executors the runtime ships: each module here is the device side of one backend
(``init`` / ``execute``), imports only torch, the standard library and the program format, and is
registered by :func:`exportir.runtime.default_delegate_registry` under its backend id.

- :mod:`exportir.runtime.backends.fused_cpu`: the fused CPU backend (``"FusedCpuBackend"``),
  whose compile side is :mod:`exportir.backends.fused_cpu`.
"""
