"""``allgather``: a strategy of one's own in one module and one registry line (the last line), touching
nothing in scaletrain and importing only :mod:`scaletrain.extend`.

Each step every worker all-gathers every worker's flat gradient and combines them itself, then takes
the same step, so it trains like all-reduce (``join`` and ``split``, Šlampa 2017's vocabulary) while
each worker receives N−1 whole gradients instead of a ring's 2(N−1)/N. Its estimator terms say
exactly that: N−1 messages of all the weights, then the optimizer step.

Its two options: ``chunks`` (``-S chunks=K`` or ``--gather-chunks K``), how many all-gathers each step's
gradient is cut into (the same sums, smaller messages), which it refuses below 1 or above the model's
parameter tensors; ``combine`` (``-S combine=mean|sum``), whether the gathered gradients are averaged, as
all-reduce does, or summed (a learning rate N times as large). Its capability flag: it sends float32 only,
so ``--wire`` anything else is refused before a process starts. Name the module in ``SCALETRAIN_PLUGINS``
so that every process of a run registers it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from scaletrain.extend import (
    STRATEGIES,
    AllReduceExchange,
    ConfigError,
    EstimatorTerms,
    ExchangeTimes,
    Layout,
    Prepared,
    StepInputs,
    Strategy,
    StrategyOption,
    TrainConfig,
    clip_and_step,
    collect_stats,
    flatten,
    layout_fields,
    now,
    train_worker,
    transfer_seconds,
    unflatten_into,
    weight_bytes,
    worker_role,
    write_summary,
)


def allgather_seconds(inputs: StepInputs, n: np.ndarray) -> np.ndarray:
    """A synchronous step besides the gradient: N−1 messages of all the weights, then the optimizer step."""
    profile = inputs.profile
    return (n - 1) * transfer_seconds(profile, weight_bytes(profile)) + profile.t_update


class AllGather(Strategy):
    name = "allgather"
    description = "every worker gathers all gradients and combines them itself"
    syncs = ("join", "split")
    wires = ("fp32",)  # the capability: its gradients travel as float32 whatever a codec would do
    options = (
        StrategyOption(
            "chunks", "all-gathers per step (the same sums in smaller messages)", 1, type=int, flag="gather_chunks"
        ),
        StrategyOption(
            "combine", "mean (as all-reduce) or sum of the gathered gradients", "mean", choices=("mean", "sum")
        ),
    )

    def check_options(self, values: Mapping[str, Any], layout: Layout, config: TrainConfig) -> None:
        if values["chunks"] < 1:
            raise ConfigError(f"--strategy allgather: -S chunks must be 1 or more, got {values['chunks']}")

    def estimator_terms(self, server: str) -> EstimatorTerms | None:
        return EstimatorTerms(exchange=allgather_seconds)  # no thesis formula stands for it

    def run(self, prepared: Prepared, layout: Layout, rank: int, store: dist.Store) -> dict[str, Any] | None:
        options = self.option_values(prepared.config.strategy_options)
        exchange = AllGatherExchange(layout.workers, options["chunks"], options["combine"])
        trainer = train_worker(prepared, worker_role(prepared, layout, rank, store, exchange), store)
        if rank != 0:
            return None
        stats = collect_stats(store, layout.worker_ranks(), set(), prepared.config.timeout)
        fields = layout_fields(layout, prepared.config)
        return write_summary(prepared, trainer.final_quality(), stats, layout_fields=fields)


class AllGatherExchange(AllReduceExchange):
    """All-reduce's start (rank 0's weights to everyone) and reconfiguration; its own step."""

    def __init__(self, workers: int, chunks: int, combine: str) -> None:
        super().__init__(workers)
        self.chunks, self.combine = chunks, combine

    def start(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        tensors = sum(1 for _ in model.parameters())
        if self.chunks > tensors:  # known only once the network is built: every worker refuses alike
            raise ConfigError(f"--strategy allgather: -S chunks={self.chunks} exceeds the {tensors} parameter tensors")
        super().start(model, optimizer)

    def step(self, model: nn.Module, optimizer: torch.optim.Optimizer, clip_norm: float | None) -> ExchangeTimes:
        communication = 0.0
        if self.workers > 1:
            gradients = [p.grad for p in model.parameters() if p.grad is not None]
            for piece in np.array_split(np.arange(len(gradients)), self.chunks):
                part = [gradients[i] for i in piece]
                begin = now()
                mine = flatten(part)
                gathered = [torch.empty_like(mine) for _ in range(self.workers)]
                dist.all_gather(gathered, mine)
                communication += now() - begin
                stacked = torch.stack(gathered)
                unflatten_into(stacked.mean(dim=0) if self.combine == "mean" else stacked.sum(dim=0), part)
        skipped = clip_and_step(model, optimizer, clip_norm, self.skip_nonfinite)
        return ExchangeTimes(communication=communication, skipped=skipped)


STRATEGIES[AllGather.name] = AllGather()
