"""The ``exportir`` command.

::

    exportir export MODULE:FACTORY [--example-inputs SPEC ...] [--backend fused_cpu] -o model.xpt
    exportir inspect model.xpt [--method NAME]
    exportir run model.xpt [--method NAME] [--inputs SPEC ...] [--repeat N]

``MODULE`` is an importable module (``pkg.models``, resolved from the current directory too) or a
Python file (``models/net.py``); ``FACTORY`` names an attribute of it: an ``nn.Module`` instance,
or a callable (class or function) taking no arguments that returns an ``nn.Module``, a
``(module, args)`` or a ``(module, args, kwargs)`` tuple. Modules are exported in eval mode
unless ``--train`` is given.

An input ``SPEC`` is one of:

* ``DTYPE[SHAPE]`` — a random tensor, e.g. ``f32[1,3,32,32]``, ``int64[2,8]``, ``[4]``
  (float32); optionally ``DTYPE[SHAPE]:LOW:HIGH`` for values drawn uniformly from [LOW, HIGH)
  (integers for integer dtypes);
* a ``.npy`` file (loaded without pickle);
* a Python literal scalar: ``3``, ``0.5``, ``true``, ``false``, ``none``.

``export --backend fused_cpu`` delegates what the fused CPU backend's partitioner claims. ``run``
registers that backend's executor, so delegated programs run too. ``run`` without ``--inputs``
makes random inputs from the method's signature. ``run`` and ``inspect`` use only the runtime,
the program format and backend executors; ``export`` loads the compiler.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

_DTYPES: dict[str, torch.dtype] = {
    "f16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "f32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "f64": torch.float64, "float64": torch.float64, "double": torch.float64,
    "i8": torch.int8, "int8": torch.int8, "u8": torch.uint8, "uint8": torch.uint8,
    "i16": torch.int16, "int16": torch.int16, "i32": torch.int32, "int32": torch.int32,
    "int": torch.int32, "i64": torch.int64, "int64": torch.int64, "long": torch.int64,
    "b8": torch.bool, "bool": torch.bool,
}  # fmt: skip
_TENSOR_SPEC = re.compile(
    r"^(?P<dtype>[a-z0-9]*)\[(?P<shape>[0-9,\s]*)\](?::(?P<low>[-+.\deE]+):(?P<high>[-+.\deE]+))?$"
)


class CliError(Exception):
    """A user error: printed as ``exportir: error: ...`` with exit status 2."""


# ------------------------------------------------------------------------------ inputs


def parse_input(spec: str, generator: torch.Generator | None = None) -> Any:
    """One input from its ``SPEC`` (see the module docstring)."""
    text = spec.strip()
    if text.endswith(".npy"):
        return _load_npy(text)
    match = _TENSOR_SPEC.match(text.lower())
    if match is not None:
        dtype_name = match["dtype"] or "f32"
        dtype = _DTYPES.get(dtype_name)
        if dtype is None:
            raise CliError(f"unknown dtype {dtype_name!r} in input {spec!r}; use one of "
                           f"{', '.join(sorted(_DTYPES))}")
        shape = tuple(int(s) for s in match["shape"].replace(" ", "").split(",") if s)
        low = float(match["low"]) if match["low"] is not None else None
        high = float(match["high"]) if match["high"] is not None else None
        return random_tensor(dtype, shape, generator, low, high)
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered == "none":
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise CliError(
            f"cannot read input {spec!r}: expected DTYPE[SHAPE] (e.g. f32[2,3]), a .npy file, "
            "or a scalar (3, 0.5, true, none)"
        ) from None


def _load_npy(path: str) -> torch.Tensor:
    import numpy as np

    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot read {path}: {exc}") from exc
    return torch.from_numpy(np.ascontiguousarray(array))


def random_tensor(
    dtype: torch.dtype,
    shape: Sequence[int],
    generator: torch.Generator | None = None,
    low: float | None = None,
    high: float | None = None,
) -> torch.Tensor:
    """Random values of ``dtype``: normal floats (or uniform in [low, high)), ints in
    [low, high) (default [0, 2): valid indices for any embedding), random bools."""
    if dtype == torch.bool:
        return torch.randint(0, 2, tuple(shape), generator=generator).bool()
    if dtype.is_floating_point:
        if low is None or high is None:
            return torch.randn(tuple(shape), generator=generator).to(dtype)
        return (torch.rand(tuple(shape), generator=generator) * (high - low) + low).to(dtype)
    lo = int(low) if low is not None else 0
    hi = int(high) if high is not None else 2
    return torch.randint(lo, hi, tuple(shape), generator=generator, dtype=dtype)


# ------------------------------------------------------------------------------ export


def _import_target(target: str) -> Any:
    module_name, sep, attr = target.rpartition(":")
    if not sep or not module_name or not attr:
        raise CliError(f"expected MODULE:FACTORY (e.g. mypkg.models:make_model); got {target!r}")
    if module_name.endswith(".py") or "/" in module_name:
        path = Path(module_name)
        if not path.is_file():
            raise CliError(f"no such file: {module_name}")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise CliError(f"cannot import {module_name}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        spec.loader.exec_module(module)
    else:
        if "" not in sys.path and str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise CliError(f"cannot import module {module_name!r}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise CliError(f"{module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def _model_and_inputs(
    target: str, specs: Sequence[str] | None, train: bool, generator: torch.Generator
) -> tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]:
    made = _import_target(target)
    if not isinstance(made, torch.nn.Module):
        if not callable(made):
            raise CliError(f"{target} is neither an nn.Module nor a callable factory")
        made = made()
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = {}
    if isinstance(made, tuple) and made and isinstance(made[0], torch.nn.Module):
        module = made[0]
        args = tuple(made[1]) if len(made) > 1 else ()
        kwargs = dict(made[2]) if len(made) > 2 else {}
    elif isinstance(made, torch.nn.Module):
        module = made
    else:
        raise CliError(f"{target} returned {type(made).__name__}; expected an nn.Module or a "
                       "(module, args[, kwargs]) tuple")
    if specs:
        args, kwargs = tuple(parse_input(s, generator) for s in specs), {}
    elif not args and not kwargs:
        raise CliError(f"{target} gives a module without example inputs; pass "
                       "--example-inputs (e.g. --example-inputs f32[1,16])")
    return (module.train() if train else module.eval()), args, kwargs


def cmd_export(ns: argparse.Namespace) -> int:
    generator = torch.Generator().manual_seed(ns.seed)
    torch.manual_seed(ns.seed)
    module, args, kwargs = _model_and_inputs(ns.target, ns.example_inputs, ns.train, generator)

    from exportir.export import export
    from exportir.program.manager import to_edge

    def stage(name: str, fn: Any) -> Any:
        start = time.perf_counter()
        result = fn()
        print(f"{name:<12} {1000 * (time.perf_counter() - start):9.1f} ms")
        return result

    ep = stage("export", lambda: export(module, args, kwargs))
    edge = stage("to_edge", lambda: to_edge(ep))
    if ns.backend == "fused_cpu":
        from exportir.backends.fused_cpu import FusedCpuPartitioner

        edge = stage("to_backend", lambda: edge.to_backend(FusedCpuPartitioner()))
    prog = stage("to_program", edge.to_program)
    data = stage("serialize", lambda: prog.buffer)
    out = Path(ns.output)
    out.write_bytes(data)
    weights = sum(c.nbytes for c in prog.program.constants)
    print(f"wrote {out} ({len(data)} bytes; constants {weights} bytes; "
          f"{len(prog.program.delegates)} delegate(s); methods "
          f"{', '.join(prog.program.method_names)})")
    return 0


# ------------------------------------------------------------------------------ inspect, run


def _read_file(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from exc


def cmd_inspect(ns: argparse.Namespace) -> int:
    from exportir.format import serialize
    from exportir.program import printer

    data = _read_file(ns.path)
    program = serialize.deserialize_program(data)
    layout = serialize.read_layout(data)
    if ns.method is None:
        print(printer.format_program(program, layout), end="")
        return 0
    if ns.method not in program.method_names:
        raise CliError(f"{ns.path} has no method {ns.method!r}; it has "
                       f"{', '.join(program.method_names)}")
    print("\n".join(printer.format_method(program.method(ns.method), program)))
    print()
    print("\n".join(printer.format_sizes(program, layout)))
    return 0


def _random_inputs(method: Any, generator: torch.Generator) -> list[Any]:
    from exportir.format import schema
    from exportir.runtime.memory import torch_dtype

    inputs = []
    for index in method.meta.inputs:
        v = method.meta.values[index]
        if isinstance(v, schema.Tensor):
            inputs.append(random_tensor(torch_dtype(v.dtype), v.sizes, generator))
        elif isinstance(v, schema.Null):
            inputs.append(None)
        else:
            inputs.append(v.value)  # the scalar recorded at export
    return inputs


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        head = f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
        if value.numel() == 0:
            return head
        flat = value.detach().reshape(-1)
        sample = ", ".join(f"{x:.4g}" if isinstance(x, float) else str(x)
                           for x in flat[:6].tolist())
        more = ", ..." if flat.numel() > 6 else ""
        if value.is_floating_point():
            stats = (f" mean={flat.double().mean().item():.4g} min={flat.min().item():.4g} "
                     f"max={flat.max().item():.4g}")
        else:
            stats = ""
        return f"{head}{stats} [{sample}{more}]"
    return repr(value)


def _delegate_registry() -> Any:
    """The runtime's default registry (it holds the executors of the backends exportir ships)."""
    from exportir.runtime import default_delegate_registry

    return default_delegate_registry()


