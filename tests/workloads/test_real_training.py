"""Training the thesis workloads on the real datasets (minutes on 2 cores; CI runs them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import scaletrain

pytestmark = pytest.mark.slow


def test_lenet_reaches_85_percent_in_two_epochs(real_fmnist: Path, tmp_path: Path) -> None:
    # The documented configuration: the workload defaults (SGD, momentum 0.9, lr 0.01, batch 32).
    summary = scaletrain.train("lenet", data_dir=real_fmnist, out=tmp_path / "run", progress="off", tensorboard=False)
    assert summary["epochs"] == 2.0 and summary["batch_size"] == 32
    assert summary["test_accuracy"] >= 0.85


def test_lstm_test_perplexity_falls_epoch_over_epoch(real_ptb: Path, tmp_path: Path) -> None:
    summary = scaletrain.train(
        "ptb-lstm",
        data_dir=real_ptb,
        out=tmp_path / "run",
        epochs=3,
        progress="off",
        tensorboard=False,
        options={"train_split": "valid"},
    )
    epochs = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    perplexities = [record["test_perplexity"] for record in epochs if record["kind"] == "epoch"]
    assert len(perplexities) == 3
    assert perplexities[0] > perplexities[1] > perplexities[2]
    assert perplexities[0] < 10_000  # below the uniform guess over the vocabulary after one epoch
    assert summary["test_perplexity"] == perplexities[-1]
