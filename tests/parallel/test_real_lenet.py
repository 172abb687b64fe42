"""The real Fashion-MNIST LeNet runs that several tests read, each trained once (the ``trained`` fixture):
the local run at batch 64, lr 0.05, momentum 0.9, 2 epochs; the same in bfloat16; and two asynchronous
workers on the central server.

Asynchronous training keeps the accuracy of a rate that works locally (issue 9, item 5): without
compensation 2 asynchronous workers reached 0.754 against 0.878 locally. With the default compensation
(:mod:`scaletrain.parallel.strategies.ps.staleness`) the server lowers the explicit momentum from the staleness it
measures; the run must come within 2 points of the local one, trained at the same settings. With the default
``--async-batches split`` each of the two workers' updates is a batch of 32 at half the rate: 2 · 60,000 // 32
updates in two epochs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tests.helpers import REAL_ASYNC, REAL_LENET, TrainedOnce

from scaletrain.train.divergence import REFERENCE_STEPS

# The asynchronous tests run alone: the staleness of the asynchronous run, hence its momentum and
# accuracy, follow how the processes share the cores. The local runs (one thread each) do not depend
# on it; the bf16 test comes first so that they train beside other tests.
pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


def test_bf16_autocast_lenet_is_within_one_point_of_float32_on_real_fashion_mnist(
    real_fmnist: Path, trained: TrainedOnce
) -> None:
    # Both runs whole (2 epochs): after the first epoch the two differ by which kernels the CPU has, not by how
    # well bf16 trains. On a CPU with AMX, bf16 was 1.5 points behind float32 after one epoch (0.8542 against
    # 0.8696) and ahead after two (0.8742 against 0.8705); the same CPU without AMX's kernels (ONEDNN_MAX_CPU_ISA=
    # AVX512_CORE_BF16) was 0.4 behind after one (2026-12-06).
    fp32, run = trained("lenet", data_dir=real_fmnist, **REAL_LENET)
    bf16, _ = trained("lenet", data_dir=real_fmnist, precision="bf16", **REAL_LENET)
    assert bf16["precision"] == "bf16" and fp32["precision"] == "fp32"
    assert fp32["test_accuracy"] > 0.8
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    first = next(record for record in logged if record["kind"] == "epoch")
    assert first["epoch"] == 0 and first["test_accuracy"] > 0.7  # 0-based
    assert bf16["test_accuracy"] >= fp32["test_accuracy"] - 0.01


@pytest.mark.alone
def test_compensated_async_with_two_workers_is_within_two_points_of_local(
    real_fmnist: Path, trained: TrainedOnce
) -> None:
    local, _ = trained("lenet", data_dir=real_fmnist, **REAL_LENET)
    asynchronous, run = trained("lenet", data_dir=real_fmnist, **REAL_ASYNC, **REAL_LENET)
    assert asynchronous["update_batch_size"] == REAL_LENET["batch_size"] // 2
    assert asynchronous["steps"] == 2 * (60_000 // 32)  # every batch of both epochs applied once
    assert asynchronous["staleness"]["mean"] > 0  # the two workers really did overlap
    compensation = asynchronous["async_compensation"]
    assert compensation["mode"] == "momentum" and compensation["requested_momentum"] == 0.9
    assert 0.0 < compensation["mean_explicit_momentum"] < 0.9  # lowered, from the measured staleness
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    momenta = [record["momentum"] for record in logged if record["kind"] == "step"]
    assert momenta and all(0.0 < momentum < 0.9 for momentum in momenta)
    print(
        f"local {local['test_accuracy']:.4f}, async {asynchronous['test_accuracy']:.4f} "
        f"(explicit momentum {compensation['mean_explicit_momentum']:.3f}, "
        f"staleness mean {asynchronous['staleness']['mean']:.2f})"
    )
    assert asynchronous["test_accuracy"] >= local["test_accuracy"] - 0.02


@pytest.mark.alone
def test_async_lenet_with_two_workers_reaches_80_percent_in_two_epochs(real_fmnist: Path, trained: TrainedOnce) -> None:
    summary, _ = trained("lenet", data_dir=real_fmnist, **REAL_ASYNC, **REAL_LENET)
    assert summary["steps"] == 2 * (60_000 // (REAL_LENET["batch_size"] // 2))  # every batch of both epochs, once
    assert summary["staleness"]["max"] >= 1  # two workers really did overlap
    assert summary["test_accuracy"] >= 0.80


@pytest.mark.alone
def test_its_central_server_keeps_the_workers_divergence_reference(real_fmnist: Path, trained: TrainedOnce) -> None:
    """The server sees no loss; the deciding worker shares its first losses at each epoch's end."""
    _, out = trained("lenet", data_dir=real_fmnist, **REAL_ASYNC, **REAL_LENET)
    first_losses = torch.load(out / "checkpoint.pt", weights_only=True)["first_losses"]
    # the first near ln 10 (10 classes, weights as initialised); the loss falls fast: 1.46 by the fifth step
    assert len(first_losses) == REFERENCE_STEPS and 2.0 < first_losses[0] < 2.6, first_losses
    assert all(0.5 < loss < 3.0 for loss in first_losses), first_losses
