"""Public module path of ``torch.export.dynamic_shapes``: ``Dim``, ``dims``, ``ShapesCollection``.

The code lives in the dynamic-shapes room (``exportir/export/dynamic/``); this module only names
its public classes where torch users look for them.
"""

from exportir.export.dynamic.dims import Dim, ShapesCollection, dims

__all__ = ["Dim", "ShapesCollection", "dims"]
