"""Downpour SGD on the real Fashion-MNIST: two asynchronous workers and a central server."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.helpers import REAL_ASYNC, REAL_LENET, REAL_LENET_GROUP, TrainedOnce

from scaletrain.train.divergence import REFERENCE_STEPS

# alone: the staleness of the asynchronous run, hence its momentum and accuracy, follow how the
# processes share the cores
pytestmark = [pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.xdist_group(REAL_LENET_GROUP), pytest.mark.alone]


def test_async_lenet_with_two_workers_reaches_80_percent_in_two_epochs(real_fmnist: Path, trained: TrainedOnce) -> None:
    # the run of tests/parallel/test_real_async_compensation.py, trained once for both
    summary, _ = trained("lenet", data_dir=real_fmnist, **REAL_ASYNC, **REAL_LENET)
    assert summary["steps"] == 2 * (60_000 // REAL_LENET["batch_size"])  # every batch of both epochs applied once
    assert summary["staleness"]["max"] >= 1  # two workers really did overlap
    assert summary["test_accuracy"] >= 0.80


def test_its_central_server_keeps_the_workers_divergence_reference(real_fmnist: Path, trained: TrainedOnce) -> None:
    """The server sees no loss; the deciding worker shares its first losses at each epoch's end."""
    _, out = trained("lenet", data_dir=real_fmnist, **REAL_ASYNC, **REAL_LENET)
    first_losses = torch.load(out / "checkpoint.pt", weights_only=True)["first_losses"]
    # the first near ln 10 (10 classes, weights as initialised); the loss falls fast: 1.46 by the fifth step
    assert len(first_losses) == REFERENCE_STEPS and 2.0 < first_losses[0] < 2.6, first_losses
    assert all(0.5 < loss < 3.0 for loss in first_losses), first_losses
