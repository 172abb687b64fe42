"""The engines' tests share each installed engine as a parameter (``engine``); the others skip, naming the install."""

from __future__ import annotations

import pytest

from scaletrain.engines.install import installed
from scaletrain.engines.registry import ENGINES

NAMES = list(ENGINES)


@pytest.fixture(params=NAMES)
def engine(request: pytest.FixtureRequest) -> str:
    name = request.param
    if installed(ENGINES[name]) is None:
        pytest.skip(f"the {name} engine is not installed: scaletrain engines install {name} (CI installs it)")
    return name
