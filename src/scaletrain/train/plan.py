"""Which data one worker computes in each epoch: its part of every global batch, or its own chunk."""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.data.sampler import Part

__all__ = ["WorkerPlan"]


@dataclass(frozen=True)
class WorkerPlan:
    """One worker's share of the training data.

    ``global_batch_factor``: global batch of one update in units of ``--batch-size`` (N for join).
    ``part``: the slice of every global batch this worker computes (synchronous strategies).
    ``chunk``: for asynchronous workers, which contiguous share of each epoch's batches is theirs.
    ``batch_fraction``: how much of one batch of ``--batch-size`` a step of this worker computes.

    >>> WorkerPlan(chunk=Part(1, 2)).numbers(0, 10)
    range(5, 10)
    """

    global_batch_factor: int = 1
    part: Part = Part()
    chunk: Part | None = None
    batch_fraction: float = 1.0

    def numbers(self, start: int, stop: int) -> range:
        """This worker's batch numbers among the epoch's remaining global batches ``start..stop``."""
        if self.chunk is None:
            return range(start, stop)
        length = stop - start
        index, count = self.chunk.index, self.chunk.count
        return range(start + index * length // count, start + (index + 1) * length // count)
