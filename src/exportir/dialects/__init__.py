"""Export IR dialects: each owns its operator table, its traits and its verifier.

- :mod:`exportir.dialects.edge`: the Edge dialect (dtype-specialised ATen ops, seed 001).
"""
