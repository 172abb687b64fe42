"""A run's settings completed: the workload's defaults fill what the user left unset."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from scaletrain.config import TrainConfig
from scaletrain.workloads.base import WorkloadDefaults
from scaletrain.workloads.reference import workload_label

__all__ = ["resolve"]


def resolve(config: TrainConfig, defaults: WorkloadDefaults) -> TrainConfig:
    """Fill every ``None`` hyper-parameter from the workload's defaults (an optimizer other than SGD gets no
    momentum of the workload's).

    Without ``out`` a run gets its own folder, ``runs/<workload>-<date>-<time>`` (a reference's
    module and attribute for ``<workload>``: ``my_pkg.tasks:make`` gives ``runs/tasks-make-…``).
    """
    filled: dict[str, Any] = {
        name: getattr(defaults, name)
        for name in ("epochs", "batch_size", "lr", "momentum", "clip_norm", "loader_workers")
        if getattr(config, name) is None
    }
    if config.optimizer.lower() != "sgd" and config.momentum is None:
        filled["momentum"] = 0.0  # the workload's momentum is tuned for SGD; another optimizer keeps its own
    if config.out is None:
        filled["out"] = Path("runs") / f"{workload_label(config.workload)}-{time.strftime('%Y%m%d-%H%M%S')}"
    return dataclasses.replace(config, **filled)
