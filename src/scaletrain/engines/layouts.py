"""Which foreign run stands for a scaletrain strategy: the same layout in the engine's own terms.

``allreduce-join`` (N workers, each its batch, gradients averaged: a global batch of N × b) is TensorFlow's
MultiWorkerMirroredStrategy and MXNet's ``dist_sync``; ``ps-central-async`` (one server, every worker
applies its own batches) is the thesis's setting: TensorFlow's ParameterServerStrategy with one ``ps``,
MXNet's ``dist_async`` with one server; ``ps-sharded-async`` has one server per worker, as the sharded
server has one shard owner per worker. One worker of all-reduce is one process (``local``), as in scaletrain.
The other strategies (``split`` batches, a synchronous parameter server) have no counterpart here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scaletrain.engines.prepare import EngineRun
from scaletrain.workloads import create_workload

__all__ = ["FOREIGN_MODES", "FOREIGN_STRATEGIES", "engine_run", "foreign_mode"]

#: The scaletrain strategy specs a foreign engine runs: the engine's mode and the servers the strategy has (1: one
#: central server; None: one per worker, sharded; 0: none of its own, where an engine's mode may still add some).
FOREIGN_MODES: dict[str, tuple[str, int | None]] = {
    "local": ("local", 0),
    "allreduce-join": ("sync", 0),
    "ps-central-async": ("async", 1),
    "ps-sharded-async": ("async", None),
}
#: the scaletrain strategies a foreign engine runs
FOREIGN_STRATEGIES = tuple(FOREIGN_MODES)


def foreign_mode(strategy: str, workers: int) -> tuple[str, int] | None:
    """(mode, servers) of the foreign run standing for ``strategy`` at ``workers``; None when there is none.

    >>> foreign_mode("allreduce-join", 1), foreign_mode("allreduce-join", 4), foreign_mode("ps-sharded-async", 4)
    (('local', 0), ('sync', 0), ('async', 4))
    >>> foreign_mode("allreduce-split", 2) is None
    True
    """
    if strategy not in FOREIGN_MODES:
        return None
    mode, servers = FOREIGN_MODES[strategy]
    if workers == 1 and servers == 0:  # one worker exchanges nothing: the engine's local mode
        return "local", 0
    return mode, workers if servers is None else servers


def engine_run(framework: str, workload: str, strategy: str, workers: int, settings: dict[str, Any]) -> EngineRun:
    """The foreign run of one sweep run: ``settings`` are the :func:`scaletrain.train` settings it would have."""
    mode = foreign_mode(strategy, workers)
    if mode is None:
        raise ValueError(f"{strategy} has no foreign counterpart")
    defaults = create_workload(workload).defaults
    epochs, steps = settings.get("epochs"), settings.get("steps")
    if epochs is None and steps is None:
        epochs = defaults.epochs

    def given(name: str, default: Any) -> Any:
        value = settings.get(name)
        return default if value is None else value

    data_dir = settings.get("data_dir")
    return EngineRun(
        framework=framework,
        workload=workload,
        mode=mode[0],
        workers=workers,
        servers=mode[1],
        batch_size=given("batch_size", defaults.batch_size),
        lr=given("lr", defaults.lr),
        momentum=given("momentum", defaults.momentum),
        weight_decay=given("weight_decay", 0.0),
        epochs=epochs,
        steps=steps,
        warmup_steps=given("warmup_steps", 5),
        threads=given("threads", 1),
        seed=given("seed", 0),
        data_dir=Path(data_dir) if data_dir is not None else None,
        clip_norm=given("clip_norm", defaults.clip_norm),
        options=dict(settings.get("options") or {}),
    )
