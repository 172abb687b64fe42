"""Parameter servers on c10d point-to-point: central (one server process) or sharded (every worker
owns a share of the tensors), synchronous or asynchronous (Downpour SGD, Dean et al. 2012).

Every worker–owner pair talks over its own two-process group, so a worker that dies breaks only
its own links: an asynchronous central server carries on with the others. An owner serves each
peer from its own thread; the threads meet in :class:`ShardServer`, which applies updates under a
lock. Messages (tags keep the two directions of a pair apart):

- worker → owner, ``REQUEST``: header ``[kind, version, batches_done, layout_id, numel]`` then, for
  a gradient, the flat gradient of the owner's tensors (kinds: gradient, done, reconfigure — the
  worker is at a step boundary where the network changes; ``version`` then holds the epoch);
- owner → worker, ``REPLY``: header ``[version, layout_id, numel, skipped]`` then the owner's flat
  weights (no weights when the layouts differ: both sides then stop with both layouts named);
  ``skipped`` is 1 when the update this reply answers was not made because the gradient overflowed
  (with ``skip_nonfinite``, under dynamic loss scaling);
- owner → worker, ``GRANT``: with ``--ps-admission exclusive``, permission to send (Šlampa 2017
  §7.2: one transfer at a time into the server, one out).
- owner → rank 0, ``FINAL_SHARD``: once training has ended, a sharded owner's final master tensors
  (for rank 0's evaluation and ``model.pt``).

Every request is a header and a body (a one-value stand-in for done and reconfigure), and each side
posts the receives of both before it waits for either: gloo holds back a message's bytes until its
receive is posted, so a body whose receive is posted only after its header arrives costs one more
trip over the link (measured with LeNet's 1.7 MB at 1 thread: 1.27 ms against 0.95 ms per round trip).
A worker's first reply from an owner (and the first after a reconfiguration) is received header
first, since only that header tells how many weights follow when the two networks differ.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from scaletrain.errors import ScaletrainError
from scaletrain.parallel.codec import LayoutMismatch, TensorLayout, WireCodec
from scaletrain.parallel.failures import describe
from scaletrain.parallel.sharding import flatten, unflatten_into
from scaletrain.parallel.staleness import Compensation
from scaletrain.train.device import synchronize
from scaletrain.train.exchange import ExchangeTimes, GradientExchange, finite
from scaletrain.train.meter import now

__all__ = ["FINAL_SHARD", "PSExchange", "PeerLost", "ShardServer", "pair_groups", "post_message", "send_message"]

REQUEST, REPLY, GRANT = 1, 2, 3
#: owner → rank 0 once training has ended (sharded server): the owner's final master tensors.
FINAL_SHARD = 4
HOST_STAGING = "SCALETRAIN_HOST_STAGING"
GRADIENT, DONE, RECONFIGURE = 0, 1, 2
REQUEST_FIELDS, REPLY_FIELDS = 5, 4


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
    skipped: int = 0  # overflowed gradients not applied (dynamic loss scaling)
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
    ``skip_nonfinite``: an update whose gradient holds inf or nan is not made (the version still
    advances, as the workers' step count does) and the reply says so.
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
        after_step: Callable[[list[nn.Parameter], float], None] | None = None,
        timeout: float = 60.0,
        stats: ServerStats | None = None,
        codec: WireCodec | None = None,
        skip_nonfinite: bool = False,
    ) -> None:
        self.master, self.optimizer = master, optimizer
        self.peers, self.contributors, self.synchronous = peers, contributors, synchronous
        self.clip_norm, self.learning_rate, self.compensation = clip_norm, learning_rate, compensation
        self.on_update, self.after_step, self.timeout = on_update, after_step, timeout
        self.version = version
        self.stats = stats or ServerStats()  # a server rebuilt after a reconfiguration goes on counting
        self.layout = TensorLayout.of(master)
        self.codec = codec or WireCodec()
        self.skip_nonfinite = skip_nonfinite
        self._skipped = False  # whether the last update was skipped
        #: Peers that reached a reconfiguration (their thread ended); the epoch each named.
        self.reconfiguring: dict[int, int] = {}
        self._condition = threading.Condition()
        # The master tensors become views of one flat buffer, so a reply sends it as it is; gradients
        # arrive in flat buffers whose views are handed to the optimizer as .grad. Nothing is packed
        # or unpacked per update (the one copy left: an async reply's snapshot).
        self._flat = flatten([p.detach() for p in self.master])
        with torch.no_grad():
            for parameter, view in zip(self.master, views_of(self._flat, self.master), strict=True):
                parameter.data = view
        # Only a synchronous update of several gradients adds them up; otherwise no sum buffer is kept.
        summing = synchronous and contributors > 1
        self._sum = torch.zeros_like(self._flat) if summing else self._flat.new_empty(0)
        self._sum_views = views_of(self._sum, self.master) if summing else []
        self._arrived = 0
        self._round = 0
        self._snapshot = self._flat if synchronous else self._flat.clone()
        self._failure: tuple[int, str] | None = None
        self._mismatch: str | None = None
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

    def contribute(self, gradient: torch.Tensor, version: int) -> tuple[int, torch.Tensor, bool]:
        """The owner's own worker adds its gradient; returns the new version, the weights and whether
        the update was skipped."""
        return self._apply(gradient, views_of(gradient, self.master), version)

    def join(self, deadline_seconds: float | None = None) -> ServerStats:
        """Wait for every peer to finish or to reach a reconfiguration; in synchronous mode a lost peer
        is an error, and in every mode a peer whose network differs from this server's."""
        deadline = None if deadline_seconds is None else now() + deadline_seconds
        with self._condition:  # woken by every thread's end or failure; a mismatch stops the run at once
            while self._mismatch is None and any(thread.is_alive() for thread in self._threads):
                if deadline is not None and now() > deadline:
                    break
                self._condition.wait(0.2)
        if self._mismatch is not None:
            raise LayoutMismatch(self._mismatch)
        if self.synchronous and self._failure is not None:
            peer, reason = self._failure
            raise PeerLost(f"worker rank {peer} failed during synchronous training: {reason}")
        return self.stats

    # -- one thread per peer ------------------------------------------------------------------
    def _serve(self, peer: int) -> None:
        group = self.peers[peer]
        header = torch.zeros(REQUEST_FIELDS, dtype=torch.int64)
        gradient = torch.zeros_like(self._flat)
        wire = self.codec.receive_buffer(gradient)
        gradient_views = views_of(gradient, self.master)
        try:
            self._reply(peer, group, self.version, self.weights())
            while True:
                with _held(self._receiving):
                    if self._receiving is not None:
                        dist.send(torch.zeros(1, dtype=torch.int64), dst=peer, group=group, tag=GRANT)
                    body = receive_header(header, wire, peer, group, REQUEST)
                    kind, version, batches_done, layout_id, numel = (int(v) for v in header)
                    theirs = TensorLayout(layout_id, numel)
                    if theirs != self.layout:  # only a network that differed at the first reply: a stand-in body
                        self._refuse(peer, group, theirs)
                        return
                    body.wait()
                    if kind == GRADIENT:
                        self.codec.unpack(wire, gradient)
                with self._condition:
                    self.stats.batches_done[peer] = batches_done
                if kind == DONE:
                    return
                if kind == RECONFIGURE:
                    with self._condition:
                        self.reconfiguring[peer] = version
                    return
                new_version, weights, skipped = self._apply(gradient, gradient_views, version)
                self._reply(peer, group, new_version, weights, skipped)
        except Exception as exc:  # the peer died or timed out: gloo raises RuntimeError
            reason = describe(exc, self.timeout, peer=f"worker rank {peer}")
            with self._condition:
                self.stats.lost[peer] = reason
                if self.synchronous and self._failure is None:
                    self._failure = (peer, reason)
                self._condition.notify_all()

    def _refuse(self, peer: int, group: dist.ProcessGroup, theirs: TensorLayout) -> None:
        """A worker whose network differs: tell it this server's layout (it stops with both named), and stop."""
        message = (
            f"worker rank {peer} sent tensors of layout {theirs} but its server holds layout {self.layout}; "
            "every process must build the same network (same workload, options and reconfigurations)"
        )
        with self._condition:
            self._mismatch = self._mismatch or message
            self._failure = self._failure or (peer, message)
            self._condition.notify_all()
        with _held(self._sending):
            dist.send(self._reply_header(-1), dst=peer, group=group, tag=REPLY)

    def _reply_header(self, version: int, skipped: bool = False) -> torch.Tensor:
        return torch.tensor([version, self.layout.layout_id, self.layout.numel, int(skipped)], dtype=torch.int64)

    def _reply(
        self, peer: int, group: dist.ProcessGroup, version: int, weights: torch.Tensor, skipped: bool = False
    ) -> None:
        with _held(self._sending):
            send_message(self._reply_header(version, skipped), self.codec.encode(weights), peer, group, REPLY)

    # -- updates --------------------------------------------------------------------------------
    def _apply(self, gradient: torch.Tensor, views: list[torch.Tensor], version: int) -> tuple[int, torch.Tensor, bool]:
        with self._condition:
            if not self.synchronous:
                staleness = self.version - version
                self.stats.staleness[staleness] += 1
                scale, momentum = self.compensation.step(staleness) if self.compensation else (1.0, None)
                self._update(views, scale, momentum)
                return self.version, self._snapshot, self._skipped
            my_round = self._round
            if self.contributors == 1:  # nothing to add up: the optimizer reads the received buffer
                self._update(views, 1.0)
                self._round += 1
                return self.version, self._snapshot, self._skipped
            if self._arrived == 0:
                self._sum.copy_(gradient)
            else:
                self._sum += gradient
            self._arrived += 1
            if self._arrived == self.contributors:
                self._sum /= self.contributors
                self._update(self._sum_views, 1.0)
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
            return self.version, self._snapshot, self._skipped

    def _update(self, gradients: list[torch.Tensor], scale: float, momentum: float | None = None) -> None:
        """One optimizer step on the master tensors with these gradients (caller holds the lock); the rate
        times ``scale``, and ``momentum`` instead of the optimizer's when given; skipped when the
        gradient overflowed and ``skip_nonfinite`` is on."""
        self._skipped = self.skip_nonfinite and not finite(gradients)
        if self._skipped:
            self.version += 1
            self.stats.skipped += 1
            if self.on_update is not None:
                self.on_update(self.version)
            return
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
        if self.after_step is not None:  # a technique's change of the new weights (PruneTrain's shrinking)
            self.after_step(self.master, rate * scale)
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
    straight into the model; gradients are packed into a reused flat buffer per owner. A model on a
    GPU stays there: the flat buffers are in host memory (gloo sends from there), and each step
    copies the gradients down and the weights up once per owner, timed apart (``host_copy``).

    ``plan(parameters)`` gives each tensor's owner (recomputed after a reconfiguration);
    ``serve(owned, optimizer)``, for a worker that owns tensors (sharded server), builds and starts
    its :class:`ShardServer` over clones of them with their optimizer state; ``gather(model,
    optimizer)``, before a reconfiguration, brings every owner's master weights and optimizer state
    into ``model`` and ``optimizer`` (sharded) or does nothing (central: the server reconfigures its own).
    """

    updates_here = False  # the servers step

    def __init__(
        self,
        *,
        rank: int,
        plan: Callable[[list[nn.Parameter]], list[int]],
        groups: dict[int, dist.ProcessGroup],
        serve: Callable[[list[nn.Parameter], torch.optim.Optimizer], ShardServer] | None = None,
        gather: Callable[[PSExchange, nn.Module, torch.optim.Optimizer], None] | None = None,
        exclusive: bool = False,
        codec: WireCodec | None = None,
    ) -> None:
        self.rank, self.plan, self.groups = rank, plan, groups
        self.serve, self.gather, self.exclusive = serve, gather, exclusive
        self.codec = codec or WireCodec()
        self.local_server: ShardServer | None = None
        self.owner_of: list[int] = []
        self.owners: list[int] = []
        self.versions: dict[int, int] = {}
        self.batches_done = 0
        self._skipped = False  # whether an owner skipped this step's update
        self._device = torch.device("cpu")  # the model's; another one: host buffers and copies
        self._owned: dict[int, list[nn.Parameter]] = {}
        self._layouts: dict[int, TensorLayout] = {}
        self._weights: dict[int, torch.Tensor] = {}
        self._gradients: dict[int, torch.Tensor] = {}
        self._headers: dict[int, torch.Tensor] = {}  # each owner's reply header, received in place
        self._wires: dict[int, torch.Tensor] = {}  # each owner's weights as they travel (the weights for fp32)

    def start(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        parameters = list(model.parameters())
        self._device = parameters[0].device if parameters else torch.device("cpu")
        self.owner_of = self.plan(parameters)
        self.owners = sorted(set(self.owner_of))
        self.versions = {owner: self.versions.get(owner, 0) for owner in self.owners}
        self._owned, self._layouts, self._weights, self._gradients = {}, {}, {}, {}
        for owner in self.owners:
            owned = [p for p, o in zip(parameters, self.owner_of, strict=True) if o == owner]
            self._owned[owner] = owned
            self._layouts[owner] = TensorLayout.of(owned)
            self._weights[owner] = flatten([p.detach() for p in owned]).cpu()
            self._gradients[owner] = torch.zeros_like(self._weights[owner])
            self._headers[owner] = torch.zeros(REPLY_FIELDS, dtype=torch.int64)
            self._wires[owner] = self.codec.receive_buffer(self._weights[owner])
        # A worker may own nothing (more workers than tensors), also after owning a shard of an earlier network.
        self.local_server = self.serve(self._owned[self.rank], optimizer) if self.rank in self._owned else None
        for owner in self.owners:
            owned = self._owned[owner]
            if not self._staged:
                with torch.no_grad():
                    for parameter, view in zip(owned, views_of(self._weights[owner], owned), strict=True):
                        parameter.data = view
            if owner == self.rank:
                self._weights[owner].copy_(self.local_server.weights())
            else:
                self._receive_first_reply(owner)
        self._weights_to_device()

    @property
    def _staged(self) -> bool:
        """The model is not in host memory: its tensors are copied to and from the flat buffers
        (``SCALETRAIN_HOST_STAGING=1`` does so on the CPU too: the GPU path's code without a GPU)."""
        return self._device.type != "cpu" or os.environ.get(HOST_STAGING) == "1"

    def _weights_to_device(self) -> float:
        """Copy every owner's flat weights into a model on a GPU; the seconds it took (0 on the CPU)."""
        if not self._staged:
            return 0.0
        begin = now()
        with torch.no_grad():
            for owner in self.owners:
                unflatten_into(self._weights[owner], self._owned[owner])
        synchronize(self._device)
        return now() - begin

    def _pack_gradients(self) -> float:
        """Each owner's share of the gradients into its flat host buffer; the seconds a GPU's copies took."""
        begin = now()
        for owner in self.owners:
            gradients = [_gradient(p) for p in self._owned[owner]]
            if self._staged:
                self._gradients[owner].copy_(flatten(gradients))  # one device-to-host copy per owner
            else:
                self.codec.pack(gradients, out=self._gradients[owner])
        return now() - begin if self._staged else 0.0

    def owned(self, owner: int) -> list[nn.Parameter]:
        """The model's tensors that ``owner`` holds the master copy of (views of its flat weights)."""
        return self._owned[owner]

    def _receive_first_reply(self, owner: int) -> None:
        """An owner's first reply (after a start or a reconfiguration), header first: a server whose network
        differs is told so and named, and its weights are not taken."""
        dist.recv(self._headers[owner], src=owner, group=self.groups[owner], tag=REPLY)
        version, layout_id, numel, _ = (int(v) for v in self._headers[owner])
        theirs, mine = TensorLayout(layout_id, numel), self._layouts[owner]
        if theirs != mine:
            if version >= 0:  # the server has not seen it yet: take its weights, then our header stops it too
                with contextlib.suppress(RuntimeError):
                    dist.recv(self.codec.buffer(theirs.numel), src=owner, group=self.groups[owner], tag=REPLY)
                    self._request(owner, DONE, version)
            raise LayoutMismatch(
                f"worker rank {self.rank} holds tensors of layout {mine} for the server at rank {owner}, which "
                f"holds layout {theirs}; every process must build the same network (same workload, options and "
                "reconfigurations)"
            )
        self._take_weights(owner, dist.irecv(self._wires[owner], src=owner, group=self.groups[owner], tag=REPLY))

    def _post_reply(self, owner: int) -> tuple[dist.Work, dist.Work]:
        """Post the receives of ``owner``'s next reply (header and weights) before asking for it."""
        return post_message(self._headers[owner], self._wires[owner], owner, self.groups[owner], REPLY)

    def _receive_reply(self, owner: int, header: dist.Work, body: dist.Work) -> float:
        """Finish receiving a posted reply into the model; returns the wait for the header."""
        begin = now()
        header.wait()
        waited = now() - begin
        version, layout_id, numel, skipped = (int(v) for v in self._headers[owner])
        if TensorLayout(layout_id, numel) != self._layouts[owner]:  # the server refused (version -1): no body
            raise LayoutMismatch(
                f"the server at rank {owner} refused worker rank {self.rank}'s tensors of layout "
                f"{self._layouts[owner]}: every process must build the same network"
            )
        self._skipped = self._skipped or bool(skipped)
        self._take_weights(owner, body)
        self.versions[owner] = version
        return waited

    def _take_weights(self, owner: int, body: dist.Work) -> None:
        body.wait()
        self.codec.unpack(self._wires[owner], self._weights[owner])

    def step(self, model: nn.Module, optimizer: torch.optim.Optimizer, clip_norm: float | None) -> ExchangeTimes:
        begin = now()
        waited = 0.0
        self.batches_done += 1
        self._skipped = False
        host_copy = self._pack_gradients()
        remote = [owner for owner in self.owners if owner != self.rank]
        replies = {owner: self._post_reply(owner) for owner in remote}
        for owner in remote:
            waited += self._await_grant(owner)
            wire = self.codec.encode_gradient(self._gradients[owner], stream=owner)
            self._request(owner, GRADIENT, self.versions[owner], wire)
        if self.rank in self._owned:
            arrive = now()
            own = self._gradients[self.rank]
            wire = self.codec.encode_gradient(own, stream=self.rank)
            if wire.data_ptr() != own.data_ptr():  # rounded as the other owners receive theirs
                self.codec.unpack(wire, own)
            version, weights, skipped = self.local_server.contribute(own, self.versions[self.rank])
            self.codec.unpack(self.codec.encode(weights), self._weights[self.rank])  # as the others get theirs
            self.versions[self.rank] = version
            self._skipped = self._skipped or skipped
            waited += now() - arrive
        for owner in remote:
            waited += self._receive_reply(owner, *replies[owner])
        host_copy += self._weights_to_device()
        return ExchangeTimes(
            communication=now() - begin - waited - host_copy, wait=waited, skipped=self._skipped, host_copy=host_copy
        )

    def _request(self, owner: int, kind: int, version: int, body: torch.Tensor | None = None) -> None:
        """Send ``owner`` a request: its header, then ``body`` (a one-value stand-in when there is none)."""
        layout = self._layouts[owner]
        header = torch.tensor([kind, version, self.batches_done, layout.layout_id, layout.numel], dtype=torch.int64)
        body = self.codec.buffer(1) if body is None else body
        send_message(header, body, owner, self.groups[owner], REQUEST)

    def _await_grant(self, owner: int) -> float:
        if not self.exclusive:
            return 0.0
        begin = now()
        dist.recv(torch.zeros(1, dtype=torch.int64), src=owner, group=self.groups[owner], tag=GRANT)
        return now() - begin

    def finish(self, model: nn.Module) -> None:
        """Tell every remote owner this worker is done."""
        self._tell_owners(DONE)

    def _tell_owners(self, kind: int, epoch: int | None = None) -> None:
        for owner in self.owners:
            if owner == self.rank:
                continue
            self._await_grant(owner)
            self._request(owner, kind, self.versions[owner] if epoch is None else epoch)

    def prepare_reconfiguration(self, model: nn.Module, optimizer: torch.optim.Optimizer, epoch: int) -> None:
        """At the agreed step boundary: tell every remote owner (their serving threads end), then bring the
        owners' master weights and optimizer state into ``model`` and ``optimizer``."""
        self._tell_owners(RECONFIGURE, epoch)
        if self.gather is not None:
            self.gather(self, model, optimizer)

    def reconfigure(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Re-plan ownership over the new tensors, start this worker's new shard server (sharded) and pull
        every owner's weights, as at the start."""
        self.codec.reset()
        self.start(model, optimizer)


def post_message(
    header: torch.Tensor, body: torch.Tensor, peer: int, group: dist.ProcessGroup, tag: int
) -> tuple[dist.Work, dist.Work]:
    """Post both receives of a message at once (a shorter body than ``body`` fits, a longer one does not)."""
    return dist.irecv(header, src=peer, group=group, tag=tag), dist.irecv(body, src=peer, group=group, tag=tag)


def receive_header(
    header: torch.Tensor, body: torch.Tensor, peer: int, group: dist.ProcessGroup, tag: int
) -> dist.Work:
    """Post both receives, wait for the header; the body's receive is returned to wait on."""
    header_work, body_work = post_message(header, body, peer, group, tag)
    header_work.wait()
    return body_work


def send_message(header: torch.Tensor, body: torch.Tensor, peer: int, group: dist.ProcessGroup, tag: int) -> None:
    """Send a message's two parts back to back, then wait for both."""
    works = [dist.isend(header, dst=peer, group=group, tag=tag), dist.isend(body, dst=peer, group=group, tag=tag)]
    for work in works:
        work.wait()


def views_of(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    """Views of ``flat`` shaped like ``like``, back to back (the layout of :func:`flatten`)."""
    views, offset = [], 0
    for tensor in like:
        views.append(flat[offset : offset + tensor.numel()].view_as(tensor))
        offset += tensor.numel()
    return views


def _gradient(parameter: torch.Tensor) -> torch.Tensor:
    return parameter.grad if parameter.grad is not None else torch.zeros_like(parameter)
