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
import time
from pathlib import Path
from typing import Any

from scaletrain.config import TrainConfig, load_toml, merge, resolve
from scaletrain.errors import ConfigError
from scaletrain.measure.bench import compare_results, preset_config, run_bench
from scaletrain.measure.sweep import SweepConfig
from scaletrain.parallel.launch import launch_local
from scaletrain.parallel.process import layout_of, run_process
from scaletrain.parallel.rendezvous import ENV_RANK, ENV_WORLD_SIZE, Rendezvous
from scaletrain.train.loop import run_training
from scaletrain.workloads import WORKLOADS, Workload, create_workload

__all__ = ["bench", "compare", "list_workloads", "make_config", "train"]


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
        config = dataclasses.replace(config, out=resolve(config, create_workload(config.workload).defaults).out)
    return launch_local(config, layout)


def _run_launched(config: TrainConfig, rendezvous: Rendezvous, workload: Workload | None) -> dict[str, Any]:
    """This process is one of several started by someone else (torchrun, a node file on each machine)."""
    if config.network is not None:
        raise ConfigError(
            "--network emulates a network for processes started here; drop it with --nodefile or torchrun"
        )
    if config.out is None:
        raise ConfigError("give --out when another launcher starts the processes, so they share one folder name")
    summary = run_process(config, rendezvous, workload)
    return summary if summary is not None else {"rank": rendezvous.rank, "out": str(config.out)}


def bench(
    workload: str | None = None,
    *,
    preset: str | None = None,
    quick: bool = False,
    out: Path | None = None,
    **sweep: Any,
) -> dict[str, Any]:
    """Sweep workers × strategies × batch sizes with real runs; write results, pictures and report.md.

    ``sweep`` holds :class:`~scaletrain.measure.sweep.SweepConfig` fields (``workers``,
    ``strategies``, ``batch_sizes``, ``steps``, ``repeats``, ``network`` …); ``None`` values count as
    not given. Returns the rows, notes and the paths written.

    >>> result = bench("lenet", workers=(1, 2), strategies=("allreduce-join",), steps=50)  # doctest: +SKIP
    >>> result["report"]  # doctest: +SKIP
    PosixPath('bench-results/lenet-…/report.md')
    """
    given = {key: value for key, value in sweep.items() if value is not None}
    name = preset or workload
    if name is None:
        raise ConfigError("name a workload or a preset")
    out = out or Path("bench-results") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if preset is not None:
        config = preset_config(preset, out, quick=quick, **given)
        if workload is not None and workload != config.workload:
            raise ConfigError(f"preset {preset} trains {config.workload}, not {workload}")
        return run_bench(config, title=f"Scaling of {config.workload} ({preset})")
    return run_bench(SweepConfig(workload=workload, out=out, **given))


def compare(sources: list[Path], *, out: Path, names: list[str] | None = None) -> dict[str, Any]:
    """Overlay two or more bench result sets in the same pictures and one report."""
    return compare_results([Path(source) for source in sources], Path(out), names=names)


def list_workloads() -> list[dict[str, Any]]:
    """Name, dataset, metric and parameter count of every registered workload.

    >>> [w["name"] for w in list_workloads()]
    ['lenet', 'ptb-lstm']
    """
    return [create_workload(name).describe() for name in WORKLOADS]
