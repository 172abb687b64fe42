"""What a parameter server's ``summary.json`` says beyond every run's fields: its updates, the staleness and
compensation of an asynchronous run, the workers it lost (and the batches they did not do), or an elastic
run's membership changes."""

from __future__ import annotations

from typing import Any

from scaletrain.parallel.strategies.base import Layout
from scaletrain.parallel.strategies.ps.bound import StalenessBound
from scaletrain.parallel.strategies.ps.membership import Members
from scaletrain.parallel.strategies.ps.options import ps_options
from scaletrain.parallel.strategies.ps.records import ServerStats
from scaletrain.parallel.strategies.ps.staleness import Compensation
from scaletrain.train.state import Prepared

__all__ = ["server_extra"]


def server_extra(
    stats: ServerStats,
    layout: Layout,
    prepared: Prepared,
    compensation: Compensation | None,
    members: Members | None = None,
    steps: int = 0,
    bound: StalenessBound | None = None,
) -> dict[str, Any]:
    """``steps``: the updates the run made in all (an elastic central server's last membership ends there);
    ``bound``: the server's ``--max-staleness`` (for a sharded run rank 0's owner, whose holds stand for all:
    every owner holds a fast worker until the same slow push reaches it)."""
    options = ps_options(prepared.config)
    extra: dict[str, Any] = {
        "server_updates": stats.updates,
        "server_skipped_updates": stats.skipped,
        "ps_admission": options["admission"],
    }
    if layout.sync == "async":
        extra["staleness"] = stats.staleness_summary()
        extra["async_compensation"] = compensation.summary() if compensation else None
        extra["async_batches"] = options["async_batches"]
        extra["update_batch_size"] = prepared.update_batch  # --batch-size // N under split
        extra["max_staleness"] = options["max_staleness"]
        extra["staleness_wait"] = bound.summary() if bound is not None else None
    if members is not None:  # the survivors did the lost workers' batches: the changes say who left when
        segments = members.segments(layout.workers, steps)
        extra |= {"min_workers": prepared.config.min_workers, "membership": members.changes, "lost_workers": []}
        return extra | {"membership_segments": segments}
    planned = _planned_batches(prepared, layout)
    extra["lost_workers"] = [
        {"rank": rank, "reason": reason, "batches_not_done": planned[rank] - stats.batches_done.get(rank, 0)}
        for rank, reason in sorted(stats.lost.items())
    ]
    return extra


def _planned_batches(prepared: Prepared, layout: Layout) -> dict[int, int]:
    """How many batches each worker was to compute over the rest of the run."""
    planned = {}
    for rank in layout.worker_ranks():
        plan, position, schedule, total = layout.worker_plan(rank), prepared.position, prepared.schedule, 0
        epoch, start = position.epoch, position.batch
        while schedule.first_step(epoch) < schedule.total_steps:
            stop = min(schedule.steps_in(epoch), schedule.total_steps - schedule.first_step(epoch))
            total += len(plan.numbers(start, stop))
            epoch, start = epoch + 1, 0
        planned[rank] = total
    return planned
