"""The ``exportir`` command.

::

    exportir export MODULE:FACTORY [--example-inputs SPEC ...] [--dynamic DIMSPEC ...]
                    [--backend fused_cpu] -o model.xpt
    exportir lower model.pt2 [--backend fused_cpu] -o model.xpt
    exportir inspect model.xpt [--summary [--top N]] [--method NAME]
    exportir run model.xpt [--method NAME] [--inputs SPEC ...] [--repeat N] [--profile] [--trace T]
    exportir view model.xpt|model.pt2 [-o page.html]     (docs/viewer.md)

Every subcommand takes ``--import MODULE`` (repeatable): a module (or ``.py`` file) imported
before anything else, e.g. the library defining a model's ``torch.library`` custom ops; ``run``
registers the operators it defines with the runtime. ``docs/cli.md`` describes every flag.

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

``export --example-inputs`` also takes ``NAME=SPEC``: a keyword argument of ``forward``.

A ``DIMSPEC`` (``--dynamic``) is ``INPUT:DIM=NAME[MIN,MAX]`` (see :mod:`exportir.cli_dynamic`).

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

from exportir import _cli_profile

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


def _load_module(module_name: str) -> Any:
    """Import a dotted module (found from the current directory too) or a ``.py`` file."""
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
    return module


def import_modules(names: Sequence[str]) -> list[str]:
    """Import the ``--import`` modules; returns the ``torch.library`` operators they defined
    (``namespace::name``)."""
    if not names:
        return []
    before = set(torch._C._dispatch_get_all_op_names())
    for name in names:
        _load_module(name)
    return sorted(set(torch._C._dispatch_get_all_op_names()) - before)


def _import_target(target: str) -> Any:
    module_name, sep, attr = target.rpartition(":")
    if not sep or not module_name or not attr:
        raise CliError(f"expected MODULE:FACTORY (e.g. mypkg.models:make_model); got {target!r}")
    module = _load_module(module_name)
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
        args, kwargs = _example_inputs(specs, generator)
    elif not args and not kwargs:
        raise CliError(f"{target} gives a module without example inputs; pass "
                       "--example-inputs (e.g. --example-inputs f32[1,16])")
    return (module.train() if train else module.eval()), args, kwargs


def _dynamic_shapes(ns: argparse.Namespace, module: torch.nn.Module, args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
    from exportir.cli_dynamic import DimSpecError, dynamic_shapes, parse_dynamic

    texts = [t for group in (ns.dynamic or []) for t in group]
    try:
        return dynamic_shapes(parse_dynamic(texts), module, args, kwargs)
    except DimSpecError as exc:
        raise CliError(str(exc)) from None


def _capture(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
             dynamic: Any) -> Any:
    from exportir.export import export
    from exportir.export.dynamic.dims import UserError

    try:
        return export(module, args, kwargs, dynamic_shapes=dynamic)
    except UserError as exc:
        if dynamic is None:
            raise
        raise CliError(f"export refused the --dynamic specs:\n{exc}") from None


def _lower_and_write(ep: Any, backend: str | None, output: str, stages: Any) -> int:
    """to_edge (with the backend: to_edge_transform_and_lower), to_program, write ``output``;
    the stages are printed."""
    from exportir.program.manager import to_edge

    if backend == "fused_cpu":
        from exportir.backends.fused_cpu import FusedCpuPartitioner
        from exportir.program.transform_and_lower import to_edge_transform_and_lower

        edge = stages.run(
            "lower",
            lambda: to_edge_transform_and_lower(ep, partitioner=[FusedCpuPartitioner()]),
            note="(to_edge_transform_and_lower: to_edge, then fused_cpu claims what it runs)",
        )
    else:
        edge = stages.run("to_edge", lambda: to_edge(ep))
    prog = stages.run("to_program", edge.to_program)
    data = stages.run("serialize", lambda: prog.buffer)
    out = Path(output)
    from exportir.format.serialize import replace_file

    try:
        replace_file(out, lambda f: f.write(data))
    except OSError as exc:
        raise CliError(f"cannot write {output}: {exc.strerror or exc}") from exc
    weights = sum(c.nbytes for c in prog.program.constants)
    print(f"wrote {out} ({len(data)} bytes; constants {weights} bytes; "
          f"{len(prog.program.delegates)} delegate(s); methods "
          f"{', '.join(prog.program.method_names)})")
    for m in prog.program.methods:
        if m.symbols:
            ranges = ", ".join(f"{r.name} in [{r.min}, {'inf' if r.max is None else r.max}]"
                               for r in m.symbols)
            print(f"  method {m.name!r} accepts dynamic sizes: {ranges}")
    return 0


def _import_compiler() -> None:
    importlib.import_module("exportir.export")
    importlib.import_module("exportir.program.manager")


_KEYWORD = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<spec>.+)$")


def _example_inputs(
    specs: Sequence[str], generator: torch.Generator
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Positional SPECs, then keyword ones written ``NAME=SPEC`` (``attention_mask=i64[1,8]``)."""
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for spec in specs:
        keyword = _KEYWORD.match(spec.strip())
        if keyword is None:
            if kwargs:
                raise CliError(f"positional input {spec!r} after keyword inputs; give the "
                               "NAME=SPEC inputs last")
            args.append(parse_input(spec, generator))
        elif keyword["name"] in kwargs:
            raise CliError(f"input {keyword['name']!r} given twice")
        else:
            kwargs[keyword["name"]] = parse_input(keyword["spec"], generator)
    return tuple(args), kwargs


