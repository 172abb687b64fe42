"""AdamW with a warm-up and a cosine schedule under every synchronous strategy, weight for weight against one
process; ``--accumulate`` against the whole batch; a run killed part-way and resumed against an uninterrupted one.
Real processes on loopback; LeNet on generated Fashion-MNIST files (192 training images)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tests.helpers import REPO, assert_same_weights, make_fashion_mnist
from tests.helpers import model_weights as weights

import scaletrain

pytestmark = pytest.mark.multiprocess

#: AdamW at a rate of its kind (at 0.05 its sign-like steps turn float reordering into 1e-3 differences)
ADAMW = {"optimizer": "adamw", "optimizer_options": {"betas": "0.9,0.95"}, "lr": 1e-3}
SCHEDULE = {"lr_schedule": "cosine", "lr_warmup": 3}
COMMON = {"epochs": 1, "progress": "off", "tensorboard": False, "threads": 1, "seed": 11, **ADAMW, **SCHEDULE}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_fashion_mnist(tmp_path_factory.mktemp("optimizers") / "fmnist", train=192, test=32)


@pytest.fixture(scope="module")
def alone(data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, torch.Tensor]]:
    """One process at batch 16 and 64."""
    runs = {}
    for batch in (16, 64):
        out = tmp_path_factory.mktemp(f"alone-{batch}") / "run"
        summary = scaletrain.train("lenet", data_dir=data, out=out, batch_size=batch, **COMMON)
        assert (summary["optimizer"], summary["lr_schedule"]) == ("AdamW", "cosine")
        runs[batch] = weights(out)
    return runs


@pytest.mark.parametrize("spec", ["allreduce-split", "ps-central-split", "ps-sharded-split"])
def test_adamw_with_a_cosine_schedule_on_four_split_workers_equals_one_process(
    spec: str, data: Path, alone: dict, tmp_path: Path
) -> None:
    summary = scaletrain.train(
        "lenet", data_dir=data, out=tmp_path / "run", batch_size=16, workers=4, strategy=spec, **COMMON
    )
    assert summary["steps"] == 12 and summary["optimizer"] == "AdamW"
    run = weights(tmp_path / "run")
    assert run.keys() == alone[16].keys() and len(run) > 0
    for name, tensor in run.items():  # within 1e-5 absolute, as the issue asks
        torch.testing.assert_close(tensor, alone[16][name], rtol=0, atol=1e-5, msg=name)


RESNET = {"dataset": "fashion-mnist", "stages": "2", "blocks": "1", "width": "4"}


@pytest.fixture(scope="module")
def resnet_alone(data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    out = tmp_path_factory.mktemp("resnet-alone") / "run"
    scaletrain.train("resnet", options=RESNET, data_dir=data, out=out, batch_size=16, **COMMON)
    return weights(out)


@pytest.mark.parametrize("spec", ["allreduce-split", "ps-central-split", "ps-sharded-split"])
def test_the_parametric_resnet_with_adamw_on_four_split_workers_equals_one_process(
    spec: str, data: Path, resnet_alone: dict, tmp_path: Path
) -> None:
    """Batch norm over the whole global batch (``--sync-batchnorm``), as one process computes it: every weight and
    running statistic within 1e-5 of one process's after 12 updates (measured 4.2e-6 at most). Adam divides each
    element's step by its own gradient scale, so it magnifies what the statistics lose to rounding: with the
    workers' sums recovered from float32 means and variances this run ended 3.9e-5 apart (SGD: 7.6e-6)."""
    settings = {"batch_size": 16, "workers": 4, "strategy": spec, "sync_batchnorm": True, **COMMON}
    scaletrain.train("resnet", options=RESNET, data_dir=data, out=tmp_path / "run", **settings)
    run = weights(tmp_path / "run")
    assert run.keys() == resnet_alone.keys() and len(run) > 0
    for name, tensor in run.items():
        torch.testing.assert_close(tensor, resnet_alone[name], rtol=0, atol=1e-5, msg=name)


@pytest.mark.parametrize("spec", ["local", "allreduce-split", "ps-central-split", "ps-sharded-split"])
def test_accumulating_four_batches_of_16_equals_one_batch_of_64(
    spec: str, data: Path, alone: dict, tmp_path: Path
) -> None:
    workers = 1 if spec == "local" else 2
    summary = scaletrain.train(
        "lenet",
        data_dir=data,
        out=tmp_path / "run",
        batch_size=16,
        accumulate=4,
        workers=workers,
        strategy=spec,
        **COMMON,
    )
    assert summary["steps"] == 192 // 64 and summary["accumulate"] == 4
    assert_same_weights(weights(tmp_path / "run"), alone[64])


def test_a_run_killed_mid_epoch_resumes_to_the_uninterrupted_weights(data: Path, tmp_path: Path) -> None:
    """Two split workers, a checkpoint every update; the launcher is killed once six of its 24 updates are
    recorded, and ``--resume`` finishes the run: the schedule's rate at every update is the uninterrupted one's."""
    settings = {**COMMON, "epochs": 2, "workers": 2, "strategy": "allreduce-split", "batch_size": 16}
    scaletrain.train("lenet", data_dir=data, out=tmp_path / "whole", **settings)
    flags = [
        "train",
        "lenet",
        "--data-dir",
        str(data),
        "--out",
        str(tmp_path / "cut"),
        "--workers",
        "2",
        "--strategy",
        "allreduce-split",
        "--batch-size",
        "16",
        "--epochs",
        "2",
        "--optimizer",
        "adamw",
        "-O",
        "betas=0.9,0.95",
        "--lr",
        "1e-3",
        "--lr-schedule",
        "cosine",
        "--lr-warmup",
        "3",
        "--seed",
        "11",
        "--threads",
        "1",
        "--progress",
        "off",
        "--checkpoint-every",
        "1",
        "--log-every",
        "1",
    ]
    environment = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    process = subprocess.Popen(
        [sys.executable, "-m", "scaletrain", *flags],
        env=environment,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    metrics, deadline = tmp_path / "cut" / "metrics.jsonl", time.monotonic() + 120
    try:
        while time.monotonic() < deadline and process.poll() is None:
            lines = metrics.read_text().splitlines() if metrics.exists() else []
            if sum(json.loads(line).get("kind") == "step" for line in lines) >= 6:
                break
            time.sleep(0.05)
        assert process.poll() is None, "the run ended before it could be killed"
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    resumed = scaletrain.train("lenet", data_dir=data, out=tmp_path / "cut", resume=True, **settings)
    assert 0 < resumed["resumed_from_step"] < 24 and resumed["steps"] == 24  # its last checkpoint: step 5 or 6
    assert_same_weights(weights(tmp_path / "cut"), weights(tmp_path / "whole"))
