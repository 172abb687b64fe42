"""``allgather``: a strategy of one's own in one module and one registry line (the last line), touching
nothing in scaletrain.

Each step every worker all-gathers every worker's flat gradient and averages them itself, then takes
the same step, so it trains like all-reduce (``join`` and ``split``, Šlampa 2017's vocabulary) while
each worker receives N−1 whole gradients instead of a ring's 2(N−1)/N. Its estimator terms say
exactly that: N−1 messages of all the weights, then the optimizer step. The gradients travel as
float32 whatever ``--wire`` says. Name the module in ``SCALETRAIN_PLUGINS`` so that every process of
a run registers it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from scaletrain.parallel.agreement import StoreAgreement
from scaletrain.parallel.strategies import STRATEGIES, Layout, Strategy
from scaletrain.parallel.strategies.allreduce import AllReduceExchange
from scaletrain.parallel.strategies.base import collect_stats, layout_fields, train_worker
from scaletrain.parallel.strategies.terms import EstimatorTerms, StepInputs, transfer_seconds, weight_bytes
from scaletrain.tensors.flat import flatten, unflatten_into
from scaletrain.train.exchange import ExchangeTimes, clip_and_step
from scaletrain.train.meter import now
from scaletrain.train.state import Prepared, Role
from scaletrain.train.summary import write_summary


def allgather_seconds(inputs: StepInputs, n: np.ndarray) -> np.ndarray:
    """A synchronous step besides the gradient: N−1 messages of all the weights, then the optimizer step."""
    profile = inputs.profile
    return (n - 1) * transfer_seconds(profile, weight_bytes(profile)) + profile.t_update


class AllGather(Strategy):
    name = "allgather"
    description = "every worker gathers all gradients and averages them itself"
    syncs = ("join", "split")

    def estimator_terms(self, server: str) -> EstimatorTerms | None:
        return EstimatorTerms(exchange=allgather_seconds)  # no thesis formula stands for it

    def run(self, prepared: Prepared, layout: Layout, rank: int, store: dist.Store) -> dict[str, Any] | None:
        workers = tuple(layout.worker_ranks())
        timeout = prepared.config.timeout
        role = Role(
            rank=rank,
            plan=layout.worker_plan(rank),
            exchange=AllGatherExchange(layout.workers),
            coordinator=rank == 0,
            checkpoints=rank == 0,
            evaluate_each_epoch=False,
            agreement=StoreAgreement(store, deciding=rank == 0, timeout=timeout, rank=rank, workers=workers),
        )
        trainer = train_worker(prepared, role, store)
        if rank != 0:
            return None
        stats = collect_stats(store, list(workers), set(), timeout)
        return write_summary(prepared, trainer.final_quality(), stats, layout_fields=layout_fields(layout))


class AllGatherExchange(AllReduceExchange):
    """All-reduce's start (rank 0's weights to everyone) and reconfiguration; its own step."""

    def step(self, model: nn.Module, optimizer: torch.optim.Optimizer, clip_norm: float | None) -> ExchangeTimes:
        if self.workers > 1:
            gradients = [p.grad for p in model.parameters() if p.grad is not None]
            begin = now()
            mine = flatten(gradients)
            gathered = [torch.empty_like(mine) for _ in range(self.workers)]
            dist.all_gather(gathered, mine)
            communication = now() - begin
            unflatten_into(torch.stack(gathered).mean(dim=0), gradients)
        else:
            communication = 0.0
        skipped = clip_and_step(model, optimizer, clip_norm, self.skip_nonfinite)
        return ExchangeTimes(communication=communication, skipped=skipped)


STRATEGIES[AllGather.name] = AllGather()
