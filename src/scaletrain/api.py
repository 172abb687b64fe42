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

import dataclasses
import os
from pathlib import Path
from typing import Any

from scaletrain.config import TrainConfig, load_toml, merge, resolve
from scaletrain.errors import ConfigError
from scaletrain.parallel.launch import launch_local
from scaletrain.parallel.process import layout_of, run_process
from scaletrain.parallel.rendezvous import ENV_RANK, ENV_WORLD_SIZE, Rendezvous
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
    ``out``, ``options``, ``workers``, ``strategy``, ``server``, ``sync`` ...). With more than one
    process the run is distributed: started here on 127.0.0.1 (``workers=N``), or joined as one
    process of a job started elsewhere (``nodefile`` + ``index``, or the torchrun variables); then
    only rank 0 gets the summary.
    """
    own = workload if isinstance(workload, Workload) else None
    config = make_config(own.name if own else workload, config_file=config_file, **settings)
    layout = layout_of(config)  # checks the strategy flags before anything starts
    if config.nodefile is not None:
        return _run_launched(config, Rendezvous.from_nodefile(config.nodefile, config.index), own)
    if layout.world_size == 1:
        return run_training(config, own)
    if ENV_RANK in os.environ and ENV_WORLD_SIZE in os.environ:
        return _run_launched(config, Rendezvous.from_env(), own)
    if own is not None:
        raise ConfigError(
            "the local launcher starts fresh processes, which cannot receive a workload object; register "
            "the workload (scaletrain.workloads.WORKLOADS) or start the processes yourself with torchrun"
        )
    if config.out is None:
        config = dataclasses.replace(
            config, out=resolve(config, create_workload(config.workload).defaults).out
        )
    return launch_local(config, layout)


def _run_launched(config: TrainConfig, rendezvous: Rendezvous, workload: Workload | None) -> dict[str, Any]:
    """This process is one of several started by someone else (torchrun, a node file on each machine)."""
    if config.out is None:
        raise ConfigError(
            "give --out when another launcher starts the processes, so they share one folder name"
        )
    summary = run_process(config, rendezvous, workload)
    return summary if summary is not None else {"rank": rendezvous.rank, "out": str(config.out)}


def list_workloads() -> list[dict[str, Any]]:
    """Name, dataset, metric and parameter count of every registered workload.

    >>> [w["name"] for w in list_workloads()]
    ['lenet', 'ptb-lstm']
    """
    return [create_workload(name).describe() for name in WORKLOADS]
