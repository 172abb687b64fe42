"""A refined speedup model: the thesis's reasoning plus what it leaves out, all from one profile.

What it adds to :mod:`scaletrain.estimate.thesis` (every constant comes from ``scaletrain profile``,
none is fitted to the runs it is judged on):

- **Latency per message** (``latency``, a 4-byte round trip / 2) besides **bandwidth** (weight
  bytes / (t_comm − latency)); a transfer of ``b`` bytes takes latency + b / bandwidth.
- **The measured t_grad at the split batch** (t_grad of batch/N, which is rarely t_grad/N).
- **The optimizer step** (``t_update``) on the server or on every worker; the sequential reference
  is t_grad + t_update per batch, what a one-worker ``local`` run takes per step.
- **Stragglers**: a synchronous step waits for the slowest of N workers, so t_grad × the expected
  maximum of N draws from the measured gradient times (their mean for one worker and for
  asynchronous workers, and for the sequential reference).
- **CPU contention** when the workers share one machine's cores: t_grad × the slowdown measured
  with that many processes computing at once (``contention``).
- **The shard sizes of the sharded server** (Algorithm 3.7's greedy assignment over the real
  tensors; one large tensor makes one owner's link the bottleneck, not (N−1)/N of the weights).
- **The central server's link shared by synchronised workers**: they finish their gradients
  together, so N pushes share the server's downlink and N replies its uplink (the thesis's worst
  case is the usual one).
- **Asynchronous training as a closed queueing network** solved exactly by mean value analysis
  (Reiser & Lavenberg 1980): every worker cycles through compute (a delay) and the server's
  downlink, update and uplink (queues); this gives the waiting near saturation that the best/worst
  bounds bracket.
- **Ring all-reduce**: 2(N−1)/N · bytes / bandwidth + 2(N−1) latencies (Patarasuk & Yuan 2009).

Throughput is in batches per second as SPEC §3 counts them (a join step is N batches, a split step
one); speedup = throughput × (t_grad + t_update), i.e. against one worker training alone.

Which configurations: every spec the strategy registry (:mod:`scaletrain.parallel.strategies`) marks
``predicted`` (:func:`scaletrain.estimate.models.predicted_configurations`). The formulas are keyed
by (strategy, server), never chosen by an ``if`` on a name, so a new strategy is predicted once it
adds (besides ``predicted = True``, the default, on its class):

- its synchronous step's time besides the gradient to :data:`EXCHANGES` (join and split);
- if it has an ``async`` mode, its closed network per worker count to :data:`ASYNCHRONOUS`;
- the thesis formula that stands for it to :data:`scaletrain.estimate.models.THESIS_SERVERS`.

Until then asking for it is a :class:`~scaletrain.errors.ConfigError` saying it is not modelled by
the estimator; ``predicted = False`` keeps it out of the estimator's list (and ``recommend``).

>>> from scaletrain.estimate.profile import Profile
>>> p = Profile("toy", 32, t_grad=0.1, t_comm=0.01, weight_bytes=10**6, tensor_bytes=(5 * 10**5, 5 * 10**5))
>>> round(predict(p, strategy="allreduce", sync="join", workers=2).speedup, 3)  # 2·0.1 / (0.1 + 0.01)
1.818
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from scaletrain.errors import ConfigError
from scaletrain.estimate.profile import Profile
from scaletrain.estimate.queueing import mean_value_throughput, mean_value_throughputs
from scaletrain.parallel.sharding import assign_greedy
from scaletrain.parallel.strategies import ALIASES, all_specs, get_strategy

__all__ = [
    "ASYNCHRONOUS",
    "EXCHANGES",
    "Prediction",
    "Terms",
    "asynchronous_networks",
    "batches_per_second",
    "mean_value_throughput",
    "modelled",
    "predict",
    "predict_many",
]


@dataclass(frozen=True)
class Prediction:
    """A predicted run: batches per second, speedup against one worker alone, and t_train of D batches."""

    batches_per_second: float
    speedup: float
    train_seconds: float


def predict(
    profile: Profile,
    *,
    strategy: str,
    sync: str,
    workers: int,
    server: str = "central",
    batches: float = 128,
    cores: int | None = None,
) -> Prediction:
    """Predict one configuration. ``cores``: the workers share this many cores (None: a machine each).

    ``server`` counts only for a strategy that has servers (``ps``); ``allreduce`` ignores it.
    """
    return predict_many(profile, strategy=strategy, sync=sync, workers=[workers], server=server, batches=batches,
                        cores=cores)[0]  # fmt: skip


def predict_many(
    profile: Profile,
    *,
    strategy: str,
    sync: str,
    workers: Sequence[int],
    server: str = "central",
    batches: float = 128,
    cores: int | None = None,
    terms: Terms | None = None,
) -> list[Prediction]:
    """:func:`predict` for each worker count in ``workers`` at once (numpy over the counts).

    ``terms``: the profile's per-worker-count terms, to share them between configurations.
    """
    terms = terms or Terms(profile, cores)
    rates = batches_per_second(terms, strategy=strategy, server=server, sync=sync, workers=workers)
    sequential = terms.sequential
    return [Prediction(batches_per_second=rate, speedup=rate * sequential, train_seconds=batches / rate)
            for rate in rates.tolist()]  # fmt: skip


def batches_per_second(terms: Terms, *, strategy: str, server: str, sync: str, workers: Sequence[int]) -> np.ndarray:
    """Predicted batches per second on each of ``workers`` worker counts; × ``terms.sequential`` is the speedup."""
    strategy, server, sync = modelled(strategy, server, sync)
    n = np.asarray(workers, dtype=int)
    if sync == "async":
        networks = asynchronous_networks(terms, strategy=strategy, server=server, workers=n)
        return np.array(mean_value_throughputs(networks))
    step = terms.gradient(sync, n) + EXCHANGES[(strategy, server)](terms, n)
    # A join step trains N batches, a split step one.
    return (n if sync == "join" else 1) / step


def modelled(strategy: str, server: str, sync: str) -> tuple[str, str, str]:
    """The configuration with the thesis's aliases resolved and no server for a strategy without one.

    One the registry does not predict, or one it predicts that no formula here models yet, is an error.

    >>> modelled("allreduce", "central", "join"), modelled("ps", "distributed", "none")
    (('allreduce', '', 'join'), ('ps', 'sharded', 'async'))
    """
    registered = get_strategy(strategy)
    server = ALIASES.get(server, server) if registered.servers else ""
    sync = ALIASES.get(sync, sync)
    label = registered.label(server, sync)
    if (
        not registered.predicted
        or sync not in registered.syncs
        or (registered.servers and server not in registered.servers)
    ):
        raise ConfigError(
            f"{label} is not a configuration to predict; choose one of {', '.join(all_specs(predicted_only=True))}"
        )
    formulas = ASYNCHRONOUS if sync == "async" else EXCHANGES if sync in ("join", "split") else {}
    if (strategy, server) not in formulas:
        raise ConfigError(
            f"{label} is not modelled by the estimator: scaletrain.estimate.refined has no formula for its "
            f"{'asynchronous ' if sync == 'async' else ''}{sync} step yet (its module docstring says what to add)"
        )
    return strategy, server, sync


class Terms:
    """The profile's terms that depend on the worker count, each computed once however often it is asked for."""

    def __init__(self, profile: Profile, cores: int | None) -> None:
        self.profile = profile
        self.cores = cores
        self._columns: dict[str, dict[int, Any]] = {}
        # The sequential reference: one worker alone, t_grad + t_update per batch.
        self.sequential = profile.t_grad * profile.slowest_of(1) + profile.t_update

    def _column(self, name: str, workers: np.ndarray, compute: Callable[[int], Any]) -> list[Any]:
        """``compute(n)`` for each of ``workers``, each n computed once per name."""
        if workers.size and workers.min() < 1:
            raise ConfigError(f"--workers must be ≥ 1, got {workers.min()}")
        column = self._columns.setdefault(name, {})
        counts = workers.tolist()
        column.update((n, compute(n)) for n in counts if n not in column)
        return [column[n] for n in counts]

    def gradient(self, sync: str, workers: np.ndarray) -> np.ndarray:
        """t_grad of one worker's part of a step among N: its batch share, contention, stragglers."""
        profile = self.profile
        if sync == "split":
            part = np.array(self._column("split", workers, profile.t_grad_at))
        else:
            part = np.full(workers.shape, profile.t_grad_at(1))
        contention = self._column("contention", workers, lambda n: profile.contention_at(n, cores=self.cores))
        # Synchronous steps wait for the slowest of N workers; asynchronous workers each go at their mean pace.
        slowest = self._column("slowest", workers if sync != "async" else np.ones_like(workers), profile.slowest_of)
        return part * np.array(contention) * np.array(slowest)

    def shares(self, workers: np.ndarray) -> list[dict[float, int]]:
        """Per N: fraction of the weight bytes an owner holds → how many of the N owners hold it (Algorithm 3.7)."""
        return self._column("shares", workers, lambda n: _shares(self.profile.tensor_bytes, n))


