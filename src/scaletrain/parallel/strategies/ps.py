"""``ps``: a parameter server, central (one server process, rank 0) or sharded (every worker owns a
share of the tensors, Šlampa 2017 Algorithm 3.7), with ``join``, ``split`` or ``async`` updates.

The machinery (servers, the worker's exchange, the wire protocol) is in :mod:`scaletrain.parallel.ps`;
this module assembles it for one process and handles a reconfiguration: the server side rebuilds its
master tensors, buffers and optimizer state for the new network, and ownership is planned again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scaletrain.efficient import Reconfiguration, Technique
from scaletrain.parallel.agreement import StoreAgreement, load_buffers
from scaletrain.parallel.ps.exchange import PSExchange
from scaletrain.parallel.ps.membership import CentralMembership, Members
from scaletrain.parallel.ps.protocol import FINAL_SHARD, pair_groups
from scaletrain.parallel.ps.records import ServerObserver, ServerStats, ShardCheckpointer, restore_shard
from scaletrain.parallel.ps.server import ShardServer
from scaletrain.parallel.ps.staleness import Compensation
from scaletrain.parallel.sharding import assign_greedy
from scaletrain.parallel.strategies.base import Layout, Strategy, collect_stats, layout_fields, train_worker
from scaletrain.parallel.strategies.batch_norm import batch_group
from scaletrain.parallel.strategies.elastic_rules import check_elastic_backend, check_elastic_batch
from scaletrain.parallel.strategies.ps_summary import server_extra
from scaletrain.parallel.strategies.ps_terms import CENTRAL, SHARDED
from scaletrain.parallel.strategies.terms import EstimatorTerms
from scaletrain.tensors.codec import wire_codec
from scaletrain.tensors.flat import flatten, unflatten_into, views_of
from scaletrain.train.reconfigure import apply_decision, describe_decision
from scaletrain.train.state import Prepared, Role, learning_rate_at_step, make_optimizer
from scaletrain.train.summary import write_summary

__all__ = ["ParameterServer"]


class ParameterServer(Strategy):
    name = "ps"
    description = "parameter server: central (a server process) or sharded over the workers"
    servers = ("central", "sharded")
    syncs = ("join", "split", "async")

    def estimator_terms(self, server: str) -> EstimatorTerms | None:
        return {"central": CENTRAL, "sharded": SHARDED}.get(server)

    def extra_processes(self, layout: Layout) -> int:
        return 1 if layout.server == "central" else 0

    def outlives_lost_workers(self, layout: Layout) -> bool:
        # The asynchronous central server counts a lost worker and finishes with the others; a sharded
        # worker also owns a share, and a synchronous step needs every worker.
        return layout.server == "central" and layout.sync == "async"

    def run(self, prepared: Prepared, layout: Layout, rank: int, store: dist.Store) -> dict[str, Any] | None:
        setup = _Setup.of(prepared, layout, store)
        if layout.has_server_process and rank == 0:
            return _central_server(setup)
        return _worker(setup, rank)


@dataclass
class _Setup:
    """What every process of a parameter-server run builds the same way."""

    prepared: Prepared
    layout: Layout
    store: dist.Store
    peers_of: dict[int, dict[int, dist.ProcessGroup]]
    options: dict[str, Any]
    batch_group: dist.ProcessGroup | None = None  # the workers, for synchronised batch norm

    @classmethod
    def of(cls, prepared: Prepared, layout: Layout, store: dist.Store) -> _Setup:
        config, workers = prepared.config, layout.worker_ranks()
        if layout.server == "central":
            pairs = [(0, worker) for worker in workers]
        else:
            pairs = [(a, b) for a in workers for b in workers if a < b]
        groups = pair_groups(layout.world_size, pairs, timeout=config.timeout)
        peers_of = {
            r: {b if a == r else a: g for (a, b), g in groups.items() if r in (a, b)} for r in range(layout.world_size)
        }
        options = dict(
            contributors=layout.workers,
            synchronous=layout.sync != "async",
            exclusive=config.ps_admission == "exclusive",
            clip_norm=config.clip_norm,
            learning_rate=lambda version: learning_rate_at_step(prepared, version),
            timeout=config.timeout,
            codec=wire_codec(config),  # weights out, gradients in: no error feedback on a server
            skip_nonfinite=prepared.technique is not None and prepared.technique.skips_nonfinite,
        )
        return cls(prepared, layout, store, peers_of, options, batch_group(config, layout))

    @property
    def synchronous(self) -> bool:
        return self.layout.sync != "async"

    @property
    def elastic(self) -> bool:
        """A synchronous central server that goes on without lost workers (``--min-workers``)."""
        config, layout = self.prepared.config, self.layout
        return config.min_workers is not None and layout.server == "central" and self.synchronous and layout.workers > 1

    def compensation(self) -> Compensation | None:
        """One per server: each measures the staleness of the gradients it applies."""
        if self.synchronous:
            return None
        config = self.prepared.config
        return Compensation(config.async_compensation, momentum=config.momentum, workers=self.layout.workers)

    def agreement(self, rank: int) -> StoreAgreement:
        deciding = rank == self.layout.worker_ranks()[0]
        return StoreAgreement(
            self.store,
            deciding=deciding,
            timeout=self.prepared.config.timeout,
            rank=rank,
            workers=tuple(self.layout.worker_ranks()),
            synchronous=self.synchronous,
        )


def _central_server(setup: _Setup) -> dict[str, Any]:
    """Rank 0 of ``ps central``: serve until every worker is done; at a reconfiguration rebuild the
    master network, carry its optimizer state, and serve the survivors again."""
    prepared, layout = setup.prepared, setup.layout
    observer = ServerObserver(prepared, setup.agreement(0))
    peers, version, stats, compensation = setup.peers_of[0], prepared.position.step, None, setup.compensation()
    members = None
    if setup.elastic:  # started by another launcher, this process may be the first to see the settings
        check_elastic_batch(prepared.config, layout, prepared.batch_size)
        check_elastic_backend(dist.get_backend())
        members = Members.of_server(observer, list(peers), setup.store)
    if prepared.technique is not None:  # it changes the weights after each update here, where they are made
        context = prepared.technique_context(
            mean=setup.agreement(0).mean,
            epoch=lambda: prepared.schedule.position(observer.version).epoch,
            computes_loss=False,
        )
        prepared.technique.start(prepared.model, context)
    try:
        while True:
            names = [name for name, _ in prepared.model.named_parameters()]
            server = ShardServer(
                master=list(prepared.model.parameters()),
                optimizer=prepared.optimizer,
                version=version,
                peers=peers,
                on_update=observer,
                after_step=_technique_step(prepared.technique, names),
                compensation=compensation,
                stats=stats,
                members=members,
                **setup.options,
            )
            server.start()
            stats = server.join()
            if not server.reconfiguring:
                break
            epoch = max(server.reconfiguring.values())
            what = _reconfigure_master(prepared, setup.agreement(0).read(epoch), epoch)
            version = server.version
            observer.save(version)
            observer.message(f"after epoch {epoch + 1}: {what}")
            peers = {peer: group for peer, group in peers.items() if peer not in stats.lost}
    finally:
        observer.close()
    observer.take_shared(server.version)  # the workers' final buffers, for the evaluation and model.pt
    lost = set(stats.lost)
    worker_stats = collect_stats(setup.store, layout.worker_ranks(), lost, prepared.config.timeout)
    quality = prepared.workload.evaluate(prepared.model, prepared.data)
    return write_summary(
        prepared,
        quality,
        worker_stats,
        layout_fields=layout_fields(layout),
        steps=server.version,
        extra=server_extra(stats, layout, prepared, server.compensation, members),
    )


def _reconfigure_master(prepared: Prepared, decision: Reconfiguration | None, epoch: int) -> str:
    prepared.decided_epochs = epoch + 1
    if decision is None:
        return "nothing changed"
    apply_decision(prepared, decision, epoch)
    if prepared.technique is not None:
        prepared.technique.reconfigured(prepared.model)
    return describe_decision(prepared, decision)


def _technique_step(
    technique: Technique | None, names: list[str]
) -> Callable[[list[nn.Parameter], float], None] | None:
    """A server's call of ``technique.after_update`` with its master tensors named as the model's."""
    if technique is None:
        return None
    return lambda master, rate: technique.after_update(dict(zip(names, master, strict=True)), rate)


def _worker(setup: _Setup, rank: int) -> dict[str, Any] | None:
    prepared, layout, config = setup.prepared, setup.layout, setup.prepared.config
    workers = layout.worker_ranks()
    shards = _Shards(setup, rank) if layout.server == "sharded" else None
    exchange = PSExchange(
        rank=rank,
        plan=shards.plan if shards else (lambda parameters: [0] * len(parameters)),
        groups=setup.peers_of[rank],
        serve=shards.serve if shards else None,
        gather=shards.gather if shards else None,
        exclusive=config.ps_admission == "exclusive",
        codec=wire_codec(config),
        # the server may wait out --timeout on a stopped worker before it answers the others
        patience=2 * config.timeout + 10 if setup.elastic else None,
    )
    membership = None
    if setup.elastic:
        factor = layout.worker_plan(rank).global_batch_factor
        membership = CentralMembership(setup.store, rank=rank, exchange=exchange, factor=factor, timeout=config.timeout)
    role = Role(
        rank=rank,
        plan=layout.worker_plan(rank),
        exchange=exchange,
        coordinator=rank == 0,
        checkpoints=False,
        evaluate_each_epoch=False,
        agreement=setup.agreement(rank),
        batch_group=setup.batch_group,
        membership=membership,
    )
    trainer = train_worker(prepared, role, setup.store)
    if shards is None:
        return None  # central: the server process holds the final weights
    local_server = exchange.local_server
    # With more workers than tensors some own nothing (local_server None): they have nothing to hand over.
    server_stats = local_server.join() if local_server is not None else None
    _send_final_shards(exchange, rank, setup.peers_of[rank])
    if rank != 0:
        return None
    # Rank 0 always owns a shard: the first tensor goes to the first worker (assign_greedy's ties).
    if not setup.synchronous:  # every worker published its last buffers before it said goodbye
        load_buffers(prepared.model, role.agreement.worker_buffers(None))
    stats = collect_stats(setup.store, workers, set(), config.timeout)
    return write_summary(
        prepared,
        trainer.final_quality(),
        stats,
        layout_fields=layout_fields(layout),
        steps=local_server.version,
        extra=server_extra(server_stats, layout, prepared, local_server.compensation),
    )


class _Shards:
    """A sharded worker's own server: who owns what, starting this worker's shard, and gathering every
    shard before a reconfiguration (ownership is planned again over the new tensors)."""

    def __init__(self, setup: _Setup, rank: int) -> None:
        self.setup, self.rank = setup, rank
        self.version: int | None = None  # where the next server starts (None: the run's start)
        self.stats: ServerStats | None = None

    def plan(self, parameters: list[nn.Parameter]) -> list[int]:
        return assign_greedy([p.numel() * p.element_size() for p in parameters], self.setup.layout.worker_ranks())

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
        checkpointer = ShardCheckpointer(prepared, self.rank, master, shard_optimizer, setup.agreement(self.rank))
        if self.version is None:
            version = (
                restore_shard(prepared, self.rank, master, shard_optimizer, setup.synchronous)
                if prepared.config.resume
                else 0
            )
        else:
            version = self.version
            checkpointer.save(version)  # the new network's shards, and (rank 0) checkpoint.pt
        server = ShardServer(
            master=master,
            optimizer=shard_optimizer,
            version=version,
            peers=setup.peers_of[self.rank],
            on_update=checkpointer,
            after_step=_technique_step(prepared.technique, [names[id(p)] for p in owned]),
            compensation=setup.compensation(),
            stats=self.stats,
            **setup.options,
        )
        server.start()
        return server

    def gather(self, exchange: PSExchange, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Every owner's master weights (into ``model``) and momentum (into ``optimizer``), on every worker."""
        old = exchange.local_server
        if old is not None:
            self.stats = old.join()  # every peer said it reached the boundary
        version = torch.tensor([old.version if old is not None else 0], dtype=torch.int64)
        single = self.setup.layout.world_size == 1
        if not single:
            dist.all_reduce(version, op=dist.ReduceOp.MAX)
        self.version = int(version)
        momentum = optimizer if self.setup.prepared.config.momentum > 0 else None
        _share_shards(exchange, self.rank, single=single, momentum_into=momentum)


