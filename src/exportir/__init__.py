"""exportir: capture PyTorch programs into Export IR, lower them, and run them.

The FX toolkit lives in :mod:`exportir.fx` (a drop-in for ``torch.fx``); the pytree utilities in
:mod:`exportir.pytree`. Capture, dialects, program files and the runtime come in later layers.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
