"""Regenerate tests/export/fidelity_oracle.json: torch.export's graphs of both corpora.

    PYTHONPATH=src .venv/bin/python scripts/gen_fidelity_oracle.py [key ...]

Keys are ``real:<name>`` / ``export:<name>`` (all models by default; given keys are updated in
place). Takes ~6 s per model (torch.export, run_decompositions({}) and run_decompositions()).
Review the diff of the file like a golden file: it is the oracle of tests/export/test_fidelity.py.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
warnings.filterwarnings("ignore")

from corpus import fidelity as F


def main(argv: list[str]) -> None:
    wanted = argv or F.keys()
    models = F.load() if argv and F.ORACLE_PATH.exists() else {}
    for key in wanted:
        models[key] = F.torch_summary(key)
        print(key, sorted(models[key]), flush=True)
    F.write(models)


if __name__ == "__main__":
    main(sys.argv[1:])
