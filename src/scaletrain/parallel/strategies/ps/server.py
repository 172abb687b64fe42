"""An owner's side of a parameter server: the master copy of its tensors, updated under a lock by the
threads that serve its peers."""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from scaletrain.errors import ScaletrainError
from scaletrain.parallel.failures import connection_closed, describe
from scaletrain.parallel.strategies.ps.bound import StalenessBound, StalenessTimeout
from scaletrain.parallel.strategies.ps.losses import Closed, LossHandling, Redo
from scaletrain.parallel.strategies.ps.membership import REDO, Members
from scaletrain.parallel.strategies.ps.protocol import (
    DONE,
    GRADIENT,
    GRANT,
    RECONFIGURE,
    REPLY,
    REQUEST,
    REQUEST_FIELDS,
    PeerLost,
    held,
    receive_header,
    send_message,
)
from scaletrain.parallel.strategies.ps.records import ServerStats
from scaletrain.parallel.strategies.ps.staleness import Compensation
from scaletrain.tensors.codec import LayoutMismatch, TensorLayout, WireCodec, WireMismatch
from scaletrain.tensors.flat import finite, flatten, views_of
from scaletrain.tensors.optimizers import set_momentum
from scaletrain.train.meter import now

__all__ = ["ShardServer"]


class ShardServer(LossHandling):
    """Holds the master copy of some tensors and their optimizer; serves peers from threads.

    ``master`` must not be trained on by anyone else: a sharded worker passes clones of its
    tensors, the central server its own model's parameters.

    ``contributors`` gradients make one synchronous update (peers plus, for a sharded server, the
    owner's own worker through :meth:`contribute`). Asynchronous: every gradient is applied on
    arrival, and its staleness (updates applied since the sender's weights were current) recorded;
    ``compensation`` then sets each update's rate factor and momentum (:mod:`.staleness`).
    ``skip_nonfinite``: an update whose gradient holds inf or nan is not made (the version still
    advances, as the workers' step count does) and the reply says so. ``bound`` (asynchronous,
    ``--max-staleness``): a worker's reply is held until the slowest worker is close enough
    (:mod:`scaletrain.parallel.strategies.ps.bound`).
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
        compiled: bool = False,
        stats: ServerStats | None = None,
        codec: WireCodec | None = None,
        skip_nonfinite: bool = False,
        members: Members | None = None,
        lost: Callable[[], bool] | None = None,
        bound: StalenessBound | None = None,
    ) -> None:
        self.master, self.optimizer = master, optimizer
        self.peers, self.contributors, self.synchronous = peers, contributors, synchronous
        self.clip_norm, self.learning_rate, self.compensation = clip_norm, learning_rate, compensation
        self.on_update, self.after_step, self.timeout = on_update, after_step, timeout
        self.compiled = compiled  # the workers compile their first steps (--compile): a timeout may be that
        self.version = version
        # without a schedule the optimizer's rate as given: the group's own is overwritten by each scaled update
        self._base_rate = optimizer.param_groups[0]["lr"]
        self.stats = stats or ServerStats()  # a server rebuilt after a reconfiguration goes on counting
        self.layout = TensorLayout.of(master)
        self.codec = codec or WireCodec()
        self.payload_bytes = self.codec.payload_bytes(self.layout)  # of a gradient message, in every header
        self.skip_nonfinite = skip_nonfinite
        self.bound = bound if not synchronous else None
        # elastic (--min-workers, synchronous central server): a lost peer is dropped and the survivors go on
        self.members = members if synchronous else None
        self._skipped = False  # whether the last update was skipped
        # elastic sharded (--min-workers): ``lost()`` says a peer was lost while the owner's own worker waits for
        # an update; the owner's momentum before the last update is kept, as a step of a lost peer is undone
        self.lost = lost
        self._before: tuple[int, dict[str, torch.Tensor]] | None = None
        self.closed = False  # the survivors regrouped: nothing more is applied, the threads end quietly
        self.closed_peers: set[int] = set()  # whose connection closed (they died), as the serving threads saw
        #: Set by the owner's worker before it contributes (the first owner, elastic): a worker waits to join;
        #: every reply of the update it is part of says so (``announced``), so all members learn it in one step.
        self.announce = 0
        self.announced = 0
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
        self._own_sent: torch.Tensor | None = None  # the owner's worker's weights, as the last update left them
        self._failure: tuple[int, str] | None = None
        self._mismatch: ScaletrainError | None = None  # a worker's network or codec differs
        self._probed: dict[int, float] = {}  # when each peer was last probed (elastic: see _closed)
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

    def contribute(
        self, gradient: torch.Tensor, version: int, push: tuple[int, int] | None = None
    ) -> tuple[int, torch.Tensor, bool]:
        """The owner's own worker adds its gradient; returns the new version, the weights and whether
        the update was skipped. ``push``: the worker's rank and clock (for ``--max-staleness``)."""
        if self._stalled() is not None:  # a peer's reply was held past the deadline: stop this worker too
            raise self._stalled()
        new_version, self._own_sent, skipped = self._apply(
            gradient, views_of(gradient, self.master), version, self._own_sent, push=push
        )
        return new_version, self._own_sent, skipped

    def finished(self, worker: int) -> None:
        """The owner's own worker has trained its last batch: it no longer holds the others back."""
        with self._condition:
            self.stats.finished.add(worker)
            self._condition.notify_all()

    def join(self, deadline_seconds: float | None = None) -> ServerStats:
        """Wait for every peer to finish or to reach a reconfiguration; in synchronous mode a lost peer
        is an error, and in every mode a peer whose network differs from this server's."""
        deadline = None if deadline_seconds is None else now() + deadline_seconds
        with self._condition:  # woken by every thread's end or failure; a mismatch stops the run at once
            while self._mismatch is None and self._stalled() is None and any(self._serving()):
                if deadline is not None and now() > deadline:
                    break
                self._condition.wait(0.2)
        if self._mismatch is not None:
            raise self._mismatch
        if self._stalled() is not None:
            raise self._stalled()
        if self.synchronous and self._failure is not None:
            peer, reason = self._failure
            raise PeerLost(f"worker rank {peer} failed during synchronous training: {reason}")
        return self.stats

    def _stalled(self) -> StalenessTimeout | None:
        """A reply held past ``--max-staleness``'s deadline: the run stops naming the slowest worker."""
        return self.bound.failure if self.bound is not None else None

    def _serving(self) -> list[int]:
        """The peers whose thread is still serving them (not one an elastic server dropped: its thread may
        wait out --timeout on a frozen worker, which the survivors do not wait for)."""
        dropped = set(self.peers) - set(self.members.active) if self.members is not None else set()
        return [
            peer
            for peer, thread in zip(self.peers, self._threads, strict=True)
            if thread.is_alive() and peer not in dropped
        ]

    # -- one thread per peer ------------------------------------------------------------------
    def _serve(self, peer: int) -> None:
        group = self.peers[peer]
        header = torch.zeros(REQUEST_FIELDS, dtype=torch.int64)
        gradient = torch.zeros_like(self._flat)
        wire = self.codec.message_buffer(self.layout, gradient)  # the gradient itself for float32
        gradient_views = views_of(gradient, self.master)
        try:
            sent = self.weights()  # what this peer computes its next gradient on (DC-ASGD reads it)
            self._reply(peer, group, self.version, sent)
            while True:
                with held(self._receiving):
                    if self._receiving is not None:
                        dist.send(torch.zeros(1, dtype=torch.int64), dst=peer, group=group, tag=GRANT)
                    body = receive_header(header, wire, peer, group, REQUEST)
                    kind, version, batches_done, layout_id, numel, size = (int(v) for v in header)
                    theirs = TensorLayout(layout_id, numel)
                    # only what differed at the first reply (the worker stopped there): a stand-in body
                    if theirs != self.layout:
                        self._refuse(peer, group, self._other_network(peer, theirs))
                        return
                    if size != self.payload_bytes:
                        self._refuse(peer, group, self._other_codec(peer, size))
                        return
                    body.wait()
                    if kind == GRADIENT:
                        self.codec.decompress(self.codec.from_message(wire, self.layout), self.layout, out=gradient)
                with self._condition:
                    self.stats.batches_done[peer] = batches_done
                if kind == DONE:
                    self.finished(peer)
                    return
                if kind == RECONFIGURE:
                    with self._condition:
                        self.reconfiguring[peer] = version
                    return
                try:
                    new_version, sent, skipped = self._apply(
                        gradient, gradient_views, version, sent, peer, push=(peer, batches_done)
                    )
                except Redo:  # computed before the membership changed: the same weights, and do it again
                    self._reply(peer, group, self.version, sent, REDO)
                    continue
                self._reply(peer, group, new_version, sent, skipped)
        except (Closed, StalenessTimeout):  # the bound's failure stops the run from join
            return
        except Exception as exc:  # the peer died or timed out: gloo raises RuntimeError
            if self.closed:  # a group the survivors left behind
                return
            reason = describe(exc, self.timeout, peer=f"worker rank {peer}", compiled=self.compiled)
            with self._condition:
                self.stats.lost[peer] = reason
                if connection_closed(exc):
                    self.closed_peers.add(peer)
                if self.synchronous and self._failure is None and not self._dropped(peer, reason):
                    self._failure = (peer, reason)
                self._condition.notify_all()

    def _other_network(self, peer: int, theirs: TensorLayout) -> LayoutMismatch:
        return LayoutMismatch(
            f"worker rank {peer} sent tensors of layout {theirs} but its server holds layout {self.layout}; "
            "every process must build the same network (same workload, options and reconfigurations)"
        )

    def _other_codec(self, peer: int, size: int) -> WireMismatch:
        return WireMismatch(
            f"worker rank {peer} encodes a gradient of layout {self.layout} in {size} bytes but its server's wire "
            f"codec {self.codec.name!r} in {self.payload_bytes}; every process must use the same wire codec"
        )

    def _refuse(self, peer: int, group: dist.ProcessGroup, error: ScaletrainError) -> None:
        """A worker whose network or codec differs: tell it (version -1; it stops naming both), and stop."""
        with self._condition:
            self._mismatch = self._mismatch or error
            self._failure = self._failure or (peer, str(error))
            self._condition.notify_all()
        with held(self._sending):
            dist.send(self._reply_header(-1), dst=peer, group=group, tag=REPLY)

    def _reply_header(self, version: int, skipped: int = 0) -> torch.Tensor:
        layout, generation = self.layout, self._generation()
        fields = [version, layout.layout_id, layout.numel, int(skipped), self.payload_bytes, generation]
        fields.append(self.announced)
        return torch.tensor(fields, dtype=torch.int64)

    def _reply(
        self, peer: int, group: dist.ProcessGroup, version: int, weights: torch.Tensor, skipped: int = 0
    ) -> None:
        with held(self._sending):
            send_message(self._reply_header(version, skipped), self.codec.encode(weights), peer, group, REPLY)

    # -- updates --------------------------------------------------------------------------------
    def _apply(
        self,
        gradient: torch.Tensor,
        views: list[torch.Tensor],
        version: int,
        stale: torch.Tensor | None = None,
        peer: int | None = None,
        push: tuple[int, int] | None = None,
    ) -> tuple[int, torch.Tensor, bool]:
        """``stale``: the weights the gradient was computed on, when known (async replies are snapshots).
        ``peer``: who sent it (an elastic server raises :class:`Redo` for a gradient of an old membership).
        ``push``: the sender's rank and clock; with a bound, the weights returned are those after the hold."""
        with self._condition:
            if not self.synchronous:
                staleness = self.version - version
                self.stats.staleness[staleness] += 1
                if self.compensation is not None and self.compensation.corrects_delay and stale is not None:
                    self.compensation.correct(gradient, self._flat, stale)
                scale, momentum = self.compensation.step(staleness) if self.compensation else (1.0, None)
                self._update(views, scale, momentum)
                skipped = self._skipped
                if self.bound is not None and push is not None:
                    self.bound.pushed(*push)
                    self._condition.notify_all()
                    self.bound.hold(self._condition, *push)
                return self.version, self._snapshot, skipped
            if self.members is not None and peer is not None and self.members.redo(peer):
                raise Redo
            if self.closed:
                raise Closed
            my_round, generation = self._round, self._generation()
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
            elif not self._wait_round(
                lambda: (
                    self._round != my_round
                    or self._failure is not None
                    or self._generation() != generation
                    or self.closed
                ),
                own=peer is None,
            ):
                raise PeerLost(f"no synchronous update within {self.timeout:.0f} s: a worker is stuck or gone")
            if self.closed and self._round == my_round:
                raise Closed
            if self._round == my_round and self._generation() != generation:
                self.members.redo(peer)
                raise Redo
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
        rate = self.learning_rate(self.version) if self.learning_rate else self._base_rate
        if self.lost is not None:  # elastic sharded: the state this update starts from (see state_at)
            self._before = (self.version, self._state())
        for group in self.optimizer.param_groups:
            group["lr"] = rate * scale
            if momentum is not None:
                set_momentum(group, momentum)
        self.optimizer.step()
        if self.after_step is not None:  # a technique's change of the new weights (PruneTrain's shrinking)
            self.after_step(self.master, rate * scale)
        self.version += 1
        self.stats.updates += 1
        self.announced = self.announce
        if self.members is not None:
            self.members.updated()
        # Synchronous replies go out before the next update can start (it needs every worker's next
        # gradient), so they may send the live buffer; asynchronous ones need a copy of this version.
        self._snapshot = self._flat if self.synchronous else self._flat.clone()
        if self.on_update is not None:
            self.on_update(self.version)
