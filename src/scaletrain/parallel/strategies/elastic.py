"""Elastic all-reduce (``--min-workers M``): a run that loses a worker goes on with the survivors.

When a worker dies (its connections close) or stops answering (its heartbeat stands still for
:data:`~scaletrain.parallel.heartbeat.SILENCE_SECONDS`, which rank 0 watches while it waits in the step's
collective; otherwise the collective waits out ``--timeout``), every survivor's all-reduce fails before
any update of that step is applied (:class:`~scaletrain.train.exchange.PeerLost`). The survivors then
agree on the new membership through the rendezvous store, as reconfiguration decisions are agreed
(:mod:`scaletrain.parallel.agreement`):

1. the first survivor to fail says so under ``membership/G/lost``, which the others' waits watch
   (:func:`watched`), so that no survivor waits out ``--timeout`` on another survivor; each survivor
   writes ``membership/G/alive/RANK``: its step, and what it saw (``died``: connections closed;
   ``stopped answering``: its wait ran out; nothing when it only heard of the loss);
2. rank 0, which hosts the store, waits until every member of generation ``G`` has either reported or
   has a heartbeat (:mod:`scaletrain.parallel.heartbeat`) that stood still for :data:`SILENCE_SECONDS`
   (at most ``--timeout``), and writes ``membership/G/decision``: the survivors, who left and why,
   and the survivor furthest ahead (one may have completed the step in flight before the loss);
3. every survivor joins a new gloo group over the survivors (ranks in the old ranks' order, the store's
   keys under a fresh prefix ``membership/G+1/``), takes weights, optimizer state and position from the
   survivor furthest ahead, and does the step in flight again with its new part of each global batch.

The rest of the epoch is re-partitioned by the same rule as at start: each global batch (whose samples
depend on the seed and epoch only) is cut into one part per survivor, so no sample of the epoch is
skipped or seen twice. ``split`` keeps the global batch of ``--batch-size``; ``join`` keeps its global
batch of N·``--batch-size`` as well (so the learning rate stays right), each survivor computing N/N' of
its former share. A global batch that some membership from ``M`` to N cannot divide evenly is refused
before any process starts.

Not covered yet: losing rank 0 (it hosts the store: the run stops as without ``--min-workers``), the
sharded parameter server (the central one goes on: :mod:`scaletrain.parallel.ps.membership`), a worker
joining, techniques that reconfigure the network, synchronised batch norm, and NCCL (GPU) process groups:
elastic runs use gloo."""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from scaletrain.config import TrainConfig
from scaletrain.data.sampler import Part
from scaletrain.errors import ConfigError
from scaletrain.parallel.agreement import StoreAgreement
from scaletrain.parallel.failures import DROPPED_EXIT_CODE, Dropped, ProcessFailed
from scaletrain.parallel.heartbeat import FROZEN_SECONDS, SILENCE_SECONDS, SilenceWatch
from scaletrain.parallel.strategies.base import Layout
from scaletrain.train.plan import WorkerPlan
from scaletrain.train.state import Membership, Regrouped

__all__ = [
    "DROPPED_EXIT_CODE",
    "Dropped",
    "HeardOfLoss",
    "StoreMembership",
    "check_elastic",
    "check_elastic_backend",
    "check_elastic_batch",
    "watched",
]

POLL_SECONDS = 0.05
#: How often a waiting collective asks the store whether another survivor has seen a peer lost.
WATCH_SECONDS = 0.02
#: How a lost worker is named, most telling first (a survivor can also report a reason of its own).
WHY_ORDER = ("stopped answering", "died")
#: Groups left behind, referenced until the process leaves (without destructors, parallel.teardown): freeing one
#: waits for a collective still pending in it (on a frozen peer: until --timeout).
_ABANDONED: list[dist.ProcessGroup] = []


