"""A sharded parameter server's shards (Šlampa 2017 Algorithm 3.7): who owns which tensors, each worker's own
server over its share, and moving every owner's master tensors (and optimizer state) to the workers at a
reconfiguration and to rank 0 at the end."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scaletrain.efficient import Technique
from scaletrain.parallel.agreement import StoreAgreement
from scaletrain.parallel.sharding import assign_greedy
from scaletrain.parallel.strategies.ps.exchange import PSExchange
from scaletrain.parallel.strategies.ps.protocol import FINAL_SHARD
from scaletrain.parallel.strategies.ps.records import ServerStats, ShardCheckpointer, restore_shard
from scaletrain.parallel.strategies.ps.server import ShardServer
from scaletrain.tensors.flat import flatten, unflatten_into, views_of
from scaletrain.tensors.optimizers import state_layout
from scaletrain.train.state import make_optimizer

__all__ = ["Shards", "send_final_shards", "share_shards", "technique_step", "tensor_bytes"]


def technique_step(technique: Technique | None, names: list[str]) -> Callable[[list[nn.Parameter], float], None] | None:
    """A server's call of ``technique.after_update`` with its master tensors named as the model's."""
    if technique is None:
        return None
    return lambda master, rate: technique.after_update(dict(zip(names, master, strict=True)), rate)


def tensor_bytes(parameters: list[nn.Parameter]) -> list[int]:
    """Each tensor's bytes: what ownership is planned by (:func:`~scaletrain.parallel.sharding.assign_greedy`)."""
    return [p.numel() * p.element_size() for p in parameters]


