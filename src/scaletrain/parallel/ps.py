"""Parameter servers on c10d point-to-point: central (one server process) or sharded (every worker
owns a share of the tensors), synchronous or asynchronous (Downpour SGD, Dean et al. 2012).

Every worker–owner pair talks over its own two-process group, so a worker that dies breaks only
its own links: an asynchronous central server carries on with the others. An owner serves each
peer from its own thread; the threads meet in :class:`ShardServer`, which applies updates under a
lock. Messages (tags keep the two directions of a pair apart):

- worker → owner, ``REQUEST``: header ``[kind, version, batches_done]`` then, for a gradient, the
  flat gradient of the owner's tensors;
- owner → worker, ``REPLY``: header ``[version]`` then the owner's flat weights;
- owner → worker, ``GRANT``: with ``--ps-admission exclusive``, permission to send (Šlampa 2017
  §7.2: one transfer at a time into the server, one out).
"""

from __future__ import annotations

import datetime
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from scaletrain.errors import ScaletrainError
from scaletrain.parallel.failures import describe
from scaletrain.parallel.sharding import flatten
from scaletrain.parallel.staleness import Compensation
from scaletrain.train.exchange import ExchangeTimes, GradientExchange
from scaletrain.train.meter import now

__all__ = ["PSExchange", "PeerLost", "ShardServer", "pair_groups"]

REQUEST, REPLY, GRANT = 1, 2, 3
GRADIENT, DONE = 0, 1


class PeerLost(ScaletrainError):
    """A process this one exchanges weights with failed or vanished."""


def pair_groups(
    world_size: int, pairs: list[tuple[int, int]], timeout: float | None = None
) -> dict[tuple[int, int], dist.ProcessGroup]:
    """One two-process group per pair; every rank must call this with the same ``pairs``.

    ``timeout`` (seconds) bounds every send and receive on the pairs. Give it: without it c10d
    uses its default of 30 minutes, so a peer that stops answering without closing its
    connection (a frozen process) would hold its partner that long.
    """
    limit = None if timeout is None else datetime.timedelta(seconds=timeout)
    groups = {}
    for first, second in pairs:
        groups[(first, second)] = dist.new_group([first, second], timeout=limit)
    return groups


@dataclass
class ServerStats:
    """What an owner observed: updates, staleness of applied gradients, lost peers."""

    updates: int = 0
    staleness: Counter = field(default_factory=Counter)
    lost: dict[int, str] = field(default_factory=dict)
    batches_done: dict[int, int] = field(default_factory=dict)

    def staleness_summary(self) -> dict[str, object]:
        count = sum(self.staleness.values())
        if not count:
            return {"mean": None, "max": None, "histogram": {}}
        mean = sum(value * times for value, times in self.staleness.items()) / count
        return {
            "mean": mean,
            "max": max(self.staleness),
            "histogram": {str(value): self.staleness[value] for value in sorted(self.staleness)},
        }


