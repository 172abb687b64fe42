"""Which process owns which tensor."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["assign_greedy"]


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
