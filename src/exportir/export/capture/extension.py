"""``CaptureExtension``: how a room above capture joins the traces it asks for.

Control flow builds on capture (its rules trace bodies with the Recorder), so capture cannot
import it. Instead ``capture`` and ``retrace`` take an extension: ``export`` and
``run_decompositions`` pass ``control_flow.rules.CONTROL_FLOW``. Without one, a trace records no
control-flow operators.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from exportir.fx import GraphModule

__all__ = ["NO_EXTENSION", "CaptureExtension"]


@dataclass(frozen=True, slots=True)
class CaptureExtension:
    """What a room above capture adds to the traces it asks for.

    ``mode()`` makes a context entered around the traced code (control flow's
    ``ControlFlowMode``, which records ``torch.cond`` / ``map`` / ``while_loop``); ``finish(gm,
    subgraphs)`` runs on the finished graph with the subgraphs the recorder collected
    (``Recorder.subgraphs``) and returns the graph module.
    """

    mode: Callable[[], AbstractContextManager[Any]]
    finish: Callable[[GraphModule, dict[str, GraphModule]], GraphModule]


def _unchanged(gm: GraphModule, subgraphs: dict[str, GraphModule]) -> GraphModule:
    return gm


NO_EXTENSION = CaptureExtension(nullcontext, _unchanged)
