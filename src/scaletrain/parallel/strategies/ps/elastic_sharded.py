"""Elastic sharded parameter server (``--strategy ps --server sharded --sync join|split --min-workers M``): a
worker that dies or stops answering is dropped and the survivors go on; a worker started later (``--join``)
is admitted at a step boundary.

Every worker owns a shard (Šlampa 2017 Algorithm 3.7), so a lost worker is a lost owner too. Its weights lose
nothing, since after each step every worker holds all of them. Its SGD momentum is rebuilt by the survivor the
members go on from, from its weights at the start of the last two steps (``momentum_rebuilt``; equal up to float32
rounding, no traffic during training), or is zero (``momentum_reset``) where that survivor does not know the step
before; another optimizer's state (Adam's moments and step count) starts again from zero. Every other owner hands
its shard's whole optimizer state on.

The survivors agree on the membership as an elastic all-reduce run does
(:class:`~scaletrain.parallel.strategies.elastic.StoreMembership`). A worker sees a loss when a send or a reply
fails (``died``), when a thread serving the lost peer fails while its own server's update waits, or, on rank 0
waiting for every gradient of its shard, when a heartbeat stood still (``stopped answering``). Every model then
goes back to the weights the step began from, since one owner may have applied that step and another not, and
the survivors do it again from those weights and momentum (each owner keeps the momentum from before its last
update: :meth:`ShardServer.state_at`), unless one of them had completed it (then all take its weights).

Then each survivor rebuilds (:meth:`ElasticShardExchange.resize`): the owners still members broadcast their
shard's momentum at the agreed step, pairs are made anew among the members (rank 0 stays 0), ownership is planned
again over them, and each worker's new server starts from the agreed step. A worker admitted at a step boundary
takes the weights and position from rank 0 and joins the same rebuild; every member learns that a worker waits
from the first owner's reply to that step's gradient.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scaletrain.parallel.failures import connection_closed
from scaletrain.parallel.sharding import assign_greedy
from scaletrain.parallel.strategies.elastic import StoreMembership, store_membership
from scaletrain.parallel.strategies.elastic_waits import ABANDONED, WATCH_SECONDS, HeardOfLoss
from scaletrain.parallel.strategies.ps.exchange import PSExchange
from scaletrain.parallel.strategies.ps.options import ps_options
from scaletrain.parallel.strategies.ps.protocol import REQUEST, pair_groups
from scaletrain.parallel.strategies.ps.protocol import PeerLost as ServerPeerLost
from scaletrain.parallel.strategies.ps.records import ServerStats
from scaletrain.parallel.strategies.ps.server import ShardServer
from scaletrain.parallel.strategies.ps.shards import Shards, tensor_bytes
from scaletrain.tensors.codec import wire_codec
from scaletrain.tensors.flat import views_of
from scaletrain.tensors.optimizers import state_layout
from scaletrain.train.exchange import ExchangeTimes, PeerLost
from scaletrain.train.membership import take_live_state
from scaletrain.train.state import Regrouped

__all__ = ["ElasticShardExchange", "elastic_sharded"]

#: The first owner: the first tensor goes to the first worker (assign_greedy's ties), rank 0 in every generation.
FIRST_OWNER = 0
#: Where the first owner says a worker waits to join, in a reply's header (``joining``: ps.protocol).
JOINING_FIELD = 6


class ElasticShardExchange(PSExchange):
    """A sharded worker's exchange that turns a lost peer into :class:`PeerLost` (the loop regroups) and rebuilds
    the shards over the members after each change. ``before``: for a worker that joined, the members before it
    was admitted (whose shards' momentum it takes)."""

    def __init__(
        self,
        *,
        shards: Shards,
        membership: StoreMembership,
        before: list[int] | None = None,
        learning_rate: Callable[[int], float] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(rank=shards.rank, plan=shards.plan, groups=shards.peers, serve=shards.serve, **options)
        self.shards, self.membership = shards, membership
        self._members = list(before if before is not None else membership.members)  # whom this exchange's ranks index
        self._joined = before is not None
        self._learning_rate = learning_rate  # the servers' rate at each update (of the step it is numbered by)
        self._began: dict[int, torch.Tensor] = {}  # each owner's weights as the step began
        self._previous: dict[int, torch.Tensor] = {}  # and as the step before began (when _previous_known)
        self._previous_known = self._stepped = False
        self._retired: ShardServer | None = None  # this worker's server before the change being rebuilt
        self._talking_to: int | None = None  # the owner this worker sends to or waits for
        self._model: nn.Module | None = None
        self._optimizer: torch.optim.Optimizer | None = None

    def start(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self._model, self._optimizer = model, optimizer
        if self._joined:  # admitted: the members rebuild their shards with this worker now
            self._joined = False
            self._rebuild()
        else:
            super().start(model, optimizer)
            self._keep_began()

    def step(self, model: nn.Module, optimizer: torch.optim.Optimizer, clip_norm: float | None) -> ExchangeTimes:
        server = self.local_server
        if self.rank == FIRST_OWNER and server is not None:
            server.announce = int(self.membership.join_requested())
        if self._stepped:  # the weights at the start of this step and the one before
            self._previous, self._began = self._began, self._previous
            self._previous_known = True
        self._stepped, self._talking_to = False, None
        for owner, weights in self._weights.items():
            self._began[owner].copy_(weights)
        try:
            times = super().step(model, optimizer, clip_norm)
        except (RuntimeError, TimeoutError, HeardOfLoss, ServerPeerLost) as error:
            print(f"a peer was lost during the step: {type(error).__name__}: {str(error).splitlines()[0]}", flush=True)
            self._say_closed(error, server)
            self._close()
            for owner, weights in self._weights.items():  # the model goes back to the weights the step began from
                weights.copy_(self._began[owner])
            raise PeerLost(_why(error)) from error
        self._stepped = True
        if self.rank == FIRST_OWNER:
            due = server is not None and bool(server.announced)
        else:
            due = bool(self._headers[FIRST_OWNER][JOINING_FIELD])
        self.membership.join_due = due
        if due:
            self._close()  # the step is done everywhere; the members rebuild after admitting the worker
        return times

    def _say_closed(self, error: BaseException, server: ShardServer | None) -> None:
        """Tell the membership whose connection this worker saw close (the decision need not wait for their
        heartbeat's silence): the owner it was sending to or waiting for, the peers its own server's threads lost."""
        ranks = set(server.closed_peers) if server is not None else set()
        gloo = isinstance(error, RuntimeError) and not isinstance(error, HeardOfLoss)  # not a survivor's word
        if gloo and connection_closed(error) and self._talking_to is not None:
            ranks.add(self._talking_to)
        self.membership.closed = sorted(self._members[rank] for rank in ranks)

    def resize(self, workers: int) -> None:
        """The members changed (a loss or an admission): rebuild the shards over them."""
        self._rebuild()

    # -- waits that give up when a peer was lost ------------------------------------------------------------
    def _send(self, header: torch.Tensor, body: torch.Tensor, owner: int) -> None:
        self._talking_to = owner
        group = self.groups[owner]
        for work in (
            dist.isend(header, dst=owner, group=group, tag=REQUEST),
            dist.isend(body, dst=owner, group=group, tag=REQUEST),
        ):
            self._wait(work)

    def _receive_reply(self, owner: int, header: dist.Work, body: dist.Work) -> float:
        self._talking_to = owner
        return super()._receive_reply(owner, header, body)

    def _wait_reply(self, header: dist.Work) -> None:
        self._wait(header)

    def _wait(self, work: dist.Work) -> None:
        """Wait for ``work`` (a send or receive on a pair), and give up when a survivor says a peer was lost (rank 0
        also reads the heartbeats) or after ``--timeout``. A gloo send or receive says it is done only to a wait,
        and a wait that runs out fails it: so a thread waits, and this one asks the store meanwhile."""
        finished, failure = threading.Event(), []

        def wait() -> None:
            try:
                work.wait()
            except Exception as error:  # a group left behind after a loss: its wait fails, nobody asks
                failure.append(error)
            finally:
                finished.set()

        threading.Thread(target=wait, name="pair-wait", daemon=True).start()
        deadline = time.monotonic() + self.membership.timeout
        while not finished.wait(WATCH_SECONDS):
            if self.membership.peer_lost():
                raise HeardOfLoss("another survivor saw a peer lost during this step")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no answer within --timeout {self.membership.timeout:g} s")
        if failure:
            raise failure[0]

    # -- after a change ---------------------------------------------------------------------------------
    def _close(self) -> None:
        """Retire this worker's server (once per change: a rebuild tried again keeps the first)."""
        if self._retired is None and self.local_server is not None:
            self._retired = self.local_server
            self._retired.close()

    def _keep_began(self) -> None:
        self._began = {owner: weights.clone() for owner, weights in self._weights.items()}
        self._previous = {owner: weights.clone() for owner, weights in self._weights.items()}
        self._previous_known = self._stepped = False  # the step before this one's start is not known here

    def _rebuild(self) -> None:
        """Momentum from the owners still members, new pairs and ownership over the members, new servers from the
        agreed step, every owner's first reply. A peer lost meanwhile raises :class:`PeerLost` (no step in flight):
        the members agree again, and this exchange still knows the owners before the change."""
        members, step = self.membership.members, self.membership.record["step"]  # the step the members go on from
        index = members.index(self.membership.rank)
        try:
            reset = self._share_momentum(members, index, step)
            pairs = [(a, b) for a in range(len(members)) for b in range(a + 1, len(members))]
            groups = pair_groups(len(members), pairs, timeout=self.membership.timeout)
        except RuntimeError as error:
            raise PeerLost(_why(error), in_flight=False) from error
        ABANDONED.extend(self.groups.values())  # a server thread may still wait in one (see elastic.ABANDONED)
        peers = {b if a == index else a: group for (a, b), group in groups.items() if index in (a, b)}
        old = self.local_server
        stats = old.stats if old is not None else ServerStats()
        shards = self.shards
        shards.rank, shards.peers, shards.workers, shards.version = index, peers, list(range(len(members))), step
        shards.agreement = self.membership.agreement()
        shards.stats = ServerStats(updates=stats.updates, skipped=stats.skipped)  # the old pairs' peers are gone
        self.rank, self.groups = index, peers
        self.codec.reset()  # residuals and factors were the old owners'
        try:
            super().start(self._model, self._optimizer)
        except RuntimeError as error:
            raise PeerLost(_why(error), in_flight=False) from error
        self.versions = {owner: step for owner in self.owners}
        self._members = list(members)
        if self.membership.record is not None and reset:  # the change's record: how each lost shard's state went on
            self.membership.record |= reset
        self._retired = None
        self._keep_began()

    def _share_momentum(self, members: list[int], index: int, step: int) -> dict[str, list[int]]:
        """Every shard's optimizer state at ``step`` into this worker's optimizer (the new servers start from it), in
        the old owners' order: an owner still a member broadcasts its own (every key: SGD's momentum, Adam's
        moments and step count); a lost owner's SGD momentum is rebuilt by the survivor the members go on from,
        out of its weights at the start of this step and the step before: SGD moved them by the rate times the
        momentum (``momentum_rebuilt``); where it does not know the step before (the first step after a start or
        a change), and for every other optimizer's state, it starts again from zero (``momentum_reset``: Adam's
        moments and step count 0, whose bias correction then treats the shard as fresh). Both name the owners'
        launch ranks."""
        whole, scalars = state_layout(self._optimizer)
        if not whole and not scalars:
            return {}
        parameters = list(self._model.parameters())
        before = self._members
        owner_of = assign_greedy(tensor_bytes(parameters), list(range(len(before))))  # the plan before the change
        source = members.index(self.membership.source)
        lost = step > 0 and any(member not in members for member in before)  # at step 0 zero is exact
        known = torch.tensor([int(self._previous_known)])
        if lost:  # whether the survivor the members go on from knows the step before
            dist.broadcast(known, src=source)
        rebuilt = bool(known.item()) and whole == ["momentum_buffer"] and not scalars
        record: dict[str, list[int]] = {"momentum_rebuilt": [], "momentum_reset": []}
        for old in sorted(set(owner_of)):
            shard = [p for p, owner in zip(parameters, owner_of, strict=True) if owner == old]
            size = sum(p.numel() for p in shard)
            state = {key: torch.zeros(size) for key in whole} | {
                key: torch.zeros(len(shard), dtype=torch.float64) for key in scalars
            }
            if before[old] in members:  # its owner hands it on
                if members.index(before[old]) == index:
                    state = self._own_state(step, state)
                for key in state:
                    dist.broadcast(state[key], src=members.index(before[old]))
            elif step > 0:
                record["momentum_rebuilt" if rebuilt else "momentum_reset"].append(before[old])
                if index == source and rebuilt:
                    buffer = state["momentum_buffer"]
                    torch.sub(self._previous[old], self._began[old], out=buffer)
                    buffer /= self._learning_rate(step - 1)
                for key in state:
                    dist.broadcast(state[key], src=source)
            for key in whole:
                for parameter, view in zip(shard, views_of(state[key], shard), strict=True):
                    self._optimizer.state[parameter][key] = view.to(parameter.device, copy=True)
            for key, kind in scalars.items():
                for parameter, value in zip(shard, state[key].tolist(), strict=True):
                    self._optimizer.state[parameter][key] = torch.tensor(value, dtype=kind)
        return record

    def _own_state(self, step: int, zeros: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        server = self._retired
        state = server.state_at(step) if server is not None else None
        if state is None:  # cannot happen by the rule in the module's text; said in the log if it does
            print(f"worker rank {self.membership.rank}: no state of its shard at step {step}: zero", flush=True)
            return zeros
        return state


def _why(error: BaseException) -> str | None:
    """What a worker saw (:class:`PeerLost`'s ``why``): ``None`` when it only heard of the loss."""
    text = str(error).lower()
    if isinstance(error, HeardOfLoss) or "another worker saw" in text:
        return None
    if (
        isinstance(error, TimeoutError)
        or "timed out" in text
        or "stopped answering" in text
        or "no synchronous" in text
    ):
        return "stopped answering"
    return "died"


def elastic_sharded(setup: Any, rank: int) -> tuple[ElasticShardExchange, StoreMembership, Regrouped | None]:
    """A sharded worker's exchange and membership in an elastic run; a worker started with ``--join`` is admitted
    first (its weights and position from rank 0; the change's :class:`Regrouped` is returned, else None)."""
    prepared, layout, config = setup.prepared, setup.layout, setup.prepared.config
    membership = store_membership(setup.store, rank, layout, config, prepared.batch_size)
    before, regrouped = None, None
    if config.join:
        regrouped, state = membership.join()
        take_live_state(prepared.model, prepared.optimizer, prepared.position, state)
        joined = {who["rank"] for who in regrouped.record["joined"]}
        before = [member for member in membership.members if member not in joined]
    shards = Shards(setup, rank)
    shards.lost = membership.peer_lost  # the owner's own worker gives up its wait for an update on a loss
    exchange = ElasticShardExchange(
        shards=shards,
        membership=membership,
        before=before,
        learning_rate=setup.options["learning_rate"],
        exclusive=ps_options(config)["admission"] == "exclusive",
        codec=wire_codec(config),
    )
    return exchange, membership, regrouped
