"""Throughput as SPEC §3 defines it: batches processed divided by the wall time they took.

The first ``warmup_steps`` steps of a process (allocator and thread-pool start-up, first-call
overheads) are excluded from the rate; evaluation and checkpoint writing are not training time and
are excluded too. Both exclusions are stated in ``summary.json``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

__all__ = ["ThroughputMeter"]


@dataclass
class ThroughputMeter:
    """Accumulates the time of training steps after a warm-up.

    >>> meter = ThroughputMeter(warmup_steps=1)
    >>> meter.add(0.5); meter.add(0.25); meter.add(0.25)
    >>> meter.measured_steps, meter.batches_per_second()
    (2, 4.0)
    """

    warmup_steps: int = 5
    steps_seen: int = 0
    measured_steps: int = 0
    measured_seconds: float = 0.0
    window_steps: int = 0
    window_seconds: float = 0.0

    def add(self, seconds: float) -> None:
        """Record one step that took ``seconds``."""
        self.steps_seen += 1
        if self.steps_seen <= self.warmup_steps:
            return
        self.measured_steps += 1
        self.measured_seconds += seconds
        self.window_steps += 1
        self.window_seconds += seconds

    def batches_per_second(self) -> float | None:
        """Rate over every measured step so far; ``None`` while still warming up."""
        if self.measured_steps == 0 or self.measured_seconds <= 0:
            return None
        return self.measured_steps / self.measured_seconds

    def take_window(self) -> float | None:
        """Rate since the previous call (for periodic logs), then start a new window."""
        rate = self.window_steps / self.window_seconds if self.window_seconds > 0 else None
        self.window_steps, self.window_seconds = 0, 0.0
        return rate


def now() -> float:
    """The clock every timer uses (monotonic, high resolution)."""
    return time.perf_counter()
