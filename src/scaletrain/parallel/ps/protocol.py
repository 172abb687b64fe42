"""The parameter servers' wire protocol: message tags and header layouts, one two-process group per
worker–owner pair, and sending or receiving one message (a header and a body of one or more tensors).

A request's header is ``kind, version, batches done, layout id, element count, payload bytes``: a
gradient's body is its wire codec's payload (its size need not be the element count's), the other
kinds send a one-value stand-in per payload tensor and 0 bytes. A reply's header is ``version,
layout id, element count, skipped`` and its body the weights (version -1: refused, no body)."""

from __future__ import annotations

import datetime
from collections.abc import Sequence

import torch
import torch.distributed as dist

from scaletrain.errors import ScaletrainError

__all__ = [
    "DONE",
    "FINAL_SHARD",
    "GRADIENT",
    "GRANT",
    "RECONFIGURE",
    "REPLY",
    "REPLY_FIELDS",
    "REQUEST",
    "REQUEST_FIELDS",
    "PeerLost",
    "pair_groups",
    "post_message",
    "receive_header",
    "send_message",
]

REQUEST, REPLY, GRANT = 1, 2, 3
#: owner → rank 0 once training has ended (sharded server): the owner's final master tensors.
FINAL_SHARD = 4
GRADIENT, DONE, RECONFIGURE = 0, 1, 2
REQUEST_FIELDS, REPLY_FIELDS = 6, 4


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


class _Received:
    """The receives of a body of several tensors, waited on as one."""

    def __init__(self, works: list[dist.Work]) -> None:
        self.works = works

    def wait(self) -> None:
        for work in self.works:
            work.wait()


Body = torch.Tensor | Sequence[torch.Tensor]


def _parts(body: Body) -> Sequence[torch.Tensor]:
    return (body,) if isinstance(body, torch.Tensor) else body


def post_message(
    header: torch.Tensor, body: Body, peer: int, group: dist.ProcessGroup, tag: int
) -> tuple[dist.Work, dist.Work | _Received]:
    """Post every receive of a message at once (a shorter body tensor than ``body``'s fits, a longer one
    does not)."""
    header_work = dist.irecv(header, src=peer, group=group, tag=tag)
    if isinstance(body, torch.Tensor):
        return header_work, dist.irecv(body, src=peer, group=group, tag=tag)
    return header_work, _Received([dist.irecv(part, src=peer, group=group, tag=tag) for part in body])


def receive_header(
    header: torch.Tensor, body: Body, peer: int, group: dist.ProcessGroup, tag: int
) -> dist.Work | _Received:
    """Post every receive, wait for the header; the body's receive is returned to wait on."""
    header_work, body_work = post_message(header, body, peer, group, tag)
    header_work.wait()
    return body_work


def send_message(header: torch.Tensor, body: Body, peer: int, group: dist.ProcessGroup, tag: int) -> None:
    """Send a message's parts back to back, then wait for all of them."""
    works = [dist.isend(part, dst=peer, group=group, tag=tag) for part in (header, *_parts(body))]
    for work in works:
        work.wait()
