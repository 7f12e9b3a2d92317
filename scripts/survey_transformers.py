"""Every transformers model class of one kind through exportir's stages, one line per model.

    PYTHONPATH=src .venv/bin/python scripts/survey_transformers.py [--suffix ForCausalLM]
        [--stages torch,export,core,dynamic,program,fused] [--memory-gib 10] [Name ...]

Where tests/corpus/real_models.py holds ~80 chosen architectures, this walks every class of the
installed transformers whose name ends with ``--suffix`` (``ForCausalLM``: ~170 in 5.23), builds
each from its config class with tiny text sizes and random weights (a second set of sizes when
the first does not build: some configs need ``pad_token_id`` inside the vocabulary or derive
``head_dim``), and runs it on a batch of two 8-token sequences (image classes,
``--suffix ForImageClassification``: their default config with tiny widths and depth, two 64 x 64
images, the batch dynamic):

- ``torch``: ``torch.export.export(strict=False)`` succeeds (the oracle: a model torch cannot
  export either is reported, not counted against us);
- ``export``: ``exportir.export`` and ``ep.module()`` equal to eager;
- ``core``: ``run_decompositions()`` equal to eager;
- ``dynamic``: batch and sequence length dynamic, ``module()`` on a 3 x 5 input (``refused``
  where torch.export refuses the same spec: models that specialize the sequence length);
- ``program`` / ``fused``: ``to_edge -> to_program -> save -> load -> run`` on the portable and
  the ``FusedCpuPartitioner`` roads, equal to eager.

A developer's survey, not a test (the assertions are in tests/real_models/); each stage has a
time limit and the process an address-space limit, so one configuration that allocates
gigabytes (some defaults do) is reported instead of taking the machine down.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
warnings.filterwarnings("ignore")

import torch
from corpus import real_models as R  # the torchvision shim, before transformers
from survey_real_models import mismatch  # (this script's folder is on sys.path)

import exportir

VISION = False  # set by --suffix: image classes take pixel_values, dynamic in the batch only
STAGES = ("torch", "export", "core", "dynamic", "program", "fused")
# two sets of tiny sizes: the first as the corpus's LLMs, the second for configs that reject it
SIZES = (
    {**R.TINY_TEXT, "tie_word_embeddings": False, "num_key_value_heads": 2, "head_dim": 8},
    {**R.TINY_TEXT, "tie_word_embeddings": False, "num_key_value_heads": 4, "pad_token_id": 0},
)


class StageTimeout(Exception):
    pass


class _AsTorch(Exception):
    """exportir refused what torch.export refuses too (e.g. a dynamic dim the model specializes)."""


def _alarm(*_: Any) -> None:
    raise StageTimeout("stage time limit")


# vision classes (``--suffix ForImageClassification``): the config's defaults, these made tiny
VISION_SIZES = {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 2,
                "intermediate_size": 64, "image_size": 64}


def _vision_config(cls: Any) -> Any:
    cfg = cls.config_class()
    for key, value in VISION_SIZES.items():
        if isinstance(getattr(cfg, key, None), int):
            setattr(cfg, key, value)
    return cfg


def _pixels(cfg: Any, batch: int) -> dict[str, Any]:
    size = getattr(cfg, "image_size", 64)
    size = size if isinstance(size, int) else 64
    channels = getattr(cfg, "num_channels", 3)
    g = torch.Generator().manual_seed(batch)
    return {"pixel_values": torch.randn(batch, channels, size, size, generator=g)}


def build(name: str) -> tuple[torch.nn.Module, dict[str, Any], Any]:
    import transformers

    cls = getattr(transformers, name)
    if VISION:
        cfg = _vision_config(cls)
        torch.manual_seed(0)
        model = cls(cfg).eval()
        kwargs = _pixels(cfg, 2)  # not 1: torch.export specializes a size-1 dim
        with torch.no_grad():
            return model, kwargs, model(**kwargs)
    last: Exception | None = None
    for sizes in SIZES:
        try:
            cfg = cls.config_class(**sizes)
            cfg.use_cache = False
            torch.manual_seed(0)
            model = cls(cfg).eval()
            kwargs = R.text_inputs()(2, 8, 0)
            with torch.no_grad():
                return model, kwargs, model(**kwargs)
        except Exception as e:  # noqa: BLE001  (the next set of sizes, then a BUILD line)
            last = e
    assert last is not None
    raise last


def _run_file(lowered: Any, kwargs: dict[str, Any]) -> Any:
    from exportir.runtime import Program

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.xpt")
        lowered.to_program().save(path)
        return Program.load(path).method("forward")(**kwargs)


def survey(name: str, stages: tuple[str, ...], limit: int) -> tuple[str, dict[str, str]]:
    try:
        model, kw, ref = build(name)
    except Exception as e:  # noqa: BLE001
        return f"{name:42s} BUILD {type(e).__name__}: {str(e).splitlines()[0][:90] if str(e) else ''}", {}
    from torch.export import Dim

    state: dict[str, Any] = {}

    def run(stage: str) -> str | None:
        if stage == "torch":
            torch.export.export(model, (), kw, strict=False)
            return None
        if stage == "export":
            state["ep"] = exportir.export(model, (), kw)
            return mismatch(state["ep"].module()(**kw), ref)
        ep = state["ep"]
        if stage == "core":
            return mismatch(ep.run_decompositions().module()(**kw), ref)
        if stage == "dynamic":
            b, s = Dim("batch", min=1, max=16), Dim("seq", min=2, max=32)
            if VISION:
                spec = {k: {0: b} for k in kw}
                fresh = _pixels(model.config, 3)
            else:
                spec = {k: {0: b, 1: s} for k in kw}
                fresh = R.text_inputs()(3, 5, 1)
            with torch.no_grad():
                fresh_ref = model(**fresh)
            try:
                ep = exportir.export(model, (), kw, dynamic_shapes=spec)
            except Exception as e:
                try:
                    torch.export.export(model, (), kw, dynamic_shapes=spec, strict=False)
                except Exception:  # noqa: BLE001
                    raise _AsTorch(f"{type(e).__name__}, as torch.export") from None
                raise
            return mismatch(ep.module()(**fresh), fresh_ref)
        if stage == "program":
            return mismatch(_run_file(exportir.to_edge(ep), kw), ref)
        from exportir.backends.fused_cpu import FusedCpuPartitioner

        lowered = exportir.to_edge_transform_and_lower(ep, partitioner=[FusedCpuPartitioner()])
        return mismatch(_run_file(lowered, kw), ref)

    results: dict[str, str] = {}
    start = time.perf_counter()
    for stage in stages:
        if stage != "torch" and stage != "export" and "ep" not in state:
            break
        signal.alarm(limit)
        try:
            bad = run(stage)
            results[stage] = "ok" if bad is None else f"BAD({bad})"
        except _AsTorch as e:
            results[stage] = f"refused({e})"
        except Exception as e:  # noqa: BLE001  (a survey reports every failure and goes on)
            first = str(e).splitlines()[0][:140] if str(e) else ""
            results[stage] = f"FAIL({type(e).__name__}: {first})"
        finally:
            signal.alarm(0)
    cells = " ".join(f"{k}:{v}" for k, v in results.items())
    return f"{name:42s} {time.perf_counter() - start:5.1f}s {cells}", results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*")
    parser.add_argument("--suffix", default="ForCausalLM")
    parser.add_argument("--stages", default=",".join(STAGES))
    parser.add_argument("--time-limit", type=int, default=180, help="seconds per stage")
    parser.add_argument("--memory-gib", type=float, default=10.0, help="address-space limit")
    args = parser.parse_args()
    limit = int(args.memory_gib * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGALRM, _alarm)

    import transformers

    transformers.logging.set_verbosity_error()
    names = args.names or sorted(
        n for n in dir(transformers) if n.endswith(args.suffix) and not n.startswith(("Auto", "TF"))
    )
    global VISION
    VISION = "Image" in args.suffix or "Segmentation" in args.suffix
    stages = tuple(s for s in args.stages.split(",") if s)
    unknown = set(stages) - set(STAGES)
    if unknown:
        parser.error(f"unknown stages {sorted(unknown)}; choose from {','.join(STAGES)}")
    tally: Counter[str] = Counter()
    for name in names:
        line, results = survey(name, stages, args.time_limit)
        print(line, flush=True)
        if not results:
            tally["did not build"] += 1
            continue
        torch_ok = results.get("torch", "ok") == "ok"
        ours_ok = all(v == "ok" or v.startswith("refused(") for k, v in results.items()
                      if k != "torch")
        tally["every stage ok" if ours_ok else ("failed, torch too" if not torch_ok else "FAILED where torch exports")] += 1
    print("\n" + ", ".join(f"{k}: {v}" for k, v in sorted(tally.items())))


if __name__ == "__main__":
    main()
