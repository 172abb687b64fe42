"""Heartbeats in the rendezvous store, to name the process that stopped answering.

When a collective times out, every surviving process knows only that *someone* did not answer.
Each process therefore counts up a key ``heartbeat/RANK`` in the store four times a second from
a thread of its own, over its own connection. A frozen process (``SIGSTOP``, a machine that hangs)
stops counting; a survivor that hits a timeout reads the counters twice and names the ranks whose
counters stood still. If the store itself does not answer, the process hosting it (rank 0, unless
torchrun's agent hosts it) is the one that stopped.

A process that has done its part marks itself finished as it leaves, so a survivor that still
expected it (a defect) is told that it left, not that it stopped or died.

A busy store is not a stopped one: with many processes on few cores (16 workers on 2) the store's
thread may take seconds to accept a connection or answer a count. The heartbeat connects within
the run's timeout, as the process group did, and a beat that times out is tried again at the next
beat instead of ending the heartbeat (which would have a healthy process named as stopped).
"""

from __future__ import annotations

import contextlib
import datetime
import threading
import time

import torch.distributed as dist

from scaletrain.parallel.rendezvous import Rendezvous, own_keys

__all__ = ["FROZEN_SECONDS", "SILENCE_SECONDS", "Heartbeat", "SilenceWatch"]

#: Often enough that an elastic run's survivors know a lost worker's silence within a second or two
#: (:data:`SILENCE_SECONDS`); 4 counts a second per process.
INTERVAL_SECONDS = 0.25
#: An elastic run's decision drops a member whose heartbeat did not move for this long since the decision
#: began, and that did not report: five missed beats. A process that is alive but slow keeps beating from its
#: own thread, and no step's traffic competes with the beats then.
SILENCE_SECONDS = 1.25
#: A member waiting in a step calls a peer frozen whose heartbeat stood still this long (and starts the
#: decision). Longer than :data:`SILENCE_SECONDS`: under a step's traffic on a slow link a beat may wait for
#: TCP to resend it (on an emulated 100 Mbit/s link, 1.5 s of silence happened to live workers).
FROZEN_SECONDS = 5.0
#: How long a survivor watches the counters: many beats, so a slow-but-alive process still counts.
WATCH_SECONDS = 3.5
STORE_TIMEOUT_SECONDS = 5.0


class Heartbeat:
    """This process's heartbeat; :meth:`silent_ranks` names the ranks whose heartbeat stopped."""

    def __init__(self, rendezvous: Rendezvous, connect_timeout: float = STORE_TIMEOUT_SECONDS) -> None:
        self.rendezvous = rendezvous
        self._stop = threading.Event()
        self._store = _client(rendezvous, connect_timeout)
        self._thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        key = _beat_key(self.rendezvous.rank)
        while not self._stop.is_set():
            # A beat that fails (a busy store, or one that is gone as the run ends or its host stopped)
            # is tried again at the next: the survivors say which process stopped.
            with contextlib.suppress(RuntimeError):
                self._store.add(key, 1)
            self._stop.wait(INTERVAL_SECONDS)

    def silent_ranks(self) -> list[int]:
        """The other ranks whose heartbeat did not move for :data:`WATCH_SECONDS` (blocks that long),
        leaving out those that finished.

        When the store does not answer, the rank that hosts it, if that is not this one.
        """
        others = self._others()
        try:
            before = {rank: self._count(rank) for rank in others}
            time.sleep(WATCH_SECONDS)
            after = {rank: self._count(rank) for rank in others}
            finished = set(self.finished_ranks())
        except RuntimeError:
            host = None if self.rendezvous.agent_store else 0
            return [host] if host is not None and host != self.rendezvous.rank else []
        return [rank for rank in others if before[rank] == after[rank] and rank not in finished]

    def finished_ranks(self) -> list[int]:
        """The other ranks that did their part and left (see :meth:`stop`)."""
        return [rank for rank in self._others() if self._store.check([_finished_key(rank)])]

    def _others(self) -> list[int]:
        return [rank for rank in range(self.rendezvous.world_size) if rank != self.rendezvous.rank]

    def _count(self, rank: int) -> int:
        return self._store.add(_beat_key(rank), 0)

    def stop(self, *, finished: bool = False) -> None:
        """Stop beating, waiting for a beat under way (at most a count's timeout), so that none lands after this
        returns (a survivor would read it as life); ``finished``: this process did its part, so it is named as
        having left, not stopped."""
        self._stop.set()
        self._thread.join(timeout=STORE_TIMEOUT_SECONDS + INTERVAL_SECONDS)
        if finished:
            with contextlib.suppress(RuntimeError):  # the store's host may have left already
                self._store.set(_finished_key(self.rendezvous.rank), "1")


class SilenceWatch:
    """Which ranks' heartbeats stood still for ``seconds``, from ``store`` (the run's keys), read at most once
    per beat however often asked: an elastic run's survivors drop a frozen worker on this, without waiting
    out ``--timeout`` (a process that is alive beats from its own thread, however busy its main thread)."""

    def __init__(self, store: dist.Store, seconds: float) -> None:
        self.store, self.seconds = store, seconds
        self._seen: dict[int, tuple[int, float]] = {}  # rank: its count, and when it last moved
        self._asked = float("-inf")

    def silent(self, ranks: list[int], seconds: float | None = None) -> list[int]:
        """Those of ``ranks`` whose count stood still for ``seconds`` (default: the watch's) as far as seen."""
        seconds = self.seconds if seconds is None else seconds
        clock = time.monotonic()
        if clock - self._asked >= INTERVAL_SECONDS:
            self._asked = clock
            for rank in ranks:
                count = self.count(rank)
                if self._seen.get(rank, (None,))[0] != count:
                    self._seen[rank] = (count, clock)
        return [rank for rank in ranks if rank in self._seen and clock - self._seen[rank][1] >= seconds]

    def still_for(self, rank: int) -> float:
        """How long ``rank``'s count has stood still as far as this watch saw (0 when never read)."""
        return time.monotonic() - self._seen[rank][1] if rank in self._seen else 0.0

    def count(self, rank: int) -> int:
        return self.store.add(_beat_key(rank), 0)


def _beat_key(rank: int) -> str:
    """Where ``rank`` counts up its heartbeat in the store."""
    return f"heartbeat/{rank}"


def _finished_key(rank: int) -> str:
    return f"heartbeat-finished/{rank}"


def _client(rendezvous: Rendezvous, connect_timeout: float) -> dist.Store:
    """A connection of its own to the run's store (the main one may be blocked in a wait), made within
    ``connect_timeout`` seconds; each count then waits at most :data:`STORE_TIMEOUT_SECONDS`."""
    store = dist.TCPStore(
        rendezvous.master_addr,
        rendezvous.master_port,
        is_master=False,
        timeout=datetime.timedelta(seconds=max(connect_timeout, STORE_TIMEOUT_SECONDS)),
        wait_for_workers=False,
    )
    store.set_timeout(datetime.timedelta(seconds=STORE_TIMEOUT_SECONDS))
    return own_keys(store, rendezvous)
