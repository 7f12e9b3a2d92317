"""The export corpus run through ``exportir.export`` and compared with eager PyTorch.

For every model of ``tests/corpus/export_models.py``:

- ``export(m, args, kwargs).module()`` returns what ``m`` returns, on the example inputs and
  again on fresh random inputs of the same shapes; buffers end up updated exactly like eager's,
  and mutated user inputs are mutated the same way;
- exporting leaves the module, its state and the example inputs untouched;
- the exported graph is functional (no in-place or ``out=`` ops) and carries the seed-000
  metadata contract on every call_function node;
- ``run_decompositions()`` leaves only core ATen ops (plus getitem, higher-order ops and the
  corpus's custom ops) and still matches eager;
- re-exporting ``ep.module()`` gives the same program, and ``save``/``load`` round-trips it.

A failure message names the model; reproduce one with
``PYTHONPATH=src .venv/bin/python -m pytest -p no:xdist tests/export/test_corpus.py -k <name>``.
Set ``EXPORTIR_EXPORT_IMPL=torch.export`` to run the harness against torch itself (see
``TORCH_DIFFERS`` for the tests that then fail on purpose).
"""

from __future__ import annotations

import io
import operator
import re

import pytest
import torch
from corpus import export_harness as h
from corpus import export_models as em

NAMES = [e.name for e in em.ENTRIES]
CUSTOM_NAMESPACES = frozenset({em.CUSTOM_NS})

# With EXPORTIR_EXPORT_IMPL=torch.export these tests fail by design: torch 2.13's export
# returns the non-functional training IR (``add_``, ``copy_`` for buffer updates) and its node
# metadata has ``torch_fn`` instead of ``source_fn_stack`` for plain tensor methods. exportir
# follows the seed-000 contract instead. torch's save/load also fails on namedtuple_io (it
# pickles the example inputs) and no_grad_and_dtype (its loaded graph differs in text).
# The damage tests pin exportir's documented file format (docs/format/exported-program.md).
TORCH_DIFFERS = (
    "test_graph_is_functional",
    "test_node_metadata_contract",
    "test_save_load_roundtrip",
    "test_truncated_file_is_a_serialization_error",
    "test_damaged_member_is_named",
    "test_tampered_member_fails_sha256",
)


def _export(entry: em.Entry):
    module, args, kwargs = em.build(entry)
    ep = h.quiet(h.ours().export, module, args, kwargs)
    return module, args, kwargs, ep


def _run(fn, args: tuple, kwargs: dict):
    args, kwargs = em.clone_inputs(args, kwargs)
    out = h.quiet(fn, *args, **kwargs)
    return out, (args, kwargs)


def _check_against_eager(program_module, eager, args, kwargs, what: str) -> None:
    """One call of each on clones of the inputs: outputs, buffers, mutated inputs."""
    ours_out, ours_inputs = _run(program_module, args, kwargs)
    eager_out, eager_inputs = _run(eager, args, kwargs)
    h.assert_same_tree(ours_out, eager_out, f"{what}: outputs")
    eager_buffers = h.buffers_of(eager)
    ours_buffers = h.buffers_of(program_module)
    assert sorted(ours_buffers) == sorted(eager_buffers), f"{what}: buffer names differ"
    for name, value in eager_buffers.items():
        torch.testing.assert_close(
            ours_buffers[name], value, msg=lambda m, n=name: f"{what}: buffer {n!r} after the call: {m}"
        )
    h.assert_same_tree(ours_inputs, eager_inputs, f"{what}: inputs after the call (user input mutation)")


@pytest.mark.parametrize("name", NAMES)
def test_module_matches_eager(name: str) -> None:
    entry = em.BY_NAME[name]
    module, args, kwargs = em.build(entry)
    eager = h.deepcopy_module(module)
    ep = h.quiet(h.ours().export, module, args, kwargs)
    program_module = ep.module()
    _check_against_eager(program_module, eager, args, kwargs, f"{name} (example inputs)")
    # State carries over from the first call in both, so buffer updates compound the same way.
    for seed in (1, 2):
        fresh_args, fresh_kwargs = em.fresh_inputs(args, kwargs, seed)
        _check_against_eager(program_module, eager, fresh_args, fresh_kwargs, f"{name} (fresh inputs, seed {seed})")


