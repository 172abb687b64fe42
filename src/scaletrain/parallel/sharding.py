"""Which process owns which tensor."""

from __future__ import annotations

import functools
from collections.abc import Sequence

__all__ = ["assign_greedy", "owner_shares"]


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


def owner_shares(tensor_bytes: tuple[int, ...], n: int) -> dict[float, int]:
    """Each of ``n`` owners' fraction of the bytes (Algorithm 3.7 over the real tensors) → how many owners hold it.

    >>> owner_shares((300, 100, 100, 100), 2)
    {0.5: 2}
    >>> owner_shares((), 4)  # tensor sizes unknown: the thesis's even split
    {0.25: 4}
    """
    if not tensor_bytes:
        return {1 / n: n}  # tensor sizes unknown: the thesis's even split
    total = sum(tensor_bytes)
    if n >= len(tensor_bytes) and min(tensor_bytes) > 0:
        # Every tensor finds an owner still empty, so tensor i goes to owner i and the rest hold nothing.
        shares = dict(_one_tensor_each(tensor_bytes))
        if n > len(tensor_bytes):
            shares[0 / total] = n - len(tensor_bytes)
        return shares
    owners = assign_greedy(tensor_bytes, list(range(n)))
    held = [sum(size for size, owner in zip(tensor_bytes, owners, strict=True) if owner == j) / total for j in range(n)]
    return _tally(held)


@functools.lru_cache(maxsize=16)
def _one_tensor_each(tensor_bytes: tuple[int, ...]) -> dict[float, int]:
    """The shares when every tensor has an owner of its own (do not modify: it is cached)."""
    total = sum(tensor_bytes)
    return _tally([size / total for size in tensor_bytes])


def _tally(values: Sequence[float]) -> dict[float, int]:
    """``{value: how often}`` in order of first appearance."""
    tally: dict[float, int] = {}
    for value in values:
        tally[value] = tally.get(value, 0) + 1
    return tally
