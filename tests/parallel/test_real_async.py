"""Downpour SGD on the real Fashion-MNIST: two asynchronous workers and a central server."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.helpers import REAL_ASYNC, REAL_LENET, REAL_LENET_GROUP, TrainedOnce

# alone: the staleness of the asynchronous run, hence its momentum and accuracy, follow how the
# processes share the cores
pytestmark = [pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.xdist_group(REAL_LENET_GROUP), pytest.mark.alone]


def test_async_lenet_with_two_workers_reaches_80_percent_in_two_epochs(real_fmnist: Path, trained: TrainedOnce) -> None:
    # the run of tests/parallel/test_real_async_compensation.py, trained once for both
    summary, _ = trained("lenet", data_dir=real_fmnist, **REAL_ASYNC, **REAL_LENET)
    assert summary["steps"] == 2 * (60_000 // REAL_LENET["batch_size"])  # every batch of both epochs applied once
    assert summary["staleness"]["max"] >= 1  # two workers really did overlap
    assert summary["test_accuracy"] >= 0.80
