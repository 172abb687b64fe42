"""Each foreign engine's one process trains LeNet to the accuracy scaletrain's own reaches (a file of its own:
the longest of the engines' tests, so that pytest-xdist can run it beside the others)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scaletrain.engines.launch import run_engine
from tests.engines.settings import setting

pytestmark = pytest.mark.multiprocess


@pytest.mark.slow
def test_one_process_reaches_85_percent_in_two_epochs_at_the_default_settings(
    engine: str, real_fmnist: Path, tmp_path: Path
) -> None:
    run = setting(engine, "local", 1, 32, real_fmnist, lr=0.01, momentum=0.9, steps=None, epochs=2, seed=0)
    summary = run_engine(run, tmp_path / "run")
    assert summary["steps"] == 2 * (60_000 // 32)
    assert summary["test_accuracy"] >= 0.85, summary["test_accuracy"]
