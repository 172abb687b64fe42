"""A profile: the measured inputs of the speedup estimators (Šlampa 2017, §6.2) for one workload at one
batch size, as ``scaletrain profile`` (:mod:`scaletrain.measure.profile`) writes it.

>>> profile = Profile.from_json({"workload": "toy", "batch_size": 8, "t_grad": 0.1, "t_comm": 0.02})
>>> profile.t_grad_at(2), profile.contention_at(2, cores=None)
(0.05, 1.0)
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scaletrain.errors import ConfigError
from scaletrain.workloads.reference import workload_label

__all__ = ["Profile", "launch_chunks", "typical_mean"]


@dataclass(frozen=True)
class Profile:
    """Measured times of one workload at one batch size (seconds, bytes, bytes per second).

    Only ``t_grad`` and ``t_comm`` are needed (the thesis's inputs); the rest refine the estimate
    and default to "not measured".
    """

    workload: str
    batch_size: int
    t_grad: float
    t_comm: float
    t_grad_parts: dict[int, float] = field(default_factory=dict)  # n → t_grad of batch/n
    t_update: float = 0.0
    #: seconds a batch of one process training alone, measured in real runs (the median of their launches'), which
    #: every speedup is over; None: not measured, t_grad + t_update stands for it
    t_step: float | None = None
    t_backward: float | None = None  # backward's part of t_grad (whole batch); None: not measured
    #: the runs predicted all-reduce buckets of this many bytes of gradient while backward computes
    #: (``train --overlap``); None: after backward
    overlap_bucket_bytes: int | None = None
    latency: float = 0.0
    bandwidth: float | None = None  # None: weight_bytes / t_comm
    weight_bytes: int | None = None
    gradient_bytes: int | None = None  # one worker's gradient message as its wire codec sends it; None: weight_bytes
    tensor_bytes: tuple[int, ...] = ()
    contention: dict[int, float] = field(default_factory=dict)  # k processes → t_grad factor
    #: N workers → seconds of one all-reduce of the gradient message among them, timed as the all-reduce
    #: exchange times its communication (``--exchange-at``); empty: not measured
    allreduce: dict[int, float] = field(default_factory=dict)
    #: N workers → seconds of one synchronous exchange with the central server (push, the server's wait for
    #: all N and its update, the reply), as a worker times it (communication + wait; ``--exchange-at``)
    central: dict[int, float] = field(default_factory=dict)
    #: N workers → seconds of one synchronous sharded exchange (every worker an owner: its pushes, the owners' wait
    #: and update, the replies), as a worker times it (communication + wait; ``--exchange-at``)
    sharded: dict[int, float] = field(default_factory=dict)
    #: N workers → seconds of one exchange with the asynchronous central server (the push and the wait for the
    #: reply, as they queue behind the other workers'), as a worker times it among N pushing as they please
    central_async: dict[int, float] = field(default_factory=dict)
    #: exchange (``allreduce``, ``central``, ``sharded``, ``central-async``) → N → a worker's gradient seconds (its
    #: whole batch) in the same probe, a gradient before each exchange as in training: the computation under that
    #: strategy's own traffic and threads among N (``contention``: the processes only compute)
    exchange_compute: dict[str, dict[int, float]] = field(default_factory=dict)
    #: exchange → N → a worker's mean seconds a step waiting for the slowest of N, timed in the same probe where
    #: the exchange's own seconds leave that wait out (the all-reduce's one-number all-reduce before it); 0 where
    #: they hold it (a parameter-server worker's wait for its reply). Where timed, it stands for the straggler term
    exchange_wait: dict[str, dict[int, float]] = field(default_factory=dict)
    cores: int | None = None
    threads: int = 1
    network: str | None = None
    parameters: int | None = None
    options: dict[str, str] = field(default_factory=dict)
    samples: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    architecture: dict[str, dict[str, int]] = field(default_factory=dict)  # as ProfileConfig's
    precision: str = "fp32"
    wire: str = "fp32"
    memory_format: str = "contiguous"  # as timed (auto resolved)
    wire_options: dict[str, Any] = field(default_factory=dict)  # the codec's -W options gradient_bytes was sized with
    #: the wire codec's own compute per step on one worker, in seconds (``scaletrain profile`` with a
    #: ``--wire`` other than fp32): ``allreduce`` (its all-reduce less the float32 one, one process alone),
    #: ``compress`` (a gradient message, error feedback included) and ``decompress`` (one message);
    #: empty: not measured (float32, whose packing every strategy pays alike)
    codec_seconds: dict[str, float] = field(default_factory=dict)
    collective: str = "all_reduce"  # how the codec's all-reduce moves its payload (WireCodec.collective)
    collective_calls: int = 1  # its collectives per step (WireCodec.collective_calls)
    #: whose runs it measured: ``scaletrain``, or a foreign engine (``tensorflow``, ``mxnet``) timed with its own
    #: program and python (``scaletrain profile --framework``; :mod:`scaletrain.estimate.foreign`)
    framework: str = "scaletrain"
    #: N workers → seconds of MXNet ``dist_sync``'s push of the gradient and pull of the sum among N workers and
    #: N servers, as its worker times it (a profile of the mxnet engine); empty: not measured
    kvstore: dict[int, float] = field(default_factory=dict)

    def codec(self, part: str) -> float:
        """Seconds of the wire codec's own ``part`` per step (0 where not measured).

        >>> Profile("toy", 8, t_grad=0.1, t_comm=0.02, codec_seconds={"compress": 0.003}).codec("compress")
        0.003
        """
        return self.codec_seconds.get(part, 0.0)

    def t_grad_at(self, parts: int) -> float:
        """t_grad of 1/``parts`` of the batch: measured, else t_grad/parts (the thesis's assumption)."""
        return self.t_grad_parts.get(parts, self.t_grad / parts)

    def slowest_of(self, workers: int) -> float:
        """Expected slowest of ``workers`` gradient times over t_grad (the median of the samples).

        A run goes at its steps' mean pace, and a synchronous step waits for the slowest worker (Chen et al. 2016
        measured such stragglers at scale): E[max of N draws] of the steps' spread within a launch, at the
        typical launch's level (:func:`typical_mean`). So one slow launch of the profile (a process's pace varies
        from launch to launch) widens the range (:mod:`scaletrain.estimate.intervals`) but does not move the
        point prediction. For N = 1 the typical launch's mean. Without samples: 1.

        >>> Profile("toy", 8, t_grad=1.0, t_comm=0.1, samples={"t_grad": [1.0, 1.0, 2.0]}).slowest_of(2)
        1.555...
        >>> slow_launch = {"t_grad": [1.0, 1.0, 1.0, 1.0, 2.0, 2.0], "launches": 3}
        >>> Profile("toy", 8, t_grad=1.0, t_comm=0.1, samples=slow_launch).slowest_of(1)  # the pooled mean: 1.33
        1.0
        """
        samples = list(self.samples.get("t_grad") or ())
        if not samples:
            return 1.0
        chunks = launch_chunks(samples, self.samples.get("launches"))
        levels = [statistics.fmean(chunk) for chunk in chunks]
        spread = sorted(x / level for chunk, level in zip(chunks, levels, strict=True) for x in chunk)
        count = len(spread)
        expected = sum(x * ((i / count) ** workers - ((i - 1) / count) ** workers) for i, x in enumerate(spread, 1))
        return statistics.median(levels) * expected / statistics.median(samples)

    def contention_at(self, processes: int, *, cores: int | None) -> float:
        """How much slower t_grad is with ``processes`` computing on ``cores`` shared cores.

        ``cores`` None: every worker has its own machine (factor 1). Measured factors are used as
        they are; beyond them the factor grows with processes per core.
        """
        if cores is None or processes <= 1:
            return 1.0
        if processes in self.contention:
            return self.contention[processes]
        above = min((k for k in self.contention if k > processes), default=None)
        if above is not None:  # between two measured counts (``contention_counts``): on the line between them
            below = max(k for k in self.contention if k < processes)
            share = (processes - below) / (above - below)
            return self.contention[below] + share * (self.contention[above] - self.contention[below])
        known = max((k for k in self.contention if k <= processes), default=1)
        base = self.contention.get(known, 1.0)
        return base * max(1.0, processes / max(known, cores))

    def calibrated(self, measured: dict[int, float], processes: int, modelled: Callable[[int], float]) -> float:
        """``modelled(processes)`` corrected by what was ``measured`` at some process counts: times the ratio
        measured ÷ modelled at a measured count, on the line between the two nearest measured counts,
        and the nearest one's beyond them. Nothing measured: the model as it is.

        >>> toy = Profile("toy", 8, t_grad=1.0, t_comm=0.1)
        >>> round(toy.calibrated({2: 0.2, 4: 0.6}, 3, lambda n: 0.1 * n), 3)  # 0.3 × (1 + 1.5) / 2
        0.375
        """
        counts = sorted(k for k in measured if k >= 2 and modelled(k) > 0)
        if not counts or processes < 2:
            return modelled(processes)
        factors = {k: measured[k] / modelled(k) for k in counts}
        if processes <= counts[0] or processes >= counts[-1]:
            factor = factors[counts[0] if processes <= counts[0] else counts[-1]]
        else:
            above = min(k for k in counts if k >= processes)
            below = max(k for k in counts if k <= processes)
            share = (processes - below) / (above - below) if above != below else 0.0
            factor = factors[below] + share * (factors[above] - factors[below])
        return modelled(processes) * factor

    def exchange_timed(self, kind: str) -> dict[int, float]:
        """N workers → the seconds of exchange ``kind`` (``--exchanges``: allreduce, central, sharded, central-async)
        the profile timed among N; empty where it timed none."""
        timed = {
            "allreduce": self.allreduce,
            "central": self.central,
            "sharded": self.sharded,
            "central-async": self.central_async,
        }
        return timed.get(kind, {})

    @property
    def bytes_per_second(self) -> float:
        if self.bandwidth:
            return self.bandwidth
        size = self.weight_bytes or 1
        # A latency measured at or above t_comm (noise on a loaded machine) says nothing about bandwidth.
        transfer = self.t_comm - self.latency if self.t_comm > 2 * self.latency else self.t_comm
        return size / max(transfer, 1e-12)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Profile:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ConfigError(f"profile has unknown fields {sorted(unknown)}; was it written by scaletrain profile?")
        given = dict(data)
        for key in ("t_grad_parts", "contention", "allreduce", "central", "sharded", "central_async", "kvstore"):
            if key in given:
                given[key] = {int(k): float(v) for k, v in given[key].items()}
        for key in ("exchange_compute", "exchange_wait"):
            if key in given:
                given[key] = {kind: {int(k): float(v) for k, v in timed.items()} for kind, timed in given[key].items()}
        if "tensor_bytes" in given:
            given["tensor_bytes"] = tuple(given["tensor_bytes"])
        try:
            return cls(**given)
        except TypeError as exc:
            raise ConfigError(f"profile is missing a field: {exc}") from None

    def save(self, path: Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2), encoding="utf-8")
        return path

    def default_path(self) -> Path:
        """``profiles/WORKLOAD-bBATCH[-FRAMEWORK][-RATE][-PRECISION][-wWIRE[-KEYVALUE…]][-overlap].json`` (scaletrain,
        float32 parts and an exchange after backward left out)

        >>> Profile("lenet", 64, t_grad=0.02, t_comm=0.001, framework="mxnet").default_path().name
        'lenet-b64-mxnet.json'
        """
        network = f"-{self.framework}" if self.framework != "scaletrain" else ""
        network += f"-{self.network}" if self.network else ""
        precision = f"-{self.precision}" if self.precision != "fp32" else ""
        wire = f"-w{self.wire}" if self.wire != "fp32" else ""
        wire += "".join(f"-{key}{value}" for key, value in sorted(self.wire_options.items()))
        wire += "-overlap" if self.overlap_bucket_bytes else ""
        return Path("profiles") / f"{workload_label(self.workload)}-b{self.batch_size}{network}{precision}{wire}.json"

    @classmethod
    def load(cls, path: Path) -> Profile:
        try:
            return cls.from_json(json.loads(Path(path).read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read profile {path}: {exc}; write one with `scaletrain profile`") from None


def launch_chunks(samples: list[float], launches: object) -> list[list[float]]:
    """``samples`` pooled launch after launch (``launches`` fresh processes, each as many samples), by launch; one
    chunk where the launches are not recorded or do not divide the samples."""
    if not isinstance(launches, int) or launches < 1 or len(samples) % launches:
        launches = 1
    size = len(samples) // launches
    return [samples[i * size : (i + 1) * size] for i in range(launches)]


def typical_mean(samples: list[float], launches: object) -> float:
    """The typical launch's mean: the median over launches of each launch's mean.

    A run's throughput follows its steps' mean (a step of 10 % more now and then costs 10 % of those steps),
    while a whole launch that happens to be slow (one of three, ±15 % here) is the run-to-run noise that
    prediction ranges carry: so the mean within a launch, the median across them.

    >>> typical_mean([1.0, 3.0, 2.0, 2.0, 9.0, 9.0], 3)  # launch means 2, 2, 9
    2.0
    >>> typical_mean([1.0, 3.0, 2.0], None)  # one launch: the mean
    2.0
    """
    return statistics.median(statistics.fmean(chunk) for chunk in launch_chunks(samples, launches))
