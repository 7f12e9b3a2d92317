"""Graph passes over FX GraphModules (the subset of ``torch.fx.passes`` exportir provides)."""

from exportir.fx.passes import reinplace, shape_prop, split_module

__all__ = ["reinplace", "shape_prop", "split_module"]
