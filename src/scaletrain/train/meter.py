"""Throughput as SPEC §3 defines it: batches processed divided by the wall time they took.

The first ``warmup_steps`` steps of a process (allocator and thread-pool start-up, first-call
overheads) are excluded from the rate; evaluation and checkpoint writing are not training time and
are excluded too. Both exclusions are stated in ``summary.json``.

The meter also counts the process's minor page faults over the same measured steps: a step whose
buffers the C allocator gave back to the kernel faults them in again, which costs time the step
timer sees but cannot explain (see :mod:`scaletrain.train.runtime`).
"""

from __future__ import annotations

import resource
import statistics
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from scaletrain.config import WARMUP_STEPS

__all__ = ["EpochSteps", "ThroughputMeter", "minor_faults", "now", "timed_batches"]


@dataclass
class ThroughputMeter:
    """Accumulates the time of training steps after a warm-up.

    >>> meter = ThroughputMeter(warmup_steps=1)
    >>> meter.add(0.5); meter.add(0.25); meter.add(0.25)
    >>> meter.measured_steps, meter.batches_per_second()
    (2, 4.0)
    """

    warmup_steps: int = WARMUP_STEPS
    steps_seen: int = 0
    measured_steps: int = 0
    measured_seconds: float = 0.0
    window_steps: int = 0
    window_seconds: float = 0.0
    # ru_minflt when the last warm-up step ended, and when the latest measured step ended.
    faults_before_measuring: int | None = field(default=None, repr=False)
    faults_after_measuring: int | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.warmup_steps == 0:
            self.faults_before_measuring = minor_faults()

    def add(self, seconds: float) -> None:
        """Record one step that took ``seconds``."""
        self.steps_seen += 1
        if self.steps_seen <= self.warmup_steps:
            if self.steps_seen == self.warmup_steps:
                self.faults_before_measuring = minor_faults()
            return
        self.faults_after_measuring = minor_faults()  # a system call of about a microsecond
        self.measured_steps += 1
        self.measured_seconds += seconds
        self.window_steps += 1
        self.window_seconds += seconds

    def batches_per_second(self) -> float | None:
        """Rate over every measured step so far; ``None`` while still warming up."""
        if self.measured_steps == 0 or self.measured_seconds <= 0:
            return None
        return self.measured_steps / self.measured_seconds

    def minor_faults_per_step(self) -> float | None:
        """Minor page faults of this process per measured step; ``None`` while still warming up.

        Counted from the end of the last warm-up step to the end of the latest measured step, so it
        includes the work between steps (logs, a checkpoint write, an epoch's evaluation) but not the
        final evaluation. The time, measured per step, leaves those out.
        """
        if self.measured_steps == 0 or self.faults_before_measuring is None or self.faults_after_measuring is None:
            return None
        return (self.faults_after_measuring - self.faults_before_measuring) / self.measured_steps

    def take_window(self) -> float | None:
        """Rate since the previous call (for periodic logs), then start a new window."""
        rate = self.window_steps / self.window_seconds if self.window_seconds > 0 else None
        self.window_steps, self.window_seconds = 0, 0.0
        return rate


def minor_faults() -> int:
    """Minor page faults of this process (all its threads) so far: pages the kernel had to map in."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def now() -> float:
    """The clock every timer uses (monotonic, high resolution)."""
    return time.perf_counter()


@dataclass
class EpochSteps:
    """The steps of one epoch: medians of a whole step, of its communication (push, pull or all-reduce) and
    of its data part (waiting for the batch), and what they become for a network whose compute and bytes are
    scaled.

    >>> steps = EpochSteps()
    >>> for seconds, communication, data in ((1.0, 0.4, 0.1), (1.2, 0.4, 0.1), (9.0, 0.5, 0.1)):
    ...     steps.add(seconds, communication, data)
    >>> steps.figures()["seconds_per_step"], steps.scaled(compute=0.5, communication=0.5)["seconds_per_step"]
    (1.2, 0.65)
    """

    seconds: list[float] = field(default_factory=list)
    communication: list[float] = field(default_factory=list)
    data: list[float] = field(default_factory=list)

    def add(self, seconds: float, communication: float, data: float = 0.0) -> None:
        self.seconds.append(seconds)
        self.communication.append(communication)
        self.data.append(data)

    def figures(self) -> dict[str, float | int]:
        """``steps``, and the median ``seconds_per_step``, ``communication_seconds_per_step`` and
        ``data_seconds_per_step``."""
        if not self.seconds:
            return {}
        return {
            "steps": len(self.seconds),
            "seconds_per_step": statistics.median(self.seconds),
            "communication_seconds_per_step": statistics.median(self.communication),
            "data_seconds_per_step": statistics.median(self.data),
        }

    def scaled(self, *, compute: float, communication: float) -> dict[str, float] | None:
        """Step and communication times with the compute (the step less its communication and data) times
        ``compute``, the communication times ``communication`` and the data part as it was (reading a batch
        does not depend on the network); ``None`` without steps."""
        if not self.seconds:
            return None
        moved = statistics.median(self.communication) * communication
        computed = statistics.median(
            s - c - d for s, c, d in zip(self.seconds, self.communication, self.data, strict=True)
        )
        return {
            "seconds_per_step": computed * compute + moved + statistics.median(self.data),
            "communication_seconds_per_step": moved,
        }


def timed_batches(batches: Iterable[Any]) -> Iterator[tuple[float, float, Any]]:
    """``(asked, got, batch)`` for each batch: the clock when the step asked for it and when it came. The time
    between is the step's data part: reading and collating in this process, or waiting for a loader's workers."""
    iterator = iter(batches)
    try:
        while True:
            asked = now()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            yield asked, now(), batch
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
