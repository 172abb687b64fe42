"""Which rows of each global batch one worker computes: the index sampler every strategy and workload shares.

It lives with the data, so that the parallel package and the workloads both use it without
importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.errors import ConfigError

__all__ = ["Part"]


@dataclass(frozen=True)
class Part:
    """Which consecutive slice of every global batch a worker computes: slice ``index`` of ``count``.

    ``Part(0, 1)`` is the whole batch. The global batch size must divide evenly.
    """

    index: int = 0
    count: int = 1

    def slice(self, size: int) -> slice:
        if size % self.count:
            raise ConfigError(
                f"a batch of {size} cannot be split evenly over {self.count} workers; "
                f"choose a batch size that is a multiple of {self.count}"
            )
        share = size // self.count
        return slice(self.index * share, (self.index + 1) * share)
