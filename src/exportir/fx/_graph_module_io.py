"""GraphModule output outside its ``forward``: ``to_folder`` and the fast sympy printer.

Contract: :func:`_write_folder` writes ``gm`` as an importable package (``module.py`` with the
generated code, ``state_dict.pt``, pickled children that cannot be rebuilt from their repr).
:func:`_fast_sym_repr` prints a symbolic value's expression without simplifying it (the
``fast_sympy_print`` option of ``print_readable``).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.modules.module import _addindent

from exportir.fx.codegen import _custom_builtins

if TYPE_CHECKING:
    from exportir.fx.graph_module import GraphModule


# --------------------------------------------------------------------------------------------
# to_folder
# --------------------------------------------------------------------------------------------

_REPR_SAFE_MODULES = (
    nn.Linear,
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
)
_TAB = " " * 4


def _child_init_line(folder: Path, name: str, child: nn.Module, pickled: list[str]) -> str:
    """One ``__init__`` line recreating ``child``: by repr when safe, else a saved pickle."""
    if type(child) in _REPR_SAFE_MODULES:
        return f"{_TAB * 2}setattr(self, '{name}', {child!r})\n"
    child_file = folder / f"{name}.pt"
    torch.save(child, child_file)
    pickled.append(name)
    one_line_repr = repr(child).replace("\r", " ").replace("\n", " ")
    loader = f"torch.load(r'{child_file}', weights_only=False)"
    return f"{_TAB * 2}setattr(self, '{name}', {loader}) # {one_line_repr}\n"


def _tensor_init_lines(gm: nn.Module) -> str:
    """Empty buffers/parameters of the right shape and dtype, filled later by load_state_dict."""
    lines = [
        f"{_TAB * 2}self.register_buffer('{name}', "
        f"torch.empty({list(buf.shape)}, dtype={buf.dtype}))\n"
        for name, buf in gm._buffers.items()
        if buf is not None
    ]
    lines += [
        f"{_TAB * 2}setattr(self, '{name}', torch.nn.Parameter("
        f"torch.empty({list(p.shape)}, dtype={p.dtype})))\n"
        for name, p in gm._parameters.items()
        if p is not None
    ]
    return "".join(lines)


def _write_folder(gm: GraphModule, folder: Path, module_name: str) -> None:
    folder.mkdir(exist_ok=True)
    torch.save(gm.state_dict(), folder / "state_dict.pt")
    builtin_imports = "\n".join(b.import_str for b in _custom_builtins.values())
    header = (
        f"\nimport torch\n{builtin_imports}\n\nfrom torch.nn import *\n"
        f"class {module_name}(torch.nn.Module):\n"
        f"{_TAB}def __init__(self):\n{_TAB * 2}super().__init__()\n"
    )
    parts = [header]
    pickled: list[str] = []
    parts += [_child_init_line(folder, n, c, pickled) for n, c in gm.named_children()]
    parts.append(_tensor_init_lines(gm))
    parts.append(f"{_TAB * 2}self.load_state_dict(torch.load(r'{folder}/state_dict.pt'))\n")
    parts.append(f"{_addindent(gm.code, 4)}\n")
    (folder / "module.py").write_text("".join(parts))
    (folder / "__init__.py").write_text("from .module import *")
    if pickled:
        warnings.warn(
            "Was not able to save the following children modules as reprs -"
            f"saved as pickled files instead: {pickled}"
        )


# --------------------------------------------------------------------------------------------
# Fast sympy printing (print_readable(fast_sympy_print=True))
# --------------------------------------------------------------------------------------------


_SYMPY_CALL_STYLE = frozenset({"ModularIndexing", "CleanDiv", "FloorDiv", "Identity"})


def _is_negation(expr: Any) -> bool:
    return expr.is_Mul and len(expr.args) == 2 and expr.args[0] == -1


def _sym_sum_str(expr: Any) -> str:
    """Fast, non-simplifying sympy printing: ``a - b`` for a two-term difference, else
    ``+``-joined terms."""
    if not expr.is_Add:
        return _sym_product_str(expr)
    if len(expr.args) == 2 and _is_negation(expr.args[1]):
        return f"{_sym_product_str(expr.args[0])} - {_sym_product_str(expr.args[1].args[1])}"
    return " + ".join(map(_sym_product_str, expr.args))


def _sym_product_str(expr: Any) -> str:
    if not expr.is_Mul:
        return _sym_atom_str(expr)
    if _is_negation(expr):
        return f"-{_sym_atom_str(expr.args[1])}"
    return " * ".join(map(_sym_atom_str, expr.args))


def _sym_atom_str(expr: Any) -> str:
    if expr.is_Symbol:
        return expr.name
    if expr.is_Add or expr.is_Mul:
        return f"({_sym_sum_str(expr)})"
    name = getattr(expr.func, "__name__", "")
    if name in _SYMPY_CALL_STYLE:
        return f"{name}({', '.join(map(_sym_sum_str, expr.args))})"
    return str(expr)


def _fast_sym_repr(value: Any) -> str:
    return _sym_sum_str(value.node.expr)
