"""Kernels of custom operators that libraries people export from put in their graphs.

transformers (5.x) runs its mixture-of-experts layers through its own custom operator
``transformers::grouped_mm_fallback`` wherever torch's grouped GEMM cannot serve: in float32
under export (``torch.compiler.is_compiling()``) and on CPU, that is on every MoE model exported
for CPU (Qwen3-MoE, DeepSeek-V3/V4, GPT-OSS, OLMoE, Granite-MoE, ...). Its programs name the op
as a functional fallback. The runtime knows it by that exact name and runs its own
implementation below: neither transformers nor its op needs to be importable where the program
runs, and nothing of the library is called. Names select only from :data:`LIBRARY_KERNELS`.
Imports only torch.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from exportir.runtime import operands

__all__ = ["LIBRARY_KERNELS", "grouped_mm_fallback"]

_mm = torch.mm


def grouped_mm_fallback(
    input: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor, out: torch.Tensor
) -> None:
    """``out[S, N]`` = the rows of ``input [S, K]``, sorted by group, each multiplied by its
    group's ``weight[g] [K, N]``; group ``g`` holds rows ``offs[g-1] .. offs[g]`` (``offs``:
    cumulative row counts, one per group). Rows after ``offs[-1]`` and empty groups give zeros,
    as transformers' own implementation does."""
    if input.dim() != 2 or weight.dim() != 3 or offs.dim() != 1:
        raise ValueError(
            "transformers::grouped_mm_fallback takes input [S, K], weight [G, K, N] and offs "
            f"[G]; got input {list(input.shape)}, weight {list(weight.shape)}, offs "
            f"{list(offs.shape)}"
        )
    rows, groups = input.shape[0], weight.shape[0]
    if input.shape[1] != weight.shape[1]:
        raise ValueError(
            f"transformers::grouped_mm_fallback: input has {input.shape[1]} columns, weight "
            f"{weight.shape[1]} rows per group"
        )
    if offs.shape[0] != groups or offs.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"transformers::grouped_mm_fallback: offs must be {groups} int32 / int64 cumulative "
            f"row counts (one per group of weight); got {offs.dtype} {list(offs.shape)}"
        )
    if input.dtype != weight.dtype:
        raise ValueError(
            f"transformers::grouped_mm_fallback: input is {input.dtype}, weight {weight.dtype}"
        )
    ends = offs.tolist()
    start = 0
    for g, end in enumerate(ends):
        if not start <= end <= rows:
            raise ValueError(
                f"transformers::grouped_mm_fallback: offs[{g}] = {end} is outside "
                f"[{start}, {rows}] (offs must be non-decreasing row counts of the {rows}-row "
                "input)"
            )
        start = end
    shape = (rows, weight.shape[2])
    if tuple(out.shape) != shape:
        out.resize_(shape)
    out[start:].zero_()  # the rows after the last group (the groups write all the others)
    dense = out.is_contiguous()
    start = 0
    for g, end in enumerate(ends):
        if end > start:
            if dense:
                _mm(input[start:end], weight[g], out=out[start:end])
            else:
                out[start:end].copy_(_mm(input[start:end], weight[g]))
        start = end


def _kernel(name: str, fn: object, schema_text: str) -> object:
    from exportir.runtime.kernels import Kernel

    arguments = torch._C.parse_schema(schema_text).arguments
    arity = len(arguments)

    def run(args: Sequence[object]) -> None:
        fn(*args)  # type: ignore[operator]

    params = (*operands.params_of(arguments), operands.out_tensor("result0"))
    return Kernel(name, run, arity + 1, (arity,), False, params=params)


@functools.cache
def library_kernels() -> tuple[object, ...]:
    """One kernel per known library operator, made once per process: kernels are immutable,
    so every registry shares them (as it shares the kernels of torch's ops)."""
    return tuple(_kernel(name, fn, text) for name, (fn, text) in LIBRARY_KERNELS.items())


# program name -> (implementation, the operator's schema as the library declares it)
LIBRARY_KERNELS = {
    "transformers::grouped_mm_fallback.default@functional": (
        grouped_mm_fallback,
        "transformers::grouped_mm_fallback(Tensor input, Tensor weight, Tensor offs) -> Tensor",
    ),
}