@pytest.mark.parametrize("name", NAMES)
def test_export_leaves_module_and_inputs_untouched(name: str) -> None:
    module, args, kwargs = em.build(em.BY_NAME[name])
    before_state = {k: v.detach().clone() for k, v in module.state_dict(keep_vars=True).items()}
    before_buffers = h.buffers_of(module)
    before_modes = {n: m.training for n, m in module.named_modules()}
    before_inputs = em.clone_inputs(args, kwargs)
    h.quiet(h.ours().export, module, args, kwargs)
    after_state = module.state_dict(keep_vars=True)
    assert sorted(after_state) == sorted(before_state)
    for key, value in before_state.items():
        torch.testing.assert_close(after_state[key].detach(), value, rtol=0, atol=0, msg=f"{name}: {key} changed")
    for key, value in before_buffers.items():
        torch.testing.assert_close(dict(module.named_buffers())[key], value, rtol=0, atol=0)
    assert {n: m.training for n, m in module.named_modules()} == before_modes
    h.assert_same_tree((args, kwargs), before_inputs, f"{name}: example inputs after export")


@pytest.mark.parametrize("name", NAMES)
def test_graph_is_functional(name: str) -> None:
    """No node of the ATen-dialect graph mutates its inputs (seed 000 "functional")."""
    *_, ep = _export(em.BY_NAME[name])
    offenders = []
    for node in ep.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        schema = node.target._schema
        if schema.is_mutable or any(a.is_out for a in schema.arguments):
            offenders.append(h.op_name(node.target))
    assert offenders == [], f"{name}: mutating ops in the exported graph: {offenders}"


@pytest.mark.parametrize("name", NAMES)
def test_node_metadata_contract(name: str) -> None:
    """Every call_function node has ``val``, a ``stack_trace`` into the corpus source,
    ``nn_module_stack`` and ``source_fn_stack``; placeholders and the output have ``val``."""
    *_, ep = _export(em.BY_NAME[name])
    required = {"val", "stack_trace", "nn_module_stack", "source_fn_stack"}
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            assert "val" in node.meta, f"{name}: placeholder {node.name} has no val"
        elif node.op == "call_function":
            missing = required - set(node.meta)
            assert not missing, f"{name}: {node.format_node()} lacks {sorted(missing)}"
            assert "export_models.py" in node.meta["stack_trace"], (
                f"{name}: {node.name}'s stack_trace does not point at the model source:\n"
                f"{node.meta['stack_trace']}"
            )
            stack = node.meta["nn_module_stack"]
            assert isinstance(stack, dict)
            for key, value in stack.items():
                assert isinstance(key, str) and isinstance(value, tuple) and len(value) == 2, (
                    f"{name}: {node.name}: nn_module_stack entry {key!r}: {value!r}"
                )
            val = node.meta["val"]
            if node.target is not operator.getitem and isinstance(val, torch.Tensor):
                assert val.device == torch.device("cpu"), f"{name}: {node.name}: val on {val.device}"
        elif node.op == "output":
            assert "val" in node.meta, f"{name}: the output node has no val"


@pytest.mark.parametrize("name", NAMES)
def test_decomposed_is_core_and_matches(name: str) -> None:
    entry = em.BY_NAME[name]
    module, args, kwargs = em.build(entry)
    eager = h.deepcopy_module(module)
    ep = h.quiet(h.ours().export, module, args, kwargs)
    ops_before, signature_before = h.op_multiset(ep), h.signature_rows(ep)
    decomposed = h.quiet(ep.run_decompositions)
    # Decomposing returns a new program and leaves the original one as it was.
    assert (h.op_multiset(ep), h.signature_rows(ep)) == (ops_before, signature_before)
    # Non-core ops torch itself keeps are allowed (pinned against torch by test_oracle.py).
    allowed_noncore = em.TORCH_KEEPS_NONCORE.get(name, frozenset())
    bad = sorted(
        {
            h.op_name(n.target)
            for n in decomposed.graph.nodes
            if n.op == "call_function" and not h.is_core_or_allowed(n.target, CUSTOM_NAMESPACES)
        }
        - allowed_noncore
    )
    assert bad == [], f"{name}: non-core ops left after run_decompositions(): {bad}"
    program_module = decomposed.module()
    _check_against_eager(program_module, eager, args, kwargs, f"{name} decomposed (example inputs)")
    fresh_args, fresh_kwargs = em.fresh_inputs(args, kwargs, 3)
    _check_against_eager(program_module, eager, fresh_args, fresh_kwargs, f"{name} decomposed (fresh inputs)")


@pytest.mark.parametrize("name", NAMES)
def test_reexport_of_module_is_same_program(name: str) -> None:
    """Whole-suite variant: export ``ep.module()`` again; same ops, signature, numerics."""
    _module, args, kwargs, ep = _export(em.BY_NAME[name])
    eager = h.deepcopy_module(em.build(em.BY_NAME[name])[0])
    again = h.quiet(h.ours().export, ep.module(), args, kwargs)
    assert h.op_multiset(again) == h.op_multiset(ep)
    assert h.signature_rows(again) == h.signature_rows(ep)
    _check_against_eager(again.module(), eager, args, kwargs, f"{name} re-exported")


