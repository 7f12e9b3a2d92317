"""Reading and writing torch.export's .pt2: exportir against torch (the anchor), same process.

    PYTHONPATH=src .venv/bin/python benchmarks/torch_pt2_bench.py [--rounds N] [--only NAME ...]

For each model (a few of tests/corpus/export_models.py and, with ``--real``, a few real models
of tests/corpus/real_models.py) torch exports and saves a .pt2 once; then, interleaved, best of
``--rounds`` in process CPU time on one thread:

- load: ``exportir.load(bytes)`` vs ``torch.export.load(bytes)``;
- save: ``exportir.save(ep, format="torch")`` of the loaded program vs ``torch.export.save`` of
  torch's.

Prints ours / torch per row (< 1.0: exportir is faster) and the geometric mean.
"""

from __future__ import annotations

import argparse
import io
import math
import sys
import time
import warnings
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
for _path in (_ROOT / "tests", _ROOT / "src"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import torch
import torch.export as texport
from corpus import export_models as em

import exportir

MODELS = ("mlp", "resnet_tiny", "transformer_encoder_layer", "lstm", "cnn_bn_train")
REAL = ("bert", "gpt2", "vit")


def _cpu(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def _best(data: bytes, ours_ep: exportir.ExportedProgram, tep: texport.ExportedProgram,
          rounds: int) -> dict[str, float]:
    """Best CPU times of load / save, ours and torch's, interleaved round by round."""
    work = {
        "lo": lambda: exportir.load(io.BytesIO(data)),
        "lt": lambda: texport.load(io.BytesIO(data)),
        "so": lambda: exportir.save(ours_ep, io.BytesIO(), format="torch"),
        "st": lambda: texport.save(tep, io.BytesIO()),
    }
    best = dict.fromkeys(work, math.inf)
    for _ in range(rounds):
        for key, fn in work.items():
            best[key] = min(best[key], _cpu(fn))
    return best


def _cases(real: bool) -> dict[str, texport.ExportedProgram]:
    out = {}
    for name in MODELS:
        module, args, kwargs = em.build(next(e for e in em.ENTRIES if e.name == name))
        out[name] = texport.export(module, args, kwargs)
    if real:
        from corpus import _torchvision_ops  # noqa: F401  (before transformers)
        from corpus import real_models as rm

        for name in REAL:
            case = rm.build(name)
            with torch.no_grad():
                out[name] = texport.export(case.model, (), case.kwargs, strict=False,
                                           dynamic_shapes=case.dynamic_shapes())
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", action="append", default=[])
    parser.add_argument("--real", action="store_true")
    ns = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    cases = _cases(ns.real)
    ratios: dict[str, list[float]] = {"load": [], "save": []}
    print(f"{'model':28} {'load ours':>10} {'torch':>10} {'ratio':>6}   "
          f"{'save ours':>10} {'torch':>10} {'ratio':>6}")
    for name, tep in cases.items():
        if ns.only and name not in ns.only:
            continue
        buf = io.BytesIO()
        texport.save(tep, buf)
        data = buf.getvalue()
        ours_ep = exportir.load(io.BytesIO(data))
        best = _best(data, ours_ep, tep, ns.rounds)
        load, save = best["lo"] / best["lt"], best["so"] / best["st"]
        ratios["load"].append(load)
        ratios["save"].append(save)
        print(f"{name:28} {best['lo'] * 1e3:9.1f}ms {best['lt'] * 1e3:9.1f}ms {load:6.2f}   "
              f"{best['so'] * 1e3:9.1f}ms {best['st'] * 1e3:9.1f}ms {save:6.2f}")
    for key, values in ratios.items():
        if values:
            geo = math.exp(sum(map(math.log, values)) / len(values))
            print(f"geometric mean {key} ours/torch: {geo:.2f}")


if __name__ == "__main__":
    main()
