"""``exportir run --profile``: the options and the report (see :mod:`exportir.runtime.profile`)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from exportir.runtime.profile import GROUPINGS


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", action="store_true",
                   help="time every instruction and every op inside delegates over --repeat "
                        "runs and print the costliest")
    p.add_argument("--profile-by", choices=GROUPINGS, action="append",
                   help="group the profile by instruction (default), op or module; repeatable")
    p.add_argument("--top", type=_positive, default=20, help="profile rows to print (default 20)")
    p.add_argument("--trace", metavar="PATH",
                   help="write the profiled runs as Chrome trace JSON (chrome://tracing, Perfetto)")


def wanted(ns: argparse.Namespace) -> bool:
    return bool(ns.profile or ns.trace or ns.profile_by)


def report(method: Any, inputs: Sequence[Any], ns: argparse.Namespace) -> None:
    """Profile ``method`` on ``inputs`` and print the tables (and write the trace)."""
    profile = method.profile(*inputs, repeat=max(ns.repeat, 1), warmup=max(ns.warmup, 1))
    for by in ns.profile_by or ["instruction"]:
        print()
        profile.print(by=by, top=ns.top)
    if ns.trace:
        profile.save_chrome_trace(ns.trace)
        print(f"\nChrome trace written to {ns.trace} (open in https://ui.perfetto.dev or "
              "chrome://tracing)")
