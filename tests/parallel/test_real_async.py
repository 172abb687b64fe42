"""Downpour SGD on the real Fashion-MNIST: two asynchronous workers and a central server."""

from __future__ import annotations

from pathlib import Path

import pytest

import scaletrain

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


def test_async_lenet_with_two_workers_reaches_80_percent_in_two_epochs(real_fmnist: Path, tmp_path: Path) -> None:
    summary = scaletrain.train(
        "lenet",
        data_dir=real_fmnist,
        out=tmp_path / "run",
        workers=2,
        strategy="ps",
        sync="async",
        epochs=2,
        progress="off",
        tensorboard=False,
    )
    assert summary["steps"] == 2 * 60_000 // 32  # every batch of both epochs applied once
    assert summary["staleness"]["max"] >= 1  # two workers really did overlap
    assert summary["test_accuracy"] >= 0.80
