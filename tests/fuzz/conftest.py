"""Session fixtures of the fuzz suite: the seed files every mutation starts from."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def xpt_seed_files() -> dict[str, bytes]:
    from seeds import xpt_seeds

    return xpt_seeds()


@pytest.fixture(scope="session")
def pt2_seed_files() -> dict[str, bytes]:
    from seeds import pt2_seeds

    return pt2_seeds()
