"""``to_edge`` and ``EdgeProgramManager``: the Edge dialect stage of the pipeline (seed 001).

``to_edge`` takes one ``ExportedProgram`` (the method ``"forward"``) or a dict of them and,
for each method:

1. decomposes to the core ATen op set (``run_decompositions``; ``preserve_ops`` stay whole),
   and the few non-core ops the core table leaves (``linalg_vector_norm``, ``histc``: see
   :mod:`exportir.passes.edge_decompositions`),
2. removes unused assertion ops,
3. turns view ops into their ``*_copy`` ops,
4. lifts Python scalars in ``Tensor`` argument positions to constant tensors,
5. replaces ATen ops with edge ops,

then builds the edge ``ExportedProgram`` whose construction runs the Edge verifier.
``EdgeProgramManager`` mirrors ExecuTorch's: ``exported_program(name)``, ``methods``,
``transform(passes)`` (re-verifies), ``to_backend(partitioner)``, ``to_program(config)``.
Backends that need ops kept whole (``Partitioner.ops_to_not_decompose``) are lowered with
``exportir.to_edge_transform_and_lower`` (``transform_and_lower.py``), built on the steps here.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from exportir.dialects.edge.config import CONFIG_META_KEY, EdgeCompileConfig
from exportir.dialects.edge.verifier import EdgeVerifier
from exportir.export.program.exported_program import ExportedProgram, default_decompositions
from exportir.export.serialize.torch_interop import from_torch, is_torch_program
from exportir.export.signature import ExportGraphSignature
from exportir.passes.edge_decompositions import edge_decompositions
from exportir.passes.scalar_to_tensor import scalar_to_tensor
from exportir.passes.to_edge import OpReplacePass, RemoveGraphAssertsPass
from exportir.passes.view_copy import ReplaceViewOpsWithViewCopyPass

__all__ = ["EdgeCompileConfig", "EdgeProgramManager", "ProgramManager", "to_edge"]

_DEFAULT_METHOD = "forward"
Pass = Callable[..., Any]


def _as_methods(
    programs: ExportedProgram | Mapping[str, ExportedProgram], caller: str = "to_edge"
) -> dict[str, ExportedProgram]:
    if isinstance(programs, ExportedProgram):
        return {_DEFAULT_METHOD: programs}
    if is_torch_program(programs):  # torch.export's: converted (exportir.from_torch)
        return {_DEFAULT_METHOD: from_torch(programs)}
    if isinstance(programs, Mapping) and programs:
        programs = {k: from_torch(v) if is_torch_program(v) else v for k, v in programs.items()}
        bad = {
            k: type(v).__name__ for k, v in programs.items() if not isinstance(v, ExportedProgram)
        }
        if not bad and all(isinstance(k, str) for k in programs):
            return dict(programs)
        raise TypeError(
            f"{caller} takes an ExportedProgram or a dict of method name -> ExportedProgram; "
            f"got non-programs {bad}"
        )
    raise TypeError(
        f"{caller} takes an ExportedProgram (from exportir.export or torch.export.export) or a "
        f"non-empty dict of method name -> ExportedProgram; got {type(programs).__name__}"
    )


def core_decomposition_table(config: EdgeCompileConfig) -> dict[Any, Callable[..., Any]]:
    """The table ``to_edge`` decomposes with: the core ATen table and the Edge additions
    (:mod:`exportir.passes.edge_decompositions`), minus ``preserve_ops``."""
    table = {**default_decompositions(), **edge_decompositions()}
    for op in config.preserve_ops:
        table.pop(op, None)
    return table


def _build_edge_program(
    ep: ExportedProgram,
    gm: Any,
    signature: ExportGraphSignature,
    constants: dict[str, Any],
    config: EdgeCompileConfig,
) -> ExportedProgram:
    gm.meta[CONFIG_META_KEY] = config
    return ExportedProgram(
        root=gm,
        graph=gm.graph,
        graph_signature=signature,
        state_dict=ep.state_dict,
        range_constraints=copy.deepcopy(ep.range_constraints),
        module_call_graph=copy.deepcopy(ep.module_call_graph),
        example_inputs=ep.example_inputs,
        constants=constants,
        verifiers=[EdgeVerifier],
    )


def lower_to_edge(ep: ExportedProgram, config: EdgeCompileConfig) -> ExportedProgram:
    """One method's ATen program -> its verified Edge program (steps 1-5 of ``to_edge``)."""
    return edge_from_core_aten(ep.run_decompositions(core_decomposition_table(config)), config)


