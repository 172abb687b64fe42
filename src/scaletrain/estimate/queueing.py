"""Closed queueing networks solved exactly by mean value analysis (Reiser & Lavenberg, J. ACM 27(2), 1980).

A network here is ``customers`` jobs cycling through one delay (``think`` seconds, no queueing) and
single-server queues given by their service demands. Queues with equal demands have equal queue
lengths at every population, so a group of identical queues is computed once and counted
``queues`` times: ``{demand: queues}``. The refined model (:mod:`scaletrain.estimate.refined`)
asks for one network per worker count; :func:`mean_value_throughputs` solves all of them in one
vectorised pass over the population instead of one interpreted recursion each.

>>> mean_value_throughput(2, 1.0, [0.5, 0.5]) == mean_value_throughput(2, 1.0, [0.5], [2])
True
>>> [round(x, 6) for x in mean_value_throughputs([(1, 1.0, {0.5: 2}), (2, 2.0, {0.5: 2})])]
[0.5, 0.631579]
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence

import numpy as np

__all__ = ["mean_value_throughput", "mean_value_throughputs", "throughput_bound"]


def mean_value_throughput(
    customers: int, think: float, demands: Sequence[float], counts: Sequence[int] | None = None
) -> float:
    """Throughput of a closed network: ``customers`` jobs, a delay of ``think``, queues with ``demands``.

    ``counts[i]``: how many identical queues have demand ``demands[i]`` (default one each).

    >>> mean_value_throughput(1, 1.0, [0.5, 0.5])  # one job: 1 / (1 + 0.5 + 0.5)
    0.5
    >>> round(mean_value_throughput(50, 1.0, [0.25]), 6)  # saturated: 1 / 0.25
    4.0
    """
    last = deque(_recursion(customers, think, demands, counts), maxlen=1)
    return last[0] if last else 0.0


def _recursion(customers: int, think: float, demands: Sequence[float], counts: Sequence[int] | None) -> Iterator[float]:
    """The throughput at 1, 2, …, ``customers`` jobs, one population after the other."""
    counts = [1] * len(demands) if counts is None else counts
    queues = [0.0] * len(demands)
    for jobs in range(1, customers + 1):
        residence = [demand * (1 + queue) for demand, queue in zip(demands, queues, strict=True)]
        throughput = jobs / (think + sum(count * time for count, time in zip(counts, residence, strict=True)))
        queues = [throughput * time for time in residence]
        yield throughput


def mean_value_throughputs(networks: Sequence[tuple[int, float, dict[float, int]]]) -> list[float]:
    """:func:`mean_value_throughput` of many networks, each ``(customers, think, {demand: queues})``.

    The population recursion runs once for all networks side by side: step k updates every network
    with at least k customers in one numpy operation, so N networks of up to N customers take N
    vectorised steps, not N² interpreted ones. Networks that are all alike share one recursion.
    """
    if not networks:
        return []
    first = networks[0]
    if all(think == first[1] and demands == first[2] for _, think, demands in networks):
        wanted = {customers for customers, _, _ in networks}
        at = {}
        for jobs, throughput in enumerate(
            _recursion(max(wanted), first[1], list(first[2]), list(first[2].values())), 1
        ):
            if jobs in wanted:
                at[jobs] = throughput
        return [at[customers] for customers, _, _ in networks]
    order = sorted(range(len(networks)), key=lambda index: networks[index][0])
    width = max(1, *(len(networks[index][2]) for index in order))
    customers = np.array([networks[index][0] for index in order])
    think = np.array([networks[index][1] for index in order], dtype=float)
    demand = np.zeros((len(order), width))
    count = np.zeros((len(order), width))
    for row, index in enumerate(order):
        demand[row, : len(networks[index][2])] = list(networks[index][2])
        count[row, : len(networks[index][2])] = list(networks[index][2].values())
    waiting = np.ones_like(demand)  # 1 + the mean queue length a job finds on arrival
    solved = np.empty(len(order))
    start = 0  # rows before this one have all their customers; they are solved
    for jobs in range(1, int(customers[-1]) + 1):
        residence = demand[start:] * waiting[start:]
        throughput = jobs / (think[start:] + np.einsum("ij,ij->i", count[start:], residence))
        np.multiply(residence, throughput[:, None], out=residence)
        residence += 1
        waiting[start:] = residence
        end = start + int(np.searchsorted(customers[start:], jobs, side="right"))
        solved[start:end] = throughput[: end - start]
        start = end
    result = [0.0] * len(order)
    for row, index in enumerate(order):
        result[index] = float(solved[row])
    return result


def throughput_bound(customers: int, think: float, demands: dict[float, int]) -> float:
    """An upper bound on the network's throughput: no job ever waits, or the busiest queue never idles.

    The asymptotic bounds: X ≤ N / (think + Σ demands) and X ≤ 1 / the largest demand.

    >>> throughput_bound(1, 1.0, {0.5: 2}), throughput_bound(50, 1.0, {0.25: 1})
    (0.5, 4.0)
    """
    unhindered = customers / (think + sum(demand * count for demand, count in demands.items()))
    return min(unhindered, 1 / max(demands)) if demands else unhindered
