"""One KV cache shared by an LLM program's ``prefill`` and ``decode`` (format 2.2 shared state),
on a hand-written decoder with its cache in registered buffers."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import subprocess
import sys

import pytest
import torch
from toy_lm import eager_greedy, toy_lm

import exportir
from exportir.format.validate import ProgramLoadError
from exportir.program import schema, serialize
from exportir.program.emit import EmitConfig, EmitError
from exportir.program.llm import export_llm
from exportir.runtime import Program, generate, llm_info

PROMPT = [5, 9, 33, 2, 17]
SRC = str(pathlib.Path(__file__).resolve().parents[2] / "src")


@pytest.fixture(scope="module")
def toy_program() -> bytes:
    return export_llm(toy_lm(), max_seq_len=24, max_prefill=8, token_arg=None,
                      position_arg=None, eos_ids=(63,)).buffer


def test_methods_share_one_cache(toy_program):
    program = Program.load(toy_program)
    assert set(program.method_names) >= {"prefill", "decode", "get_max_seq_len", "get_eos_ids"}
    prefill, decode = (program.schema.method(n) for n in ("prefill", "decode"))
    assert {s.name for s in prefill.shared_state} == {"model.k_cache", "model.v_cache"}
    assert {s.name for s in decode.shared_state} == {"model.k_cache", "model.v_cache"}
    # the cache lives in arena 1 of both methods, not in their working arenas
    assert prefill.plan.arenas[1] == decode.plan.arenas[1] == 2 * 24 * 16 * 4
    assert toy_program[10:12] == (2).to_bytes(2, "little")  # minor version 2.2
    assert llm_info(program).eos_ids == (63,)


def test_generate_equals_eager(toy_program):
    expected = eager_greedy(toy_lm(), PROMPT, 10)
    program = Program.load(toy_program)
    assert list(generate(program, PROMPT, 10, stop_at_eos=False)) == expected
    # a second call starts a new sequence (reset_state), and gives the same tokens
    assert list(generate(program, PROMPT, 10, stop_at_eos=False)) == expected


def test_generate_command_in_a_fresh_process(toy_program, tmp_path):
    path = tmp_path / "toy.xpt"
    path.write_bytes(toy_program)
    cmd = [sys.executable, "-m", "exportir.cli", "generate", str(path), "--prompt-ids",
           ",".join(map(str, PROMPT)), "--max-new-tokens", "6", "--ignore-eos", "--timing"]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": SRC})
    assert done.returncode == 0, done.stderr
    assert [int(t) for t in done.stdout.split()] == eager_greedy(toy_lm(), PROMPT, 6)
    assert "decode" in done.stderr and "tokens/s" in done.stderr


def test_long_prompt_prefills_in_blocks(toy_program):
    prompt = list(range(1, 20))  # 19 tokens: blocks of 8, 8, 2 (max_prefill=8), then decode
    expected = eager_greedy(toy_lm(), prompt, 4)
    assert list(generate(Program.load(toy_program), prompt, 4, stop_at_eos=False)) == expected
    one = eager_greedy(toy_lm(), [7], 3)  # a one-token prompt is a decode step
    assert list(generate(Program.load(toy_program), [7], 3, stop_at_eos=False)) == one


def test_sampling_is_seeded(toy_program):
    program = Program.load(toy_program)
    a = list(generate(program, PROMPT, 8, temperature=0.9, top_k=5, seed=3, stop_at_eos=False))
    b = list(generate(program, PROMPT, 8, temperature=0.9, top_k=5, seed=3, stop_at_eos=False))
    assert a == b
    greedy = list(generate(program, PROMPT, 8, stop_at_eos=False))
    assert list(generate(program, PROMPT, 8, temperature=1.0, top_k=1, seed=0,
                         stop_at_eos=False)) == greedy


def test_generate_rejects_bad_requests(toy_program):
    program = Program.load(toy_program)
    with pytest.raises(ValueError, match="exceeds the program's KV cache of 24"):
        generate(program, PROMPT, 20)
    with pytest.raises(ValueError, match="prompt is empty"):
        generate(program, [], 2)
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 64\)"):
        generate(program, [64], 2)
    with pytest.raises(ValueError, match="temperature"):
        generate(program, PROMPT, 2, temperature=-1.0)
    plain = exportir.to_edge(exportir.export(torch.nn.ReLU(), (torch.ones(2),))).to_program()
    with pytest.raises(ValueError, match="not an LLM program"):
        generate(Program.load(plain.buffer), PROMPT, 2)
    with pytest.raises(ValueError, match="max_prefill"):
        export_llm(toy_lm(), max_seq_len=24, max_prefill=30, token_arg=None, position_arg=None)


def _cache_module(rows: int) -> torch.nn.Module:
    class Step(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("cache", torch.zeros(rows, 4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.cache.add_(x)
            return self.cache.sum(0)

    return Step()


def test_state_is_shared_only_when_asked():
    x = torch.ones(3, 4)
    programs = {"a": exportir.export(_cache_module(3), (x,)),
                "b": exportir.export(_cache_module(3), (x,))}
    shared = Program.load(exportir.to_edge(programs).to_program(
        EmitConfig(share_mutable_buffers=True)).buffer)
    shared.method("a")(x)
    assert torch.equal(shared.method("b")(x), torch.full((4,), 6.0))
    shared.reset_state()
    assert torch.equal(shared.method("b")(x), torch.full((4,), 3.0))
    separate = Program.load(exportir.to_edge(programs).to_program().buffer)
    separate.method("a")(x)
    assert torch.equal(separate.method("b")(x), torch.full((4,), 3.0))


def test_shared_buffer_shapes_must_agree():
    programs = {"a": exportir.export(_cache_module(3), (torch.ones(3, 4),)),
                "b": exportir.export(_cache_module(5), (torch.ones(5, 4),))}
    with pytest.raises(EmitError, match=r"buffer 'cache' is .*\[5, 4\] in method 'b'"):
        exportir.to_edge(programs).to_program(EmitConfig(share_mutable_buffers=True))


def _reload(program: schema.Program) -> Program:
    return Program.load(serialize.serialize_program(program))


def test_hostile_shared_state_is_refused(toy_program):
    program = serialize.deserialize_program(toy_program)
    m = program.method("decode")
    index = program.methods.index(m)

    def with_entry(entry: schema.SharedState) -> schema.Program:
        methods = list(program.methods)
        methods[index] = dataclasses.replace(m, shared_state=(entry,) + m.shared_state[1:])
        return dataclasses.replace(program, methods=tuple(methods))

    not_state = next(i for i in m.inputs)
    with pytest.raises(ProgramLoadError, match=r"shared_state\[0\]\.value"):
        _reload(with_entry(schema.SharedState("model.k_cache", not_state)))
    with pytest.raises(ProgramLoadError, match=r"shared_state\[0\]\.value"):
        _reload(with_entry(schema.SharedState("model.k_cache", 10**6)))
    with pytest.raises(ProgramLoadError, match="empty or repeated"):
        _reload(with_entry(schema.SharedState("", m.shared_state[0].value)))


def test_hostile_shared_state_shapes_are_refused():
    """Two methods naming one shared state with different shapes: refused at load."""
    programs = {"a": exportir.export(_cache_module(3), (torch.ones(3, 4),)),
                "b": exportir.export(_cache_module(5), (torch.ones(5, 4),))}
    program = exportir.to_edge(programs).to_program().program
    methods = []
    for m in program.methods:
        state = next(i for i, v in enumerate(m.values)
                     if isinstance(v, schema.Tensor) and v.initial is not None)
        methods.append(dataclasses.replace(m, shared_state=(schema.SharedState("cache", state),)))
    with pytest.raises(ProgramLoadError, match=r"methods\[1\]\.shared_state\[0\].*float32\[5, 4\]"):
        _reload(dataclasses.replace(program, methods=tuple(methods)))
