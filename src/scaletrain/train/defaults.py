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
    """Fill every ``None`` hyper-parameter from the workload's defaults, its optimizer and schedule included (an
    optimizer other than the workload's gets no momentum of the workload's; ``--lr-decay`` asks for the
    ``step`` schedule).

    Without ``out`` a run gets its own folder, ``runs/<workload>-<date>-<time>`` (a reference's
    module and attribute for ``<workload>``: ``my_pkg.tasks:make`` gives ``runs/tasks-make-…``).
    """
    filled: dict[str, Any] = {
        name: getattr(defaults, name)
        for name in ("epochs", "batch_size", "lr", "momentum", "clip_norm", "loader_workers", "optimizer")
        if getattr(config, name) is None
    }
    for name in ("lr_schedule", "lr_warmup"):  # the workload's schedule goes with its optimizer and rate
        if getattr(config, name) is None:
            filled[name] = getattr(defaults, name) if config.lr_decay == 1.0 else {"lr_schedule": "step"}.get(name, 0)
    optimizer = filled.get("optimizer", config.optimizer)
    if optimizer.lower() != defaults.optimizer.lower() and config.momentum is None:
        filled["momentum"] = 0.0  # the workload's momentum is its optimizer's; another keeps its own
    if config.out is None:
        filled["out"] = Path("runs") / f"{workload_label(config.workload)}-{time.strftime('%Y%m%d-%H%M%S')}"
    return dataclasses.replace(config, **filled)