def check_elastic(config: TrainConfig, layout: Layout) -> None:
    """Refuse ``--min-workers`` where the survivors could not go on (before any process starts)."""
    if config.min_workers is None:
        return
    central = layout.strategy == "ps" and layout.server == "central" and layout.sync != "async"
    if layout.strategy != "allreduce" and not central:
        raise ConfigError(
            f"--min-workers is supported with --strategy allreduce and the central parameter server (--sync join "
            f"or split) only for now, not {layout.label}; drop --min-workers (a lost worker then stops the run, "
            "continue with --resume; an asynchronous central server goes on without lost workers by itself)"
        )
    for flag, given in (("--technique", config.technique), ("--sync-batchnorm", config.sync_batchnorm or None)):
        if given is not None:
            raise ConfigError(f"--min-workers does not work with {flag} yet; drop one of them")


def check_elastic_backend(backend: str) -> None:
    """Refuse an elastic run whose process group is not gloo: regrouping is built and tested on gloo only."""
    if backend != "gloo":
        raise ConfigError(
            f"--min-workers regroups gloo process groups only for now, and this run's is {backend}; "
            "use --device cpu, or drop --min-workers"
        )


def check_elastic_batch(config: TrainConfig, layout: Layout, batch_size: int) -> None:
    """Every membership from ``--min-workers`` to ``--workers`` must divide the global batch evenly."""
    if config.min_workers is None:
        return
    factor = layout.worker_plan(layout.worker_ranks()[0]).global_batch_factor
    total = batch_size * factor
    uneven = [count for count in range(config.min_workers, layout.workers + 1) if total % count]
    if uneven:
        raise ConfigError(
            f"with --min-workers {config.min_workers} the global batch of {total} must divide evenly over every "
            f"worker count from {config.min_workers} to {layout.workers}, and {', '.join(map(str, uneven))} "
            "does not; choose a batch size that does (or another --min-workers)"
        )


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


