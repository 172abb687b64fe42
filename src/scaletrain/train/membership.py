"""An elastic run's membership changes as the training loop sees them (``--min-workers``): regrouping with
the survivors after a lost worker, admitting a worker started later (``--join``), and the record of each
change (``membership`` in ``summary.json``, ``"kind": "membership"`` in ``metrics.jsonl``)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, Protocol

import torch
from torch import nn

from scaletrain.train.exchange import PeerLost
from scaletrain.train.logs import MetricsLog
from scaletrain.train.records import RunRecords
from scaletrain.train.schedule import Position
from scaletrain.train.state import Prepared, Regrouped, Role
from scaletrain.workloads import Workload

__all__ = [
    "ElasticTrainer",
    "MembershipLog",
    "admit",
    "elastic_fields",
    "membership_segments",
    "regroup",
    "take_live_state",
]


def membership_segments(
    changes: list[dict[str, Any]], *, workers: int, start: tuple[int, float], end: tuple[int, float]
) -> list[dict[str, Any]]:
    """The run's throughput per membership: the steps between one change's recovery and the next change's
    detection (``start`` and ``end``: the run's first and last step count, with the clock then), each with its
    worker count; the recoveries themselves (detection to the first step after it) are left out, so a
    segment's rate is what that many workers did undisturbed. ``changes``: the ``membership`` records.

    >>> change = {"step": 10, "workers": 2, "recovered": 12.0, "seconds_to_recover": 1.5}
    >>> [(s["workers"], s["steps"], s["seconds"]) for s in membership_segments([change], workers=3,
    ...     start=(0, 0.0), end=(20, 21.0))]
    [(3, 10, 10.5), (2, 9, 9.0)]
    """
    segments, (step, clock), count = [], start, workers
    for change in changes:
        detected = change["recovered"] - change["seconds_to_recover"]
        segments.append(_segment(count, step, change["step"], clock, detected))
        step, clock, count = change["step"] + 1, change["recovered"], change["workers"]  # one step to recover
    segments.append(_segment(count, step, end[0], clock, end[1]))
    return segments


def _segment(workers: int, first: int, last: int, began: float, ended: float) -> dict[str, Any]:
    steps, seconds = max(last - first, 0), max(ended - began, 0.0)
    rate = steps / seconds if steps and seconds > 0 else None
    return {
        "workers": workers,
        "first_step": first,
        "steps": steps,
        "seconds": round(seconds, 3),
        "steps_per_second": None if rate is None else round(rate, 3),
    }


class MembershipLog:
    """The changes so far, and the one being recovered from until the first step after it is done.
    ``start``: the step count and the clock where this process began training (for the segments)."""

    def __init__(self, start_step: int = 0) -> None:
        self.changes: list[dict[str, Any]] = []
        self._pending: dict[str, Any] | None = None
        self.start = (start_step, time.time())

    def segments(self, workers: int, end_step: int) -> list[dict[str, Any]]:
        """Throughput per membership up to now (:func:`membership_segments`), starting with ``workers``."""
        return membership_segments(self.changes, workers=workers, start=self.start, end=(end_step, time.time()))

    @property
    def recovering(self) -> bool:
        return self._pending is not None

    def regrouped(self, record: dict[str, Any], detected: float) -> None:
        self._pending = {**record, "detected": detected}

    def step_done(self, metrics: MetricsLog | None) -> None:
        """The first step after a regroup is done: the change's record, with the seconds it took to recover
        (from the loss's detection, or the admission's start, here to the end of that step)."""
        record = dict(self._pending or {})
        detected = record.pop("detected")
        record["seconds_to_recover"] = round(time.time() - detected, 3)
        record["recovered"] = time.time()
        self._pending = None
        self.changes.append(record)
        if metrics is not None:
            metrics.write({"kind": "membership", **record})


class ElasticTrainer(Protocol):
    """What :func:`regroup` and :func:`admit` read and change of the training loop that calls them
    (:class:`scaletrain.train.loop.Trainer`): its role (membership, plan, agreement, exchange), weights, optimizer,
    position and workload state, and where it records the change."""

    role: Role
    records: RunRecords
    position: Position
    model: nn.Module
    optimizer: torch.optim.Optimizer
    prepared: Prepared
    workload: Workload
    state: Any  # the workload's own state between steps (an LSTM's hidden state), or None
    membership: MembershipLog


class MembersView(Protocol):
    """The bounds and members :func:`elastic_fields` reads of a run's membership."""

    minimum: int
    maximum: int
    members: list[int]


def regroup(trainer: ElasticTrainer, lost: PeerLost) -> None:
    """``trainer`` (the :class:`scaletrain.train.loop.Trainer` that calls this): agree with the survivors on
    who goes on, take the live state of the one furthest ahead (the step in flight is done again unless
    one of them completed it), and go on with the new plan."""
    detected = time.time()
    while True:
        try:
            regrouped, state = trainer.role.membership.regroup(
                trainer.position.step, lost.why, _live_state(trainer), in_flight=lost.in_flight
            )
            _go_on(trainer, regrouped, state, detected)
            break
        except PeerLost as again:  # another member lost while the group was rebuilt: agree once more
            lost = PeerLost(again.why, in_flight=lost.in_flight)
    if trainer.records.metrics is not None:
        left = ", ".join(f"worker rank {who['rank']} ({who['why']})" for who in regrouped.record["left"])
        # nobody left: a member that seemed lost (its heartbeat stood still under load) answered the decision
        what = f"{left} left" if left else "every member answered after a peer seemed lost"
        trainer.records.progress.message(
            f"step {trainer.position.step + 1}: {what}; going on with {regrouped.workers} workers"
        )


def admit(trainer: ElasticTrainer) -> None:
    """At the step boundary where every member learnt that a worker waits: admit it, hand it the live state of
    the deciding member, and go on with the batches re-partitioned over the new membership."""
    detected = time.time()
    regrouped, state = trainer.role.membership.admit(_live_state(trainer))
    _go_on(trainer, regrouped, state, detected)
    if trainer.records.metrics is not None:
        joined = ", ".join(f"worker rank {who['rank']}" for who in regrouped.record["joined"])
        trainer.records.progress.message(
            f"after step {trainer.position.step}: {joined} joined; going on with {regrouped.workers} workers"
        )


def take_live_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, position: Position, state: dict[str, Any]
) -> None:
    """Continue from a peer's live state: its weights, optimizer state and position."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    for name, value in state["position"].items():
        setattr(position, name, value)


def _live_state(trainer: ElasticTrainer) -> Callable[[], dict[str, Any]]:
    def live_state() -> dict[str, Any]:  # what a member hands the others: weights, optimizer state, position
        return {
            "model": trainer.model.state_dict(),
            "optimizer": trainer.optimizer.state_dict(),
            "position": asdict(trainer.position),
        }

    return live_state


def _go_on(trainer: ElasticTrainer, regrouped: Regrouped, state: dict[str, Any] | None, detected: float) -> None:
    if state is not None:  # None: this worker holds the state to go on from (a central server's reply)
        take_live_state(trainer.model, trainer.optimizer, trainer.position, state)
    trainer.role = dataclasses.replace(trainer.role, plan=regrouped.plan, agreement=regrouped.agreement)
    trainer.role.exchange.resize(regrouped.workers)
    rows = trainer.prepared.batch_size * regrouped.plan.global_batch_factor // regrouped.plan.part.count
    trainer.state = trainer.workload.initial_state(trainer.model, rows)
    trainer.membership.regrouped(regrouped.record, detected)


def elastic_fields(membership: MembersView, trainer: ElasticTrainer, workers: int) -> dict[str, Any]:
    """An elastic run's fields of ``summary.json``: its bounds, its workers at the end, each membership change
    and the throughput of each membership (``membership``: a run's
    :class:`~scaletrain.parallel.strategies.elastic.StoreMembership`; ``trainer``: rank 0's
    :class:`~scaletrain.train.loop.Trainer`; ``workers``: the run's workers at its start)."""
    return {
        "min_workers": membership.minimum,
        "max_workers": membership.maximum,
        "workers_at_end": len(membership.members),
        "membership": trainer.membership.changes,
        "membership_segments": trainer.membership.segments(workers, trainer.position.step),
    }
