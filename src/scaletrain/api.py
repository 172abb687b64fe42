"""The public Python API; the ``scaletrain`` command only parses flags and calls these.

Train a built-in workload::

    >>> import scaletrain
    >>> summary = scaletrain.train("lenet", steps=100, out="runs/demo")  # doctest: +SKIP
    >>> round(summary["test_accuracy"], 2)  # doctest: +SKIP
    0.71

Train your own model on your own tensors with the same loop, metrics and output files::

    >>> import torch
    >>> from torch import nn
    >>> from scaletrain import ClassificationWorkload
    >>> x, y = torch.randn(256, 8), torch.randint(0, 2, (256,))
    >>> mine = ClassificationWorkload.from_tensors("mine", lambda: nn.Linear(8, 2), train=(x, y), test=(x, y))
    >>> summary = scaletrain.train(mine, epochs=1, out="runs/mine")  # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scaletrain.config import TrainConfig, load_toml, merge
from scaletrain.train.loop import run_training
from scaletrain.workloads import WORKLOADS, Workload, create_workload

__all__ = ["list_workloads", "make_config", "train"]


def make_config(workload: str, *, config_file: Path | None = None, **settings: Any) -> TrainConfig:
    """Build a :class:`TrainConfig`: workload defaults < ``config_file`` (TOML) < ``settings``.

    ``settings`` whose value is ``None`` count as not given.

    >>> make_config("lenet", batch_size=64).batch_size
    64
    """
    from_file = load_toml(config_file) if config_file is not None else {}
    given = {key: value for key, value in settings.items() if value is not None}
    return TrainConfig(**merge({"workload": workload}, from_file, given))


def train(workload: str | Workload, *, config_file: Path | None = None, **settings: Any) -> dict[str, Any]:
    """Train a workload (a registered name or a :class:`Workload` object); return ``summary.json``'s content.

    ``settings`` are :class:`TrainConfig` fields (``epochs``, ``steps``, ``batch_size``, ``lr``,
    ``out``, ``options`` ...).
    """
    if isinstance(workload, Workload):
        config = make_config(workload.name, config_file=config_file, **settings)
        return run_training(config, workload)
    config = make_config(workload, config_file=config_file, **settings)
    return run_training(config)


def list_workloads() -> list[dict[str, Any]]:
    """Name, dataset, metric and parameter count of every registered workload.

    >>> [w["name"] for w in list_workloads()]
    ['lenet', 'ptb-lstm']
    """
    return [create_workload(name).describe() for name in WORKLOADS]