class StoreMembership(Membership):
    """The members of an elastic all-reduce run, agreed through the rendezvous ``store`` (its keys of the
    whole run, not a group's prefix). ``rank``: this process's rank at launch, which names it throughout."""

    def __init__(self, store: dist.Store, *, rank: int, layout: Layout, minimum: int, timeout: float) -> None:
        self.store, self.rank, self.layout = store, rank, layout
        self.minimum, self.timeout = minimum, timeout
        self.members = layout.worker_ranks()
        self.generation = 0
        self.factor = layout.worker_plan(self.members[0]).global_batch_factor
        self.watch = SilenceWatch(store, FROZEN_SECONDS)
        self._noticed: str | None = None  # why the first member saw a peer lost itself (a heartbeat stood still)

    @property
    def group_store(self) -> dist.Store:
        """The current group's keys: the launch store for the first group, a fresh prefix for each after."""
        return self.store if self.generation == 0 else dist.PrefixStore(f"membership/{self.generation}/", self.store)

    def peer_lost(self) -> bool:
        """Whether a survivor has said that a peer of the current group was lost; the first member (rank 0)
        also reads the heartbeats while it waits, so a frozen peer is found after :data:`FROZEN_SECONDS`
        rather than after ``--timeout`` (the decision then gives every member its chance to report)."""
        if self.store.check([f"membership/{self.generation}/lost"]):
            return True
        if self.rank == self.members[0] and self.watch.silent([rank for rank in self.members if rank != self.rank]):
            self._noticed = "stopped answering"
            return True
        return False

    def agreement(self) -> StoreAgreement:
        return StoreAgreement(
            self.group_store,
            deciding=self.members[0] == self.rank,
            timeout=self.timeout,
            rank=self.rank,
            workers=tuple(self.members),
            lost=self.peer_lost,
        )

    def regroup(
        self, step: int, why: str | None, live_state: Callable[[], dict[str, Any]]
    ) -> tuple[Regrouped, dict[str, Any] | None]:
        prefix = f"membership/{self.generation}/"
        why, self._noticed = why if why is not None else self._noticed, None
        backend = dist.get_backend()
        _ABANDONED.append(dist.group.WORLD)
        dist.destroy_process_group()
        try:
            # Wakes survivors that wait in a collective on this process (a ring waits on its neighbour, not on
            # the lost worker), so that they need not wait out --timeout (see watched()).
            self.store.set(f"{prefix}lost", "1")
            self.store.set(f"{prefix}alive/{self.rank}", json.dumps({"step": step, "why": why}))
            decision = self._decide(prefix) if self.rank == self.members[0] else self._read(prefix)
        except RuntimeError:
            raise ProcessFailed(
                f"worker rank {self.rank}: lost a peer, then the rendezvous store of worker rank 0; the run cannot go "
                "on without rank 0 (it hosts the store), even with --min-workers"
            ) from None
        survivors = decision["members"]
        if self.rank not in survivors:
            raise Dropped(
                "the other workers went on without this one: it stopped answering for longer than they waited"
            )
        if len(survivors) < self.minimum:
            left = ", ".join(str(who["rank"]) for who in decision["left"])
            raise ProcessFailed(
                f"worker rank {self.rank}: lost worker rank {left}; {len(survivors)} workers are left, fewer than "
                f"--min-workers {self.minimum}"
            )
        self.generation += 1
        self.members = survivors
        index = survivors.index(self.rank)
        dist.init_process_group(
            backend,
            store=dist.PrefixStore(f"membership/{self.generation}/group/", self.store),
            rank=index,
            world_size=len(survivors),
            timeout=datetime.timedelta(seconds=self.timeout),
        )
        source = survivors.index(decision["source"])
        shared = [live_state() if index == source else None]
        dist.broadcast_object_list(shared, src=source)
        workers = len(survivors)
        plan = WorkerPlan(
            global_batch_factor=self.factor, part=Part(index, workers), batch_fraction=self.factor / workers
        )
        record = {
            "step": shared[0]["position"]["step"],
            "epoch": shared[0]["position"]["epoch"],
            "batch": shared[0]["position"]["batch"],
            "left": decision["left"],
            "workers": workers,
            "members": survivors,
            "steps_redone": decision["steps_redone"],
        }
        return Regrouped(plan=plan, workers=workers, agreement=self.agreement(), record=record), shared[0]

    def _decide(self, prefix: str) -> dict[str, Any]:
        """Rank 0: wait for every member's report, or for its heartbeat to stand still; write the decision."""
        start = time.monotonic()
        # Silence counted from now: while every survivor stands here the links are quiet, so a member that is
        # alive reports or beats within SILENCE_SECONDS even behind a slow link (under a step's traffic a beat
        # can wait seconds for TCP to resend it, so a silence seen before is not enough).
        watch = SilenceWatch(self.store, SILENCE_SECONDS)
        while True:
            reported = [rank for rank in self.members if self.store.check([f"{prefix}alive/{rank}"])]
            missing = [rank for rank in self.members if rank not in reported]
            if len(watch.silent(missing)) == len(missing) or time.monotonic() - start > self.timeout:
                break
            time.sleep(POLL_SECONDS)
        reports = {rank: json.loads(self.store.get(f"{prefix}alive/{rank}")) for rank in reported}
        # what the survivors saw: one whose wait ran out says more than one that saw connections close
        seen = [report["why"] for report in reports.values() if report["why"] is not None]
        why = next((reason for reason in WHY_ORDER if reason in seen), seen[0] if seen else "died")
        steps = {rank: report["step"] for rank, report in reports.items()}
        furthest = max(steps.values())
        decision = {
            "members": reported,
            "left": [{"rank": rank, "why": why} for rank in missing],
            "source": min(rank for rank, step in steps.items() if step == furthest),
            # a survivor that completed the step in flight hands it to the others: nothing is done again
            "steps_redone": int(min(steps.values()) == furthest),
        }
        self.store.set(f"{prefix}decision", json.dumps(decision))
        return decision

    def _read(self, prefix: str) -> dict[str, Any]:
        limit = self.timeout + SILENCE_SECONDS + 5.0
        try:
            self.store.wait([f"{prefix}decision"], datetime.timedelta(seconds=limit))
        except RuntimeError:
            raise ProcessFailed(
                f"worker rank {self.rank}: lost a peer, and worker rank 0 did not say who goes on within "
                f"{limit:.0f} s; the run cannot go on without rank 0 (it hosts the store), even with --min-workers"
            ) from None
        return json.loads(self.store.get(f"{prefix}decision"))