def _transfer(profile: Profile, size: np.ndarray) -> np.ndarray:
    return profile.latency + size / profile.bytes_per_second


def _weight_bytes(profile: Profile) -> float:
    return profile.weight_bytes or profile.t_comm * profile.bytes_per_second


def _ring_allreduce(profile: Profile, n: np.ndarray) -> np.ndarray:
    ring = 2 * (n - 1) * profile.latency + 2 * (n - 1) / n * _weight_bytes(profile) / profile.bytes_per_second
    return np.where(n == 1, 0.0, ring)


def _central_exchange(profile: Profile, n: np.ndarray) -> np.ndarray:
    """N workers push at once through the server's downlink, then N replies share its uplink."""
    return 2 * _transfer(profile, n * _weight_bytes(profile))


def _shares(tensor_bytes: tuple[int, ...], n: int) -> dict[float, int]:
    """Each owner's fraction of the bytes (Algorithm 3.7 over the real tensors) → how many owners hold it."""
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
    held = [sum(size for size, owner in zip(tensor_bytes, owners, strict=True) if owner == j) / total
            for j in range(n)]  # fmt: skip
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


def _sharded_exchange(profile: Profile, terms: Terms, n: np.ndarray) -> np.ndarray:
    """Push every owner its share, owners update in parallel, pull every share back.

    Worker i sends (1 − s_i) of the bytes over its uplink while owner j receives (N−1)·s_j over its
    downlink; the busiest link sets each phase's length (and the same for the replies): the one of
    the owner with the smallest share or the one with the largest.
    """
    shares = terms.shares(n)
    smallest = np.array([min(held) for held in shares])
    largest = np.array([max(held) for held in shares])
    update = largest * profile.t_update
    busiest = np.maximum(1 - smallest, (n - 1) * largest)
    phase = (n - 1) * profile.latency + busiest * _weight_bytes(profile) / profile.bytes_per_second
    return np.where(n == 1, update, 2 * phase + update)


