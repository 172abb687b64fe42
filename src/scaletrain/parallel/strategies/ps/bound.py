"""Bounded staleness for an asynchronous parameter server (``--max-staleness S``): stale synchronous
parallel, Ho, Cipar, Cui, Kim, Lee, Gibbons, Gibson, Ganger and Xing (2013, "More effective distributed ML
via a stale synchronous parallel parameter server", NIPS).

A worker's *clock* is the number of gradients it has pushed. After its push ``c`` the owner applies the gradient at
once, as every asynchronous update, and holds its reply (the weights of the next step) until every worker that still
counts (not finished, not lost) has a clock of at least ``c − S``; the reply then carries the weights as they are
when it is released, the slow workers' updates included. ``S = 0`` is a barrier per step whose updates are still
applied one gradient at a time.

The clock travels in the request's header (``batches done``), and every worker pushes to every owner each step, so
every owner sees the same clocks: a sharded server's owners agree without talking to one another. A worker that
sends ``done`` or that the server lost stops counting, so it holds nobody back. With ``N`` counted workers a gradient
is at most ``(N − 1)(2S + 1)`` of its owner's updates stale (docs/distributed.md says why). The bound pays when one
worker is much slower than the others; the fast workers then wait, which the server measures (``staleness_wait``).

>>> clocks = {1: 5, 2: 3, 3: 4}
>>> allowed(clocks, 6, limit=2), allowed(clocks, 6, limit=3), slowest(clocks)
(False, True, (2, 3))
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from scaletrain.parallel.strategies.ps.protocol import PeerLost
from scaletrain.parallel.strategies.ps.records import ServerStats
from scaletrain.train.meter import now

__all__ = ["StalenessBound", "StalenessTimeout", "allowed", "slowest", "staleness_guarantee"]


class StalenessTimeout(PeerLost):
    """A held worker waited past the bound's deadline for the slowest one."""


def allowed(clocks: dict[int, int], clock: int, *, limit: int) -> bool:
    """Whether a worker whose clock is ``clock`` may go on: every counted clock is at least ``clock − limit``."""
    return all(other >= clock - limit for other in clocks.values())


def slowest(clocks: dict[int, int]) -> tuple[int, int]:
    """The counted worker with the lowest clock (the lowest rank among ties) and its clock."""
    return min(clocks.items(), key=lambda item: (item[1], item[0]))


def staleness_guarantee(limit: int, workers: int) -> int:
    """The most updates an applied gradient can be stale under ``--max-staleness limit``: ``(N − 1)(2S + 1)``.

    >>> staleness_guarantee(0, 3), staleness_guarantee(1, 3)
    (2, 6)
    """
    return (workers - 1) * (2 * limit + 1)


class StalenessBound:
    """An owner's side of ``--max-staleness``: the workers' clocks (in ``stats``, so a server rebuilt after
    a reconfiguration goes on from them), and the hold of a reply.

    ``workers``: every worker that pushes to this owner (its own worker too, for a sharded owner).
    ``deadline``: the most seconds a reply is held; a lagging worker's own link times out sooner
    (``--timeout``), and a lost worker stops counting, so it is reached only by a worker that is alive but
    stuck; the hold then fails naming it.
    """

    def __init__(self, limit: int, workers: Iterable[int], stats: ServerStats, deadline: float) -> None:
        if limit < 0:
            raise ValueError(f"max_staleness must be ≥ 0, got {limit!r}")
        self.limit, self.workers, self.stats, self.deadline = limit, sorted(workers), stats, deadline
        self.failure: StalenessTimeout | None = None

    def pushed(self, worker: int, clock: int) -> None:
        """``worker``'s push ``clock`` was applied (the caller holds the server's lock and wakes the held)."""
        self.stats.clocks[worker] = max(clock, self.stats.clocks.get(worker, 0))

    def counted(self) -> dict[int, int]:
        """The clocks of the workers that still hold the others back: not finished, not lost."""
        gone = self.stats.finished | set(self.stats.lost)
        return {worker: self.stats.clocks.get(worker, 0) for worker in self.workers if worker not in gone}

    def hold(self, condition: threading.Condition, worker: int, clock: int) -> None:
        """Wait (``condition`` held, released while waiting) until ``worker`` after push ``clock`` is within
        the bound; record the wait. Raises :class:`StalenessTimeout` past the deadline."""
        if allowed(self.counted(), clock, limit=self.limit):
            return
        begin = now()
        end = begin + self.deadline
        while self.failure is None and not allowed(self.counted(), clock, limit=self.limit):
            left = end - now()
            if left <= 0:
                behind, at = slowest(self.counted())
                self.failure = StalenessTimeout(
                    f"worker rank {behind} made no push past {at} within {self.deadline:.0f} s while worker rank "
                    f"{worker} waited at {clock} (--max-staleness {self.limit}): it is stuck or far too slow"
                )
                condition.notify_all()
                break
            condition.wait(min(left, 1.0))
        waited = now() - begin
        self.stats.held += 1
        self.stats.held_seconds[worker] = self.stats.held_seconds.get(worker, 0.0) + waited
        if self.failure is not None:
            raise self.failure

    def summary(self) -> dict[str, object]:
        """For ``summary.json``: the bound, what it guarantees, and how long workers waited for it."""
        pushes = sum(self.stats.clocks.values())
        seconds = sum(self.stats.held_seconds.values())
        return {
            "max_staleness": self.limit,
            "guaranteed_max": staleness_guarantee(self.limit, len(self.workers)),
            "seconds": round(seconds, 6),
            "seconds_per_step": seconds / pushes if pushes else 0.0,
            "held_steps": self.stats.held,
            "by_worker": {str(worker): round(self.stats.held_seconds.get(worker, 0.0), 6) for worker in self.workers},
        }
