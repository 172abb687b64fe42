"""Checks made before any process starts or any file is written, so bad settings cost nothing.

A run that would fail in its first seconds — a split batch that cannot be divided, a checkpoint
written with other settings, an output folder that cannot be created — fails here instead, with
one line that names the fix, and leaves no half-made run folder behind. The processes repeat the
checks that matter to them (a launcher of another kind may have started them).
"""

from __future__ import annotations

import dataclasses

from scaletrain.config import TrainConfig
from scaletrain.data.loading import Loading
from scaletrain.efficient.sync_batchnorm import sync_batch_norm
from scaletrain.errors import ConfigError
from scaletrain.parallel.strategies import Layout, run_label
from scaletrain.parallel.strategies.elastic_rules import check_elastic_batch
from scaletrain.tensors.codec import WireCodec, wire_codec
from scaletrain.train.checkpoint import (
    CHECKPOINT_NAME,
    check_compatible,
    check_writable,
    load_checkpoint,
    refuse_overwrite,
)
from scaletrain.train.defaults import resolve
from scaletrain.train.state import check_async_split
from scaletrain.workloads import Workload, create_workload

__all__ = ["check_before_start"]


def check_before_start(config: TrainConfig, layout: Layout, workload: Workload | None = None) -> TrainConfig:
    """Check ``config`` for ``layout``; return it with the workload's defaults filled in.

    >>> from scaletrain.config import TrainConfig
    >>> check_before_start(TrainConfig("lenet", workers=4, strategy="ps", sync="split", batch_size=2,
    ...                                out="/tmp/x"), Layout("ps", 4, "central", "split"))
    Traceback (most recent call last):
    ...
    scaletrain.errors.ConfigError: --sync split divides each batch of 2 over 4 workers, ...
    """
    workload = workload or create_workload(config.workload, config.options)
    resolved = resolve(config, workload.defaults)
    if config.accumulate > 1 and type(workload).initial_state is not Workload.initial_state:
        raise ConfigError(
            f"--accumulate {config.accumulate} cuts each batch into micro-batches, and {workload.name} carries a "
            "state from batch to batch (an LSTM's hidden state) that they cannot share; drop --accumulate"
        )
    workload.set_loading(Loading(resolved.loader_workers))  # a workload without a loader refuses its workers
    batch = resolved.batch_size
    if layout.sync == "split" and batch % layout.workers:
        smaller = "" if batch < layout.workers else f" or {batch - batch % layout.workers}"
        raise ConfigError(
            f"--sync split divides each batch of {batch} over {layout.workers} workers, which does not go evenly; "
            f"use --batch-size {layout.workers * max(1, batch // layout.workers)}{smaller} "
            f"(a multiple of {layout.workers}), fewer workers, or --sync join"
        )
    split = layout.plugin.batch_split(config, layout)
    check_async_split(batch, split)
    check_elastic_batch(config, layout, batch)
    if config.sync_batchnorm:  # a network without batch norm is refused before any process starts
        sync_batch_norm(workload.build_model())
    codec = wire_codec(config)
    if type(codec).check_network is not WireCodec.check_network:  # a rank the network's matrices cannot hold
        codec.check_network([p.shape for p in workload.build_model().parameters()])
    if config.network is not None and layout.world_size == 1:
        raise ConfigError(
            "--network emulates the links between processes, and this run has one process; "
            "use --workers 2 or more (or drop --network)"
        )
    out = resolved.out
    refuse_overwrite(out, resume=config.resume)
    if config.resume:
        check_compatible(load_checkpoint(out / CHECKPOINT_NAME), resolved, workload, run_label, split)
    check_writable(out)
    return dataclasses.replace(config, out=out)
