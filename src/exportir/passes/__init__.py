"""Passes between dialects and generic graph passes, each small with a stated contract.

- :mod:`~exportir.passes.view_copy`: view ops -> ``*_copy`` ops (copy semantics);
- :mod:`~exportir.passes.scalar_to_tensor`: Python scalars in ``Tensor`` positions -> lifted
  constant tensors;
- :mod:`~exportir.passes.to_edge`: ATen ops -> edge ops, removal of assertion ops.

``exportir.program.manager.to_edge`` runs them in that order (after decomposition). Each
reaches the bodies of ``cond`` / ``map`` / ``while_loop`` nodes, nested to any depth.
"""
