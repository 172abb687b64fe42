"""An image network through the whole training loop on synthetic images (seconds, not minutes)."""

from __future__ import annotations

import json
from pathlib import Path

import scaletrain
from scaletrain.workloads.base import count_parameters
from scaletrain.workloads.googlenet import GoogLeNet


def test_googlenet_trains_on_synthetic_images(tmp_path: Path) -> None:
    options = {"data": "synthetic", "image_size": "32", "num_classes": "5", "synthetic_train": "12"}
    summary = scaletrain.train(
        "googlenet",
        steps=3,
        batch_size=4,
        threads=1,
        options={**options, "synthetic_test": "6"},
        out=tmp_path / "run",
        progress="off",
        tensorboard=False,
        log_every=1,
    )
    assert (summary["steps"], summary["steps_per_epoch"], summary["epochs"]) == (3, 3, 1.0)
    assert "for timing only; accuracy is meaningless" in summary["dataset"]
    assert summary["options"]["data"] == "synthetic" and summary["options"]["image_size"] == 32
    assert summary["parameters"] == count_parameters(GoogLeNet(5))  # the auxiliary heads train too
    assert summary["test_accuracy"] in {k / 6 for k in range(7)} and summary["test_loss"] > 0
    written = json.loads((tmp_path / "run/summary.json").read_text())
    assert written["dataset"] == summary["dataset"]
    steps = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in steps if record["kind"] == "step"] == [1, 2, 3]
    assert (tmp_path / "run/model.pt").exists()
