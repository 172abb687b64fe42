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

>>> from scaletrain.measure.profile import Profile
>>> p = Profile("toy", 32, t_grad=0.1, t_comm=0.01, weight_bytes=10**6, tensor_bytes=(5 * 10**5, 5 * 10**5))
>>> round(predict(p, strategy="allreduce", sync="join", workers=2).speedup, 3)  # 2·0.1 / (0.1 + 0.01)
1.818
"""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.errors import ConfigError
from scaletrain.measure.profile import Profile
from scaletrain.parallel.sharding import assign_greedy

__all__ = ["CONFIGURATIONS", "Prediction", "mean_value_throughput", "predict"]

# (strategy, server, sync) the refined model covers; the labels are the bench's strategy specs.
CONFIGURATIONS = (
    ("allreduce", "", "join"),
    ("allreduce", "", "split"),
    *(("ps", server, sync) for server in ("central", "sharded") for sync in ("join", "split", "async")),
)


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
    """Predict one configuration. ``cores``: the workers share this many cores (None: a machine each)."""
    server = {"distributed": "sharded"}.get(server, server)
    sync = {"none": "async"}.get(sync, sync)
    if (strategy, server if strategy == "ps" else "", sync) not in CONFIGURATIONS:
        raise ConfigError(
            f"the refined model covers allreduce join/split and ps central/sharded join/split/async, "
            f"not {strategy} {server} {sync}"
        )
    if workers < 1:
        raise ConfigError(f"--workers must be ≥ 1, got {workers}")
    n = workers
    gradient = profile.t_grad_at(n if sync == "split" else 1) * profile.contention_at(n, cores=cores)
    # Synchronous steps wait for the slowest of N workers; asynchronous workers each go at their mean pace.
    gradient *= profile.slowest_of(n if sync != "async" else 1)
    if strategy == "allreduce":
        rate = _per_step(n, sync, gradient + _ring_allreduce(profile, n) + profile.t_update)
    elif sync == "async":
        rate = _asynchronous(profile, server, n, gradient)
    elif server == "central":
        rate = _per_step(n, sync, gradient + _central_exchange(profile, n) + profile.t_update)
    else:
        rate = _per_step(n, sync, gradient + _sharded_exchange(profile, n))
    sequential = profile.t_grad * profile.slowest_of(1) + profile.t_update
    return Prediction(batches_per_second=rate, speedup=rate * sequential, train_seconds=batches / rate)


def _per_step(workers: int, sync: str, step_seconds: float) -> float:
    """Batches per second of a synchronous run: a join step trains N batches, a split step one."""
    return (workers if sync == "join" else 1) / step_seconds


def _transfer(profile: Profile, size: float) -> float:
    return profile.latency + size / profile.bytes_per_second


def _weight_bytes(profile: Profile) -> float:
    return profile.weight_bytes or profile.t_comm * profile.bytes_per_second


def _ring_allreduce(profile: Profile, n: int) -> float:
    if n == 1:
        return 0.0
    return 2 * (n - 1) * profile.latency + 2 * (n - 1) / n * _weight_bytes(profile) / profile.bytes_per_second


def _central_exchange(profile: Profile, n: int) -> float:
    """N workers push at once through the server's downlink, then N replies share its uplink."""
    return 2 * _transfer(profile, n * _weight_bytes(profile))


def _shares(profile: Profile, n: int) -> list[float]:
    """Fraction of the weight bytes each of the N owners holds (Algorithm 3.7 over the real tensors)."""
    if not profile.tensor_bytes:
        return [1 / n] * n  # tensor sizes unknown: the thesis's even split
    owners = assign_greedy(profile.tensor_bytes, list(range(n)))
    total = sum(profile.tensor_bytes)
    return [sum(size for size, owner in zip(profile.tensor_bytes, owners, strict=True) if owner == j) / total
            for j in range(n)]  # fmt: skip


def _sharded_exchange(profile: Profile, n: int) -> float:
    """Push every owner its share, owners update in parallel, pull every share back.

    Worker i sends (1 − s_i) of the bytes over its uplink while owner j receives (N−1)·s_j over its
    downlink; the busiest link sets each phase's length (and the same for the replies).
    """
    shares = _shares(profile, n)
    update = max(shares) * profile.t_update
    if n == 1:
        return update
    busiest = max(max(1 - share, (n - 1) * share) for share in shares)
    phase = (n - 1) * profile.latency + busiest * _weight_bytes(profile) / profile.bytes_per_second
    return 2 * phase + update


def _asynchronous(profile: Profile, server: str, n: int, gradient: float) -> float:
    """Updates per second of N workers cycling compute → push → update → pull (mean value analysis)."""
    size = _weight_bytes(profile)
    bandwidth = profile.bytes_per_second
    if server == "central":
        # Queues: the server's downlink (gradients), its update lock, its uplink (weights).
        demands = [size / bandwidth, profile.t_update, size / bandwidth]
        think = gradient + 2 * profile.latency
    else:
        # Every process's uplink and downlink carry its own worker's pushes/pulls of the other shares
        # and its owner's traffic for the other workers; averaged over which worker is cycling.
        shares = _shares(profile, n)
        demands = []
        for share in shares:
            link = ((1 - share) / n + (n - 1) / n * share) * size / bandwidth if n > 1 else 0.0
            demands += [link, link, share * profile.t_update]
        think = gradient + 2 * (n - 1) * profile.latency
    return mean_value_throughput(n, think, demands)


def mean_value_throughput(customers: int, think: float, demands: list[float]) -> float:
    """Throughput of a closed network: ``customers`` jobs, a delay of ``think``, queues with ``demands``.

    Exact mean value analysis (Reiser & Lavenberg, J. ACM 27(2), 1980) for single-server queues.

    >>> mean_value_throughput(1, 1.0, [0.5, 0.5])  # one job: 1 / (1 + 0.5 + 0.5)
    0.5
    >>> round(mean_value_throughput(50, 1.0, [0.25]), 6)  # saturated: 1 / 0.25
    4.0
    """
    queues = [0.0] * len(demands)
    throughput = 0.0
    for jobs in range(1, customers + 1):
        residence = [demand * (1 + queue) for demand, queue in zip(demands, queues, strict=True)]
        throughput = jobs / (think + sum(residence))
        queues = [throughput * time for time in residence]
    return throughput
