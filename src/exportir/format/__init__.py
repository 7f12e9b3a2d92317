"""exportir.format: the program file formats, shared by the emitter and the runtime.

``schema`` (frozen dataclasses: the closed instruction union, values, allocations),
``serialize`` / ``_codec`` (our ``.xpt`` file), ``validate`` (load-time checks and limits),
``planning`` (memory plans and their verifier), ``work`` (per-call work estimates) and
``quantized_ops`` (the ``quantized_decomposed`` operators programs name). Imports nothing of
exportir outside this package, so the runtime can read files without the compiler.
"""
