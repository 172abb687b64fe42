"""An elastic run's membership changes as the training loop sees them (``--min-workers``): regrouping with
the survivors after a lost worker, and the record of each change (``membership`` in ``summary.json``,
``"kind": "membership"`` in ``metrics.jsonl``)."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict
from typing import Any

from scaletrain.train.exchange import PeerLost

__all__ = ["MembershipLog", "regroup"]


class MembershipLog:
    """The changes so far, and the one being recovered from until the first step after it is done."""

    def __init__(self) -> None:
        self.changes: list[dict[str, Any]] = []
        self._pending: dict[str, Any] | None = None

    @property
    def recovering(self) -> bool:
        return self._pending is not None

    def regrouped(self, record: dict[str, Any], detected: float) -> None:
        self._pending = {**record, "detected": detected}

    def step_done(self, metrics: Any) -> None:
        """The first step after a regroup is done: the change's record, with the seconds it took to recover
        (from the loss's detection here to the end of that step)."""
        record = dict(self._pending or {})
        detected = record.pop("detected")
        record["seconds_to_recover"] = round(time.time() - detected, 3)
        record["recovered"] = time.time()
        self._pending = None
        self.changes.append(record)
        if metrics is not None:
            metrics.write({"kind": "membership", **record})


def regroup(trainer: Any, lost: PeerLost) -> None:
    """``trainer`` (the :class:`scaletrain.train.loop.Trainer` that calls this): agree with the survivors on
    who goes on, take the live state of the one furthest ahead (the step in flight is done again unless
    one of them completed it), and go on with the new plan."""
    detected = time.time()

    def live_state() -> dict[str, Any]:  # what a survivor hands the others: weights, optimizer state, position
        return {"model": trainer.model.state_dict(), "optimizer": trainer.optimizer.state_dict(),
                "position": asdict(trainer.position)}  # fmt: skip

    regrouped, state = trainer.role.membership.regroup(trainer.position.step, lost.why, live_state)
    if state is not None:  # None: this worker holds the state to go on from (a central server's reply)
        trainer.model.load_state_dict(state["model"])
        trainer.optimizer.load_state_dict(state["optimizer"])
        for name, value in state["position"].items():
            setattr(trainer.position, name, value)
    trainer.role = dataclasses.replace(trainer.role, plan=regrouped.plan, agreement=regrouped.agreement)
    trainer.role.exchange.resize(regrouped.workers)
    rows = trainer.prepared.batch_size * regrouped.plan.global_batch_factor // regrouped.plan.part.count
    trainer.state = trainer.workload.initial_state(trainer.model, rows)
    trainer.membership.regrouped(regrouped.record, detected)
    if trainer.records.metrics is not None:
        left = ", ".join(f"worker rank {who['rank']} ({who['why']})" for who in regrouped.record["left"])
        trainer.records.progress.message(
            f"step {trainer.position.step + 1}: {left} left; going on with {regrouped.workers} workers"
        )