def cmd_run(ns: argparse.Namespace) -> int:
    from exportir.runtime import Program

    start = time.perf_counter()
    program = Program.load(ns.path, delegates=_delegate_registry(), verify_data=not ns.no_verify)
    loaded = time.perf_counter()
    method = program.method(ns.method)
    prepared = time.perf_counter()
    generator = torch.Generator().manual_seed(ns.seed)
    if ns.inputs:
        inputs = [parse_input(s, generator) for s in ns.inputs]
    else:
        inputs = _random_inputs(method, generator)
    print(f"load         {1000 * (loaded - start):9.2f} ms  ({ns.path})")
    print(f"prepare      {1000 * (prepared - loaded):9.2f} ms  (method {ns.method!r}, "
          f"{method.num_instructions} instructions, arenas {list(method.arena_bytes)} B)")
    for k, x in enumerate(inputs):
        print(f"input {k:<6} {_describe(x)}")
    outputs: tuple[Any, ...] = ()
    for _ in range(ns.warmup):
        outputs = method.execute(inputs)
    times = []
    for _ in range(max(ns.repeat, 1)):
        t0 = time.perf_counter()
        outputs = method.execute(inputs)
        times.append(time.perf_counter() - t0)
    ms = [1000 * t for t in times]
    print(f"execute      {statistics.median(ms):9.3f} ms median  (min {min(ms):.3f}, "
          f"mean {statistics.fmean(ms):.3f} over {len(ms)} runs)")
    for k, out in enumerate(outputs):
        print(f"output {k:<5} {_describe(out)}")
    return 0