def edge_from_core_aten(aten_ep: ExportedProgram, config: EdgeCompileConfig) -> ExportedProgram:
    """Steps 2-5 of ``to_edge`` on a program already decomposed to core ATen (plus the ops
    ``config`` accepts); the result is verified with ``config``."""
    gm = aten_ep.graph_module
    for gm_pass in (RemoveGraphAssertsPass(), ReplaceViewOpsWithViewCopyPass()):
        gm_pass(gm)
    lifted = scalar_to_tensor(gm, aten_ep.graph_signature, dict(aten_ep.constants))
    OpReplacePass()(gm)
    gm.recompile()
    signature = ExportGraphSignature(lifted.input_specs, list(aten_ep.graph_signature.output_specs))
    return _build_edge_program(aten_ep, gm, signature, lifted.constants, config)


def to_edge(
    programs: ExportedProgram | Mapping[str, ExportedProgram],
    constant_methods: Mapping[str, Any] | None = None,
    compile_config: EdgeCompileConfig | None = None,
) -> EdgeProgramManager:
    """Lower exported programs to the Edge dialect; see the module docstring.

    ``programs``: one ``ExportedProgram`` (method ``"forward"``) or ``{name: program}``.
    ``constant_methods``: methods returning constants (name -> value), carried to the program.
    Raises ``SpecViolationError`` naming the node, op, dtype, source line and the way out
    when a method is not valid Edge IR.
    """
    config = compile_config or EdgeCompileConfig()
    methods = _as_methods(programs)
    edge = {name: lower_to_edge(ep, config) for name, ep in methods.items()}
    return EdgeProgramManager(edge, constant_methods, config)


def _apply_passes(
    ep: ExportedProgram, passes: Sequence[Pass], config: EdgeCompileConfig
) -> ExportedProgram:
    """Run ``passes`` on one method: GraphModule passes (-> PassResult / None) or
    ExportedProgram -> ExportedProgram callables. ``ep`` itself is left untouched."""
    gm = copy.deepcopy(ep.graph_module)
    gm.meta[CONFIG_META_KEY] = config  # the passes' result is verified with this config
    ep = ep._update(gm, copy.deepcopy(ep.graph_signature))
    for p in passes:
        if _takes_program(p):
            ep = p(ep)
            ep.graph_module.meta.setdefault(CONFIG_META_KEY, config)
        else:
            ep = ep._transform_do_not_use(p)
    return ep


def _takes_program(p: Pass) -> bool:
    return bool(getattr(p, "takes_exported_program", False))


class EdgeProgramManager:
    """One or more methods in the Edge dialect; verified when built."""

    def __init__(
        self,
        edge_programs: ExportedProgram | Mapping[str, ExportedProgram],
        constant_methods: Mapping[str, Any] | None = None,
        compile_config: EdgeCompileConfig | None = None,
    ) -> None:
        self.compile_config = compile_config or EdgeCompileConfig()
        self._edge_programs: dict[str, ExportedProgram] = _as_methods(edge_programs)
        self._config_methods: dict[str, Any] = dict(constant_methods or {})
        clash = set(self._edge_programs) & set(self._config_methods)
        if clash:
            raise ValueError(
                f"constant methods {sorted(clash)} have the same names as program methods; "
                "rename one of them"
            )
        for ep in self._edge_programs.values():
            if compile_config is not None:
                ep.graph_module.meta[CONFIG_META_KEY] = compile_config
            else:
                ep.graph_module.meta.setdefault(CONFIG_META_KEY, self.compile_config)
            EdgeVerifier().check(ep)

    @property
    def methods(self) -> set[str]:
        """Names of the methods (not constant methods)."""
        return set(self._edge_programs)

    @property
    def config_methods(self) -> set[str]:
        return set(self._config_methods)

    @property
    def constant_methods(self) -> dict[str, Any]:
        return dict(self._config_methods)

    def exported_program(self, method_name: str = _DEFAULT_METHOD) -> ExportedProgram:
        """The edge ``ExportedProgram`` of ``method_name``."""
        if method_name not in self._edge_programs:
            raise KeyError(
                f"no method {method_name!r} in this EdgeProgramManager; methods: "
                f"{sorted(self._edge_programs)}"
            )
        return self._edge_programs[method_name]

    def transform(
        self,
        passes: Sequence[Pass] | Mapping[str, Sequence[Pass]],
        compile_config: EdgeCompileConfig | None = None,
    ) -> EdgeProgramManager:
        """A new manager with ``passes`` run on every method (or per method when a dict),
        in order; the result is verified again. GraphModule passes return a ``PassResult``
        (or None after editing in place)."""
        config = compile_config or self.compile_config
        new: dict[str, ExportedProgram] = {}
        for name, ep in self._edge_programs.items():
            method_passes = passes.get(name, ()) if isinstance(passes, Mapping) else passes
            new[name] = _apply_passes(ep, method_passes, config) if method_passes else ep
        return EdgeProgramManager(new, self._config_methods, config)

    def to_backend(self, partitioner: Any) -> EdgeProgramManager:
        """Delegate what ``partitioner`` claims to backends (one partitioner for every method,
        or a dict method name -> partitioner)."""
        try:
            from exportir.passes.to_backend import to_backend
        except ImportError as e:
            raise NotImplementedError(
                "to_backend needs exportir.passes.to_backend.to_backend(program, partitioner) "
                f"from the Backend dialect, which is not available yet ({e})"
            ) from e
        new: dict[str, ExportedProgram] = {}
        for name, ep in self._edge_programs.items():
            part = partitioner.get(name) if isinstance(partitioner, Mapping) else partitioner
            new[name] = to_backend(ep, part) if part is not None else ep
        return EdgeProgramManager(new, self._config_methods, self.compile_config)

    def to_program(self, config: Any = None) -> ProgramManager:
        """Emit every method into one program (out variants, memory plan, kernel check)."""
        try:
            from exportir.program.emit import emit_program
        except ImportError as e:
            raise NotImplementedError(
                "to_program needs exportir.program.emit.emit_program(methods, config), which "
                f"is not available yet ({e})"
            ) from e
        program = emit_program(self._edge_programs, config, constant_methods=self._config_methods)
        return ProgramManager(program, dict(self._edge_programs))

    def __repr__(self) -> str:
        return f"EdgeProgramManager(methods={sorted(self.methods)})"


