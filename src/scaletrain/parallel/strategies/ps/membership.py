"""An elastic central server (``--min-workers`` with ``--strategy ps --server central``, ``join`` or
``split``): a worker that dies or stops answering is dropped, and the survivors go on.

The server sees a loss first: the thread that serves the lost worker's pair fails (its connection
closed: ``died``; no request within ``--timeout``: ``stopped answering``). While at least
``--min-workers`` remain, the server then

1. takes the worker out of the membership and starts a new *generation*: the update in flight is
   not made (the gradients of it that arrived are dropped), and the number of gradients an update
   waits for is the survivors';
2. writes the generation's record under ``membership/central/G`` in the rendezvous store (who goes on,
   who left and why, the step in flight), before it tells anyone;
3. answers each survivor's next gradient (or the one it waits with) with a reply marked :data:`REDO`
   and the generation: the weights are those the step began from, the step is not applied.

A survivor told to redo reads the record (:class:`CentralMembership`), takes its part of the rest of the
epoch's global batches by the same rule as at start (index among the survivors, one part each), and
does the step in flight again. Every global batch is thus applied once, computed by the members of one
generation: no sample of the epoch is skipped or seen twice. ``split`` keeps the global batch;
``join`` keeps N·b as well (each survivor computes N/N' of its former rows), as the elastic all-reduce
does (:mod:`scaletrain.parallel.strategies.elastic`). Losing the server (rank 0: it hosts the store and
the weights) stops the run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from scaletrain.data.sampler import Part
from scaletrain.parallel.agreement import StoreAgreement
from scaletrain.parallel.failures import Dropped
from scaletrain.parallel.heartbeat import FROZEN_SECONDS, SilenceWatch
from scaletrain.parallel.strategies.ps.records import ServerObserver
from scaletrain.train.membership import membership_segments
from scaletrain.train.plan import WorkerPlan
from scaletrain.train.state import Membership, Regrouped

__all__ = ["REDO", "CentralMembership", "Members", "membership_key"]

#: A reply's ``skipped`` field when the step it answers was not applied: do it again with the generation's members.
REDO = 2


def membership_key(generation: int) -> str:
    return f"membership/central/{generation}"


class Members:
    """The server's side: who takes part in each update, and the record of each change.

    With ``observer`` (the central server's), each change is written to ``metrics.jsonl`` and said on the
    terminal once the first update after it is made (with ``seconds_to_recover``: from the loss's detection
    to that update), and a checkpoint averages the survivors' module buffers only. ``watch``: the
    heartbeats, so that a frozen worker is dropped as soon as its heartbeat stood still for the watch's
    seconds, not after ``--timeout``."""

    def __init__(
        self,
        peers: list[int],
        *,
        minimum: int,
        store: dist.Store,
        observer: ServerObserver | None = None,
        watch: SilenceWatch | None = None,
    ) -> None:
        self.active, self.minimum, self.store = sorted(peers), minimum, store
        self.observer, self.watch = observer, watch
        self.generation = 0
        self.changes: list[dict[str, Any]] = []
        self.start = (observer.prepared.position.step if observer is not None else 0, time.time())
        self._told = dict.fromkeys(peers, 0)  # the generation each peer last heard of
        self._pending: dict[str, Any] | None = None

    @classmethod
    def of_server(cls, observer: ServerObserver, peers: list[int], store: dist.Store) -> Members:
        """The central server's, calling a worker frozen after :data:`FROZEN_SECONDS` of heartbeat silence."""
        minimum = observer.prepared.config.min_workers
        return cls(peers, minimum=minimum, store=store, observer=observer, watch=SilenceWatch(store, FROZEN_SECONDS))

    def drop(self, peer: int, why: str, step: int) -> bool:
        """Take ``peer`` out after a loss at ``step`` (updates made so far); False when too few would be left
        (the run then stops as without ``--min-workers``). The caller holds the server's lock."""
        if peer not in self.active:
            return True
        if len(self.active) - 1 < self.minimum:
            return False
        self.active.remove(peer)
        self.generation += 1
        left = {"rank": peer, "why": why}
        if self._pending is not None:  # a second loss before the first was recovered from: one change
            self._pending["left"].append(left)
        else:
            self._pending = {"step": step, **self._position(step), "left": [left], "steps_redone": 0}
            self._pending["detected"] = time.time()
        self._pending |= {"workers": len(self.active), "members": list(self.active)}
        self.store.set(membership_key(self.generation), json.dumps(self._pending))
        if self.observer is not None:  # a checkpoint's buffers are the survivors' mean
            self.observer.agreement.workers = tuple(self.active)
        return True

    def silent(self, seconds: float | None = None) -> list[int]:
        """The members whose heartbeat stood still (asked while the server waits for an update's gradients):
        for the watch's seconds, or for ``seconds`` (a shorter silence: a member to probe)."""
        return self.watch.silent(self.active, seconds) if self.watch is not None else []

    def redo(self, peer: int) -> bool:
        """Whether ``peer``'s gradient was computed without knowing of the last change (it must be done again);
        if so, ``peer`` is told now, by the reply the caller sends."""
        if self._told[peer] == self.generation:
            return False
        self._told[peer] = self.generation
        if self._pending is not None:
            self._pending["steps_redone"] = 1  # a survivor had computed the step in flight
        return True

    def updated(self) -> None:
        """An update was made: the change being recovered from (if any) is complete."""
        if self._pending is None:
            return
        record = {key: value for key, value in self._pending.items() if key != "detected"}
        record["seconds_to_recover"] = round(time.time() - self._pending["detected"], 3)
        record["recovered"] = time.time()
        self._pending = None
        self.changes.append(record)
        if self.observer is not None:
            self.observer.metrics.write({"kind": "membership", **record})
            left = ", ".join(f"worker rank {who['rank']} ({who['why']})" for who in record["left"])
            self.observer.message(f"step {record['step'] + 1}: {left} left; going on with {record['workers']} workers")

    def segments(self, workers: int, end_step: int) -> list[dict[str, Any]]:
        """Throughput per membership from the server's start to now (:func:`membership_segments`)."""
        return membership_segments(self.changes, workers=workers, start=self.start, end=(end_step, time.time()))

    def _position(self, step: int) -> dict[str, int]:
        """Where the step in flight after ``step`` updates stands in its epoch."""
        if self.observer is None:
            return {}
        where = self.observer.prepared.schedule.position(step)
        return {"epoch": where.epoch, "batch": where.batch}


class CentralMembership(Membership):
    """A worker's side: told to redo a step (``exchange.redo_generation``), it reads who goes on."""

    def __init__(self, store: dist.Store, *, rank: int, exchange: Any, factor: int, timeout: float) -> None:
        self.store, self.rank, self.exchange = store, rank, exchange
        self.factor, self.timeout = factor, timeout

    def regroup(
        self, step: int, why: str | None, live_state: Callable[[], dict[str, Any]], *, in_flight: bool = True
    ) -> tuple[Regrouped, dict[str, Any] | None]:
        generation, self.exchange.redo_generation = self.exchange.redo_generation, None
        record = json.loads(self.store.get(membership_key(generation)))  # written before the reply was sent
        members = record["members"]
        if self.rank not in members:  # its heartbeat stood still while the server waited: it went on without it
            raise Dropped("the server went on without this worker: it stopped answering for longer than it waited")
        workers = len(members)
        plan = WorkerPlan(
            global_batch_factor=self.factor,
            part=Part(members.index(self.rank), workers),
            batch_fraction=self.factor / workers,
        )
        agreement = StoreAgreement(
            self.store, deciding=self.rank == members[0], timeout=self.timeout, rank=self.rank, workers=tuple(members)
        )
        # the reply carried the weights the step began from: nothing to take from a peer
        return Regrouped(plan=plan, workers=workers, agreement=agreement, record=record), None