# --------------------------------------------------------------------------------------------
# Save / load.


def _save_load(ep):
    impl = h.ours()
    assert impl.save is not None and impl.load is not None, f"{impl.name} has no save/load yet"
    buf = io.BytesIO()
    impl.save(ep, buf)
    data = buf.getvalue()
    return data, impl.load(io.BytesIO(data))


@pytest.mark.parametrize("name", NAMES)
def test_save_load_roundtrip(name: str) -> None:
    entry = em.BY_NAME[name]
    _module, args, kwargs, ep = _export(entry)
    eager = h.deepcopy_module(em.build(entry)[0])
    _, loaded = _save_load(ep)
    assert str(loaded.graph) == str(ep.graph)
    assert h.signature_rows(loaded) == h.signature_rows(ep)
    assert sorted(loaded.state_dict) == sorted(ep.state_dict)
    for key, value in ep.state_dict.items():
        torch.testing.assert_close(loaded.state_dict[key], value, rtol=0, atol=0)
    assert sorted(loaded.constants) == sorted(ep.constants)
    _check_against_eager(loaded.module(), eager, args, kwargs, f"{name} after save/load")


DAMAGE_MODELS = ["mlp", "dict_io", "gpt_kv_cache", "tensor_constant"]


def _serialization_error():
    from exportir.export.serialize.save_load import SerializationError

    return SerializationError


@pytest.mark.parametrize("name", DAMAGE_MODELS)
def test_truncated_file_is_a_serialization_error(name: str) -> None:
    """docs/format/exported-program.md: every bad file raises SerializationError, whose
    message starts with the member and the location inside it (or the archive itself)."""
    *_, ep = _export(em.BY_NAME[name])
    data, _ = _save_load(ep)
    error = _serialization_error()
    for cut in sorted({0, 1, 4, 30, len(data) // 3, len(data) // 2, len(data) - 22, len(data) - 1}):
        with pytest.raises(error) as info:
            h.ours().load(io.BytesIO(data[:cut]))
        assert str(info.value).strip(), f"{name}: empty message for a file cut at {cut}"


def _member_payload(data: bytes, member: str) -> tuple[int, int]:
    """Byte range of an uncompressed zip member's data inside the archive."""
    import zipfile

    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        info = zf.getinfo(member)
        assert info.compress_type == zipfile.ZIP_STORED, "members are stored uncompressed (documented)"
        header = data[info.header_offset : info.header_offset + 30]
        name_len = int.from_bytes(header[26:28], "little")
        extra_len = int.from_bytes(header[28:30], "little")
        start = info.header_offset + 30 + name_len + extra_len
        return start, start + info.file_size


@pytest.mark.parametrize("name", DAMAGE_MODELS)
@pytest.mark.parametrize("member", ["program.json", "weights.safetensors"])
def test_damaged_member_is_named(name: str, member: str) -> None:
    """One flipped byte inside a member: a SerializationError whose message starts with the
    member's name (the zip CRC or the manifest's SHA-256 catches it)."""
    *_, ep = _export(em.BY_NAME[name])
    data, _ = _save_load(ep)
    start, end = _member_payload(data, member)
    assert end > start, f"{name}: {member} is empty"
    damaged = bytearray(data)
    damaged[(start + end) // 2] ^= 0x01
    with pytest.raises(_serialization_error(), match=rf"^{re.escape(member)}\b"):
        h.ours().load(io.BytesIO(bytes(damaged)))


def _rezip(data: bytes, member: str, edit) -> bytes:
    """The archive with ``member`` replaced by ``edit(bytes)``, every zip checksum valid: a
    deliberate edit that only the manifest's SHA-256 can catch."""
    import zipfile

    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            payload = src.read(info)
            dst.writestr(info, edit(payload) if info.filename == member else payload)
    return out.getvalue()


@pytest.mark.parametrize("name", DAMAGE_MODELS)
def test_tampered_member_fails_sha256(name: str) -> None:
    *_, ep = _export(em.BY_NAME[name])
    data, _ = _save_load(ep)

    def flip(payload: bytes) -> bytes:
        damaged = bytearray(payload)
        damaged[len(damaged) // 2] ^= 0x01
        return bytes(damaged)

    for member in ("program.json", "weights.safetensors"):
        with pytest.raises(_serialization_error(), match=rf"^{re.escape(member)}.*SHA-256"):
            h.ours().load(io.BytesIO(_rezip(data, member, flip)))


@pytest.mark.parametrize("name", DAMAGE_MODELS)
def test_save_is_deterministic(name: str) -> None:
    *_, ep = _export(em.BY_NAME[name])
    first, _ = _save_load(ep)
    second, _ = _save_load(ep)
    assert first == second
