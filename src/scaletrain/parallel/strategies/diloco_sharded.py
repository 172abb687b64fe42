"""``diloco`` through the sharded parameter server (``-S outer_exchange=sharded``): every H inner steps each
worker pushes its change since the anchor (anchor − weights, the pseudo-gradient) to the sharded server, each
owner averages its share over the workers and steps it with the outer optimizer, and the workers take the new
anchor from the owners' replies.

The server is :mod:`scaletrain.parallel.strategies.ps`'s, as ``--strategy ps --server sharded`` runs it: ownership
planned by :func:`~scaletrain.parallel.sharding.assign_greedy`, one two-process group per pair of workers, one
:class:`~scaletrain.parallel.strategies.ps.server.ShardServer` per owner, the worker's side
:class:`~scaletrain.parallel.strategies.ps.exchange.PSExchange`. Only the gradient it is given and the owners'
optimizer differ: the pseudo-gradient, once per outer step, and the outer optimizer at its own constant rate,
unclipped. Each owner's outer optimizer state lives with its shard; each worker saves its owner's shard and that
state beside every checkpoint, with its own weights, inner optimizer state and anchor, so a resumed run goes on
exactly. A lost worker takes its shard's state with it (``--min-workers`` is refused). The averaged change is the
same as the all-reduce's (up to the order of the sum).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scaletrain.parallel.sharding import assign_greedy
from scaletrain.parallel.strategies.base import Layout, collect_stats, layout_fields, train_worker
from scaletrain.parallel.strategies.diloco_elastic import own_state, take_own_state
from scaletrain.parallel.strategies.ps.exchange import PSExchange
from scaletrain.parallel.strategies.ps.protocol import pair_groups
from scaletrain.parallel.strategies.ps.server import ShardServer
from scaletrain.parallel.strategies.ps.shards import send_final_shards, tensor_bytes
from scaletrain.parallel.strategies.roles import worker_role
from scaletrain.tensors.codec import wire_codec
from scaletrain.tensors.flat import mean_over, unflatten_into
from scaletrain.train.exchange import ExchangeTimes, GradientExchange, clip_and_step
from scaletrain.train.state import Prepared
from scaletrain.train.summary import write_summary

__all__ = ["ShardedOuterExchange", "run_sharded"]

#: Makes the outer optimizer over an owner's master tensors.
OuterOptimizer = Callable[[list[nn.Parameter]], torch.optim.Optimizer]


def run_sharded(
    prepared: Prepared,
    layout: Layout,
    rank: int,
    store: dist.Store,
    every: int,
    make_outer: OuterOptimizer,
    *,
    asynchronous: bool = False,
) -> dict[str, Any] | None:
    """One worker of a diloco run through the sharded server (every process is a worker and an owner), an outer
    step every ``every`` inner steps; rank 0 gathers the final anchor from the owners and returns the summary.
    ``asynchronous``: each owner steps its share with each worker's change as it comes, and records how many
    updates the change's anchor was behind (its staleness); rank 0's owner's record goes into the summary."""
    config = prepared.config
    workers = layout.worker_ranks()
    pairs = [(a, b) for a in workers for b in workers if a < b]
    groups = pair_groups(layout.world_size, pairs, timeout=config.timeout)
    peers = {b if a == rank else a: group for (a, b), group in groups.items() if rank in (a, b)}

    def serve(owned: list[nn.Parameter], optimizer: torch.optim.Optimizer) -> ShardServer:
        # the master copies in host memory (gloo sends from there); the outer optimizer starts afresh
        master = [nn.Parameter(p.detach().cpu().clone()) for p in owned]
        server = ShardServer(
            master=master,
            optimizer=make_outer(master),
            peers=peers,
            contributors=layout.workers,
            synchronous=not asynchronous,
            timeout=config.timeout,
            codec=wire_codec(config),
        )
        server.start()
        return server

    server_side = PSExchange(
        rank=rank,
        plan=lambda parameters: assign_greedy(tensor_bytes(parameters), workers),
        groups=peers,
        serve=serve,
        codec=wire_codec(config),
    )
    exchange = ShardedOuterExchange(server_side, every, resumable=not asynchronous)
    role = worker_role(prepared, layout, rank, store, exchange)
    if asynchronous:  # an owner's shard moves whenever a change comes: no step to resume every process from
        role = dataclasses.replace(role, checkpoints=False)
    trainer = train_worker(prepared, role, store)
    if server_side.local_server is not None:  # more workers than tensors: some own nothing
        server_side.local_server.join()
    send_final_shards(server_side, rank, peers)  # the final anchor into rank 0's model
    if rank != 0:
        return None
    stats = collect_stats(store, workers, set(), config.timeout)
    fields = layout_fields(layout, config) | {"outer_steps": exchange.outer_steps}
    if asynchronous:  # rank 0 owns a shard: the first tensor goes to the first worker (assign_greedy's ties)
        owner = server_side.local_server.stats
        fields |= {"staleness": owner.staleness_summary(), "server_updates": owner.updates}
    return write_summary(prepared, trainer.final_quality(), stats, layout_fields=fields)