def asynchronous_networks(
    terms: Terms, *, server: str, workers: np.ndarray, strategy: str = "ps"
) -> list[tuple[int, float, dict[float, int]]]:
    """N workers cycling compute → push → update → pull as a closed network, per N: (customers, think, queues).

    ``queues``: demand → how many queues have it (see :mod:`scaletrain.estimate.queueing`).
    """
    strategy, server, _ = modelled(strategy, server, "async")
    return ASYNCHRONOUS[(strategy, server)](terms, workers)


def _central_networks(terms: Terms, workers: np.ndarray) -> list[tuple[int, float, dict[float, int]]]:
    profile = terms.profile
    gradients = terms.gradient("async", workers).tolist()
    size = _weight_bytes(profile)
    bandwidth = profile.bytes_per_second
    # Queues: the server's downlink (gradients), its update lock, its uplink (weights).
    queues = _demands([(size / bandwidth, 1), (profile.t_update, 1), (size / bandwidth, 1)])
    return [(n, gradient + 2 * profile.latency, queues)
            for n, gradient in zip(workers.tolist(), gradients, strict=True)]  # fmt: skip


def _sharded_networks(terms: Terms, workers: np.ndarray) -> list[tuple[int, float, dict[float, int]]]:
    profile = terms.profile
    gradients = terms.gradient("async", workers).tolist()
    size = _weight_bytes(profile)
    bandwidth = profile.bytes_per_second
    networks = []
    for n, gradient, shares in zip(workers.tolist(), gradients, terms.shares(workers), strict=True):
        # Every process's uplink and downlink carry its own worker's pushes/pulls of the other shares
        # and its owner's traffic for the other workers; averaged over which worker is cycling.
        queues = []
        for share, owners in shares.items():
            link = ((1 - share) / n + (n - 1) / n * share) * size / bandwidth if n > 1 else 0.0
            queues += [(link, 2 * owners), (share * profile.t_update, owners)]
        networks.append((n, gradient + 2 * (n - 1) * profile.latency, _demands(queues)))
    return networks


def _demands(queues: list[tuple[float, int]]) -> dict[float, int]:
    """``(demand, count)`` pairs merged by demand; a queue no job spends time in changes nothing and is left out."""
    demands: dict[float, int] = {}
    for demand, count in queues:
        if demand > 0:
            demands[demand] = demands.get(demand, 0) + count
    return demands


#: Per modelled (strategy, server): what a synchronous step (join or split) takes besides the
#: gradient, in seconds for each worker count: the exchange and the optimizer step.
EXCHANGES: dict[tuple[str, str], Callable[[Terms, np.ndarray], np.ndarray]] = {
    ("allreduce", ""): lambda terms, n: _ring_allreduce(terms.profile, n) + terms.profile.t_update,
    ("ps", "central"): lambda terms, n: _central_exchange(terms.profile, n) + terms.profile.t_update,
    ("ps", "sharded"): lambda terms, n: _sharded_exchange(terms.profile, terms, n),  # owners update in parallel
}
#: Per modelled (strategy, server) with an ``async`` mode: its closed queueing network per worker count.
ASYNCHRONOUS: dict[tuple[str, str], Callable[[Terms, np.ndarray], list[tuple[int, float, dict[float, int]]]]] = {
    ("ps", "central"): _central_networks,
    ("ps", "sharded"): _sharded_networks,
}
