"""All-reduce: gradients averaged over every worker, then the same step everywhere.

One flat buffer goes through ``all_reduce`` (gloo on CPU, NCCL on GPU), so its communication time
can be read apart from computation; DistributedDataParallel would overlap the two and hide it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from scaletrain.parallel.sharding import flatten, unflatten_into
from scaletrain.train.exchange import ExchangeTimes, GradientExchange, clip_and_step
from scaletrain.train.meter import now

__all__ = ["AllReduceExchange"]


class AllReduceExchange(GradientExchange):
    """Gradients averaged over all workers with ``all_reduce``; every worker then takes the same step."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._ready = torch.zeros(1)

    def start(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        weights = flatten([p.detach() for p in model.parameters()])
        dist.broadcast(weights, src=0)
        with torch.no_grad():
            unflatten_into(weights, list(model.parameters()))

    def step(self, model: nn.Module, optimizer: torch.optim.Optimizer, clip_norm: float | None) -> ExchangeTimes:
        parameters = [p for p in model.parameters() if p.grad is not None]
        begin = now()
        # A one-number all-reduce first: it returns when the slowest worker arrives, so the time it
        # takes is waiting, and the big all-reduce after it is (mostly) transfer.
        dist.all_reduce(self._ready)
        arrived = now()
        gradients = flatten([p.grad for p in parameters])
        dist.all_reduce(gradients)
        gradients /= self.workers
        unflatten_into(gradients, [p.grad for p in parameters])
        done = now()
        clip_and_step(model, optimizer, clip_norm)
        return ExchangeTimes(communication=done - arrived, wait=arrived - begin)
