"""Which samples make each global batch, and which rows of it one worker computes: the index sampler every
strategy and workload shares.

It lives with the data, so that the parallel package and the workloads both use it without
importing each other. The order of an epoch depends on the seed and the epoch only
(:func:`epoch_permutation`), so every worker, a resumed run and a ``DataLoader`` see the same batches:

    >>> batches = EpochBatches(8, batch_size=4, seed=0, epoch=0, part=Part(1, 2))
    >>> [len(rows) for rows in batches], len(batches)
    ([2, 2], 2)
    >>> list(batches)[0] == epoch_permutation(8, seed=0, epoch=0)[2:4].tolist()
    True
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from scaletrain.errors import ConfigError

__all__ = ["EpochBatches", "Part", "epoch_permutation"]


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


def epoch_permutation(size: int, *, seed: int, epoch: int) -> torch.Tensor:
    """The order of the samples in one epoch; a function of seed and epoch only."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(size, generator=generator)


class EpochBatches:
    """The sample indices of one epoch's global batches ``numbers`` (default: every whole batch), each cut
    down to ``part``: the tensor workloads' order and, iterated as lists, a ``DataLoader``'s batch sampler.

    The last incomplete batch is dropped, so every batch (and every worker's share of it) has the same size.
    """

    def __init__(
        self, size: int, *, batch_size: int, seed: int, epoch: int, part: Part = Part(), numbers: range | None = None
    ) -> None:
        self._order = epoch_permutation(size, seed=seed, epoch=epoch)
        self._batch_size = batch_size
        self._share = part.slice(batch_size)
        # An empty ``numbers`` is no batch at all (an async worker whose share of a short epoch is none).
        self.numbers = range(size // batch_size) if numbers is None else numbers

    def indices(self, number: int) -> torch.Tensor:
        """The samples of global batch ``number`` that this part computes, in batch order."""
        return self._order[number * self._batch_size : (number + 1) * self._batch_size][self._share]

    def __iter__(self) -> Iterator[list[int]]:
        for number in self.numbers:
            yield self.indices(number).tolist()

    def __len__(self) -> int:
        return len(self.numbers)
