"""How a strategy is predicted: the terms it declares beside its code, which the speedup estimators read.

The estimators (:mod:`scaletrain.estimate`) sit above the strategies, so a strategy cannot call them;
instead each :class:`~scaletrain.parallel.strategies.base.Strategy` declares, per server kind, an
:class:`EstimatorTerms`: pure functions over the profile's numbers that the refined model calls with
its per-worker-count inputs (:class:`StepInputs`), and the thesis formula that stands for it. The
estimators find them through the registry; nothing in ``estimate/`` names a strategy.

What the refined model does with them (Šlampa 2017's vocabulary for the modes): a ``join`` step
trains N batches in the slowest worker's gradient time plus ``exchange``; a ``split`` step trains one
batch in the gradient time of its N-th part plus ``exchange``; ``async`` workers cycle through the
closed queueing network of ``networks``. Throughput is batches per second; speedup is against one
worker training alone.

>>> import numpy as np
>>> from types import SimpleNamespace
>>> profile = SimpleNamespace(latency=0.001, bytes_per_second=10**8, weight_bytes=None, t_comm=0.011)
>>> transfer_seconds(profile, np.array([10**6, 2 * 10**6]))  # latency + bytes / bandwidth
array([0.011, 0.021])
>>> weight_bytes(profile)  # not measured: t_comm × bandwidth
1100000.0
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

__all__ = [
    "EstimatorTerms",
    "Exchange",
    "Network",
    "Networks",
    "ProfileNumbers",
    "StepInputs",
    "gradient_bytes",
    "queue_demands",
    "transfer_seconds",
    "weight_bytes",
]

#: A closed queueing network for N workers: (customers, think time in seconds, queues: demand in
#: seconds → how many queues have it), as :mod:`scaletrain.estimate.queueing` solves it.
Network = tuple[int, float, dict[float, int]]


class ProfileNumbers(Protocol):
    """The measured numbers of one workload at one batch size that terms may read (seconds, bytes);
    :class:`scaletrain.estimate.profile.Profile` has them."""

    @property
    def t_grad(self) -> float: ...
    @property
    def t_comm(self) -> float: ...
    @property
    def t_update(self) -> float: ...
    @property
    def latency(self) -> float: ...
    @property
    def weight_bytes(self) -> int | None: ...
    @property
    def tensor_bytes(self) -> tuple[int, ...]: ...
    @property
    def bytes_per_second(self) -> float: ...
    @property
    def allreduce(self) -> dict[int, float]: ...  # N workers → a measured all-reduce's seconds
    @property
    def central(self) -> dict[int, float]: ...  # N workers → a measured central-server exchange's seconds
    @property
    def sharded(self) -> dict[int, float]: ...  # N workers → a measured sharded exchange's seconds
    @property
    def collective(self) -> str: ...  # how the wire codec's all-reduce moves its payload (all_reduce, all_gather)
    @property
    def collective_calls(self) -> int: ...  # its collectives per step

    def codec(self, part: str) -> float:
        """Seconds of the wire codec's own ``part`` (allreduce, compress, decompress) per step; 0 unmeasured."""
        ...

    def calibrated(self, measured: dict[int, float], processes: int, modelled: Callable[[int], float]) -> float:
        """``modelled(processes)`` corrected by the ratio measured ÷ modelled at the measured counts."""
        ...


class StepInputs(Protocol):
    """What the refined model hands a strategy's terms (:class:`scaletrain.estimate.refined.Terms`)."""

    @property
    def profile(self) -> ProfileNumbers: ...
    @property
    def options(self) -> Mapping[str, Any]: ...  # the configuration's strategy options (every one, defaults filled)
    @property
    def sync(self) -> str: ...  # the configuration's steps: join or split (asynchronous updates have no exchange term)

    def gradient(
        self, sync: str, workers: np.ndarray, probe: str | None = None, meetings: np.ndarray | None = None
    ) -> np.ndarray:
        """t_grad of one worker's part of a step among N (batch share, CPU contention, stragglers); ``probe``: an
        exchange the profile may have timed it beside (``exchange_compute``); ``meetings``: the share of steps at
        which the workers wait for each other (None: every step)."""
        ...

    def run_steps(self, workers: np.ndarray) -> np.ndarray | None:
        """The steps each worker takes in the predicted run (its D batches; a join step trains N); None where the
        prediction is for no run length."""
        ...

    def per_count(self, name: str, workers: np.ndarray, compute: Callable[[int], Any]) -> list[Any]:
        """``compute(n)`` for each of ``workers``, each n computed once per ``name`` for every configuration."""
        ...


