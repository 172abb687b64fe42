"""The role a worker of a synchronous strategy without server processes plays, built in one call."""

from __future__ import annotations

import torch.distributed as dist

from scaletrain.parallel.agreement import StoreAgreement
from scaletrain.parallel.strategies.base import Layout
from scaletrain.parallel.strategies.batch_norm import batch_group
from scaletrain.train.exchange import GradientExchange
from scaletrain.train.state import Prepared, Role

__all__ = ["worker_role"]


def worker_role(prepared: Prepared, layout: Layout, rank: int, store: dist.Store, exchange: GradientExchange) -> Role:
    """Worker ``rank``'s role: its part of each global batch (:meth:`Layout.worker_plan`), its gradients turned into
    weights by ``exchange``; rank 0 writes the logs, evaluates and checkpoints; the techniques' decisions are
    agreed through ``store``; batch norm is synchronised over the workers of a split batch (``--sync-batchnorm``).
    Call it in :meth:`Strategy.run <scaletrain.parallel.strategies.base.Strategy.run>` of every worker process,
    all of them, before the training loop (the batch-norm group is a collective)."""
    config = prepared.config
    workers = tuple(layout.worker_ranks())
    return Role(
        rank=rank,
        plan=layout.worker_plan(rank),
        exchange=exchange,
        coordinator=rank == 0,
        checkpoints=rank == 0,
        evaluate_each_epoch=False,
        agreement=StoreAgreement(store, deciding=rank == 0, timeout=config.timeout, rank=rank, workers=workers),
        batch_group=batch_group(config, layout),
    )
