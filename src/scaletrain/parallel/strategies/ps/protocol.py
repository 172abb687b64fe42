"""The parameter servers' wire protocol: message tags and header layouts, one two-process group per
worker–owner pair, and sending or receiving one message (a header and a body).

A request's header is ``kind, version, batches done, layout id, element count, payload bytes``; a
gradient's body is the wire codec's payload as one message (``WireCodec.to_message``: its size need
not be the element count's), the other kinds send a one-byte stand-in. A reply's header is
``version, layout id, element count, skipped, payload bytes, generation, joining`` and its body the
weights (version -1: refused, no body; skipped 2: the step was not applied, do it again with the members of
``generation``, :mod:`scaletrain.parallel.strategies.ps.membership`; joining 1: the first owner's, in an elastic sharded
run, says a worker waits to join at this step's end). Both sides put the bytes of a gradient
message of their codec in every header, so a worker and an owner that encode gradients differently
stop, naming both, before a gradient travels."""

from __future__ import annotations

import contextlib
import datetime
import threading

import torch
import torch.distributed as dist

from scaletrain.errors import ScaletrainError

__all__ = [
    "DONE",
    "FINAL_SHARD",
    "GRADIENT",
    "GRANT",
    "PROBE",
    "RECONFIGURE",
    "REPLY",
    "REPLY_FIELDS",
    "REQUEST",
    "REQUEST_FIELDS",
    "PeerLost",
    "held",
    "pair_groups",
    "post_message",
    "receive_header",
    "send_message",
]

REQUEST, REPLY, GRANT = 1, 2, 3
#: owner → rank 0 once training has ended (sharded server): the owner's final master tensors.
FINAL_SHARD = 4
#: server → a worker whose heartbeat stood still: never received; sending it fails at once if the worker's
#: connection closed (a gloo receive posted before the close is not always woken by it).
PROBE = 5
GRADIENT, DONE, RECONFIGURE = 0, 1, 2
REQUEST_FIELDS, REPLY_FIELDS = 6, 7


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


def held(semaphore: threading.Semaphore | None) -> contextlib.AbstractContextManager:
    """``with held(semaphore)``: the semaphore held, or nothing when admission control is off."""
    return semaphore if semaphore is not None else contextlib.nullcontext()
