"""The refined speedup model: the thesis's reasoning plus what it leaves out, every constant from one profile.

Beside :mod:`scaletrain.estimate.thesis` it counts latency per message as well as bandwidth, the measured t_grad at
the split batch, the optimizer step (``t_update``), stragglers (the slowest of N gradient times, or the wait the
profile timed beside the strategy's exchange), CPU contention among workers sharing a machine's cores, the sharded
server's real shard sizes, synchronised workers sharing the central server's link, asynchronous training as a
closed queueing network solved exactly by mean value analysis, and ring all-reduce. No constant is fitted to the
runs the model is judged on; docs/prediction.md describes each term and how well the model predicts.

Throughput is in batches per second as SPEC §3 counts them (a join step is N batches, a split step one);
speedup = throughput × the reference, one worker training alone: the seconds a batch real one-process runs took
(``Profile.t_step``), else t_grad + t_update.

Each predicted strategy (:func:`scaletrain.estimate.models.predicted_configurations`) declares its own formulas
(:meth:`~scaletrain.parallel.strategies.base.Strategy.estimator_terms`, :mod:`~scaletrain.parallel.strategies.terms`;
the servers' in :mod:`scaletrain.parallel.strategies.ps.terms`): its synchronous step besides the gradient, its
asynchronous network, the thesis formula that stands for it. This module supplies what they share (the gradient
time per worker count, :class:`Terms`) and turns them into throughput; it names no strategy. A predicted strategy
without terms for a mode is a :class:`~scaletrain.errors.ConfigError`: the estimator does not model it.

>>> from scaletrain.estimate.profile import Profile
>>> p = Profile("toy", 32, t_grad=0.1, t_comm=0.01, weight_bytes=10**6, tensor_bytes=(5 * 10**5, 5 * 10**5))
>>> round(predict(p, strategy="allreduce", sync="join", workers=2).speedup, 3)  # 2·0.1 / (0.1 + 0.01)
1.818
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from scaletrain.errors import ConfigError
from scaletrain.estimate.foreign import engine_exchange, model_spec
from scaletrain.estimate.profile import Profile
from scaletrain.estimate.queueing import demand_scale, mean_value_throughput, mean_value_throughputs
from scaletrain.parallel.strategies import ALIASES, all_specs, get_strategy
from scaletrain.parallel.strategies.overlap import bucket_indices
from scaletrain.parallel.strategies.terms import Exchange, Network, Networks

__all__ = [
    "Prediction",
    "Terms",
    "asynchronous_networks",
    "batches_per_second",
    "mean_value_throughput",
    "modelled",
    "predict",
    "predict_many",
    "step_split",
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
    async_split: bool = False,
    options: Mapping[str, Any] | None = None,
) -> Prediction:
    """Predict one configuration. ``cores``: the workers share this many cores (None: a machine each).

    ``server`` counts only for a strategy that has servers (``ps``); ``allreduce`` ignores it.
    ``async_split``: asynchronous workers divide each batch (``--async-batches split``). ``options``: the
    strategy's own options its formulas read (e.g. diloco's ``sync_every``; None: its defaults).
    """
    terms = Terms(profile, cores, async_split, options, batches)
    return predict_many(
        profile, strategy=strategy, sync=sync, workers=[workers], server=server, batches=batches, terms=terms
    )[0]


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
    terms = terms or Terms(profile, cores, batches=batches)
    rates = batches_per_second(terms, strategy=strategy, server=server, sync=sync, workers=workers)
    sequential = terms.sequential
    return [
        Prediction(batches_per_second=rate, speedup=rate * sequential, train_seconds=batches / rate)
        for rate in rates.tolist()
    ]


def step_split(
    profile: Profile, *, strategy: str, sync: str, workers: int, server: str = "central", cores: int | None = None
) -> dict[str, float]:
    """A synchronous step's predicted seconds per part, as a run's workers report theirs: ``compute`` (the
    gradient, under contention), ``wait`` (for the slowest of N: the straggler term), ``exchange`` (the
    strategy's exchange, its optimizer step included) and their sum ``step``. An asynchronous worker's cycle
    from its closed network: ``compute``, ``exchange`` (its push, the update and the reply as if it were
    alone, with the messages' latencies) and ``wait`` (its queueing behind the other workers' messages).

    >>> toy = Profile("toy", 8, t_grad=0.1, t_comm=0.01, latency=0.0, weight_bytes=1000, bandwidth=1e5)
    >>> step_split(toy, strategy="allreduce", sync="join", workers=2)
    {'compute': 0.1, 'wait': 0.0, 'exchange': 0.01, 'step': 0.11}
    """
    strategy, server, sync = modelled(strategy, server, sync)
    model_spec(profile, get_strategy(strategy).label(server, sync))  # a run the profile's engine has
    terms = Terms(profile, cores)
    n = np.asarray([workers])
    if sync == "async":
        customers, think, queues = asynchronous_networks(terms, strategy=strategy, server=server, workers=n)[0]
        compute = float(terms.gradient(sync, n, get_strategy(strategy).estimator_terms(server).network_probe)[0])
        alone = sum(demand * count for demand, count in queues.items())
        response = customers / mean_value_throughput(customers, think, list(queues), list(queues.values())) - think
        split = {"compute": compute, "wait": max(response - alone, 0.0), "exchange": think - compute + alone}
        return {key: round(value, 12) for key, value in {**split, "step": think + response}.items()}
    part = profile.t_grad_at(workers) if sync == "split" else profile.t_grad_at(1)
    probe = _probe(strategy, server)
    compute = part * float(terms.contention(n, probe)[0])
    terms = terms.using(terms.options, sync=sync)
    gradient = terms.gradient(sync, n, probe, _meetings(terms, strategy, server, n))
    total = float(gradient[0])
    exchange = float(_exchange(terms, strategy, server, sync, n, gradient)[0])
    split = {"compute": compute, "wait": max(total - compute, 0.0), "exchange": exchange}
    return {key: round(value, 12) for key, value in {**split, "step": total + exchange}.items()}


def batches_per_second(terms: Terms, *, strategy: str, server: str, sync: str, workers: Sequence[int]) -> np.ndarray:
    """Predicted batches per second on each of ``workers`` worker counts; × ``terms.sequential`` is the speedup."""
    strategy, server, sync = modelled(strategy, server, sync)
    model_spec(terms.profile, get_strategy(strategy).label(server, sync))  # a run the profile's engine has
    n = np.asarray(workers, dtype=int)
    if sync == "async":
        networks = asynchronous_networks(terms, strategy=strategy, server=server, workers=n)
        return np.array(mean_value_throughputs(networks)) * terms.update_share(n)
    terms = terms.using(terms.options, sync=sync)
    gradient = terms.gradient(sync, n, _probe(strategy, server), _meetings(terms, strategy, server, n))
    step = gradient + _exchange(terms, strategy, server, sync, n, gradient)
    # A join step trains N batches, a split step one.
    return (n if sync == "join" else 1) / step


def modelled(strategy: str, server: str, sync: str) -> tuple[str, str, str]:
    """The configuration with the thesis's aliases resolved and no server for a strategy without one.

    One the registry does not predict, or one it predicts whose strategy declares no terms for it, is an error.

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
    if _declared(strategy, server, sync) is None:
        what = "networks (its async mode)" if sync == "async" else f"exchange (its {sync} step)"
        raise ConfigError(
            f"{label} is not modelled by the estimator: {registered.name}'s estimator_terms({server!r}) declares no "
            f"{what} (see scaletrain.parallel.strategies.terms)"
        )
    return strategy, server, sync


def _exchange(terms: Terms, strategy: str, server: str, sync: str, n: np.ndarray, gradient: np.ndarray) -> np.ndarray:
    """The synchronous exchange's seconds a step adds to the gradient's: all of it, or with an overlapping
    exchange and a profile of overlapped runs, what backward does not hide. A foreign engine's mode with a term
    of its own (:mod:`scaletrain.estimate.foreign`) takes that term."""
    foreign = engine_exchange(terms.profile, get_strategy(strategy).label(server, sync))
    if foreign is not None:
        return foreign(terms, n)
    exchange = _declared(strategy, server, sync)(terms, n)
    declared = get_strategy(strategy).estimator_terms(server)
    if declared is not None and declared.overlaps and terms.profile.overlap_bucket_bytes:
        # the exchange's thread needs a core of its own to run beside backward (a machine per worker: assumed)
        spare = np.ones(n.shape, bool) if terms.cores is None else n * terms.profile.threads < terms.cores
        return np.where(spare, exposed_exchange(terms.profile, exchange, gradient), exchange)
    return exchange


def exposed_exchange(profile: Profile, exchange: np.ndarray, gradient: np.ndarray) -> np.ndarray:
    """What an exchange overlapped with backward (``--overlap``) adds to a step of ``gradient`` seconds, where
    the exchange's thread has a core that backward does not use. (Where the workers' threads take every core
    of the machine, the refined model hides nothing: measured on 2 cores, ResNet-20 over 50 Mbit/s, PowerSGD
    rank 4, the communication fell by 10 ms a step and the computation rose by 11 ms.)

    The buckets are reduced one after another while backward computes; backward takes the measured
    ``t_backward / t_grad`` of the gradient's time (2/3 where a profile did not measure it: backward
    computes about twice the forward's work). The step then waits for the larger of: the last bucket's
    share of the exchange (its tensors are the last backward produces; by their float32 bytes, from the
    profile's tensor sizes, one bucket when they are not known), and the exchange less the backward it ran
    beside. The optimizer step (``t_update``) comes after either.

    >>> toy = Profile("toy", 8, t_grad=0.1, t_comm=0.01, t_update=0.0, t_backward=0.06, weight_bytes=400,
    ...               parameters=100, tensor_bytes=(100, 300), overlap_bucket_bytes=200)
    >>> exposed_exchange(toy, np.array([0.1, 0.03]), np.array([0.1, 0.1])).round(4).tolist()  # 0.1-0.06; 0.03/4
    [0.04, 0.0075]
    """
    moved = np.maximum(exchange - profile.t_update, 0.0)
    backward = profile.t_backward / profile.t_grad if profile.t_backward else 2 / 3
    return np.maximum(moved * _last_bucket_share(profile), moved - backward * gradient) + profile.t_update


def _last_bucket_share(profile: Profile) -> float:
    sizes = list(profile.tensor_bytes)
    if not sizes or not profile.weight_bytes or not profile.parameters:
        return 1.0
    scale = 4 * profile.parameters / profile.weight_bytes  # the tensors' bytes as float32 gradients
    buckets = bucket_indices([round(size * scale) for size in sizes], profile.overlap_bucket_bytes or 0)
    return sum(sizes[i] for i in buckets[-1]) / sum(sizes)


def _probe(strategy: str, server: str) -> str | None:
    """The exchange the profile times for the strategy (``EstimatorTerms.probe``), None where none."""
    terms = get_strategy(strategy).estimator_terms(server)
    return terms.probe if terms is not None else None


def _meetings(terms: Terms, strategy: str, server: str, n: np.ndarray) -> np.ndarray | None:
    """The share of steps at which the workers wait for each other (``EstimatorTerms.meetings``; None: every one)."""
    meetings = getattr(get_strategy(strategy).estimator_terms(server), "meetings", None)
    return meetings(terms, n) if meetings is not None else None


def _declared(strategy: str, server: str, sync: str) -> Exchange | Networks | None:
    """The strategy's own formula for a step of ``sync`` with ``server``, None where it declares none."""
    terms = get_strategy(strategy).estimator_terms(server)
    if terms is None:
        return None
    return terms.networks if sync == "async" else terms.exchange if sync in ("join", "split") else None


class Terms:
    """The profile's terms that depend on the worker count, each computed once however often it is asked for."""

    def __init__(
        self,
        profile: Profile,
        cores: int | None,
        async_split: bool = False,
        options: Mapping[str, Any] | None = None,
        batches: float | None = None,
    ) -> None:
        self.profile, self.cores = profile, cores
        #: the configuration's strategy options, which its formulas may read (``StepInputs.options``)
        self.options: Mapping[str, Any] = dict(options or {})
        #: the batches the predicted run trains (D), and the mode of its steps: :meth:`run_steps`
        self.batches, self.sync = batches, "split"
        # --async-batches split: each asynchronous update a gradient of batch // N, a (batch // N) / batch of a batch
        self.async_split = async_split
        self._columns: dict[str, dict[int, Any]] = {}
        # The sequential reference: one worker alone, as real runs measured it, else t_grad + t_update per batch.
        self.sequential = profile.t_step or profile.t_grad * profile.slowest_of(1) + profile.t_update

    def using(self, options: Mapping[str, Any], *, batches: float | None = None, sync: str | None = None) -> Terms:
        """These terms for a configuration with strategy options ``options`` (a run of ``batches`` in steps of ``sync``
        where given), sharing the per-count terms computed so far and later (they depend on the profile alone)."""
        batches = self.batches if batches is None else batches
        sync = sync or self.sync
        if dict(options) == self.options and (batches, sync) == (self.batches, self.sync):
            return self
        other = copy.copy(self)  # the same _columns: one cache
        other.options, other.batches, other.sync = dict(options), batches, sync
        return other

    def run_steps(self, workers: np.ndarray) -> np.ndarray | None:
        """The steps each worker takes in the predicted run of D batches: D split, D / N join; None: no run length.

        >>> toy = Profile("toy", 8, t_grad=0.1, t_comm=0.01)
        >>> Terms(toy, None, batches=120).using({}, sync="join").run_steps(np.array([1, 2, 4])).tolist()
        [120.0, 60.0, 30.0]
        """
        if self.batches is None:
            return None
        return self.batches / workers if self.sync == "join" else np.full(workers.shape, float(self.batches))

    def update_share(self, workers: np.ndarray) -> np.ndarray:
        """The batches of ``--batch-size`` one asynchronous update trains among N workers: 1, or split ``(b // N) / b``.

        >>> toy = Profile("toy", 20, t_grad=0.1, t_comm=0.01)
        >>> Terms(toy, None, async_split=True).update_share(np.array([1, 3])).tolist()
        [1.0, 0.3]
        """
        if not self.async_split:
            return np.ones(workers.shape)
        batch = self.profile.batch_size
        if batch < 1:  # times given without a batch: the thesis's t_grad / N
            return 1.0 / workers
        return np.maximum(batch // workers, 1) / batch

    def per_count(self, name: str, workers: np.ndarray, compute: Callable[[int], Any]) -> list[Any]:
        """``compute(n)`` for each of ``workers``, each n computed once per name (strategies' terms share it)."""
        if workers.size and workers.min() < 1:
            raise ConfigError(f"--workers must be ≥ 1, got {workers.min()}")
        column = self._columns.setdefault(name, {})
        counts = workers.tolist()
        column.update((n, compute(n)) for n in counts if n not in column)
        return [column[n] for n in counts]

    def gradient(
        self, sync: str, workers: np.ndarray, probe: str | None = None, meetings: np.ndarray | None = None
    ) -> np.ndarray:
        """t_grad of one worker's part of a step among N: its batch share, contention, stragglers (the expected
        slowest of N draws of t_grad, or where the profile timed the strategy's exchange among N, the mean wait
        for the slowest measured beside it: ``exchange_wait``, at the share ``meetings`` of steps where the workers
        meet only at some: ``EstimatorTerms.meetings``)."""
        profile = self.profile
        if sync == "split" or (sync == "async" and self.async_split):
            part = np.array(self.per_count("split", workers, profile.t_grad_at))
        else:
            part = np.full(workers.shape, profile.t_grad_at(1))
        # Synchronous steps wait for the slowest of N workers; asynchronous workers each go at their mean pace.
        slowest = self.per_count("slowest", workers if sync != "async" else np.ones_like(workers), profile.slowest_of)
        computed = part * self.contention(workers, probe)
        if sync == "async":
            return computed * np.array(slowest)
        # where the strategy's exchange was timed among N, the wait beside it (for a smaller batch, its share)
        timed = profile.exchange_wait.get(probe, {}) if probe is not None else {}
        beside = profile.exchange_compute.get(probe, {}) if probe is not None else {}
        waits = [timed[n] if n in timed and n in beside and n > 1 else None for n in workers.tolist()]
        share = part / profile.t_grad_at(1)
        # Workers that meet once in 1/m steps wait there for the slowest sum of 1/m gradients: a drift of √(1/m)
        # draws' spread, √m of it a step; the wait timed beside the exchange comes after each of its ends, m a step.
        met = np.ones(workers.shape) if meetings is None else np.asarray(meetings, dtype=float)
        drift = 1 + (np.array(slowest) - 1) * np.sqrt(met)
        steps = zip(computed, drift, waits, share * met, strict=True)
        return np.array(
            [alone * factor if wait is None else alone + wait * fraction for alone, factor, wait, fraction in steps]
        )

    def contention(self, workers: np.ndarray, probe: str | None = None) -> np.ndarray:
        """The gradient's slowdown among N processes: as timed beside the strategy's own exchange among N where
        the profile did (``exchange_compute[probe]``), else with the processes only computing (``contention``)."""
        profile = self.profile
        beside = profile.exchange_compute.get(probe, {}) if probe is not None else {}
        alone = self.per_count("contention", workers, lambda n: profile.contention_at(n, cores=self.cores))
        return np.array(
            [
                beside[n] / profile.t_grad if n in beside and n > 1 else factor
                for n, factor in zip(workers.tolist(), alone, strict=True)
            ]
        )


def asynchronous_networks(terms: Terms, *, server: str, workers: np.ndarray, strategy: str = "ps") -> list[Network]:
    """N workers cycling compute → push → update → pull as a closed network, per N: (customers, think, queues).

    ``queues``: demand → how many queues have it (see :mod:`scaletrain.estimate.queueing`); the
    network is the strategy's own (its :class:`~scaletrain.parallel.strategies.terms.EstimatorTerms`).
    Where the profile timed the strategy's asynchronous exchange among N workers (its ``network_probe``),
    the queues are scaled so that the network's response time is the measured exchange
    (:func:`~scaletrain.estimate.queueing.demand_scale`), on the line between the counts it timed and the
    nearest one's beyond them: what exponential service leaves out (transfers that pipeline, a server that
    serialises) is measured, not assumed. One worker alone keeps the profile's own transfer times.
    """
    strategy, server, sync = modelled(strategy, server, "async")
    networks = _declared(strategy, server, sync)(terms, workers)
    declared = get_strategy(strategy).estimator_terms(server)
    timed = terms.profile.exchange_timed(declared.network_probe) if declared.network_probe else {}
    counts = sorted(k for k in timed if k >= 2)
    if not counts:
        return networks
    # the probe's workers push whole batches: fit the factor on those networks, apply it to the ones asked for
    whole = terms if not terms.async_split else Terms(terms.profile, terms.cores)
    beside = 2 * terms.profile.latency + terms.profile.codec("compress")  # in the think time and in what was timed
    probed = _declared(strategy, server, sync)(whole, np.asarray(counts))
    factors = {k: demand_scale(k, think, queues, timed[k] - beside) for k, think, queues in probed}
    scaled = []
    for customers, think, queues in networks:
        factor = terms.profile.calibrated(factors, customers, lambda _: 1.0)
        scaled.append((customers, think, {demand * factor: count for demand, count in queues.items()}))
    return scaled
