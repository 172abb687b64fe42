"""``scaletrain profile``: the measured inputs of the speedup estimators (Šlampa 2017, §6.2).

- **t_grad**: forward + backward of one batch on one worker, median after warm-up (clocks read after a GPU
  synchronisation), under ``precision``'s autocast if given; also at 1/n of the batch for a ``split`` run's workers
  (``split_workers``); and the optimizer step, **t_update**.
- **t_step**: the one-process reference, a batch of short real one-process runs (:mod:`scaletrain.measure.reference`).
- **contention**: t_grad while k processes compute at once on this machine over t_grad alone, for
  k = 2..``concurrency`` or only at ``contention_counts`` (interpolated between); every time taken is kept
  (``samples["t_grad_contended"]``).
- **t_comm**: half the median push + pull round trip of all weights between two real processes over the parameter
  server's transport, the buffer of the ``wire`` codec's type (so ``weight_bytes`` and every estimate built on them
  are the encoded bytes); **latency**: the same for 4 bytes; **bandwidth**: weight bytes / (t_comm − latency). With
  ``network`` the two processes talk across an emulated link of that rate.
- **allreduce** and **central** (``exchange_counts``): a synchronous step's exchange among N real worker processes,
  as a run's workers report it, by which the refined model corrects its formulas; with a compressing codec past its
  dense start, the central one not for a codec only all-reduce carries (PowerSGD). Each is pooled over ``launches``
  and keeps the gradient's seconds beside it (``exchange_compute``) and the all-reduce's wait for the slowest worker
  (``exchange_wait``).
- **codec_seconds** (a ``wire`` other than fp32): the codec's own compute per step on one worker.

Every measurement runs in fresh processes started like training processes (torchrun variables, 1 torch thread by
default, as ``scaletrain bench`` runs workers), and every wait has a timeout. The result is a
:class:`scaletrain.estimate.profile.Profile`; with ``framework`` ``tensorflow`` or ``mxnet`` the engine's own program
times it (:mod:`scaletrain.measure.engine_profile`). docs/prediction.md explains each measurement.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from scaletrain.efficient.channels_last import resolved_memory_format
from scaletrain.efficient.surgery import apply_architecture
from scaletrain.engines.registry import FRAMEWORKS
from scaletrain.errors import ConfigError, ScaletrainError
from scaletrain.estimate.profile import Profile, typical_mean
from scaletrain.measure.machine import machine_info
from scaletrain.measure.reference import time_reference
from scaletrain.netem.network import EmulatedNetwork, parse_rate
from scaletrain.parallel.launch import Process, spawn_rank, stop_processes
from scaletrain.parallel.ports import free_port
from scaletrain.tensors.codec import TensorLayout, WireCodec
from scaletrain.tensors.device import resolve_device
from scaletrain.workloads import Workload, create_workload

__all__ = [
    "ProfileConfig",
    "ProfileError",
    "check_split",
    "contention_counts",
    "measure_codec",
    "network",
    "run_profile",
]

POLL_SECONDS = 0.05
#: the exchanges a profile can time (probe kinds): the synchronous three and the asynchronous central server's
EXCHANGES = ("allreduce", "central", "sharded", "central-async")
SMALL_BYTES = 4


class ProfileError(ScaletrainError):
    """A measuring process failed or did not finish in time."""

    exit_code = 1


@dataclass(frozen=True)
class ProfileConfig:
    """What to measure and how often."""

    workload: str
    batch_size: int | None = None  # None: the workload's default
    options: dict[str, str] = field(default_factory=dict)
    split_workers: tuple[int, ...] = ()  # also t_grad at batch/n for these n
    concurrency: int | None = None  # contention up to this many processes; None: this machine's cores
    #: measure contention only at these process counts (≤ ``concurrency``), not at every count from 2:
    #: a launch per count costs seconds, and counts between them are interpolated
    contention_counts: tuple[int, ...] = ()
    exchange_counts: tuple[int, ...] = ()  # time the exchanges among this many workers
    #: which exchanges ``exchange_counts`` times: the central one moves N times the weights through one link,
    #: so on a slow emulated link it takes N times as long as the all-reduce
    exchanges: tuple[str, ...] = EXCHANGES
    network: str | None = None
    threads: int = 1
    repeats: int = 10
    warmup: int = 3
    round_trips: int = 10
    launches: int = 3  # fresh processes each timing is pooled over
    lr: float | None = None
    momentum: float | None = None
    optimizer: str | None = None  # whose step t_update times (--optimizer, as train takes it; unset: the workload's)
    optimizer_options: dict[str, object] = field(default_factory=dict)
    data_dir: Path | None = None
    download: bool = True
    timeout: float = 600.0
    #: the network a run left (``summary.json``'s ``architecture``: pruned channels, removed blocks);
    #: empty: the workload's own network
    architecture: dict[str, dict[str, int]] = field(default_factory=dict)
    precision: str = "fp32"  # autocast type of the timed forward passes
    wire: str = "fp32"  # what the weights travel as (scaletrain.tensors.codec)
    wire_options: dict[str, object] = field(default_factory=dict)  # the codec's -W options, as train takes them
    device: str = "cpu"  # where t_grad is timed (--device; a GPU: clocks read after synchronising)
    memory_format: str = "auto"  # the convolutions' activations in the timed passes (--memory-format)
    overlap_bucket_mb: float | None = None  # the runs predicted all-reduce buckets of this size during backward
    #: whose runs to profile: scaletrain's, or a foreign engine's with its own program (measure.engine_profile)
    framework: str = "scaletrain"

    def __post_init__(self) -> None:
        from scaletrain.efficient.precision import Precision

        if self.framework not in FRAMEWORKS:
            raise ConfigError(f"--framework takes {', '.join(FRAMEWORKS)}, not {self.framework!r}")

        # refuses an unknown precision, and fp16 where the device is no GPU
        Precision(precision=self.precision, device_type=resolve_device(self.device).type)
        resolved_memory_format(self.memory_format)
        WireCodec.of(self.wire, options=self.wire_options)  # a bad -W is one line before anything runs
        if self.repeats < 1 or self.round_trips < 1 or self.launches < 1 or self.warmup < 0:
            raise ConfigError("--repeats, --round-trips and --launches must be ≥ 1 and --warmup ≥ 0")
        if self.threads < 1:
            raise ConfigError(f"--threads must be ≥ 1, got {self.threads}")
        bucket = self.overlap_bucket_mb
        if bucket is not None and not (math.isfinite(bucket) and bucket > 0):
            raise ConfigError(f"--bucket-mb must be a number of MiB > 0, e.g. --bucket-mb 0.25; got {bucket!r}")
        if any(n < 1 for n in self.split_workers):
            raise ConfigError(f"split worker counts must be ≥ 1, got {self.split_workers}")
        if self.concurrency is not None and self.concurrency < 1:
            raise ConfigError(f"--concurrency must be ≥ 1, got {self.concurrency}")
        if any(n < 2 for n in self.contention_counts):
            raise ConfigError(f"--contention-at counts must be ≥ 2 processes, got {self.contention_counts}")
        if any(n < 2 for n in self.exchange_counts):
            raise ConfigError(f"--exchange-at counts must be ≥ 2 workers, got {self.exchange_counts}")
        unknown = sorted(set(self.exchanges) - set(EXCHANGES))
        if unknown:
            raise ConfigError(f"--exchanges takes {', '.join(EXCHANGES)} (comma-separated), not {', '.join(unknown)}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ConfigError(f"--batch-size must be ≥ 1, got {self.batch_size}")
        if not 0 < self.timeout < math.inf:
            raise ConfigError(f"--timeout must be a number of seconds > 0, got {self.timeout}")
        if self.network is not None:
            parse_rate(self.network)


def check_split(batch_size: int, counts: tuple[int, ...], flag: str | None = None) -> None:
    """Refuse, in one line, a batch that one of ``counts`` workers cannot share evenly (``flag``: the option that
    asked for that count, named in the line)."""
    if uneven := [n for n in counts if batch_size % n]:
        asked = f" (--{flag} {uneven[0]})" if flag else ""
        raise ConfigError(f"a batch of {batch_size} cannot be split over {uneven[0]} workers{asked}; pick a multiple")


def run_profile(config: ProfileConfig, *, out: Path | None = None) -> Profile:
    """Measure everything :class:`Profile` holds; write it as JSON to ``out`` when given.

    >>> profile = run_profile(ProfileConfig("lenet", batch_size=64))  # doctest: +SKIP
    >>> profile.t_grad, profile.t_comm  # doctest: +SKIP
    (0.021, 0.0006)
    """
    workload = create_workload(config.workload, config.options)
    defaults = workload.defaults
    batch_size = config.batch_size or defaults.batch_size
    check_split(batch_size, config.split_workers)
    if config.framework != "scaletrain":
        from scaletrain.measure.engine_profile import run_engine_profile

        return run_engine_profile(config, counts=contention_counts(config), out=out)
    # Load the data here first: a missing dataset is one clear error before any process starts.
    workload.load_data(config.data_dir, download=config.download)
    codec = WireCodec.of(config.wire, options=config.wire_options)
    trained = [p for p in network(workload, config.architecture).parameters() if p.requires_grad]
    codec.check_network([p.shape for p in trained])  # e.g. a rank no matrix can hold, as train refuses it
    values = [p.numel() for p in trained]
    tensors = [n * codec.bytes_per_value for n in values]  # as they travel
    weight_bytes = sum(tensors)
    # a codec that compresses gradients (powersgd, topk; with the -W options given) sends fewer bytes than the weights'
    compressed = codec.steady_payload_bytes(TensorLayout.of(trained))
    gradient_bytes = compressed if compressed != weight_bytes else None
    job = {
        "workload": config.workload,
        "options": config.options,
        "batch_size": batch_size,
        "threads": config.threads,
        "repeats": config.repeats,
        "warmup": config.warmup,
        "lr": config.lr if config.lr is not None else defaults.lr,
        "momentum": config.momentum if config.momentum is not None else defaults.momentum,
        "optimizer": config.optimizer or defaults.optimizer,
        "optimizer_options": dict(config.optimizer_options),
        "data_dir": str(config.data_dir) if config.data_dir else None,
        "download": config.download,
        "timeout": config.timeout,
        "architecture": config.architecture,
        "precision": config.precision,
        "wire": config.wire,
        "wire_options": dict(config.wire_options),
        "device": config.device,
        "memory_format": config.memory_format,
    }
    parts = sorted({1, *config.split_workers})
    # A process's speed varies from launch to launch (±15 % here), so every timing is pooled over
    # ``launches`` fresh processes rather than taken from one.
    alone = [
        _run_probes({**job, "kind": "grad", "parts": parts}, 1, None, config.timeout)[0] for _ in range(config.launches)
    ]
    pooled = {n: [x for result in alone for x in result["t_grad"][str(n)]] for n in parts}
    t_grad_parts = {n: statistics.median(samples) for n, samples in pooled.items()}
    t_grad = t_grad_parts.pop(1)
    # the one-process reference every speedup is over: real runs, timed as a sweep times its one-worker run
    reference = time_reference(config, batch_size)
    cores = os.cpu_count() or 1
    contention = {1: 1.0}
    contended: dict[str, list[float]] = {}  # k → every t_grad timed while k processes computed (the spread at k)
    for processes in contention_counts(config):
        ranks = [
            rank
            for _ in range(config.launches)
            for rank in _run_probes({**job, "kind": "grad", "parts": [1]}, processes, None, config.timeout)
        ]
        contended[str(processes)] = [x for rank in ranks for x in rank["t_grad"]["1"]]
        contention[processes] = statistics.median(contended[str(processes)]) / t_grad
    transfer_job = {**job, "kind": "transfer", "sizes": [SMALL_BYTES, weight_bytes], "repeats": config.round_trips}
    transfer_job["warmup"] = max(1, min(config.warmup, 2))
    worker = _run_probes(transfer_job, 2, config.network, config.timeout)[1]
    latency = statistics.median(worker[str(SMALL_BYTES)]["round_trip"]) / 2
    t_comm = statistics.median(worker[str(weight_bytes)]["round_trip"]) / 2
    timed: dict[str, dict[int, float]] = {kind: {} for kind in EXCHANGES}
    computed: dict[str, dict[int, float]] = {}
    waited: dict[str, dict[int, float]] = {}
    spread: dict[str, dict[str, list[float]]] = {}  # every exchange timed, by kind and N
    exchanges = [kind for kind in config.exchanges if kind == "allreduce" or not codec.all_reduce_only]
    for workers in sorted(set(config.exchange_counts)):
        for kind in exchanges:
            pooled_parts = _time_exchange(config, transfer_job, kind, workers)
            # a run's pace is its steps' mean, at the typical launch's level (typical_mean)
            timed[kind][workers] = typical_mean(pooled_parts["exchange"], config.launches)
            spread.setdefault(kind, {})[str(workers)] = pooled_parts["exchange"]
            if pooled_parts["compute"]:  # none for a profile of another device
                computed.setdefault(kind, {})[workers] = typical_mean(pooled_parts["compute"], config.launches)
                # a wait is mostly nothing with a tail, and a step pays its mean
                waited.setdefault(kind, {})[workers] = statistics.fmean(pooled_parts["wait"])
    profile = Profile(
        workload=config.workload,
        batch_size=batch_size,
        t_grad=t_grad,
        t_comm=t_comm,
        t_grad_parts=t_grad_parts,
        t_update=statistics.median(x for result in alone for x in result["t_update"]),
        t_step=statistics.median(reference) if reference else None,
        t_backward=statistics.median(x for result in alone for x in result.get("t_backward", [])),
        overlap_bucket_bytes=int(config.overlap_bucket_mb * 2**20) if config.overlap_bucket_mb else None,
        latency=latency,
        bandwidth=weight_bytes / (t_comm - latency) if t_comm > 2 * latency else None,
        weight_bytes=weight_bytes,
        gradient_bytes=gradient_bytes,
        tensor_bytes=tuple(tensors),
        contention=contention,
        allreduce=timed["allreduce"],
        central=timed["central"],
        sharded=timed["sharded"],
        central_async=timed["central-async"],
        exchange_compute=computed,
        exchange_wait=waited,
        cores=cores,
        threads=config.threads,
        network=config.network,
        parameters=sum(values),
        options=dict(config.options),
        samples={
            "t_grad": pooled[1],
            "round_trip": worker[str(weight_bytes)]["round_trip"],
            "t_grad_contended": contended,
            "reference": reference,  # each reference run's seconds a batch
            "exchange": spread,
            "launches": config.launches,  # t_grad's samples are pooled launch after launch: the run-to-run noise
        },
        machine=machine_info(config.network),
        architecture=dict(config.architecture),
        precision=config.precision,
        wire=config.wire,
        wire_options=dict(config.wire_options),
        codec_seconds=measure_codec(config),
        collective=codec.collective,
        collective_calls=codec.collective_calls if gradient_bytes is not None else 1,
        memory_format=resolved_memory_format(config.memory_format, resolve_device(config.device).type),
    )
    if out is not None:
        profile.save(out)
    return profile


def _time_exchange(config: ProfileConfig, transfer_job: dict[str, Any], kind: str, workers: int) -> dict[str, list]:
    """Exchange ``kind`` among ``workers`` real workers, pooled over ``config.launches`` fresh launches (one
    process's pace varies from launch to launch, the computation beside the exchange with it): every worker's
    seconds per step of ``exchange``, ``compute`` (beside it) and ``wait`` (for the slowest, where the exchange
    leaves it out)."""
    server = 1 if kind.startswith("central") else 0  # the central server: one more process, rank 0, timing nothing
    probe = {**transfer_job, "kind": kind}
    if kind == "central-async":  # workers that start together take a few cycles to fall into their own pace
        probe |= {"warmup": probe["warmup"] + workers, "repeats": 2 * config.round_trips}
    ranks = [
        rank
        for _ in range(config.launches)
        for rank in _run_probes(probe, workers + server, config.network, config.timeout)[server:]
    ]
    return {part: [x for rank in ranks for x in rank.get(part, ())] for part in ("exchange", "compute", "wait")}


def contention_counts(config: ProfileConfig) -> list[int]:
    """The process counts contention is measured at: those asked for up to ``concurrency`` (default: this
    machine's cores), else every count from 2 to it."""
    most = config.concurrency or os.cpu_count() or 1
    return sorted({n for n in config.contention_counts if n <= most}) or list(range(2, most + 1))


def measure_codec(config: ProfileConfig) -> dict[str, float]:
    """The wire codec's own compute per step (a profile's ``codec_seconds``), medians of ``config.repeats``
    rounds in one fresh process; empty for float32, whose packing is a copy every strategy pays alike."""
    if config.wire == "fp32":
        return {}
    job = {
        "kind": "codec",
        "workload": config.workload,
        "options": config.options,
        "architecture": config.architecture,
        "threads": config.threads,
        "warmup": config.warmup,
        "repeats": config.repeats,
        "timeout": config.timeout,
        "wire": config.wire,
        "wire_options": dict(config.wire_options),
    }
    [timings] = _run_probes(job, 1, None, config.timeout)
    medians = {part: statistics.median(samples) for part, samples in timings.items() if part != "rank"}
    seconds = {part: medians[part] for part in ("compress", "decompress") if part in medians}
    seconds["allreduce"] = max(0.0, medians["allreduce"] - medians["fp32"])  # the collective itself moves nothing
    return seconds


def network(workload: Workload, architecture: dict[str, dict[str, int]]) -> torch.nn.Module:
    """The workload's network, resized to ``architecture`` (a run's pruned or widened network)."""
    model = workload.build_model()
    apply_architecture(model, architecture)
    return model


def _run_probes(job: dict[str, Any], world_size: int, network: str | None, timeout: float) -> list[dict[str, Any]]:
    """Start ``world_size`` probe processes (in an emulated network if asked); their results by rank."""
    with tempfile.TemporaryDirectory(prefix="scaletrain-profile-") as scratch, contextlib.ExitStack() as stack:
        folder = Path(scratch)
        (folder / "job.json").write_text(json.dumps(job), encoding="utf-8")
        emulated = stack.enter_context(EmulatedNetwork(world_size, parse_rate(network))) if network else None
        port = free_port()
        processes, logs = [], []
        try:
            for rank in range(world_size):
                log = stack.enter_context((folder / f"rank-{rank}.log").open("wb"))
                logs.append(folder / f"rank-{rank}.log")
                command = ["scaletrain.measure.probe", str(folder / "job.json"), str(folder / f"result-{rank}.json")]
                processes.append(
                    spawn_rank(rank, world_size, port, command, network=emulated, stdout=log, stderr=subprocess.STDOUT)
                )
            _wait(processes, logs, job["kind"], timeout)
        finally:
            stop_processes(processes)
        return [json.loads((folder / f"result-{rank}.json").read_text(encoding="utf-8")) for rank in range(world_size)]


def _wait(processes: list[Process], logs: list[Path], kind: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        codes = [process.poll() for process in processes]
        for rank, code in enumerate(codes):
            if code not in (None, 0):
                lines = [line for line in logs[rank].read_text(errors="replace").splitlines() if line.strip()]
                last = lines[-1] if lines else f"exit code {code}"
                raise ProfileError(f"the {kind} measurement failed in process {rank}: {last}")
        if all(code == 0 for code in codes):
            return
        if time.monotonic() > deadline:
            raise ProfileError(
                f"the {kind} measurement took longer than {timeout:.0f} s; lower --repeats or --round-trips, "
                "or raise --timeout"
            )
        time.sleep(POLL_SECONDS)