# ------------------------------------------------------------------------------ main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="exportir", description="Export PyTorch models to program files and run them."
    )
    from exportir import __version__

    parser.add_argument("--version", action="version", version=f"exportir {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show the Python traceback of a failure")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("export", help="export MODULE:FACTORY to a program file")
    p.add_argument("target", help="MODULE:FACTORY (module path or .py file, attribute)")
    p.add_argument("--example-inputs", nargs="+", metavar="SPEC",
                   help="example inputs: DTYPE[SHAPE] (random), file.npy, or scalars")
    p.add_argument("-o", "--output", required=True, help="program file to write (.xpt)")
    p.add_argument("--train", action="store_true", help="export in training mode (default eval)")
    p.add_argument("--backend", choices=["fused_cpu"],
                   help="delegate the subgraphs this backend supports")
    p.add_argument("--seed", type=int, default=0, help="seed for random inputs and the factory")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("inspect", help="print a program file's methods, ops, plan and sizes")
    p.add_argument("path")
    p.add_argument("--method", help="only this method")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("run", help="load a program file and run a method, with timing")
    p.add_argument("path")
    p.add_argument("--method", default="forward")
    p.add_argument("--inputs", nargs="+", metavar="SPEC",
                   help="inputs (default: random, from the method's signature)")
    p.add_argument("--repeat", type=int, default=10, help="timed runs (default 10)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs first (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-verify", action="store_true",
                   help="skip the data segment checksum (the structure is still validated)")
    p.set_defaults(func=cmd_run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    from exportir.format.validate import ProgramLoadError
    from exportir.runtime.errors import MethodInputError, RuntimeFailure, UnknownMethodError

    try:
        return ns.func(ns)
    except CliError as exc:
        print(f"exportir: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0
    except ProgramLoadError as exc:
        print(f"exportir: error: {ns.path}: not a valid program file: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"exportir: error: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except (RuntimeFailure, MethodInputError, UnknownMethodError) as exc:
        print(f"exportir: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        if ns.debug:
            raise
        # compiler errors (export, to_edge, to_program) carry their own explanation
        print(f"exportir: error: {type(exc).__name__}: {exc}\n(run with --debug for the "
              "traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
