"""Which workers share batch-norm statistics: the process group of synchronised batch norm
(``--sync-batchnorm``, :mod:`scaletrain.efficient.sync_batchnorm`), and the warning a split run without it
prints.

The group holds the workers that compute parts of one global batch: every worker of a ``split`` run,
and of a ``join`` run, whose update joins the workers' batches into one of N·b (= one process with batch
N·b, so there the batch norms normalise over the joined batch as that process would). Asynchronous
workers share no batch (the config refuses the setting). Under all-reduce the workers are the whole
world; a central parameter server's world holds the server too, so its workers get a group of their own,
made by every process of the run (c10d makes a group collectively).
"""

from __future__ import annotations

import datetime

import torch.distributed as dist
from torch import nn

from scaletrain.config import TrainConfig
from scaletrain.parallel.strategies.base import Layout

__all__ = ["batch_group", "split_warning"]


def batch_group(config: TrainConfig, layout: Layout) -> dist.ProcessGroup | None:
    """The process group of the workers that share each global batch, when ``config`` synchronises batch
    norm over it; ``None`` otherwise. Every process of the run calls it, at the same point."""
    if not config.sync_batchnorm or layout.workers == 1 or layout.sync == "async":
        return None
    if layout.world_size == layout.workers:
        return dist.group.WORLD
    return dist.new_group(layout.worker_ranks(), timeout=datetime.timedelta(seconds=config.timeout))


def split_warning(config: TrainConfig, layout: Layout, model: nn.Module) -> str | None:
    """The one line a split run of a network with batch norm prints at its start when each worker
    normalises over its own share of the batch (``None`` when nothing is to be said; ghost batches are
    chosen to stay within a share).

    >>> from scaletrain.config import TrainConfig
    >>> config = TrainConfig("lenet", workers=2, strategy="allreduce", sync="split", batch_size=32)
    >>> split_warning(config, Layout("allreduce", 2, sync="split"), nn.Sequential(nn.BatchNorm1d(3))).split(",")[0]
    'each of the 2 workers normalises its batch norms over its own share of each batch (16 of 32 samples)'
    """
    if layout.sync != "split" or layout.workers == 1 or config.sync_batchnorm or config.ghost_batch is not None:
        return None
    if layout.plugin.one_process_options != {}:  # diloco: not one process's training by design, batch norm or not
        return None
    if not any(isinstance(module, nn.modules.batchnorm._BatchNorm) for module in model.modules()):
        return None
    share = f" ({config.batch_size // layout.workers} of {config.batch_size} samples)" if config.batch_size else ""
    return (
        f"each of the {layout.workers} workers normalises its batch norms over its own share of each batch{share}, "
        "so this split run is not exactly one process's training; add --sync-batchnorm (sync_batchnorm=True) "
        "to normalise over the whole batch"
    )
