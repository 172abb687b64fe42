"""What a chaos run's records (``metrics.jsonl``, ``summary.json``) say about it, for :mod:`chaos`: each step applied
once and in its epoch, each global batch split over the membership that computed it, every membership change
naming who came and went, and the time no step completed because of a fault or an admission."""

from __future__ import annotations

import functools
import itertools
import statistics
from typing import Any

from scaletrain.data.sampler import EpochBatches, Part, epoch_permutation

__all__ = ["coverage_checks", "stalls", "step_checks", "step_times", "unrecorded_changes"]


def step_checks(records: list[dict[str, Any]], summary: dict[str, Any]) -> list[str]:
    """What is wrong with the steps applied: each step number once, each epoch's batches all there."""
    problems = []
    numbers = [record["step"] for record in records if record.get("kind") == "step"]
    per_epoch = summary["steps_per_epoch"]
    if numbers != list(range(1, summary["steps"] + 1)):
        seen = set(numbers)
        missing = [n for n in range(1, summary["steps"] + 1) if n not in seen]
        repeated = sorted({n for n in numbers if numbers.count(n) > 1})
        problems.append(f"steps recorded out of order: missing {missing[:10]}, repeated {repeated[:10]}")
    for record in records:
        if record.get("kind") == "step" and record["epoch"] != (record["step"] - 1) // per_epoch:
            problems.append(f"step {record['step']} recorded in epoch {record['epoch']}")
            break
    if summary["steps"] % per_epoch:
        problems.append(f"{summary['steps']} steps are not whole epochs of {per_epoch}")
    return problems


def coverage_checks(summary: dict[str, Any], samples: int, seed: int, workers: int) -> list[str]:
    """Rebuild each step's split over the membership that computed it (from the membership records);
    what is wrong: a global batch whose parts are not its samples, an epoch not covering its samples once."""
    batch, per_epoch = summary["batch_size"], summary["steps_per_epoch"]
    changes = sorted(summary["membership"], key=lambda change: change["step"])
    problems = []

    @functools.cache
    def parted(epoch: int, index: int, count: int) -> EpochBatches:
        return EpochBatches(samples, batch_size=batch, seed=seed, epoch=epoch, part=Part(index, count))

    for epoch in range(summary["steps"] // per_epoch):
        order = epoch_permutation(samples, seed=seed, epoch=epoch)
        seen = []
        for number in range(per_epoch):
            step = epoch * per_epoch + number + 1
            count = workers
            for change in changes:  # change["step"]: the steps done before the new membership's first
                if change["step"] < step:
                    count = change["workers"]
            parts = [parted(epoch, index, count).indices(number).tolist() for index in range(count)]
            rows = [row for part in parts for row in part]
            if rows != order[number * batch : (number + 1) * batch].tolist():
                problems.append(f"epoch {epoch} batch {number}: the parts of {count} workers are not the batch")
            seen += rows
        if sorted(seen) != sorted(order[: per_epoch * batch].tolist()) or len(set(seen)) != len(seen):
            problems.append(f"epoch {epoch}: its samples are not covered exactly once")
    return problems


def unrecorded_changes(changes: list[dict[str, Any]], workers: int) -> list[str]:
    """Members that came or went in a change whose record does not name them in ``joined`` or ``left``."""
    lines, before = [], list(range(workers))
    for change in changes:
        came = sorted(set(change["members"]) - set(before) - {who["rank"] for who in change["joined"]})
        went = sorted(set(before) - set(change["members"]) - {who["rank"] for who in change["left"]})
        if came or went:
            lines.append(
                f"the change after step {change['step']} (members {before} → {change['members']}) does not name "
                f"{'rank ' + str(came) + ' in joined' if came else ''}{' and ' if came and went else ''}"
                f"{'rank ' + str(went) + ' in left' if went else ''}"
            )
        before = change["members"]
    return lines


def step_times(records: list[dict[str, Any]]) -> list[float]:
    """When each step record was written, in the order of the records."""
    return [record["time"] for record in records if record.get("kind") == "step"]


def stalls(times: list[float], marks: list[float]) -> tuple[float, float]:
    """The run's median step interval, and the seconds beyond it of the intervals that hold a mark."""
    intervals = [later - earlier for earlier, later in itertools.pairwise(times)]
    median = statistics.median(intervals)
    lost = 0.0
    for index, interval in enumerate(intervals):
        if any(times[index] < mark <= times[index + 1] for mark in marks):
            lost += max(0.0, interval - median)
    return median, lost