def _send_final_shards(exchange: PSExchange, rank: int, peers: dict[int, dist.ProcessGroup]) -> None:
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


def _share_shards(
    exchange: PSExchange, rank: int, *, single: bool, momentum_into: torch.optim.Optimizer | None = None
) -> None:
    """Each owner broadcasts its master tensors into every worker's model (their views in ``exchange``),
    and, with ``momentum_into``, its momentum buffers into that optimizer's state (every worker, owner of
    a shard or not, takes part: a reconfiguration's step boundary is agreed by all of them)."""
    server = exchange.local_server
    for owner in exchange.owners:
        shard = exchange.owned(owner)
        mine = owner == rank
        size = sum(p.numel() for p in shard)
        weights = flatten([p.detach() for p in server.master]) if mine else torch.empty(size)
        buffers = _momentum(server) if mine and momentum_into is not None else torch.empty(size)
        if not single:
            dist.broadcast(weights, src=owner)
            if momentum_into is not None:
                dist.broadcast(buffers, src=owner)
        with torch.no_grad():
            unflatten_into(weights, shard)
        if momentum_into is not None:
            for parameter, view in zip(shard, views_of(buffers, shard), strict=True):
                momentum_into.state[parameter]["momentum_buffer"] = view.to(parameter.device, copy=True)


def _momentum(server: ShardServer) -> torch.Tensor:
    state = server.optimizer.state
    return flatten([state.get(p, {}).get("momentum_buffer", torch.zeros_like(p)) for p in server.master])
