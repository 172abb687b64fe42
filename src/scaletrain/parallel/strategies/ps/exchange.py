"""A worker's side of a parameter server: push each owner its share of the gradient, pull its weights."""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from scaletrain.efficient.base import Reconfiguration
from scaletrain.parallel.strategies.ps.membership import REDO
from scaletrain.parallel.strategies.ps.protocol import (
    DONE,
    GRADIENT,
    GRANT,
    RECONFIGURE,
    REPLY,
    REPLY_FIELDS,
    REQUEST,
    post_message,
    send_message,
)
from scaletrain.parallel.strategies.ps.server import ShardServer
from scaletrain.tensors.codec import LayoutMismatch, TensorLayout, WireCodec, WireMismatch
from scaletrain.tensors.device import synchronize
from scaletrain.tensors.flat import flatten, unflatten_into, views_of
from scaletrain.train.exchange import ExchangeTimes, GradientExchange, PeerLost
from scaletrain.train.meter import now

__all__ = ["HOST_STAGING", "PSExchange"]

HOST_STAGING = "SCALETRAIN_HOST_STAGING"


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
        patience: float | None = None,
    ) -> None:
        self.rank, self.plan, self.groups = rank, plan, groups
        # elastic (a central server that drops lost workers) or --max-staleness (a reply held for the slowest):
        # how long a reply may take, the server's own wait for a lost peer included; an elastic server's reply
        # then may ask for the step again (``redo_generation``)
        self.patience = patience
        self.redo_generation: int | None = None
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

    def state_dict(self) -> dict | None:
        return self.codec.state_dict()  # error feedback's residual per owner

    def load_state_dict(self, state: dict) -> None:
        self.codec.load_state_dict(state)

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
                self.versions[owner] = self.local_server.version
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
        or wire codec differs is told so and named, and its weights are not taken."""
        dist.recv(self._headers[owner], src=owner, group=self.groups[owner], tag=REPLY)
        version, layout_id, numel, _, size, _, _ = (int(v) for v in self._headers[owner])
        theirs, mine = TensorLayout(layout_id, numel), self._layouts[owner]
        if theirs != mine:
            self._stop_at_first_reply(owner, version, theirs.numel)
            raise LayoutMismatch(
                f"worker rank {self.rank} holds tensors of layout {mine} for the server at rank {owner}, which "
                f"holds layout {theirs}; every process must build the same network (same workload, options and "
                "reconfigurations)"
            )
        if size != self.codec.payload_bytes(mine):
            self._stop_at_first_reply(owner, version, theirs.numel)
            raise WireMismatch(
                f"worker rank {self.rank}'s wire codec {self.codec.name!r} encodes a gradient of layout {mine} in "
                f"{self.codec.payload_bytes(mine)} bytes but the server at rank {owner}'s in {size}; every process "
                "must use the same wire codec"
            )
        self._take_weights(owner, dist.irecv(self._wires[owner], src=owner, group=self.groups[owner], tag=REPLY))
        self.versions[owner] = version  # a resumed server starts past 0: the first gradient is not stale by that

    def _stop_at_first_reply(self, owner: int, version: int, numel: int) -> None:
        """Before raising: if the server has not seen it yet, take its ``numel`` weights (8 bytes a value:
        any type fits), then this worker's header stops it too."""
        if version >= 0:
            with contextlib.suppress(RuntimeError):
                weights = torch.zeros(numel, dtype=torch.float64)
                dist.recv(weights, src=owner, group=self.groups[owner], tag=REPLY)
                self._request(owner, DONE, version)

    def _post_reply(self, owner: int) -> tuple[dist.Work, dist.Work]:
        """Post the receives of ``owner``'s next reply (header and weights) before asking for it."""
        return post_message(self._headers[owner], self._wires[owner], owner, self.groups[owner], REPLY)

    def _receive_reply(self, owner: int, header: dist.Work, body: dist.Work) -> float:
        """Finish receiving a posted reply into the model; returns the wait for the header."""
        begin = now()
        self._wait_reply(header)
        waited = now() - begin
        version, layout_id, numel, skipped, size, generation, _ = (int(v) for v in self._headers[owner])
        if TensorLayout(layout_id, numel) != self._layouts[owner]:  # the server refused (version -1): no body
            raise LayoutMismatch(
                f"the server at rank {owner} refused worker rank {self.rank}'s tensors of layout "
                f"{self._layouts[owner]}: every process must build the same network"
            )
        if version < 0:  # the same network: the gradient's encoding was refused
            raise WireMismatch(
                f"the server at rank {owner} (gradients of {size} bytes) refused worker rank {self.rank}'s gradient "
                f"as wire codec {self.codec.name!r}: every process must use the same wire codec"
            )
        if skipped == REDO:  # not applied: the membership changed, the step is done again (PeerLost below)
            self.redo_generation = generation
        else:
            self._skipped = self._skipped or bool(skipped)
        self._take_weights(owner, body)
        self.versions[owner] = version
        return waited

    def _wait_reply(self, header: dist.Work) -> None:
        """Wait for a reply's header: within the pair's timeout, or ``patience`` seconds in an elastic run (the
        server may first wait out ``--timeout`` on a stopped peer, then answer)."""
        if self.patience is None:
            header.wait()
        else:  # gloo waits as long as asked here, past the pair's own timeout
            header.wait(timeout=datetime.timedelta(seconds=self.patience))

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
        sent = 0
        for owner in remote:
            waited += self._await_grant(owner)
            payload, _ = self.codec.compress(self._gradients[owner], self._layouts[owner], stream=owner)
            body = self.codec.to_message(payload, self._layouts[owner])
            self._request(owner, GRADIENT, self.versions[owner], body)
            sent += body.nbytes
        if self.rank in self._owned:
            arrive = now()
            own = self._gradients[self.rank]
            # as the other owners receive theirs: compressed and back (nothing at all for float32)
            payload, context = self.codec.compress(own, self._layouts[self.rank], stream=self.rank)
            self.codec.decompress(payload, context, out=own)
            push = (self.rank, self.batches_done)  # the clock of --max-staleness
            version, weights, skipped = self.local_server.contribute(own, self.versions[self.rank], push)
            self.codec.unpack(self.codec.encode(weights), self._weights[self.rank])  # as the others get theirs
            self.versions[self.rank] = version
            self._skipped = self._skipped or skipped
            waited += now() - arrive
        for owner in remote:
            waited += self._receive_reply(owner, *replies[owner])
        host_copy += self._weights_to_device()
        if self.redo_generation is not None:
            raise PeerLost(None)  # the loop regroups (CentralMembership) and does the step again
        return ExchangeTimes(
            communication=now() - begin - waited - host_copy,
            wait=waited,
            skipped=self._skipped,
            host_copy=host_copy,
            sent_bytes=sent,
        )

    def _request(self, owner: int, kind: int, version: int, body: torch.Tensor | None = None) -> None:
        """Send ``owner`` a request: its header (with the bytes of this worker's gradient messages, which the
        owner checks), then ``body`` (a one-byte stand-in when there is none)."""
        layout = self._layouts[owner]
        size = self.codec.payload_bytes(layout) if body is None else body.nbytes
        header = torch.tensor(
            [kind, version, self.batches_done, layout.layout_id, layout.numel, size], dtype=torch.int64
        )
        body = torch.zeros(1, dtype=torch.uint8) if body is None else body
        self._send(header, body, owner)

    def _send(self, header: torch.Tensor, body: torch.Tensor, owner: int) -> None:
        """Send ``owner`` a message (a request); returns when both parts are sent."""
        send_message(header, body, owner, self.groups[owner], REQUEST)

    def _await_grant(self, owner: int) -> float:
        if not self.exclusive:
            return 0.0
        begin = now()
        dist.recv(torch.zeros(1, dtype=torch.int64), src=owner, group=self.groups[owner], tag=GRANT)
        return now() - begin

    def finish(self, model: nn.Module) -> None:
        """Tell every remote owner this worker is done (and its own server: it no longer holds others back)."""
        if self.local_server is not None:
            self.local_server.finished(self.rank)
        self._tell_owners(DONE)

    def _tell_owners(self, kind: int, epoch: int | None = None) -> None:
        for owner in self.owners:
            if owner == self.rank:
                continue
            self._await_grant(owner)
            self._request(owner, kind, self.versions[owner] if epoch is None else epoch)

    def prepare_reconfiguration(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, epoch: int, decision: Reconfiguration
    ) -> None:
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


def _gradient(parameter: torch.Tensor) -> torch.Tensor:
    return parameter.grad if parameter.grad is not None else torch.zeros_like(parameter)