class ShardedOuterExchange(GradientExchange):
    """Inner steps here; every ``every`` steps the change since the anchor goes to the owners as a gradient
    (``server_side``: the worker's side of the sharded server), whose replies are the new anchor."""

    def __init__(self, server_side: PSExchange, every: int, *, resumable: bool = True) -> None:
        # resumable: each checkpoint keeps what a resumed run needs (not asynchronously, which refuses --resume)
        self.server_side, self.every, self.resumable = server_side, every, resumable
        self.inner_steps = self.outer_steps = 0
        self._anchor: list[torch.Tensor] = []
        self._model: nn.Module | None = None
        self._inner: torch.optim.Optimizer | None = None

    def start(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.server_side.start(model, optimizer)  # every worker takes the owners' weights
        self._anchor = [p.detach().clone() for p in model.parameters()]
        self._model, self._inner = model, optimizer

    def step(self, model: nn.Module, optimizer: torch.optim.Optimizer, clip_norm: float | None) -> ExchangeTimes:
        skipped = clip_and_step(model, optimizer, clip_norm, self.skip_nonfinite)
        self.inner_steps += 1
        if self.inner_steps % self.every:
            return ExchangeTimes(skipped=skipped)
        times = self._outer_step(model, optimizer)
        return dataclasses.replace(times, skipped=skipped or times.skipped)

    def conclude(self, model: nn.Module, refresh: Callable[[int], int]) -> ExchangeTimes | None:
        """The inner steps since the last outer step go into one more outer step; then batch norm's running
        statistics are re-estimated for the owners' weights on each worker's share of H batches, and the workers
        (every process of a sharded run) take their mean."""
        times = self._outer_step(model, None) if self.inner_steps % self.every else None
        buffers = [buffer for buffer in model.buffers() if buffer.is_floating_point()]
        if not self.outer_steps or not refresh(self.every) or dist.get_world_size() == 1:
            return times
        flat = mean_over(buffers, dist.all_reduce, dist.get_world_size())
        with torch.no_grad():
            unflatten_into(flat, buffers)
        sent = flat.numel() * flat.element_size() + (times.sent_bytes if times is not None else 0)
        # the outer step's seconds stay training's; the statistics' mean is the evaluation's
        return dataclasses.replace(times, sent_bytes=sent) if times is not None else ExchangeTimes(sent_bytes=sent)

    def finish(self, model: nn.Module) -> None:
        self.server_side.finish(model)  # the owners are told

    def _outer_step(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> ExchangeTimes:
        parameters = list(model.parameters())
        for anchor, parameter in zip(self._anchor, parameters, strict=True):
            parameter.grad = anchor - parameter.detach()
        times = self.server_side.step(model, optimizer, None)  # the replies are the new anchor, in the model
        for anchor, parameter in zip(self._anchor, parameters, strict=True):
            anchor.copy_(parameter.detach())
            parameter.grad = None
        self.outer_steps += 1
        return times

    def state_dict(self) -> dict | None:
        """Beside each checkpoint, per worker: the codec's state, the owners' versions, this worker's owner's shard
        with the outer optimizer's state (between outer steps, when no update can start without this worker's
        change), the anchor, and this worker's weights and inner optimizer state since the last outer step."""
        if not self.resumable:
            return self.server_side.state_dict()  # the codec's residuals only
        owner = self.server_side.local_server
        return {
            "codec": self.server_side.state_dict(),
            "versions": dict(self.server_side.versions),
            "owner": owner.saved() if owner is not None else None,
            **own_state(self._anchor, self._model, self._inner),
            "inner_steps": self.inner_steps,
            "outer_steps": self.outer_steps,
        }

    def load_state_dict(self, state: dict) -> None:
        """Before this worker's first step of the resumed run, so its owner's next update waits for it."""
        if state.get("codec"):
            self.server_side.load_state_dict(state["codec"])
        if state.get("anchor") is None:
            return
        owner = self.server_side.local_server
        if owner is not None and state["owner"] is not None:
            owner.restore(state["owner"])
        self.server_side.versions.update(state["versions"])
        take_own_state(state, self._anchor, self._model, self._inner)
        self.inner_steps, self.outer_steps = state["inner_steps"], state["outer_steps"]
