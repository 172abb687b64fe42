"""Which process owns which tensor, and packing tensors into one flat buffer for transfer."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["assign_greedy", "flatten", "unflatten_into"]


def assign_greedy(sizes: Sequence[int], owners: Sequence[int]) -> list[int]:
    """Šlampa (2017) Algorithm 3.7: each tensor, in order, goes to the owner with the fewest bytes so far.

    Ties go to the owner listed first. Returns the owner of every tensor.

    >>> assign_greedy([400, 100, 100, 300], owners=[0, 1])
    [0, 1, 1, 1]
    """
    if not owners:
        raise ValueError("at least one owner is needed")
    load = dict.fromkeys(owners, 0)
    assignment = []
    for size in sizes:
        owner = min(owners, key=lambda candidate: load[candidate])
        load[owner] += size
        assignment.append(owner)
    return assignment


def flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """One contiguous float buffer holding ``tensors`` back to back."""
    if not tensors:
        return torch.zeros(0)
    return torch.cat([tensor.reshape(-1) for tensor in tensors])


def unflatten_into(buffer: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Copy ``buffer`` (as made by :func:`flatten`) back into ``tensors`` in place."""
    offset = 0
    for tensor in tensors:
        count = tensor.numel()
        tensor.copy_(buffer[offset : offset + count].view_as(tensor))
        offset += count
    if offset != buffer.numel():
        raise ValueError(f"buffer holds {buffer.numel()} values but the tensors take {offset}")
