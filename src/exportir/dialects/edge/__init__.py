"""The Edge dialect (seed 001): core ATen operators specialised with dtype constraints.

- :mod:`~exportir.dialects.edge.ops`: ``ops.edge.aten.<op>.<overload>`` edge operators whose
  ``_schema`` arguments/returns carry ``allowed_types``;
- :mod:`~exportir.dialects.edge.constraints`: the generated table ``edge.yaml`` (YAML DSL of
  seed 001), its loader and the per-node dtype check;
- :mod:`~exportir.dialects.edge.verifier`: ``EdgeVerifier``, the dialect's verifier.
"""

from exportir.dialects.edge.ops import EdgeOpOverload, EdgeOpOverloadPacket, ops

__all__ = ["EdgeOpOverload", "EdgeOpOverloadPacket", "ops"]
