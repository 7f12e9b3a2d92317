"""Decoder LLMs with a static KV cache as one program of two methods sharing the cache.

:func:`export_llm` takes a module whose forward reads a block of token ids and their positions
and writes the keys and values it computes into registered cache buffers (transformers'
``TorchExportableModuleWithStaticCache`` / ``TorchExportableModuleForDecoderOnlyLM(...).model``,
or any ``nn.Module`` holding its cache as buffers it updates in place), and emits:

- ``prefill(tokens int64[1, T], input_pos int64[T]) -> logits float[1, V]``, ``T`` dynamic in
  ``[2, max_prefill]``: the logits of the block's last token;
- ``decode(tokens int64[1, 1], input_pos int64[1]) -> logits float[1, V]``;
- constant methods ``get_max_seq_len``, ``get_max_prefill``, ``get_vocab_size`` and
  ``get_eos_ids`` (a tuple of ints, maybe empty).

Both methods write one KV cache (``EmitConfig(share_mutable_buffers=True)``: the buffers they
mutate are the program's shared state), so a prompt is prefilled once and decoded token by
token; :func:`exportir.runtime.generate` runs that loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from exportir.export import Dim, export
from exportir.program.emit import EmitConfig
from exportir.program.manager import ProgramManager, to_edge

__all__ = ["METHODS", "LLMStep", "export_llm"]

METHODS = ("prefill", "decode")
MIN_PREFILL = 2  # a one-token block is a decode step (a size-1 dimension would specialise)


class LLMStep(torch.nn.Module):
    """``model`` called as ``(tokens, input_pos) -> logits of the last token``: the calling
    convention of both methods. ``token_arg`` / ``position_arg`` are the keyword names the model
    takes them by (``None``: positionally, in that order)."""

    def __init__(self, model: torch.nn.Module, token_arg: str | None = "input_ids",
                 position_arg: str | None = "cache_position") -> None:
        super().__init__()
        self.model = model
        self.token_arg = token_arg
        self.position_arg = position_arg

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        if self.token_arg is None or self.position_arg is None:
            out = self.model(tokens, input_pos)
        else:
            out = self.model(**{self.token_arg: tokens, self.position_arg: input_pos})
        logits = getattr(out, "logits", out)
        if isinstance(logits, (tuple, list)):
            logits = logits[0]
        return logits[:, -1, :]


def _check_sizes(max_seq_len: int, max_prefill: int) -> None:
    if not isinstance(max_seq_len, int) or max_seq_len < MIN_PREFILL + 1:
        raise ValueError(f"max_seq_len must be an int of at least {MIN_PREFILL + 1} (the static "
                         f"cache length); got {max_seq_len!r}")
    if not isinstance(max_prefill, int) or not MIN_PREFILL <= max_prefill <= max_seq_len:
        raise ValueError(f"max_prefill must be an int in [{MIN_PREFILL}, max_seq_len="
                         f"{max_seq_len}]; got {max_prefill!r}")


def export_llm_methods(
    model: torch.nn.Module,
    *,
    max_seq_len: int,
    max_prefill: int | None = None,
    token_arg: str | None = "input_ids",
    position_arg: str | None = "cache_position",
) -> dict[str, Any]:
    """The ``prefill`` and ``decode`` ExportedPrograms of ``model`` (ATen dialect), for
    :func:`exportir.to_edge` / ``to_edge_transform_and_lower`` when you lower them yourself."""
    max_prefill = max_seq_len - 1 if max_prefill is None else max_prefill
    _check_sizes(max_seq_len, max_prefill)
    step = LLMStep(model, token_arg, position_arg).eval()
    block = Dim("prefill_len", min=MIN_PREFILL, max=max_prefill)
    n = min(4, max_prefill)
    with torch.no_grad():
        prefill = export(step, (torch.zeros(1, n, dtype=torch.long), torch.arange(n)),
                         dynamic_shapes=({1: block}, {0: block}))
        decode = export(step, (torch.zeros(1, 1, dtype=torch.long), torch.tensor([n])))
    return {"prefill": prefill, "decode": decode}


def llm_constant_methods(
    programs: Mapping[str, Any], max_seq_len: int, max_prefill: int, eos_ids: Sequence[int]
) -> dict[str, Any]:
    out = next(n for n in programs["decode"].graph.nodes if n.op == "output").args[0]
    logits = out[-1] if isinstance(out, (tuple, list)) else out  # user outputs come last
    vocab = int(logits.meta["val"].shape[-1])
    return {
        "get_max_seq_len": max_seq_len,
        "get_max_prefill": max_prefill,
        "get_vocab_size": vocab,
        "get_eos_ids": tuple(int(i) for i in eos_ids),
    }


def export_llm(
    model: torch.nn.Module,
    *,
    max_seq_len: int,
    max_prefill: int | None = None,
    token_arg: str | None = "input_ids",
    position_arg: str | None = "cache_position",
    eos_ids: Sequence[int] = (),
    partitioner: Sequence[Any] | None = None,
    compile_config: Any = None,
) -> ProgramManager:
    """Export ``model`` (see the module docstring) into one program with ``prefill`` and
    ``decode`` sharing the KV cache. ``max_seq_len``: the static cache length; ``max_prefill``:
    the longest block ``prefill`` takes (default ``max_seq_len - 1``; longer prompts are
    prefilled in blocks). ``partitioner``: lower through ``to_edge_transform_and_lower`` with
    these partitioners (``[FusedCpuPartitioner()]``). A model built on the ``meta`` device gives
    a program whose weights are attached with ``ProgramManager.attach_weights``."""
    max_prefill = max_seq_len - 1 if max_prefill is None else max_prefill
    programs = export_llm_methods(model, max_seq_len=max_seq_len, max_prefill=max_prefill,
                                  token_arg=token_arg, position_arg=position_arg)
    constants = llm_constant_methods(programs, max_seq_len, max_prefill, eos_ids)
    if partitioner is None:
        edge = to_edge(programs, constant_methods=constants, compile_config=compile_config)
    else:
        from exportir.program.transform_and_lower import to_edge_transform_and_lower

        edge = to_edge_transform_and_lower(programs, partitioner=list(partitioner),
                                           constant_methods=constants,
                                           compile_config=compile_config)
    return edge.to_program(EmitConfig(share_mutable_buffers=True))
