"""The fuzz suite's child process: load and run each case file, report one outcome per case.

    python tests/fuzz/child.py {xpt|pte|pt2} MANIFEST.json START
    python tests/fuzz/child.py {xpt|pte|pt2} CASE_FILE           # reproduce one finding

``MANIFEST`` is a JSON list of case file paths; cases from ``START`` on are run in order. Before
a case the child prints ``{"start": i}``, after it ``{"case": i, "outcome": ..., "detail": ...}``
(one JSON object a line, flushed), so the parent knows which case a crash or a hang belongs to.
The parent sets the resource limits (address space, CPU time) before this process starts.

Outcomes that are fine: ``refused`` (the typed load error), ``run-error`` (a typed error while
running), ``ran`` (outputs checked: against the reference interpreter, a fresh load, and a call
after another call), ``ran-unchecked`` (no oracle: delegates or random ops). Anything else is a
finding: ``untyped`` (another exception type), ``wrong-value``, ``stale-memory``, ``allocation``
(an allocation the limits refused: the file asked for unbounded memory), ``timeout``.
"""

from __future__ import annotations

import io
import json
import math
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

_TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(_TESTS.parent / "src"), str(_TESTS / "program"), str(_TESTS)]

import torch

CASE_SECONDS = 20  # a case running longer is a hang
# Loading limits far below the defaults: a file asking for more is refused, never allocated.
LIMITS = {"max_tensor_bytes": 1 << 26, "max_arena_bytes": 1 << 27, "max_structure_bytes": 1 << 24,
          "max_loop_iterations": 1 << 12}  # a mutated loop bound runs into the cap, typed
_RANDOM_OPS = ("empty", "empty_strided", "rand", "randn", "randperm", "native_dropout",
               "bernoulli", "normal", "uniform", "multinomial", "random")


class CaseTimeout(BaseException):
    """Raised in the child when a case runs past CASE_SECONDS (not an Exception: no handler
    of the code under test may swallow it)."""


def _alarm(signum: int, frame: Any) -> None:
    raise CaseTimeout


def _chain(exc: BaseException) -> list[BaseException]:
    seen = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def _allocation(exc: BaseException) -> bool:
    return any(isinstance(e, MemoryError) or "can't allocate" in str(e) for e in _chain(exc))


def _outcome(kind: str, detail: str = "") -> dict[str, str]:
    return {"outcome": kind, "detail": detail[:1500]}


def _failure(exc: BaseException, where: str) -> dict[str, str]:
    kind = "allocation" if _allocation(exc) else "untyped"
    text = "".join(traceback.format_exception(exc, limit=-6))
    return _outcome(kind, f"{where}: {type(exc).__name__}: {exc}\n{text}")


# ------------------------------------------------------------------------------ program files


def _inputs(meta: Any, seed: int) -> list[Any]:
    from exportir.format import schema

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in meta.inputs:
        v = meta.values[i]
        if isinstance(v, schema.Tensor):
            dtype = getattr(torch, schema.TORCH_DTYPE_NAME[v.dtype])
            sizes = tuple(v.sizes)
            if dtype.is_floating_point or dtype.is_complex:
                out.append(torch.randn(sizes, generator=g).to(dtype))
            elif dtype == torch.bool:
                out.append(torch.randint(0, 2, sizes, generator=g).bool())
            else:
                out.append(torch.randint(0, 4, sizes, generator=g).to(dtype))
        else:
            out.append(getattr(v, "value", None))
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        try:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, equal_nan=True)
        except AssertionError:
            return False
        return True
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def _flat(x: Any) -> list[Any]:
    if isinstance(x, (list, tuple)):
        return [y for v in x for y in _flat(v)]
    if isinstance(x, dict):
        return [y for v in x.values() for y in _flat(v)]
    return [x]


def _stateful(meta: Any) -> bool:
    return any(getattr(v, "initial", None) is not None for v in meta.values)


def _random(meta: Any) -> bool:
    return any(op.name.split("::")[-1] in _RANDOM_OPS for op in meta.operators)


