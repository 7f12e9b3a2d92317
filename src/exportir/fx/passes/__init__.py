"""Graph passes over FX GraphModules (the subset of ``torch.fx.passes`` exportir provides)."""

from exportir.fx.passes import reinplace, runtime_assert, shape_prop, split_module

__all__ = ["reinplace", "runtime_assert", "shape_prop", "split_module"]
