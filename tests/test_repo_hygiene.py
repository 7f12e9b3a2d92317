"""Repository rules that keep the suite runnable: pytest's default import mode needs every
test module basename to be unique across folders."""

import collections
import pathlib

TESTS = pathlib.Path(__file__).resolve().parent


def test_test_module_basenames_are_unique():
    seen = collections.defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        seen[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not clashes, f"rename one of each: {clashes}"
