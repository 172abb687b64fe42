"""How an elastic run's waits give up when another survivor saw a peer lost, and the groups a regroup leaves
behind (:mod:`scaletrain.parallel.strategies.elastic`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from scaletrain.tensors.codec import Collectives

__all__ = ["ABANDONED", "WATCH_SECONDS", "HeardOfLoss", "WatchedCollectives", "watched"]

#: How often a waiting collective asks the store whether another survivor has seen a peer lost.
WATCH_SECONDS = 0.02
#: Groups left behind, referenced until the process leaves (without destructors, parallel.teardown): freeing one
#: waits for a collective still pending in it (on a frozen peer: until --timeout).
ABANDONED: list[dist.ProcessGroup] = []


class HeardOfLoss(RuntimeError):
    """Another survivor said that a peer of the group was lost."""


def watched(work: dist.Work, lost: Callable[[], bool]) -> None:
    """Wait for ``work`` (an asynchronous collective), and give up as soon as ``lost()`` says another survivor
    has seen a peer lost. A gloo wait on a peer whose connection closed before the wait began is not woken
    by the close: without this a survivor would wait out ``--timeout``."""
    asked, pause = time.monotonic(), 0.00005
    while not work.is_completed():
        if time.monotonic() - asked > WATCH_SECONDS:
            if lost():
                raise HeardOfLoss("another survivor saw a peer lost during this collective")
            asked = time.monotonic()
        # short at first (a collective of small tensors ends in microseconds), then at most 2 ms, so a long
        # wait for a slower worker does not take a core from it with thousands of wake-ups a second
        time.sleep(pause)
        pause = min(2 * pause, 0.002)
    work.wait()  # raises the collective's own error, if it failed


@dataclass(frozen=True)
class WatchedCollectives(Collectives):
    """An elastic run's collectives: each gives up as soon as ``lost()`` says another survivor saw a peer lost."""

    lost: Callable[[], bool] = lambda: False

    def all_reduce(self, tensor: torch.Tensor) -> None:
        watched(dist.all_reduce(tensor, group=self.group, async_op=True), self.lost)

    def all_gather(self, parts: list[torch.Tensor], tensor: torch.Tensor) -> None:
        watched(dist.all_gather(parts, tensor, group=self.group, async_op=True), self.lost)
