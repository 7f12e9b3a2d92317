"""``exportir generate``: stream the tokens an LLM program generates after a prompt.

::

    exportir generate llm.xpt --prompt-ids 1,2,3 --max-new-tokens 32
    exportir generate llm.xpt --prompt-ids 1,2,3 --temperature 0.8 --top-k 40 --seed 7

Token ids are printed to stdout as they come, separated by spaces (``--timing`` adds the
prefill time and decode tokens/s on stderr). The program is one ``export_llm`` wrote
(``prefill`` / ``decode`` methods sharing a KV cache; see docs/llm.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any


def _prompt_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--prompt-ids takes comma-separated token ids such as 1,2,3; got {text!r}"
        ) from None
    if not ids:
        raise argparse.ArgumentTypeError("--prompt-ids is empty: give at least one token id")
    return ids


def cmd_generate(ns: argparse.Namespace) -> int:
    from exportir.cli import CliError
    from exportir.runtime import Program, generate

    program = Program.load(ns.path)
    try:
        tokens = generate(program, ns.prompt_ids, ns.max_new_tokens, temperature=ns.temperature,
                          top_k=ns.top_k, seed=ns.seed, stop_at_eos=not ns.ignore_eos)
    except ValueError as e:
        raise CliError(str(e)) from None
    start = time.perf_counter()
    first = None
    count = 0
    for token in tokens:
        if first is None:
            first = time.perf_counter()
        count += 1
        sys.stdout.write(f"{token} " if count < ns.max_new_tokens else f"{token}")
        sys.stdout.flush()
    sys.stdout.write("\n")
    end = time.perf_counter()
    if ns.timing and first is not None:
        rate = (count - 1) / (end - first) if count > 1 and end > first else float("nan")
        print(f"prefill {1000 * (first - start):.2f} ms ({len(ns.prompt_ids)} tokens), decode "
              f"{rate:.1f} tokens/s ({count - 1} tokens)", file=sys.stderr)
    return 0


def register(sub: Any) -> None:
    """Add the ``generate`` subcommand to the ``exportir`` parser's subparsers."""
    p = sub.add_parser("generate", help="generate token ids with an LLM program (prefill/decode)")
    p.add_argument("path", help="an LLM program file (exportir.program.llm.export_llm)")
    p.add_argument("--prompt-ids", required=True, type=_prompt_ids, metavar="IDS",
                   help="comma-separated prompt token ids, e.g. 1,2,3")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy")
    p.add_argument("--top-k", type=int, default=None, help="sample from the k likeliest tokens")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling generator")
    p.add_argument("--ignore-eos", action="store_true",
                   help="do not stop at the program's end-of-sequence ids")
    p.add_argument("--timing", action="store_true",
                   help="print prefill time and decode tokens/s to stderr")
    p.set_defaults(func=cmd_generate)
