"""``--accumulate K``: an update's batch computed as K micro-batches, one after the other, their gradients
summed (each weighted by its share of the batch's rows) before the exchange, which happens once per update as
DDP's ``no_sync`` has it. A micro-batch is a slice of every tensor of the batch along its first dimension."""

from __future__ import annotations

import itertools
from typing import Any

import torch

__all__ = ["micro_batches"]


def micro_batches(batch: Any, parts: int) -> list[tuple[Any, float]]:
    """``batch`` cut into ``parts`` slices (fewer when it has fewer rows), each with its share of the rows.

    >>> [(part.tolist(), share) for part, share in micro_batches(torch.arange(5), 2)]
    [([0, 1], 0.4), ([2, 3, 4], 0.6)]
    >>> [share for _, share in micro_batches((torch.zeros(4, 3), torch.zeros(4)), 1)]
    [1.0]
    """
    if parts == 1:
        return [(batch, 1.0)]
    rows = _rows(batch)
    bounds = [rows * index // parts for index in range(parts + 1)]
    return [
        (_slice(batch, begin, end), (end - begin) / rows) for begin, end in itertools.pairwise(bounds) if end > begin
    ]


def _rows(batch: Any) -> int:
    if torch.is_tensor(batch):
        return batch.shape[0]
    values = batch.values() if isinstance(batch, dict) else batch
    for value in values:
        found = _rows(value) if isinstance(value, torch.Tensor | tuple | list | dict) else None
        if found is not None:
            return found
    raise TypeError("--accumulate slices a batch's tensors along their first dimension, and this batch holds none")


def _slice(batch: Any, begin: int, end: int) -> Any:
    if torch.is_tensor(batch):
        return batch[begin:end]
    if isinstance(batch, dict):
        return {key: _slice(value, begin, end) for key, value in batch.items()}
    if isinstance(batch, tuple | list):
        return type(batch)(_slice(value, begin, end) for value in batch)
    return batch
