"""The parameter server's estimator terms (:mod:`~scaletrain.parallel.strategies.terms`), declared by
:class:`~scaletrain.parallel.strategies.ps.strategy.ParameterServer`: what the speedup estimators
predict of each of its layouts.

- **Central server, synchronised workers**: they finish their gradients together, so N pushes share
  the server's downlink and N replies its uplink (the thesis's worst case is the usual one).
- **Sharded server**: the real shard sizes (Algorithm 3.7's greedy assignment over the real tensors;
  one large tensor makes one owner's link the bottleneck, not (N−1)/N of the weights).
- **Asynchronous workers** as a closed queueing network (Reiser & Lavenberg 1980): every worker
  cycles through compute (a delay) and the server's downlink, update and uplink (queues).
- **The wire codec's compute** (``codec_seconds``): a worker compresses its gradient once a step, an
  owner decompresses every message it receives before its update.
"""

from __future__ import annotations

import numpy as np

from scaletrain.parallel.sharding import owner_shares
from scaletrain.parallel.strategies.terms import (
    EstimatorTerms,
    Network,
    StepInputs,
    calibrated_seconds,
    gradient_bytes,
    queue_demands,
    transfer_seconds,
    weight_bytes,
)

__all__ = ["CENTRAL", "SHARDED"]


def central_exchange(inputs: StepInputs, n: np.ndarray) -> np.ndarray:
    """N workers push at once through the server's downlink, then N replies share its uplink; the server steps.
    Corrected by the exchange itself where the profile timed it among N workers (``--exchange-at``)."""
    profile = inputs.profile

    def formula(workers: int) -> float:
        pushes, replies = workers * gradient_bytes(profile), workers * weight_bytes(profile)
        codec = profile.codec("compress") + workers * profile.codec("decompress")
        return float(transfer_seconds(profile, pushes) + transfer_seconds(profile, replies) + profile.t_update + codec)

    return calibrated_seconds(profile, profile.central, n, formula)


def shares(inputs: StepInputs, n: np.ndarray) -> list[dict[float, int]]:
    """Per N: fraction of the weight bytes an owner holds → how many of the N owners hold it (Algorithm 3.7)."""
    return inputs.per_count("shares", n, lambda count: owner_shares(inputs.profile.tensor_bytes, count))


def sharded_exchange(inputs: StepInputs, n: np.ndarray) -> np.ndarray:
    """Push every owner its share, owners update in parallel, pull every share back.

    Worker i sends (1 − s_i) of the bytes over its uplink while owner j receives (N−1)·s_j over its
    downlink; the busiest link sets each phase's length (and the same for the replies): the one of
    the owner with the smallest share or the one with the largest. Corrected by the exchange itself where
    the profile timed it among N workers (``--exchange-at``).
    """
    profile = inputs.profile

    def formula(workers: int) -> float:
        held = shares(inputs, np.asarray([workers]))[0]
        smallest, largest = min(held), max(held)
        update = largest * profile.t_update
        busiest = max(1 - smallest, (workers - 1) * largest)
        both = (gradient_bytes(profile) + weight_bytes(profile)) * busiest / profile.bytes_per_second
        # every worker compresses its whole gradient (a message per owner, its own shard too: it applies what the
        # others would receive, so one worker alone pays it as well); the busiest owner decompresses N of its share
        codec = profile.codec("compress") + workers * largest * profile.codec("decompress")
        return float((update if workers == 1 else 2 * (workers - 1) * profile.latency + both + update) + codec)

    return calibrated_seconds(profile, profile.sharded, n, formula)


def central_networks(inputs: StepInputs, workers: np.ndarray) -> list[Network]:
    """Queues: the server's downlink (gradients), its update lock, its uplink (weights). The gradient as timed
    beside the asynchronous exchange where the profile did (``central-async``)."""
    profile = inputs.profile
    gradients = inputs.gradient("async", workers, "central-async").tolist()
    bandwidth = profile.bytes_per_second
    pushes, replies = gradient_bytes(profile) / bandwidth, weight_bytes(profile) / bandwidth
    queues = queue_demands([(pushes, 1), (profile.t_update + profile.codec("decompress"), 1), (replies, 1)])
    return [
        (n, gradient + 2 * profile.latency + profile.codec("compress"), queues)
        for n, gradient in zip(workers.tolist(), gradients, strict=True)
    ]


def sharded_networks(inputs: StepInputs, workers: np.ndarray) -> list[Network]:
    """Queues: every process's uplink and downlink, and its owner's update."""
    profile = inputs.profile
    gradients = inputs.gradient("async", workers).tolist()
    size = (gradient_bytes(profile) + weight_bytes(profile)) / 2  # a link carries pushes and pulls alike
    bandwidth = profile.bytes_per_second
    networks = []
    for n, gradient, held in zip(workers.tolist(), gradients, shares(inputs, workers), strict=True):
        # Every process's uplink and downlink carry its own worker's pushes/pulls of the other shares
        # and its owner's traffic for the other workers; averaged over which worker is cycling.
        queues = []
        for share, owners in held.items():
            link = ((1 - share) / n + (n - 1) / n * share) * size / bandwidth if n > 1 else 0.0
            update = share * (profile.t_update + profile.codec("decompress"))
            queues += [(link, 2 * owners), (update, owners)]
        think = gradient + 2 * (n - 1) * profile.latency + profile.codec("compress")
        networks.append((n, think, queue_demands(queues)))
    return networks


CENTRAL = EstimatorTerms(
    exchange=central_exchange,
    networks=central_networks,
    thesis_server="central",
    probe="central",
    network_probe="central-async",
)
# Owners update in parallel: their step is part of the exchange.
SHARDED = EstimatorTerms(
    exchange=sharded_exchange, networks=sharded_networks, thesis_server="distributed", probe="sharded"
)
