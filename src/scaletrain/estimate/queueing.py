"""Closed queueing networks solved exactly by mean value analysis (Reiser & Lavenberg, J. ACM 27(2), 1980).

A network here is ``customers`` jobs cycling through one delay (``think`` seconds, no queueing) and
single-server queues given by their service demands. Queues with equal demands have equal queue
lengths at every population, so a group of identical queues is computed once and counted
``queues`` times: ``{demand: queues}``. The refined model (:mod:`scaletrain.estimate.refined`)
asks for one network per worker count; :func:`mean_value_throughputs` solves all of them in one
vectorised pass over the population instead of one interpreted recursion each; :func:`demand_scale` fits
a network's demands to a response time measured among that many jobs.

>>> mean_value_throughput(2, 1.0, [0.5, 0.5]) == mean_value_throughput(2, 1.0, [0.5], [2])
True
>>> [round(x, 6) for x in mean_value_throughputs([(1, 1.0, {0.5: 2}), (2, 2.0, {0.5: 2})])]
[0.5, 0.631579]
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence

import numpy as np

__all__ = ["demand_scale", "mean_value_throughput", "mean_value_throughputs", "throughput_bound"]


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


def demand_scale(customers: int, think: float, demands: dict[float, int], response: float) -> float:
    """The factor on every demand that makes the network's response time (the time a job spends in the
    queues per cycle, customers / throughput − think) equal ``response`` at ``customers`` jobs.

    The response time grows with the factor, so it is found by bisection (on its logarithm, between
    1/1000 and 1000, the ends where the target lies beyond them). A measured response folds into the
    demands what exponential service and the model's queues leave out: pipelined transfers that
    queue less (a factor below 1), or a server that serialises what the model overlaps (above 1).

    >>> round(demand_scale(1, 1.0, {0.5: 2}, 2.0), 6)  # one job does not queue: 2 / (0.5 + 0.5)
    2.0
    >>> network = (3, 0.2, {0.1: 2})
    >>> response = 3 / mean_value_throughput(3, 0.2, [0.25], [2]) - 0.2
    >>> round(demand_scale(*network, response), 6)
    2.5
    """
    queues, counts = list(demands), list(demands.values())

    def at(factor: float) -> float:
        return customers / mean_value_throughput(customers, think, [d * factor for d in queues], counts) - think

    low, high = -3.0, 3.0  # log10 of the factor
    if not queues or response <= at(10**low):
        return 10**low
    if response >= at(10**high):
        return 10**high
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if at(10**middle) < response else (low, middle)
    return 10 ** ((low + high) / 2)