class Shards:
    """A sharded worker's own server: who owns what, starting this worker's shard, and gathering every
    shard before a reconfiguration (ownership is planned again over the new tensors)."""

    def __init__(self, setup: Any, rank: int) -> None:
        self.setup, self.rank = setup, rank
        self.version: int | None = None  # where the next server starts (None: the run's start)
        self.stats: ServerStats | None = None
        # who this worker's server serves and who owns shards: the launch's pairs and workers, until an elastic
        # run regroups (then ranks are indices among the members: elastic_sharded)
        self.peers: dict[int, dist.ProcessGroup] = setup.peers_of.get(rank, {})  # none yet: a joining worker
        self.workers: list[int] = setup.layout.worker_ranks()
        self.agreement: StoreAgreement = setup.agreement(rank)
        self.lost: Callable[[], bool] | None = None  # elastic: ShardServer's lost

    def plan(self, parameters: list[nn.Parameter]) -> list[int]:
        return assign_greedy(tensor_bytes(parameters), self.workers)

    def serve(self, owned: list[nn.Parameter], optimizer: torch.optim.Optimizer) -> ShardServer:
        """Start this worker's server over clones of ``owned``, with their state in ``optimizer``."""
        setup, prepared = self.setup, self.setup.prepared
        names = {id(p): name for name, p in prepared.model.named_parameters()}
        # the master copies live in host memory, wherever the model computes (gloo sends from there)
        master = [nn.Parameter(p.detach().cpu().clone()) for p in owned]
        shard_optimizer = make_optimizer(prepared.config, master)
        for parameter, copy in zip(owned, master, strict=True):
            state = optimizer.state.get(parameter)
            if state:
                shard_optimizer.state[copy] = {
                    k: v.detach().cpu().clone() if torch.is_tensor(v) else v for k, v in state.items()
                }
        owners = len(self.workers)
        parameters = list(prepared.model.parameters())
        indices = [next(i for i, p in enumerate(parameters) if p is tensor) for tensor in owned]
        sizes = tensor_bytes(parameters)
        checkpointer = ShardCheckpointer(prepared, self.rank, master, shard_optimizer, self.agreement, owners)
        if self.version is None:
            version = 0
            if prepared.config.resume:
                plan = {"owners": owners, "owned": indices, "sizes": sizes}
                version = restore_shard(prepared, self.rank, master, shard_optimizer, setup.synchronous, **plan)
        else:
            version = self.version
            if self.lost is None:  # not after an elastic regroup: nothing about the network changed
                checkpointer.save(version)  # the new network's shards, and (rank 0) checkpoint.pt
        stats = self.stats or ServerStats()
        server = ShardServer(
            master=master,
            optimizer=shard_optimizer,
            version=version,
            peers=self.peers,
            on_update=checkpointer,
            after_step=technique_step(prepared.technique, [names[id(p)] for p in owned]),
            compensation=setup.compensation(),
            stats=stats,
            lost=self.lost,
            bound=setup.bound(self.workers, stats),
            **{**setup.options, "contributors": len(self.workers)},
        )
        server.start()
        return server

    def gather(self, exchange: PSExchange, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Every owner's master weights (into ``model``) and optimizer state (into ``optimizer``), on every
        worker."""
        old = exchange.local_server
        if old is not None:
            self.stats = old.join()  # every peer said it reached the boundary
        version = torch.tensor([old.version if old is not None else 0], dtype=torch.int64)
        single = self.setup.layout.world_size == 1
        if not single:
            dist.all_reduce(version, op=dist.ReduceOp.MAX)
        self.version = int(version)
        share_shards(exchange, self.rank, single=single, state_into=optimizer)


def send_final_shards(exchange: PSExchange, rank: int, peers: dict[int, dist.ProcessGroup]) -> None:
    """Each owner sends its final master tensors to rank 0, over their pair, into rank 0's model (for the
    evaluation and ``model.pt``).

    Only rank 0 receives, so a worker leaves as soon as its own shard is sent, and a worker that owns
    nothing (more workers than tensors) as soon as it has trained: no collective waits for the last of
    the workers, which under ``async`` may finish long after the others.
    """
    server = exchange.local_server
    if rank != 0:
        if server is not None:
            dist.send(flatten([p.detach() for p in server.master]), dst=0, group=peers[0], tag=FINAL_SHARD)
        return
    arriving = {}
    for owner in exchange.owners:
        if owner == rank:
            arriving[owner] = (flatten([p.detach() for p in server.master]), None)
        else:
            weights = torch.empty(sum(p.numel() for p in exchange.owned(owner)))
            arriving[owner] = (weights, dist.irecv(weights, src=owner, group=peers[owner], tag=FINAL_SHARD))
    for owner, (weights, work) in arriving.items():
        if work is not None:
            work.wait()
        with torch.no_grad():
            unflatten_into(weights, exchange.owned(owner))


def share_shards(
    exchange: PSExchange, rank: int, *, single: bool, state_into: torch.optim.Optimizer | None = None
) -> None:
    """Each owner broadcasts its master tensors into every worker's model (their views in ``exchange``), and, with
    ``state_into``, every per-parameter state of its optimizer (SGD's momentum, Adam's moments and step count)
    into that optimizer's state (every worker, owner of a shard or not, takes part: a reconfiguration's step
    boundary is agreed by all of them)."""
    server = exchange.local_server
    whole, scalars = state_layout(state_into) if state_into is not None else ([], {})
    for owner in exchange.owners:
        shard = exchange.owned(owner)
        mine = owner == rank
        size = sum(p.numel() for p in shard)
        weights = flatten([p.detach() for p in server.master]) if mine else torch.empty(size)
        state = server.optimizer.state if mine else {}
        buffers = {
            key: flatten([state.get(p, {}).get(key, torch.zeros_like(p)) for p in server.master])
            if mine
            else torch.empty(size)
            for key in whole
        }
        counts = {
            key: torch.tensor([float(state.get(p, {}).get(key, 0)) for p in server.master], dtype=torch.float64)
            if mine
            else torch.empty(len(shard), dtype=torch.float64)
            for key in scalars
        }
        if not single:
            for tensor in (weights, *buffers.values(), *counts.values()):
                dist.broadcast(tensor, src=owner)
        with torch.no_grad():
            unflatten_into(weights, shard)
        for key, buffer in buffers.items():
            for parameter, view in zip(shard, views_of(buffer, shard), strict=True):
                state_into.state[parameter][key] = view.to(parameter.device, copy=True)
        for key, count in counts.items():
            for parameter, value in zip(shard, count.tolist(), strict=True):
                state_into.state[parameter][key] = torch.tensor(value, dtype=scalars[key])
