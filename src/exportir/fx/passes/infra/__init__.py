"""Pass infrastructure: ``PassBase``/``PassResult`` and ``PassManager``."""

from exportir.fx.passes.infra import pass_manager

__all__ = ["pass_manager"]