class ProgramManager:
    """An emitted program: ``program`` (the schema object), ``buffer`` (file bytes),
    ``save(path)`` / ``write_to_file(f)``, and the edge programs it came from."""

    def __init__(self, program: Any, edge_programs: dict[str, ExportedProgram]) -> None:
        self.program = program
        self._edge_programs = edge_programs
        self._buffer: bytes | None = None

    @property
    def methods(self) -> set[str]:
        return set(self._edge_programs)

    def exported_program(self, method_name: str = _DEFAULT_METHOD) -> ExportedProgram:
        return self._edge_programs[method_name]

    @property
    def deferred_weights(self) -> list[str]:
        """Names of weights that were meta tensors at emission and are not attached yet."""
        from exportir.program.weights import deferred_weights

        return deferred_weights(self.program)

    def attach_weights(self, *sources: Any) -> ProgramManager:
        """Fill the weights of a model exported on the ``meta`` device, from safetensors files
        (memory-mapped, tensor by tensor) or mappings of name -> tensor, tried in order; a
        program name matches a checkpoint key equal to it or ending it after a ``.``. Mutable
        state missing from every source starts at zero. Returns ``self``; raises
        ``WeightsError`` naming a missing or mismatched weight."""
        from exportir.program.weights import attach_weights

        self.program = attach_weights(self.program, sources)
        self._buffer = None
        return self

    @property
    def buffer(self) -> bytes:
        missing = self.deferred_weights
        if missing:
            shown = ", ".join(repr(n) for n in missing[:5])
            raise ValueError(
                f"{len(missing)} weight(s) of this program were meta tensors at export and have "
                f"no data yet ({shown}{', ...' if len(missing) > 5 else ''}); attach them with "
                "attach_weights(checkpoint.safetensors) before saving")
        if self._buffer is None:
            from exportir.format.serialize import serialize_program

            self._buffer = serialize_program(self.program)
        return self._buffer

    def get_etrecord(self) -> Any:
        """The program's ETRecord (``exportir.program.etrecord.ETRecord``): per method, the
        graph it was emitted from as a reference program, for ``exportir.debug.compare``
        against the program file; ``.save(path)`` writes it."""
        from exportir.program.etrecord import ETRecord

        return ETRecord.of(self)

    def pte_buffer(self) -> bytes:
        """The program as an ExecuTorch ``.pte`` file (docs/format/pte.md): same emission and
        memory plan, ExecuTorch's encoding. Raises ``PteEncodeError`` (a ``ValueError``) before
        writing anything ExecuTorch's portable runtime cannot run, listing the missing kernels."""
        from exportir.format.pte_write import write_pte

        return write_pte(self.program)

    def write_to_file(self, f: Any, format: str = "xpt") -> None:
        f.write(self._encoded(format))

    def save(self, path: str | os.PathLike[str], format: str | None = None) -> None:
        """Write the program to ``path``: ``format="pte"`` (or a ``.pte`` suffix) writes
        ExecuTorch's format, ``"xpt"`` (the default otherwise) exportir's."""
        if format is None:
            format = "pte" if os.fspath(path).lower().endswith(".pte") else "xpt"
        data = self._encoded(format)  # encode first: a refused program leaves no file behind
        from exportir.format.serialize import replace_file

        # a new file renamed over the old one: a program loaded from the old file keeps running
        replace_file(path, lambda f: f.write(data))

    def _encoded(self, format: str) -> bytes:
        if format == "xpt":
            return self.buffer
        if format == "pte":
            return self.pte_buffer()
        raise ValueError(f"unknown program format {format!r}; choose 'xpt' (exportir's) or "
                         "'pte' (ExecuTorch's)")