def _run_xpt_method(data: bytes, program: Any, meta: Any) -> dict[str, str]:
    from exportir.runtime import MethodInputError, Program, RuntimeFailure

    typed = (RuntimeFailure, MethodInputError)
    try:
        method = program.method(meta.name)
        first = method.execute(_inputs(meta, 0))
    except typed as e:
        return _failure(e, "running") if _allocation(e) else _outcome("run-error", str(e))
    except Exception as e:  # noqa: BLE001 - the finding itself
        return _failure(e, "running")
    if program.schema.delegates or _random(meta):
        return _outcome("ran-unchecked")
    fresh = Program.load(data, limits=_limits()).method(meta.name)
    if not _stateful(meta):  # another call first: nothing may depend on what it left behind
        try:
            fresh.execute(_inputs(meta, 1))
        except typed:
            pass
    again = fresh.execute(_inputs(meta, 0))
    if not _same(_flat(first), _flat(again)):
        return _outcome("stale-memory", "the same inputs gave other outputs after another call")
    return _reference(program.schema, meta, first)


def _reference(program: Any, meta: Any, got: Any) -> dict[str, str]:
    from program_reference import Runner

    try:
        expected = Runner(program, meta.name)(*_inputs(meta, 0))
    except Exception as e:  # noqa: BLE001 - the reference is a test oracle, less general
        return _outcome("ran-unchecked", f"the reference interpreter refused: "
                                         f"{type(e).__name__}: {e}")
    if not _same(_flat(got), _flat(expected)):
        return _outcome("wrong-value", f"runtime {_flat(got)!r:.600}\nreference "
                                       f"{_flat(expected)!r:.600}")
    return _outcome("ran")


def _limits() -> Any:
    from exportir.format.validate import LoadLimits

    return LoadLimits(**LIMITS)


def run_xpt(data: bytes) -> dict[str, str]:
    from exportir.runtime import Program, ProgramLoadError

    try:
        program = Program.load(data, limits=_limits())
    except ProgramLoadError as e:
        return _failure(e, "loading") if _allocation(e) else _outcome("refused", str(e))
    except Exception as e:  # noqa: BLE001
        return _failure(e, "loading")
    result = _outcome("ran")
    for meta in program.schema.methods[:3]:
        result = _run_xpt_method(data, program, meta)
        if result["outcome"] not in ("ran", "ran-unchecked"):
            return result
    return result


# ------------------------------------------------------------------------------ .pt2 files


def run_pt2(data: bytes) -> dict[str, str]:
    import exportir
    from exportir.export.serialize.common import SerializationError

    try:
        ep = exportir.load(io.BytesIO(data))
    except SerializationError as e:
        return _failure(e, "loading") if _allocation(e) else _outcome("refused", str(e))
    except Exception as e:  # noqa: BLE001
        return _failure(e, "loading")
    try:
        module = ep.module()
    except Exception as e:  # noqa: BLE001 - a loaded program must give its module
        return _failure(e, "ep.module()")
    if ep.example_inputs is None:
        return _outcome("ran-unchecked", "no example inputs")
    args, kwargs = ep.example_inputs
    try:
        with torch.no_grad():
            first = module(*args, **kwargs)
            second = module(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - a valid graph may fail on its inputs, as eager does
        if _allocation(e):
            return _failure(e, "running")
        return _outcome("run-error", f"{type(e).__name__}: {e}")
    random = any(getattr(n.target, "__name__", "").split(".")[0] in _RANDOM_OPS
                 for n in ep.graph.nodes)
    if not random and not _same(_flat(first), _flat(second)) and not ep.graph_signature.buffers_to_mutate:
        return _outcome("stale-memory", "two calls on the same inputs differ")
    return _outcome("ran")


RUNNERS = {"xpt": run_xpt, "pte": run_xpt, "pt2": run_pt2}  # Program.load reads .pte too


def main() -> None:
    kind, target = sys.argv[1], Path(sys.argv[2])
    start = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    torch.set_num_threads(1)
    signal.signal(signal.SIGALRM, _alarm)
    # a manifest of case files, or one case file (to reproduce a finding)
    cases = json.loads(target.read_text()) if target.suffix == ".json" else [str(target)]
    for i in range(start, len(cases)):
        print(json.dumps({"start": i}), flush=True)
        data = Path(cases[i]).read_bytes()
        signal.alarm(CASE_SECONDS)
        try:
            result = RUNNERS[kind](data)
        except CaseTimeout:
            result = _outcome("timeout", f"more than {CASE_SECONDS} s")
        except BaseException as e:  # noqa: BLE001 - e.g. RecursionError escaping a handler
            result = _failure(e, "the child")
        finally:
            signal.alarm(0)
        print(json.dumps({"case": i, **result}), flush=True)


if __name__ == "__main__":
    main()
