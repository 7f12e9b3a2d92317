"""Token-by-token generation with an LLM program (``exportir.program.llm.export_llm``).

:func:`generate` prefills the prompt (``prefill``, in blocks of at most ``get_max_prefill``
tokens; a block of one token is a ``decode`` step), then decodes one token at a time, yielding
each new token id as soon as it is chosen. Both methods share the program's KV cache; a call
starts a new sequence (the shared state is reset to its initial value first).

Choosing a token: greedy (``temperature=0``, the default: the highest logit, first on ties, as
``torch.argmax`` and transformers' greedy search pick), or sampling from
``softmax(logits / temperature)`` restricted to the ``top_k`` highest logits, drawn with
``generator`` (a seeded ``torch.Generator`` gives the same tokens on every run).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from exportir.runtime.program import Program

__all__ = ["LLMInfo", "generate", "llm_info"]

_METHODS = ("prefill", "decode", "get_max_seq_len", "get_max_prefill")


@dataclass(frozen=True, slots=True)
class LLMInfo:
    """What an LLM program declares through its constant methods."""

    max_seq_len: int
    max_prefill: int
    vocab_size: int
    eos_ids: tuple[int, ...]


def _constant(program: Program, name: str) -> tuple[object, ...]:
    return tuple(program.method(name).execute(()))


def llm_info(program: Program) -> LLMInfo:
    """The sizes an LLM program was exported with; ``ValueError`` if it is not one."""
    missing = [m for m in _METHODS if m not in program.method_names]
    if missing:
        raise ValueError(f"not an LLM program: it has no method(s) {missing} (methods: "
                         f"{list(program.method_names)}); export it with exportir.program.llm."
                         "export_llm")
    (max_seq_len,) = _constant(program, "get_max_seq_len")
    (max_prefill,) = _constant(program, "get_max_prefill")
    vocab = _constant(program, "get_vocab_size") if "get_vocab_size" in program.method_names else (0,)
    eos = _constant(program, "get_eos_ids") if "get_eos_ids" in program.method_names else ()
    return LLMInfo(int(max_seq_len), int(max_prefill), int(vocab[0]), tuple(int(e) for e in eos))


def _as_program(program: Program | str | os.PathLike[str] | bytes) -> Program:
    return program if isinstance(program, Program) else Program.load(program)


def _choose(logits: torch.Tensor, temperature: float, top_k: int | None,
            generator: torch.Generator | None) -> int:
    row = logits.reshape(-1)
    if temperature == 0:
        return int(torch.argmax(row))
    row = row.float() / temperature
    if top_k is not None and top_k < row.numel():
        kth = torch.topk(row, top_k).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    probs = torch.softmax(row, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def _check_args(prompt: Sequence[int], max_new_tokens: int, info: LLMInfo, temperature: float,
                top_k: int | None) -> list[int]:
    ids = [int(t) for t in prompt]
    if not ids:
        raise ValueError("the prompt is empty: give at least one token id")
    bad = [t for t in ids if t < 0 or (info.vocab_size and t >= info.vocab_size)]
    if bad:
        raise ValueError(f"prompt token id(s) {bad[:5]} are outside the vocabulary "
                         f"[0, {info.vocab_size})")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative int; got {max_new_tokens!r}")
    if len(ids) + max_new_tokens > info.max_seq_len:
        raise ValueError(f"prompt ({len(ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds "
                         f"the program's KV cache of {info.max_seq_len} positions; shorten them "
                         "or export with a larger max_seq_len")
    if not temperature >= 0:  # negative or NaN
        raise ValueError(f"temperature must be >= 0 (0: greedy); got {temperature!r}")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a positive int or None; got {top_k!r}")
    return ids


def _prefill(program: Program, ids: list[int], max_prefill: int) -> torch.Tensor:
    """Run the prompt through the cache; the logits after its last token."""
    prefill, decode = program.method("prefill"), program.method("decode")
    pos = 0
    logits = None
    while pos < len(ids):
        n = min(max_prefill, len(ids) - pos)
        block = torch.tensor([ids[pos:pos + n]], dtype=torch.long)
        positions = torch.arange(pos, pos + n, dtype=torch.long)
        (logits,) = (decode if n == 1 else prefill).execute([block, positions])
        pos += n
    if logits is None:
        raise ValueError("the prompt is empty: give at least one token id")
    return logits


def generate(
    program: Program | str | os.PathLike[str] | bytes,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    stop_at_eos: bool = True,
) -> Iterator[int]:
    """Yield up to ``max_new_tokens`` token ids generated after ``prompt_ids``, one at a time.

    ``program``: a loaded LLM program or a path / bytes to load. ``temperature`` 0 is greedy;
    otherwise tokens are sampled (``top_k``: from the k highest logits) with ``generator``, or a
    new generator seeded with ``seed``. Stops early after an end-of-sequence id the program
    declares (``get_eos_ids``) when ``stop_at_eos``. Raises ``ValueError`` for a prompt or size
    the program cannot take, before running anything.
    """
    program = _as_program(program)
    info = llm_info(program)
    ids = _check_args(prompt_ids, max_new_tokens, info, temperature, top_k)
    if generator is None and seed is not None:
        generator = torch.Generator().manual_seed(seed)
    return _generate(program, ids, max_new_tokens, info, temperature, top_k, generator,
                     stop_at_eos)


def _generate(program: Program, ids: list[int], max_new_tokens: int, info: LLMInfo,
              temperature: float, top_k: int | None, generator: torch.Generator | None,
              stop_at_eos: bool) -> Iterator[int]:
    if max_new_tokens == 0:
        return
    program.reset_state()
    decode = program.method("decode")
    logits = _prefill(program, ids, info.max_prefill)
    pos = len(ids)
    for k in range(max_new_tokens):
        token = _choose(logits, temperature, top_k, generator)
        yield token
        if (stop_at_eos and token in info.eos_ids) or k + 1 == max_new_tokens:
            return
        (logits,) = decode.execute([torch.tensor([[token]], dtype=torch.long),
                                    torch.tensor([pos], dtype=torch.long)])
        pos += 1
