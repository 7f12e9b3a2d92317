"""The committed table of ExecuTorch's portable kernels (exportir.format.pte_kernels) is the
installed executorch's: same operator names, and each one's argument count and returns as
torch's schema of it says (regenerate with scripts/gen_pte_kernels.py)."""

from __future__ import annotations

import pathlib
import sys

from exportir.format.pte_kernels import EXECUTORCH_VERSION, PTE_KERNELS

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "gen_pte_kernels.py"


def test_table_names_the_installed_executorch_operators():
    from executorch.extension.pybindings import portable_lib
    from executorch.version import __version__

    assert __version__ == EXECUTORCH_VERSION
    registered = set(portable_lib._get_operator_names())
    assert set(PTE_KERNELS) == registered, (
        f"missing: {sorted(registered - set(PTE_KERNELS))}, "
        f"extra: {sorted(set(PTE_KERNELS) - registered)}; run {SCRIPT.name}")


def test_table_layouts_match_torch_schemas():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gen_pte_kernels as gen
    finally:
        sys.path.remove(str(SCRIPT.parent))
    for name, layout in PTE_KERNELS.items():
        if name in gen._PRIMS_WITHOUT_TORCH_SCHEMA:
            assert layout == gen._PRIMS_WITHOUT_TORCH_SCHEMA[name]
            continue
        op = gen._overload(name)
        assert op is not None and gen._layout(op) == layout, name


def test_out_variants_return_their_out_arguments():
    n_args, returns = PTE_KERNELS["aten::add.out"]
    assert (n_args, returns) == (4, (3,))
    assert PTE_KERNELS["aten::max.dim_max"] == (5, (3, 4))
    assert PTE_KERNELS["executorch_prim::add.Scalar"] == (2, (-1,))



def test_operators_read_beyond_the_portable_set_are_exportir_kernels():
    """The reader's few operators ExecuTorch writes but its portable runtime lacks: not
    registered there, laid out as torch's schema says, and in exportir's kernel table."""
    from executorch.extension.pybindings import portable_lib

    from exportir.format.pte_read import _MORE_KERNELS
    from exportir.runtime.kernel_table import KERNEL_TABLE

    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gen_pte_kernels as gen
    finally:
        sys.path.remove(str(SCRIPT.parent))
    registered = set(portable_lib._get_operator_names())
    for name, layout in _MORE_KERNELS.items():
        assert name not in registered, f"{name} is a portable kernel now: drop it from the list"
        assert gen._layout(gen._overload(name)) == layout, name
        assert name in KERNEL_TABLE, name
