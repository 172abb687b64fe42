"""Sweeps that reproduce Jäger (2018)'s experiments (SPEC §3–4).

Jäger trained with asynchronous data parallelism: TensorFlow with one central parameter server,
MXNet with its KVStore (``dist_async``), whose servers are spread over the machines — here
``ps-central-async`` and ``ps-sharded-async``, with their whole batch per update (``--async-batches share``,
Downpour's, as both frameworks do). Worker counts 1, 2, 5, 10, 25, 50 on one-vCPU nodes. ``thesis-gpt`` runs
the RNN experiment's grid with the built-in transformer in the LSTM's place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["PRESETS", "Preset"]

THESIS_WORKERS = (1, 2, 5, 10, 25, 50)
THESIS_STRATEGIES = ("ps-central-async", "ps-sharded-async")


@dataclass(frozen=True)
class Preset:
    """A named sweep: workload, grid and training settings."""

    name: str
    description: str
    workload: str
    batch_sizes: tuple[int, ...]
    settings: dict[str, Any]
    workers: tuple[int, ...] = THESIS_WORKERS
    strategies: tuple[str, ...] = THESIS_STRATEGIES
    options: dict[str, str] = field(default_factory=dict)


PRESETS = {
    preset.name: preset
    for preset in (
        Preset(
            name="thesis-cnn",
            description="LeNet on Fashion-MNIST, batch 512/256/128, lr 0.025, plain SGD, 8 epochs (Jäger §6.1)",
            workload="lenet",
            batch_sizes=(512, 256, 128),
            settings={"lr": 0.025, "momentum": 0.0, "epochs": 8, "async_batches": "share"},
        ),
        Preset(
            name="thesis-rnn",
            description="2×200 LSTM on Penn Treebank, batch 20 and 5, lr 0.05, 4 epochs, 30 steps (Jäger §6.2)",
            workload="ptb-lstm",
            batch_sizes=(20, 5),
            settings={"lr": 0.05, "epochs": 4, "async_batches": "share"},
            options={"num_steps": "30"},
        ),
        Preset(
            name="thesis-gpt",
            description="the gpt transformer on Penn Treebank on thesis-rnn's grid: batch 20 and 5, 4 epochs, its own "
            "AdamW with warm-up and cosine (Jäger §6.2's sweep with the network people train now)",
            workload="gpt",
            batch_sizes=(20, 5),
            settings={"epochs": 4, "async_batches": "share"},
        ),
    )
}