#: What a synchronous step (join or split) takes besides the gradient, in seconds, for each worker count.
Exchange = Callable[[StepInputs, np.ndarray], np.ndarray]
#: An asynchronous mode's closed network for each worker count.
Networks = Callable[[StepInputs, np.ndarray], list[Network]]


@dataclass(frozen=True)
class EstimatorTerms:
    """How the estimators predict a strategy with one server kind.

    ``exchange``: the exchange and the optimizer step of a synchronous step (join and split), per
    worker count; None: its synchronous modes are not modelled. ``networks``: its ``async`` mode as a
    closed queueing network per worker count; None: not modelled. ``thesis_server``: the thesis
    formula that stands for it (``central`` or ``distributed``, Šlampa 2017 §2); None: the thesis
    model does not predict it. A mode left out is refused with "not modelled by the estimator".
    """

    exchange: Exchange | None = None
    networks: Networks | None = None
    thesis_server: str | None = None
    #: its synchronous exchange can run while backward computes (``--overlap``: a profile with
    #: ``overlap_bucket_bytes`` hides part of it, :func:`scaletrain.estimate.refined.exposed_exchange`)
    overlaps: bool = False
    #: the exchange ``scaletrain profile --exchange-at`` times for it (``allreduce``, ``central``, ``sharded``):
    #: where the profile timed it among N, the gradient's seconds measured beside it (``exchange_compute``) replace
    #: the contention of N processes that only compute
    probe: str | None = None
    #: the share of steps at which its workers wait for each other, per worker count (diloco: its outer steps in
    #: the run); None: every step. Scales the wait timed beside ``probe`` and the stragglers' term.
    meetings: Exchange | None = None
    #: the asynchronous exchange the profile times for it (``central-async``): where the profile timed it among N,
    #: the network's queues are scaled so that it gives the measured exchange (``scaletrain.estimate.refined``)
    network_probe: str | None = None


def calibrated_seconds(
    profile: ProfileNumbers, measured: dict[int, float], n: np.ndarray, formula: Callable[[int], float]
) -> np.ndarray:
    """``formula`` at each worker count of ``n``, corrected by what the profile ``measured`` at some counts
    (:meth:`~scaletrain.estimate.profile.Profile.calibrated`), in ``n``'s shape."""
    counts = np.asarray(n)
    seconds = [profile.calibrated(measured, int(k), formula) for k in counts.ravel().tolist()]
    return np.asarray(seconds, dtype=float).reshape(counts.shape)


def transfer_seconds(profile: ProfileNumbers, size: np.ndarray) -> np.ndarray:
    """One message of ``size`` bytes: latency + bytes / bandwidth."""
    return profile.latency + size / profile.bytes_per_second


def weight_bytes(profile: ProfileNumbers) -> float:
    """The bytes of all weights: measured, else t_comm × bandwidth."""
    return profile.weight_bytes or profile.t_comm * profile.bytes_per_second


def gradient_bytes(profile: ProfileNumbers) -> float:
    """The bytes of one worker's gradient message: as its wire codec compresses it where the profile says
    (``--wire powersgd``, ``topk``), else the weights'."""
    return getattr(profile, "gradient_bytes", None) or weight_bytes(profile)


def queue_demands(queues: list[tuple[float, int]]) -> dict[float, int]:
    """``(demand, count)`` pairs merged by demand; a queue no job spends time in changes nothing and is left out.

    >>> queue_demands([(0.5, 1), (0.0, 3), (0.5, 2), (0.1, 1)])
    {0.5: 3, 0.1: 1}
    """
    demands: dict[float, int] = {}
    for demand, count in queues:
        if demand > 0:
            demands[demand] = demands.get(demand, 0) + count
    return demands
