"""What an elastic run (``--min-workers``, ``--max-workers``, ``--join``) may be, checked before
any process starts or as a process starts (:mod:`scaletrain.parallel.strategies.elastic` does the rest), and
the settings a worker that joins must share with the run."""

from __future__ import annotations

import datetime
import json
from typing import Any

import torch.distributed as dist

from scaletrain.config import TrainConfig
from scaletrain.errors import ConfigError
from scaletrain.parallel.strategies.base import Layout

__all__ = [
    "SETTINGS_KEY",
    "SHARED_SETTINGS",
    "check_elastic",
    "check_elastic_backend",
    "check_elastic_batch",
    "check_joining_settings",
    "shared_settings",
]


def check_elastic(config: TrainConfig, layout: Layout) -> None:
    """Refuse ``--min-workers`` where the survivors could not go on (before any process starts)."""
    if config.min_workers is None:
        return
    if not layout.plugin.elastic(layout):
        raise ConfigError(
            "--min-workers is supported with --strategy allreduce, diloco and the parameter servers with --sync "
            f"join or split only for now, not {layout.label}; drop --min-workers (a lost worker then stops the run, "
            "continue with --resume; an asynchronous central server goes on without lost workers by itself)"
        )
    grows = config.join or (config.max_workers is not None and config.max_workers > layout.workers)
    if grows and not layout.plugin.admits_joiners(layout):
        raise ConfigError(
            f"workers join elastic all-reduce, diloco and sharded-server runs only for now; {layout.label} goes on "
            "without lost workers but admits none: drop --join and --max-workers, or use --server sharded"
        )
    for flag, given in (("--technique", config.technique), ("--sync-batchnorm", config.sync_batchnorm or None)):
        if given is not None:
            raise ConfigError(f"--min-workers does not work with {flag} yet; drop one of them")


def check_elastic_backend(backend: str) -> None:
    """Refuse an elastic run whose process group is not gloo: regrouping is built and tested on gloo only."""
    if backend != "gloo":
        raise ConfigError(
            f"--min-workers regroups gloo process groups only for now, and this run's is {backend}; "
            "use --device cpu, or drop --min-workers"
        )


def check_elastic_batch(config: TrainConfig, layout: Layout, batch_size: int) -> None:
    """Every membership from ``--min-workers`` to ``--max-workers`` must divide the global batch evenly."""
    if config.min_workers is None:
        return
    factor = layout.worker_plan(layout.worker_ranks()[0]).global_batch_factor
    total, most = batch_size * factor, config.max_workers or layout.workers
    uneven = [count for count in range(config.min_workers, most + 1) if total % count]
    if uneven:
        bound = "--max-workers" if config.max_workers is not None else "--workers"
        raise ConfigError(
            f"with --min-workers {config.min_workers} the global batch of {total} must divide evenly over every "
            f"worker count from {config.min_workers} to {bound} {most}, and {', '.join(map(str, uneven))} "
            "does not; choose a batch size that does (or another --min-workers)"
        )


#: Where rank 0 of an elastic run says its settings (:func:`shared_settings`), for workers that join to compare.
SETTINGS_KEY = "membership/settings"
#: The settings a joining worker must share with the run: what its steps and its part of each batch follow from.
SHARED_SETTINGS = (
    "workload",
    "options",
    "workers",
    "sync",
    "batch_size",
    "epochs",
    "steps",
    "seed",
    "lr",
    "momentum",
    "weight_decay",
    "clip_norm",
    "lr_decay",
    "lr_decay_start",
    "lr_schedule",
    "lr_warmup",
    "optimizer",
    "optimizer_options",
    "accumulate",
    "wire",
    "wire_options",
    "min_workers",
    "max_workers",
)


def shared_settings(config: TrainConfig) -> dict[str, Any]:
    return {name: getattr(config, name) for name in SHARED_SETTINGS}


def check_joining_settings(store: dist.Store, settings: dict[str, Any], timeout: float) -> None:
    """Refuse to join a run whose settings differ (the joiner would compute other steps than its peers): rank 0 of
    the run said them under :data:`SETTINGS_KEY`; ``settings``: the joining worker's own."""
    if not settings:
        return
    try:
        store.wait([SETTINGS_KEY], datetime.timedelta(seconds=timeout))
    except RuntimeError:
        raise ConfigError(
            f"the run at this store did not say its settings within --timeout {timeout:g} s: it is no elastic run "
            "that admits workers (--min-workers), or it has not started training yet"
        ) from None
    theirs = json.loads(store.get(SETTINGS_KEY))
    mine = json.loads(json.dumps(settings, default=str))
    differ = [
        f"{name} {theirs.get(name)!r} (this worker: {mine.get(name)!r})"
        for name in mine
        if theirs.get(name) != mine.get(name)
    ]
    if differ:
        raise ConfigError(f"this worker cannot join: the run trains with {'; '.join(differ)}; give its settings")