def cmd_export(ns: argparse.Namespace) -> int:
    from exportir.cli_progress import Stages

    generator = torch.Generator().manual_seed(ns.seed)
    torch.manual_seed(ns.seed)
    module, args, kwargs = _model_and_inputs(ns.target, ns.example_inputs, ns.train, generator)
    stages = Stages()
    stages.run("imports", _import_compiler, note="(exportir's compiler)")
    dynamic = _dynamic_shapes(ns, module, args, kwargs)
    ep = stages.run("export", lambda: _capture(module, args, kwargs, dynamic))
    return _lower_and_write(ep, ns.backend, ns.output, stages)


def cmd_lower(ns: argparse.Namespace) -> int:
    import exportir
    from exportir.cli_progress import Stages

    stages = Stages()
    if not Path(ns.path).is_file():
        raise CliError(f"no such file: {ns.path}")
    stages.run("imports", _import_compiler, note="(exportir's compiler)")
    ep = stages.run("load", lambda: exportir.load(ns.path), note=f"({ns.path})")
    return _lower_and_write(ep, ns.backend, ns.output, stages)


# ------------------------------------------------------------------------------ inspect, run


def _read_file(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from exc


def _refuse_archive(path: str, head: bytes) -> None:
    """A zip archive (an ExportedProgram saved by exportir.save or torch.export.save) is not a
    program file: say how to make one."""
    if head[:4] == b"PK\x03\x04":
        raise CliError(f"{path} is a zip archive (an ExportedProgram?), not a program file; "
                       f"lower it first: exportir lower {path} -o model.xpt")


def cmd_inspect(ns: argparse.Namespace) -> int:
    from exportir.format import serialize
    from exportir.program import printer

    data = _read_file(ns.path)
    _refuse_archive(ns.path, data[:4])
    program = serialize.deserialize_program(data)
    layout = serialize.read_layout(data)
    if ns.method is not None and ns.method not in program.method_names:
        raise CliError(f"{ns.path} has no method {ns.method!r}; it has "
                       f"{', '.join(program.method_names)}")
    if ns.summary:
        from exportir.cli_summary import format_summary

        if ns.top < 1:
            raise CliError(f"--top must be at least 1; got {ns.top}")
        print(format_summary(ns.path, program, layout, ns.top, ns.method), end="")
        return 0
    if ns.method is None:
        print(printer.format_program(program, layout), end="")
        if program.delegates:
            from exportir.cli_summary import format_delegates

            print("\n" + "\n".join(format_delegates(program, limit=None)))
        return 0
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


def _kernel_registry(imported_ops: Sequence[str]) -> Any:
    """The default kernels plus the operators the ``--import`` modules defined (on purpose)."""
    if not imported_ops:
        return None
    from exportir.runtime import default_kernel_registry

    kernels = default_kernel_registry()
    for name in imported_ops:
        namespace, _, op = name.partition("::")
        kernels.register_op(getattr(getattr(torch.ops, namespace), op))
    return kernels


# torch imports this module the first time one of its Python meta kernels runs (they are
# wrapped in torch._disable_dynamo); binding kernels runs some, so the first method prepared
# in a process pays for the import.
_TORCH_WARMUP_MODULE = "torch._dynamo"


def _prepare(program: Any, name: str) -> tuple[Any, float]:
    """(method, seconds torch spent importing ``_TORCH_WARMUP_MODULE`` meanwhile)."""
    from exportir.cli_progress import ImportClock

    with ImportClock(_TORCH_WARMUP_MODULE) as clock:
        method = program.method(name)
    return method, clock.seconds


def _prepare_note(name: str, prepared: tuple[Any, float]) -> str:
    from exportir.cli_progress import format_seconds

    method, warmup = prepared
    torch_note = (f"; {format_seconds(warmup)} of it is torch importing {_TORCH_WARMUP_MODULE} "
                  "for its Python meta kernels, once per process") if warmup > 0.05 else ""
    return (f"(method {name!r}: {method.num_instructions} instructions bound to kernels, "
            f"arenas {list(method.arena_bytes)} B{torch_note})")


def cmd_run(ns: argparse.Namespace) -> int:
    from exportir.cli_progress import Stages, format_seconds
    from exportir.runtime import Program

    stages = Stages()
    try:
        with open(ns.path, "rb") as f:
            _refuse_archive(ns.path, f.read(4))
    except OSError:
        pass  # Program.load reports it
    kernels = _kernel_registry(getattr(ns, "imported_ops", ()))
    program = stages.run(
        "load",
        lambda: Program.load(ns.path, kernels=kernels, delegates=_delegate_registry(),
                             verify_data=not ns.no_verify),
        note=f"({ns.path}: read and validated)",
    )
    method, _ = stages.run("prepare", lambda: _prepare(program, ns.method),
                           note=lambda prepared: _prepare_note(ns.method, prepared))
    generator = torch.Generator().manual_seed(ns.seed)
    if ns.inputs:
        inputs = [parse_input(s, generator) for s in ns.inputs]
    else:
        inputs = _random_inputs(method, generator)
    for k, x in enumerate(inputs):
        print(f"input {k:<6} {_describe(x)}")
    outputs: tuple[Any, ...] = ()
    for k in range(ns.warmup):
        t0 = time.perf_counter()
        outputs = method.execute(inputs)
        if k == 0:
            stages.line("first call", format_seconds(time.perf_counter() - t0),
                        "(warm-up: torch's first run of each kernel; not timed below)")
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
    if _cli_profile.wanted(ns):
        _cli_profile.report(method, inputs, ns)
    return 0


# ------------------------------------------------------------------------------ main


def _add_import(p: argparse.ArgumentParser) -> None:
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import MODULE (dotted name or .py file) first, e.g. a custom-op "
                        "library; repeatable")


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
                   help="example inputs: DTYPE[SHAPE] (random), file.npy, or scalars; "
                        "NAME=SPEC for a keyword argument of forward")
    p.add_argument("--dynamic", nargs="+", action="append", metavar="DIMSPEC",
                   help="dynamic dimensions: INPUT:DIM=NAME[MIN,MAX] (INPUT: name or position "
                        "of an input; the same NAME is the same Dim), e.g. x:0=batch[1,64]; "
                        "several per flag, repeatable")
    p.add_argument("-o", "--output", required=True, help="program file to write (.xpt)")
    p.add_argument("--train", action="store_true", help="export in training mode (default eval)")
    p.add_argument("--backend", choices=["fused_cpu"],
                   help="delegate the subgraphs this backend supports")
    p.add_argument("--seed", type=int, default=0, help="seed for random inputs and the factory")
    _add_import(p)
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("lower", help="lower a saved ExportedProgram (.pt2) to a program file")
    p.add_argument("path", help="an ExportedProgram archive written by exportir.save")
    p.add_argument("-o", "--output", required=True, help="program file to write (.xpt)")
    p.add_argument("--backend", choices=["fused_cpu"],
                   help="delegate the subgraphs this backend supports")
    _add_import(p)
    p.set_defaults(func=cmd_lower)

    p = sub.add_parser("inspect", help="print a program file's methods, ops, plan and sizes")
    p.add_argument("path")
    p.add_argument("--summary", action="store_true",
                   help="one screen: inputs/outputs, op histogram, delegates, memory, sizes")
    p.add_argument("--top", type=int, default=10,
                   help="operator kinds shown by --summary (default 10)")
    p.add_argument("--method", help="only this method")
    _add_import(p)
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
    _add_import(p)
    _cli_profile.add_arguments(p)
    p.set_defaults(func=cmd_run)

    from exportir.viewer.cli import add_parser as add_view_parser

    add_view_parser(sub)
    from exportir.cli_generate import register as register_generate

    register_generate(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    from exportir.format.validate import ProgramLoadError
    from exportir.runtime.errors import (
        MethodInputError,
        MissingKernelError,
        RuntimeFailure,
        UnknownMethodError,
    )

    try:
        ns.imported_ops = import_modules(getattr(ns, "imports", None) or [])
        return ns.func(ns)
    except CliError as exc:
        print(f"exportir: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0
    except MissingKernelError as exc:
        hint = ("\n  with the exportir command: pass --import MODULE (the module defining the op); "
                "`run` registers the operators it defines" if "torch.library" in str(exc) else "")
        print(f"exportir: error: {ns.path}: cannot load: {exc}{hint}", file=sys.stderr)
        return 1
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
        hint = ("\n(an operator library that is not imported? pass --import MODULE)"
                if "_OpNamespace" in str(exc) else "")
        print(f"exportir: error: {type(exc).__name__}: {exc}{hint}\n(run with --debug for the "
              "traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