class ShardServer:
    """Holds the master copy of some tensors and their optimizer; serves peers from threads.

    ``master`` must not be trained on by anyone else: a sharded worker passes clones of its
    tensors, the central server its own model's parameters.

    ``contributors`` gradients make one synchronous update (peers plus, for a sharded server, the
    owner's own worker through :meth:`contribute`). Asynchronous: every gradient is applied on
    arrival, and its staleness (updates applied since the sender's weights were current) recorded;
    ``compensation`` then sets each update's rate factor and momentum (:mod:`scaletrain.parallel.staleness`).
    """

    def __init__(
        self,
        *,
        master: list[nn.Parameter],
        optimizer: torch.optim.Optimizer,
        version: int = 0,
        peers: dict[int, dist.ProcessGroup],
        contributors: int,
        synchronous: bool,
        exclusive: bool = False,
        clip_norm: float | None = None,
        learning_rate: Callable[[int], float] | None = None,
        compensation: Compensation | None = None,
        on_update: Callable[[int], None] | None = None,
        timeout: float = 60.0,
    ) -> None:
        self.master, self.optimizer = master, optimizer
        self.peers, self.contributors, self.synchronous = peers, contributors, synchronous
        self.clip_norm, self.learning_rate, self.compensation = clip_norm, learning_rate, compensation
        self.on_update, self.timeout = on_update, timeout
        self.version = version
        self.stats = ServerStats()
        self._condition = threading.Condition()
        # The master tensors become views of one flat buffer, so a reply sends it as it is; gradients
        # arrive in flat buffers whose views are handed to the optimizer as .grad. Nothing is packed
        # or unpacked per update (the one copy left: an async reply's snapshot).
        self._flat = flatten([p.detach() for p in self.master])
        with torch.no_grad():
            for parameter, view in zip(self.master, views_of(self._flat, self.master), strict=True):
                parameter.data = view
        self._sum = torch.zeros_like(self._flat)
        self._sum_views = views_of(self._sum, self.master)
        self._arrived = 0
        self._round = 0
        self._snapshot = self._flat if synchronous else self._flat.clone()
        self._failure: tuple[int, str] | None = None
        self._receiving = threading.Semaphore(1) if exclusive else None
        self._sending = threading.Semaphore(1) if exclusive else None
        self._threads = [
            threading.Thread(target=self._serve, args=(peer,), name=f"serve-{peer}", daemon=True) for peer in peers
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def weights(self) -> torch.Tensor:
        with self._condition:
            return self._snapshot.clone()

    def contribute(self, gradient: torch.Tensor, version: int) -> tuple[int, torch.Tensor]:
        """The owner's own worker adds its gradient; returns the new version and weights."""
        return self._apply(gradient, views_of(gradient, self.master), version)

    def join(self, deadline_seconds: float | None = None) -> ServerStats:
        """Wait for every peer to finish; in synchronous mode a lost peer is an error."""
        for thread in self._threads:
            thread.join(deadline_seconds)
        if self.synchronous and self._failure is not None:
            peer, reason = self._failure
            raise PeerLost(f"worker rank {peer} failed during synchronous training: {reason}")
        return self.stats

    # -- one thread per peer ------------------------------------------------------------------
    def _serve(self, peer: int) -> None:
        group = self.peers[peer]
        header = torch.zeros(3, dtype=torch.int64)
        gradient = torch.zeros_like(self._sum)
        gradient_views = views_of(gradient, self.master)
        try:
            self._reply(peer, group, self.version, self.weights())
            while True:
                with _held(self._receiving):
                    if self._receiving is not None:
                        dist.send(torch.zeros(1, dtype=torch.int64), dst=peer, group=group, tag=GRANT)
                    dist.recv(header, src=peer, group=group, tag=REQUEST)
                    kind, version, batches_done = (int(v) for v in header)
                    if kind == GRADIENT:
                        dist.recv(gradient, src=peer, group=group, tag=REQUEST)
                with self._condition:
                    self.stats.batches_done[peer] = batches_done
                if kind == DONE:
                    return
                new_version, weights = self._apply(gradient, gradient_views, version)
                self._reply(peer, group, new_version, weights)
        except Exception as exc:  # the peer died or timed out: gloo raises RuntimeError
            reason = describe(exc, self.timeout, peer=f"worker rank {peer}")
            with self._condition:
                self.stats.lost[peer] = reason
                if self.synchronous and self._failure is None:
                    self._failure = (peer, reason)
                self._condition.notify_all()

    def _reply(self, peer: int, group: dist.ProcessGroup, version: int, weights: torch.Tensor) -> None:
        with _held(self._sending):
            dist.send(torch.tensor([version], dtype=torch.int64), dst=peer, group=group, tag=REPLY)
            dist.send(weights, dst=peer, group=group, tag=REPLY)

    # -- updates --------------------------------------------------------------------------------
    def _apply(self, gradient: torch.Tensor, views: list[torch.Tensor], version: int) -> tuple[int, torch.Tensor]:
        with self._condition:
            if not self.synchronous:
                staleness = self.version - version
                self.stats.staleness[staleness] += 1
                scale, momentum = self.compensation.step(staleness) if self.compensation else (1.0, None)
                self._update(views, scale, momentum)
                return self.version, self._snapshot
            self._sum += gradient
            self._arrived += 1
            my_round = self._round
            if self._arrived == self.contributors:
                self._sum /= self.contributors
                self._update(self._sum_views, 1.0)
                self._sum.zero_()
                self._arrived = 0
                self._round += 1
                self._condition.notify_all()
            elif not self._condition.wait_for(
                lambda: self._round != my_round or self._failure is not None, timeout=self.timeout
            ):
                raise PeerLost(f"no synchronous update within {self.timeout:.0f} s: a worker is stuck or gone")
            if self._failure is not None and self._round == my_round:
                peer, reason = self._failure
                raise PeerLost(f"worker rank {peer} failed during synchronous training: {reason}")
            return self.version, self._snapshot

    def _update(self, gradients: list[torch.Tensor], scale: float, momentum: float | None = None) -> None:
        """One optimizer step on the master tensors with these gradients (caller holds the lock); the rate
        times ``scale``, and ``momentum`` instead of the optimizer's when given."""
        for parameter, gradient in zip(self.master, gradients, strict=True):
            parameter.grad = gradient
        if self.clip_norm:
            nn.utils.clip_grad_norm_(self.master, self.clip_norm)
        rate = self.learning_rate(self.version) if self.learning_rate else self.optimizer.param_groups[0]["lr"]
        for group in self.optimizer.param_groups:
            group["lr"] = rate * scale
            if momentum is not None:
                group["momentum"] = momentum
        self.optimizer.step()
        self.version += 1
        self.stats.updates += 1
        # Synchronous replies go out before the next update can start (it needs every worker's next
        # gradient), so they may send the live buffer; asynchronous ones need a copy of this version.
        self._snapshot = self._flat if self.synchronous else self._flat.clone()
        if self.on_update is not None:
            self.on_update(self.version)


class _held:
    """``with _held(semaphore)`` — a no-op when admission control is off."""

    def __init__(self, semaphore: threading.Semaphore | None) -> None:
        self.semaphore = semaphore

    def __enter__(self) -> None:
        if self.semaphore is not None:
            self.semaphore.acquire()

    def __exit__(self, *exc: object) -> None:
        if self.semaphore is not None:
            self.semaphore.release()


class PSExchange(GradientExchange):
    """A worker's side: push each owner its share of the gradient, pull that owner's new weights.

    The model's tensors become views of one flat weight buffer per owner, so weights are received
    straight into the model; gradients are packed into a reused flat buffer per owner.
    """

    def __init__(
        self,
        *,
        rank: int,
        owner_of: list[int],
        groups: dict[int, dist.ProcessGroup],
        local_server: ShardServer | None = None,
        exclusive: bool = False,
    ) -> None:
        self.rank, self.owner_of, self.groups = rank, owner_of, groups
        self.local_server, self.exclusive = local_server, exclusive
        self.owners = sorted(set(owner_of))
        self.versions = dict.fromkeys(self.owners, 0)
        self.batches_done = 0
        self._owned: dict[int, list[nn.Parameter]] = {}
        self._weights: dict[int, torch.Tensor] = {}
        self._gradients: dict[int, torch.Tensor] = {}
        self._header = torch.zeros(1, dtype=torch.int64)

    def start(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        parameters = list(model.parameters())
        for owner in self.owners:
            owned = [p for p, o in zip(parameters, self.owner_of, strict=True) if o == owner]
            self._owned[owner] = owned
            self._weights[owner] = flatten([p.detach() for p in owned])
            self._gradients[owner] = torch.zeros_like(self._weights[owner])
            with torch.no_grad():
                for parameter, view in zip(owned, views_of(self._weights[owner], owned), strict=True):
                    parameter.data = view
            if owner == self.rank:
                self._weights[owner].copy_(self.local_server.weights())
            else:
                self._receive_reply(owner)

    def _receive_reply(self, owner: int) -> float:
        """Receive ``[version]`` + weights from ``owner`` into the model; returns the wait for the header."""
        begin = now()
        dist.recv(self._header, src=owner, group=self.groups[owner], tag=REPLY)
        waited = now() - begin
        dist.recv(self._weights[owner], src=owner, group=self.groups[owner], tag=REPLY)
        self.versions[owner] = int(self._header[0])
        return waited

    def step(self, model: nn.Module, optimizer: torch.optim.Optimizer, clip_norm: float | None) -> ExchangeTimes:
        begin = now()
        waited = 0.0
        self.batches_done += 1
        for owner in self.owners:
            gradients = [_gradient(p) for p in self._owned[owner]]
            torch.cat([g.reshape(-1) for g in gradients], out=self._gradients[owner])
        for owner in self.owners:
            if owner == self.rank:
                continue
            waited += self._await_grant(owner)
            header = torch.tensor([GRADIENT, self.versions[owner], self.batches_done], dtype=torch.int64)
            dist.send(header, dst=owner, group=self.groups[owner], tag=REQUEST)
            dist.send(self._gradients[owner], dst=owner, group=self.groups[owner], tag=REQUEST)
        if self.rank in self._owned:
            arrive = now()
            version, weights = self.local_server.contribute(self._gradients[self.rank], self.versions[self.rank])
            self._weights[self.rank].copy_(weights)
            self.versions[self.rank] = version
            waited += now() - arrive
        for owner in self.owners:
            if owner != self.rank:
                waited += self._receive_reply(owner)
        return ExchangeTimes(communication=now() - begin - waited, wait=waited)

    def _await_grant(self, owner: int) -> float:
        if not self.exclusive:
            return 0.0
        begin = now()
        dist.recv(torch.zeros(1, dtype=torch.int64), src=owner, group=self.groups[owner], tag=GRANT)
        return now() - begin

    def finish(self, model: nn.Module) -> None:
        """Tell every remote owner this worker is done."""
        for owner in self.owners:
            if owner == self.rank:
                continue
            self._await_grant(owner)
            header = torch.tensor([DONE, self.versions[owner], self.batches_done], dtype=torch.int64)
            dist.send(header, dst=owner, group=self.groups[owner], tag=REQUEST)


def views_of(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    """Views of ``flat`` shaped like ``like``, back to back (the layout of :func:`flatten`)."""
    views, offset = [], 0
    for tensor in like:
        views.append(flat[offset : offset + tensor.numel()].view_as(tensor))
        offset += tensor.numel()
    return views


def _gradient(parameter: torch.Tensor) -> torch.Tensor:
    return parameter.grad if parameter.grad is not None else torch.zeros_like(parameter)
