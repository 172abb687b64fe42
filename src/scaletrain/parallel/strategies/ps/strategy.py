"""``ps``: a parameter server, central (one server process, rank 0) or sharded (every worker owns a
share of the tensors, Šlampa 2017 Algorithm 3.7), with ``join``, ``split`` or ``async`` updates.

The machinery (servers, the worker's exchange, the wire protocol) is in :mod:`scaletrain.parallel.strategies.ps`;
this module assembles it for one process and handles a reconfiguration: the server side rebuilds its
master tensors, buffers and optimizer state for the new network, and ownership is planned again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from scaletrain.config import TrainConfig
from scaletrain.efficient import Reconfiguration
from scaletrain.parallel.agreement import StoreAgreement, load_buffers
from scaletrain.parallel.strategies.base import Layout, Strategy, collect_stats, layout_fields, train_worker
from scaletrain.parallel.strategies.batch_norm import batch_group
from scaletrain.parallel.strategies.elastic import StoreMembership
from scaletrain.parallel.strategies.elastic_rules import check_elastic_backend, check_elastic_batch
from scaletrain.parallel.strategies.ps.async_batches import batch_share, split_over, splits
from scaletrain.parallel.strategies.ps.bound import StalenessBound
from scaletrain.parallel.strategies.ps.elastic_sharded import elastic_sharded
from scaletrain.parallel.strategies.ps.exchange import PSExchange
from scaletrain.parallel.strategies.ps.membership import CentralMembership, Members
from scaletrain.parallel.strategies.ps.options import OPTIONS, check_options, ps_options
from scaletrain.parallel.strategies.ps.protocol import pair_groups
from scaletrain.parallel.strategies.ps.records import ServerObserver, ServerStats
from scaletrain.parallel.strategies.ps.server import ShardServer
from scaletrain.parallel.strategies.ps.shards import Shards, send_final_shards, technique_step
from scaletrain.parallel.strategies.ps.staleness import Compensation
from scaletrain.parallel.strategies.ps.summary import server_extra
from scaletrain.parallel.strategies.ps.terms import CENTRAL, SHARDED
from scaletrain.parallel.strategies.terms import EstimatorTerms
from scaletrain.tensors.codec import wire_codec
from scaletrain.tensors.optimizers import requested_momentum
from scaletrain.train.membership import elastic_fields
from scaletrain.train.reconfigure import apply_decision, describe_decision
from scaletrain.train.state import Prepared, Role, learning_rate_at_step, make_optimizer
from scaletrain.train.summary import write_summary

__all__ = ["ParameterServer"]


class ParameterServer(Strategy):
    name = "ps"
    description = "parameter server: central (a server process) or sharded over the workers"
    servers = ("central", "sharded")
    syncs = ("join", "split", "async")
    options = OPTIONS

    def check_options(self, values: Mapping[str, Any], layout: Layout, config: TrainConfig) -> None:
        check_options(values, layout, config)

    def batch_split(self, config: TrainConfig, layout: Layout) -> int:
        return split_over(config, layout)

    def estimator_terms(self, server: str) -> EstimatorTerms | None:
        return {"central": CENTRAL, "sharded": SHARDED}.get(server)

    def extra_processes(self, layout: Layout) -> int:
        return 1 if layout.server == "central" else 0

    def elastic(self, layout: Layout) -> bool:
        return layout.sync != "async"  # a synchronous step regroups the survivors; async has no common step

    def admits_joiners(self, layout: Layout) -> bool:
        return self.elastic(layout) and layout.server == "sharded"  # the central server admits none

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
        # a worker that joins an elastic run has no group yet: it makes its pairs once admitted (elastic_sharded)
        groups = {} if config.join else pair_groups(layout.world_size, pairs, timeout=config.timeout)
        peers_of = {
            r: {b if a == r else a: g for (a, b), g in groups.items() if r in (a, b)} for r in range(layout.world_size)
        }
        options = dict(
            contributors=layout.workers,
            synchronous=layout.sync != "async",
            exclusive=ps_options(config)["admission"] == "exclusive",
            clip_norm=config.clip_norm,
            learning_rate=lambda version: learning_rate_at_step(prepared, version),
            timeout=config.timeout,
            compiled=config.compile,
            codec=wire_codec(config),  # weights out, gradients in: no error feedback on a server
            skip_nonfinite=prepared.technique is not None and prepared.technique.skips_nonfinite,
        )
        return cls(prepared, layout, store, peers_of, options, batch_group(config, layout))

    @property
    def synchronous(self) -> bool:
        return self.layout.sync != "async"

    @property
    def elastic(self) -> bool:
        """A synchronous server whose workers go on without lost ones (``--min-workers``)."""
        config, layout = self.prepared.config, self.layout
        return config.min_workers is not None and self.synchronous and (layout.workers > 1 or config.join)

    def compensation(self) -> Compensation | None:
        """One per server: each measures the staleness of the gradients it applies."""
        if self.synchronous:
            return None
        config = self.prepared.config
        share = batch_share(config, self.layout, config.batch_size)
        mode, workers = ps_options(config)["compensation"], self.layout.workers
        # the momentum asked for (SGD's, or Adam's first-moment rate): a fresh optimizer's, not one a resume lowered
        requested = requested_momentum(make_optimizer(config, [torch.zeros(1, requires_grad=True)]))
        return Compensation(mode, momentum=requested, workers=workers, share=share)

    def bound(self, workers: list[int], stats: ServerStats) -> StalenessBound | None:
        """One per owner, over the clocks in ``stats`` of the ``workers`` that push to it (``--max-staleness``).

        A held reply waits at most 1.5 × ``--timeout`` + 5 s: a lagging worker's link times out sooner, and a
        held worker waits for its reply ``patience`` seconds (2 × ``--timeout`` + 10 s), longer still."""
        limit = ps_options(self.prepared.config)["max_staleness"]
        if self.synchronous or limit is None:
            return None
        return StalenessBound(limit, workers, stats, deadline=1.5 * self.prepared.config.timeout + 5)

    @property
    def patience(self) -> float | None:
        """How long a worker waits for a reply that a server may hold (elastic, ``--max-staleness``)."""
        held = not self.synchronous and ps_options(self.prepared.config)["max_staleness"] is not None
        return 2 * self.prepared.config.timeout + 10 if self.elastic or held else None

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
    peers, version, stats, compensation = setup.peers_of[0], prepared.position.step, ServerStats(), setup.compensation()
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
                after_step=technique_step(prepared.technique, names),
                compensation=compensation,
                stats=stats,
                members=members,
                bound=setup.bound(list(peers), stats),
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
        layout_fields=layout_fields(layout, prepared.config),
        steps=server.version,
        extra=server_extra(
            stats, layout, prepared, server.compensation, members, steps=server.version, bound=server.bound
        ),
    )


def _reconfigure_master(prepared: Prepared, decision: Reconfiguration | None, epoch: int) -> str:
    prepared.decided_epochs = epoch + 1
    if decision is None:
        return "nothing changed"
    apply_decision(prepared, decision, epoch)
    if prepared.technique is not None:
        prepared.technique.reconfigured(prepared.model)
    return describe_decision(prepared, decision)


def _worker(setup: _Setup, rank: int) -> dict[str, Any] | None:
    prepared, layout, config = setup.prepared, setup.layout, setup.prepared.config
    plan, agreement, joined = layout.worker_plan(rank), setup.agreement(rank), None
    if splits(config, layout):  # each step a part of a batch of --batch-size, as the throughput counts it
        plan = dataclasses.replace(plan, batch_fraction=batch_share(config, layout, config.batch_size))
    if setup.elastic and layout.server == "sharded":
        exchange, membership, joined = elastic_sharded(setup, rank)
        plan, agreement = (joined.plan, joined.agreement) if joined is not None else (plan, membership.agreement())
    else:
        shards = Shards(setup, rank) if layout.server == "sharded" else None
        exchange = PSExchange(
            rank=rank,
            plan=shards.plan if shards else (lambda parameters: [0] * len(parameters)),
            groups=setup.peers_of[rank],
            serve=shards.serve if shards else None,
            gather=shards.gather if shards else None,
            exclusive=ps_options(config)["admission"] == "exclusive",
            codec=wire_codec(config),
            # the server may wait out --timeout on a stopped worker before it answers the others
            patience=setup.patience,
        )
        membership = None
        if setup.elastic:
            factor = plan.global_batch_factor
            membership = CentralMembership(
                setup.store, rank=rank, exchange=exchange, factor=factor, timeout=config.timeout
            )
    role = Role(
        rank=rank,
        plan=plan,
        exchange=exchange,
        coordinator=rank == 0,
        checkpoints=False,
        evaluate_each_epoch=False,
        agreement=agreement,
        batch_group=setup.batch_group,
        membership=membership,
    )
    trainer = train_worker(prepared, role, setup.store)
    if layout.server == "central":
        return None  # the server process holds the final weights
    local_server = exchange.local_server
    # With more workers than tensors some own nothing (local_server None): they have nothing to hand over.
    server_stats = local_server.join() if local_server is not None else None
    send_final_shards(exchange, exchange.rank, exchange.groups)  # ranks among the members, after a change
    if joined is not None:
        return {"rank": rank, "out": str(config.out), "joined": joined.record}
    if exchange.rank != 0:
        return None
    elastic = isinstance(membership, StoreMembership)  # a sharded run's (the central server writes its own)
    if elastic:
        membership.refuse_waiting("the run has finished training")
    # Rank 0 always owns a shard: the first tensor goes to the first worker (assign_greedy's ties).
    if not setup.synchronous:  # every worker published its last buffers before it said goodbye
        load_buffers(prepared.model, role.agreement.worker_buffers(None))
    workers = membership.members if elastic else layout.worker_ranks()
    stats = collect_stats(setup.store, workers, set(), config.timeout)
    fields = layout_fields(layout, config)
    if elastic:
        fields |= elastic_fields(membership, trainer, layout.workers)
    return write_summary(
        prepared,
        trainer.final_quality(),
        stats,
        layout_fields=fields,
        steps=local_server.version,
        extra=server_extra(server_stats, layout, prepared, local_server.compensation, bound=local_server.bound),
    )
