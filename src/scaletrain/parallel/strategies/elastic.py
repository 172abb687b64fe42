"""Elastic all-reduce (``--min-workers M``): a run that loses a worker goes on with the survivors, and workers
started later (``--join``) are admitted at a step boundary.

A worker that dies (its connections close) or stops answering (its heartbeat stands still for
:data:`~scaletrain.parallel.heartbeat.FROZEN_SECONDS` while rank 0 waits in the step's collective; otherwise the
collective waits out ``--timeout``) makes every survivor's all-reduce fail before any update of that step is applied
(:class:`~scaletrain.train.exchange.PeerLost`). The survivors agree on the new membership through the rendezvous
store, as reconfigurations are agreed (:mod:`scaletrain.parallel.agreement`). The first to fail writes
``membership/G/lost``, which the others' waits watch, and each writes ``membership/G/alive/RANK`` (its step, and
``died``, ``stopped answering`` or nothing). Rank 0, which hosts the store, waits until every member of generation
``G`` has reported or has a heartbeat silent for :data:`~scaletrain.parallel.heartbeat.SILENCE_SECONDS` (at most
``--timeout``) and writes ``membership/G/decision``: the survivors, who left and why, who is furthest ahead. Every
survivor joins a new gloo group under ``membership/G+1/``, takes weights, optimizer state and position from the
survivor furthest ahead, and does the step in flight again with its new part of each global batch. The rest of the
epoch is cut as at the start, so no sample is skipped or seen twice; ``split`` and ``join`` keep their global batch.

A joiner (``--join``, up to ``--max-workers``) draws the next launch rank (``membership/joined``) and asks under
``membership/request/K``. Rank 0 announces it in a step's one-number all-reduce, answers ``membership/answer/K`` at
that step's end (a compare-and-set: a joiner that gave up is never admitted), and members and joiner build group
``G+1``, the joiner taking the live state from rank 0 (:meth:`StoreMembership.join`, :meth:`StoreMembership.admit`).
The sharded server's workers use this membership too (:mod:`scaletrain.parallel.strategies.ps.elastic_sharded`); the
central server drops lost workers itself (:mod:`.ps.membership`). docs/distributed.md has the
figures and what is not covered yet.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from scaletrain.data.sampler import Part
from scaletrain.errors import ConfigError
from scaletrain.parallel.agreement import StoreAgreement
from scaletrain.parallel.failures import DROPPED_EXIT_CODE, Dropped, ProcessFailed
from scaletrain.parallel.heartbeat import FROZEN_SECONDS, SILENCE_SECONDS, SilenceWatch
from scaletrain.parallel.strategies.base import Layout
from scaletrain.parallel.strategies.elastic_rules import (
    SETTINGS_KEY,
    check_elastic_backend,
    check_elastic_batch,
    check_joining_settings,
    shared_settings,
)
from scaletrain.parallel.strategies.elastic_waits import ABANDONED
from scaletrain.train.exchange import PeerLost
from scaletrain.train.plan import WorkerPlan
from scaletrain.train.state import Membership, Regrouped

__all__ = [
    "DROPPED_EXIT_CODE",
    "JOINED_KEY",
    "Dropped",
    "StoreMembership",
    "request_key",
    "store_membership",
]

POLL_SECONDS = 0.05
#: How a lost worker is named, most telling first (a survivor can also report a reason of its own).
WHY_ORDER = ("stopped answering", "died")
#: What a joining worker that gave up waiting leaves as its answer, so that the run never admits it.
WITHDRAWN = "withdrawn"
#: Each joining worker draws its number here (1, 2 …); its launch rank follows the run's own workers.
JOINED_KEY = "membership/joined"


def request_key(number: int) -> str:
    """Where joining worker ``number`` asks to join."""
    return f"membership/request/{number}"


def answer_key(number: int) -> str:
    return f"membership/answer/{number}"


def store_membership(
    store: dist.Store,
    rank: int,
    layout: Layout,
    config: Any,
    batch_size: int,
    kind: type[StoreMembership] | None = None,
) -> StoreMembership:
    """The membership of an elastic run's worker (``config``: its :class:`~scaletrain.config.TrainConfig`), once the
    batch and (but for a joining worker, which has no group yet) the process group are checked: started by
    another launcher, this process may be the first to see them. ``kind``: a strategy's own subclass of
    :class:`StoreMembership` (what the members hand each other), or that class itself."""
    check_elastic_batch(config, layout, batch_size)
    if not config.join:
        check_elastic_backend(dist.get_backend())
    return (kind or StoreMembership)(
        store,
        rank=rank,
        layout=layout,
        minimum=config.min_workers,
        maximum=config.max_workers,
        timeout=config.timeout,
        settings=shared_settings(config),
    )


class StoreMembership(Membership):
    """The members of an elastic all-reduce run, agreed through the rendezvous ``store`` (its keys of the
    whole run, not a group's prefix). ``rank``: this process's rank at launch, which names it throughout."""

    def __init__(
        self,
        store: dist.Store,
        *,
        rank: int,
        layout: Layout,
        minimum: int,
        timeout: float,
        maximum: int | None = None,
        settings: dict[str, Any] | None = None,
    ) -> None:
        self.store, self.rank, self.layout = store, rank, layout
        self.minimum, self.timeout = minimum, timeout
        self.maximum = maximum or layout.workers
        self._next_request = 1  # the deciding member's: the next joining worker's number (from 1)
        self.settings = settings or {}
        if rank == layout.worker_ranks()[0] and settings is not None:  # for workers that join, to compare
            store.set(SETTINGS_KEY, json.dumps(settings, default=str))
        self.members = layout.worker_ranks()
        self.generation = 0
        self.factor = layout.worker_plan(self.members[0]).global_batch_factor
        self._unrecorded: list[dict[str, Any]] = []  # joiners of an admission a loss interrupted
        self.watch = SilenceWatch(store, FROZEN_SECONDS)
        #: the last change's record, as this worker joined its group (a strategy may add to it before it is written)
        self.record: dict[str, Any] | None = None
        self.source: int | None = None  # whose live state the members went on from, at the last change
        self._noticed: str | None = None  # why the first member saw a peer lost itself (a heartbeat stood still)
        #: launch ranks whose connection this worker saw close in the step (a strategy that knows the peer says so:
        #: the decision need not wait for their heartbeat's silence)
        self.closed: list[int] = []

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
        self, step: int, why: str | None, live_state: Callable[[], dict[str, Any]], *, in_flight: bool = True
    ) -> tuple[Regrouped, dict[str, Any] | None]:
        prefix = f"membership/{self.generation}/"
        why, self._noticed = why if why is not None else self._noticed, None
        self.join_due = False  # a join agreed in the failed step is asked again at the next one
        try:
            # Wakes survivors that wait in a collective on this process (a ring waits on its neighbour, not on
            # the lost worker), so that they need not wait out --timeout (see watched()).
            self.store.set(f"{prefix}lost", "1")
            report = {"step": step, "why": why, "in_flight": in_flight, "closed": self.closed}
            self.closed = []
            # said before this process's connections close below: a peer that sees them close then reports it
            # as closed, and the decision must find this report first
            self.store.set(f"{prefix}alive/{self.rank}", json.dumps(report))
            if dist.is_initialized():  # not when the group being built was the one that failed
                ABANDONED.append(dist.group.WORLD)
                dist.destroy_process_group()
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
        return self._regroup_to(decision, live_state, in_flight=in_flight)

    def join_requested(self) -> bool:
        """Whether a worker waits to join (asked by the deciding member before each step's all-reduce: one
        store check; the others learn it from that all-reduce). A worker that would exceed ``--max-workers``
        is told so here and never disturbs the run."""
        if self.rank != self.members[0]:
            return False
        if len(self.members) >= self.maximum:
            self.refuse_waiting(f"the run already has {len(self.members)} workers, its --max-workers {self.maximum}")
            return False
        while self.store.check([request_key(self._next_request)]):
            if not self.store.check([answer_key(self._next_request)]):
                return True
            self._next_request += 1  # it gave up waiting (withdrawn): nobody to admit
        return False

    def refuse_waiting(self, why: str) -> None:
        """The deciding member: tell every worker waiting to join that it cannot, and ``why``."""
        while self.store.check([request_key(self._next_request)]):
            self._answer(self._next_request, {"refused": why})
            self._next_request += 1

    def admit(self, live_state: Callable[[], dict[str, Any]]) -> tuple[Regrouped, dict[str, Any]]:
        """Every member, at the step boundary where they agreed a worker waits: admit it (the deciding member
        decides who), rebuild the group with it, and hand it the live state of the deciding member."""
        prefix = f"membership/{self.generation}/"
        self.join_due = False
        decision = self._admission(prefix) if self.rank == self.members[0] else self._read(prefix)
        dist.destroy_process_group()  # a healthy group: nothing is pending in it
        return self._regroup_to(decision, live_state, in_flight=False)

    def join(self) -> tuple[Regrouped, dict[str, Any]]:
        """A worker started mid-run (``--join``; ``self.rank``: its launch rank, after the run's own workers):
        ask to join, wait (within ``--timeout``) to be admitted at a step boundary, join the new group and
        take the live state from a member."""
        number = self.rank - max(self.layout.worker_ranks())
        check_joining_settings(self.store, self.settings, self.timeout)
        self.store.set(request_key(number), json.dumps({"rank": self.rank, "asked": time.time()}))
        answer = answer_key(number)
        with contextlib.suppress(RuntimeError):  # not admitted in time: withdrawn below
            self.store.wait([answer], datetime.timedelta(seconds=self.timeout))
        # withdraws the request unless the run answered first, so that it never admits a worker that left
        if self.store.compare_set(answer, "", WITHDRAWN).decode() == WITHDRAWN:
            raise ConfigError(
                f"the run did not admit this worker within --timeout {self.timeout:g} s (it admits at step "
                "boundaries); give a longer --timeout, or check that the run is still training"
            )
        answer = json.loads(self.store.get(answer))
        if "refused" in answer:
            raise ConfigError(f"this worker cannot join: {answer['refused']}")
        self.generation = answer["admitted"]
        try:
            return self._regroup_to(self._read(f"membership/{self.generation}/"), lambda: {}, in_flight=False)
        except PeerLost:
            raise ProcessFailed(
                f"joining worker rank {self.rank}: a member of the run was lost while this worker joined; the others "
                "go on without both; start this worker again to join"
            ) from None

    def _admission(self, prefix: str) -> dict[str, Any]:
        """The deciding member: admit the waiting workers while there is room, and say so to them and to the
        members (the same decision as after a loss, with ``joined``)."""
        admitted, joined = list(self.members), []
        while len(admitted) < self.maximum and self.store.check([request_key(self._next_request)]):
            request = json.loads(self.store.get(request_key(self._next_request)))
            # the worker may have given up waiting just now: then it is not admitted
            if self._answer(self._next_request, {"admitted": self.generation}):
                admitted.append(request["rank"])
                waited = round(time.time() - request["asked"], 3)
                joined.append({"rank": request["rank"], "why": "asked to join", "waited_seconds": waited})
            self._next_request += 1
        decision = {
            "members": admitted,
            "left": [],
            "joined": joined,
            "source": self.members[0],
            "steps_redone": 0,
        }
        self.store.set(f"{prefix}decision", json.dumps(decision))  # the members' and the joiners'
        return decision

    def _answer(self, number: int, answer: dict[str, Any]) -> bool:
        """Answer request ``number`` unless its worker withdrew it; whether the answer stands."""
        text = json.dumps(answer)
        return self.store.compare_set(answer_key(number), "", text).decode() == text

    def _regroup_to(
        self, decision: dict[str, Any], live_state: Callable[[], dict[str, Any]], *, in_flight: bool
    ) -> tuple[Regrouped, dict[str, Any]]:
        """Join the group of ``decision``'s members and take the live state of its ``source``. A member that
        never comes (a joiner that died after asking) or is lost meanwhile raises :class:`PeerLost`: the
        members agree again, as after any loss (``in_flight``: whether a step is still to be done again)."""
        members = decision["members"]
        self.generation += 1
        self.members = members
        index = members.index(self.rank)
        source = members.index(decision["source"])
        shared = [live_state() if index == source else None]
        try:
            dist.init_process_group(
                "gloo",  # elastic runs are gloo only (check_elastic_backend)
                store=dist.PrefixStore(f"membership/{self.generation}/group/", self.store),
                rank=index,
                world_size=len(members),
                timeout=datetime.timedelta(seconds=self.timeout),
            )
            dist.broadcast_object_list(shared, src=source)
        except RuntimeError as error:
            print(f"lost a peer while the group was built: {str(error).splitlines()[0]}", flush=True)  # to the log
            why = "stopped answering" if "timed out" in str(error).lower() else "died"
            self._unrecorded += decision.get("joined", [])  # the next decision records who joined, if they go on
            raise PeerLost(why, in_flight=in_flight) from error
        workers = len(members)
        plan = WorkerPlan(
            global_batch_factor=self.factor, part=Part(index, workers), batch_fraction=self.factor / workers
        )
        record = {
            "step": shared[0]["position"]["step"],
            "epoch": shared[0]["position"]["epoch"],
            "batch": shared[0]["position"]["batch"],
            "left": decision["left"],
            "joined": decision.get("joined", []),
            "workers": workers,
            "members": members,
            "steps_redone": decision["steps_redone"],
        }
        self.record, self.source = record, decision["source"]
        return Regrouped(plan=plan, workers=workers, agreement=self.agreement(), record=record), shared[0]

    def _decide(self, prefix: str) -> dict[str, Any]:
        """Rank 0: wait for every member's report, or for its heartbeat to stand still; write the decision."""
        start = time.monotonic()
        # Silence counted from now: while every survivor stands here the links are quiet, so a member that is
        # alive reports or beats within SILENCE_SECONDS even behind a slow link (under a step's traffic a beat
        # can wait seconds for TCP to resend it, so a silence seen before is not enough). A member whose
        # connection a survivor saw close is not waited for.
        watch, reports = SilenceWatch(self.store, SILENCE_SECONDS), {}
        while True:
            self._take_reports(prefix, reports)
            closed = {peer for report in reports.values() for peer in report.get("closed", [])}
            unsure = [rank for rank in self.members if rank not in reports and rank not in closed]
            if len(watch.silent(unsure)) == len(unsure) or time.monotonic() - start > self.timeout:
                break
            time.sleep(POLL_SECONDS)
        self._take_reports(prefix, reports)  # one that reported while the others' were read is no less alive
        reported = [rank for rank in self.members if rank in reports]
        missing = [rank for rank in self.members if rank not in reports]
        # what the survivors saw: one whose wait ran out says more than one that saw connections close
        seen = [report["why"] for report in reports.values() if report["why"] is not None]
        why = next((reason for reason in WHY_ORDER if reason in seen), seen[0] if seen else "died")
        steps = {rank: report["step"] for rank, report in reports.items()}
        furthest, in_flight = max(steps.values()), any(report["in_flight"] for report in reports.values())
        joined, self._unrecorded = [who for who in self._unrecorded if who["rank"] in reported], []
        decision = {
            "members": reported,
            "left": [{"rank": rank, "why": "died" if rank in closed else why} for rank in missing],
            "joined": joined,  # admitted while a member was lost: this change records both
            "source": min(rank for rank, step in steps.items() if step == furthest),
            # a survivor that completed the step in flight hands it to the others: nothing is done again
            "steps_redone": int(min(steps.values()) == furthest and in_flight),
        }
        self.store.set(f"{prefix}decision", json.dumps(decision))
        return decision

    def _take_reports(self, prefix: str, reports: dict[int, dict[str, Any]]) -> None:
        """Add to ``reports`` the members' reports under ``prefix`` that are there now."""
        for rank in self.members:
            if rank not in reports and self.store.check([f"{prefix}alive/{rank}"]):
                reports[rank] = json.loads(self.store.get(f"{prefix}alive/{rank}"))

    def _read(self, prefix: str) -> dict[str, Any]:
        limit = self.timeout + SILENCE_SECONDS + 5.0
        try:
            self.store.wait([f"{prefix}decision"], datetime.timedelta(seconds=limit))
        except RuntimeError:
            raise ProcessFailed(
                f"worker rank {self.rank}: worker rank 0 did not say who goes on within {limit:.0f} s of a "
                "membership change; the run cannot go on without rank 0 (it hosts the store), even with --min-workers"
            ) from None
        return json.loads(self.store.get(f"{prefix}decision"))
