"""``scaletrain profile WORKLOAD --framework tensorflow|mxnet``: a foreign engine's profile, timed by the engine.

The same quantities as scaletrain's own profile (:mod:`scaletrain.measure.profile`), each measured with the
engine's own program and python (:mod:`scaletrain.engines.probe`), so that the estimators predict the engine's
runs (:mod:`scaletrain.estimate.foreign`):

- **t_grad** (whole batch and batch/n for ``split_workers``), **t_update** (the engine's optimizer step) and,
  for MXNet, **t_backward**: medians after warm-up, pooled over ``launches`` fresh processes.
- **contention**: t_grad with k engine processes computing at once over t_grad alone, at the same counts as
  scaletrain's profile takes them (``concurrency``, ``contention_counts``).
- **the engine's exchange** among N workers (N = 2 and ``exchange_counts``): what its synchronous mode moves each
  step, timed by its workers (the median over them and ``round_trips`` rounds): TensorFlow's
  ``MultiWorkerMirroredStrategy`` all-reduce of the gradient (kept as ``allreduce``), MXNet's ``dist_sync`` push
  of the gradient and pull of the sum through N servers (kept as ``kvstore``). With ``network`` across an
  emulated link of that rate, one host per process.
- **latency**: the same exchange of one number at 2 workers, halved (a ring of 2 and a push + pull both cross a
  link twice). **t_comm**: one transfer of all the weights as that exchange moves them at 2 workers: latency +
  (exchange − 2 latencies) / the weight transfers it makes one after the other on a worker's link (the ring of
  2: one, 2(N−1)/N of the message; push then pull: two). **bandwidth**: weight bytes / (t_comm − latency).

Not measured for an engine (refused): another wire type or precision, a GPU, a pruned architecture, overlap,
and workloads other than ``lenet`` (the probes are written for LeNet's programs).
"""

from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from scaletrain.engines.launch import check_engine
from scaletrain.engines.probe import probe_engine
from scaletrain.errors import ConfigError
from scaletrain.estimate.profile import Profile
from scaletrain.measure.machine import machine_info
from scaletrain.workloads import create_workload

__all__ = ["PROBED_WORKLOADS", "TRANSFERS", "check_engine_profile", "run_engine_profile"]

PROBED_WORKLOADS = ("lenet",)
#: weight transfers one after the other on a worker's link in the engine's exchange among 2 workers
TRANSFERS = {"tensorflow": 1, "mxnet": 2}
EXCHANGE_FIELD = {"tensorflow": "allreduce", "mxnet": "kvstore"}


def check_engine_profile(config: Any) -> None:
    """Refuse, in one line, what an engine's profile does not measure (before anything starts)."""
    if config.workload not in PROBED_WORKLOADS:
        raise ConfigError(
            f"profile --framework {config.framework} measures {', '.join(PROBED_WORKLOADS)}, not {config.workload}"
        )
    defaults = {
        "wire": "fp32",
        "precision": "fp32",
        "device": "cpu",
        "architecture": {},
        "overlap_bucket_mb": None,
        "wire_options": {},
        "options": {},
    }
    flags = {
        "wire": "--wire",
        "precision": "--precision",
        "device": "--device",
        "architecture": "--architecture-of",
        "overlap_bucket_mb": "--overlap",
        "wire_options": "-W",
        "options": "-o",
    }
    given = [flags[name] for name, value in defaults.items() if getattr(config, name) != value]
    if given:
        raise ConfigError(f"profile --framework {config.framework} does not take {', '.join(given)}; leave it out")
    check_engine(config.framework, config.workload)  # installed


def run_engine_profile(config: Any, *, counts: list[int], out: Path | None = None) -> Profile:
    """The profile of ``config.framework``'s engine (a :class:`~scaletrain.measure.profile.ProfileConfig`);
    ``counts``: the process counts to measure contention at."""
    check_engine_profile(config)
    framework = config.framework
    workload = create_workload(config.workload, config.options)
    batch_size = config.batch_size or workload.defaults.batch_size
    parts = sorted({1, *config.split_workers})
    trained = [p for p in workload.build_model().parameters() if p.requires_grad]
    tensors = [p.numel() * 4 for p in trained]
    weight_bytes = sum(tensors)
    common = {"warmup": config.warmup, "threads": config.threads}

    def probe(mode: str, processes: int, **fields: Any) -> list[dict[str, Any]]:
        with tempfile.TemporaryDirectory(prefix=f"scaletrain-profile-{framework}-") as scratch:
            return probe_engine(
                framework,
                config.workload,
                mode=mode,
                processes=processes,
                batch_size=batch_size,
                probe={**common, **fields},
                out=Path(scratch),
                data_dir=config.data_dir,
                network=config.network if mode == "sync" else None,
                timeout=config.timeout,
            )

    alone = [probe("local", 1, parts=parts, repeats=config.repeats)[0] for _ in range(config.launches)]
    pooled = {n: [x for result in alone for x in result["t_grad"][str(n)]] for n in parts}
    t_grad_parts = {n: statistics.median(samples) for n, samples in pooled.items()}
    t_grad = t_grad_parts.pop(1)
    contention, contended = {1: 1.0}, {}
    for processes in counts:
        ranks = [
            rank
            for _ in range(config.launches)
            for rank in probe("local", processes, parts=[1], repeats=config.repeats)
        ]
        contended[str(processes)] = [x for rank in ranks for x in rank["t_grad"]["1"]]
        contention[processes] = statistics.median(contended[str(processes)]) / t_grad
    exchanges, small = {}, []
    for workers in sorted({2, *config.exchange_counts}):
        ranks = probe("sync", workers, parts=[1], repeats=config.round_trips)
        exchanges[workers] = statistics.median(x for rank in ranks for x in rank["exchange"])
        if workers == 2:
            small = [x for rank in ranks for x in rank["small"]]
    latency = statistics.median(small) / 2
    moved = exchanges[2] - 2 * latency
    t_comm = latency + (moved if moved > 0 else exchanges[2]) / TRANSFERS[framework]
    backward = [x for result in alone for x in result.get("t_backward", [])]
    profile = Profile(
        workload=config.workload,
        batch_size=batch_size,
        t_grad=t_grad,
        t_comm=t_comm,
        t_grad_parts=t_grad_parts,
        t_update=statistics.median(x for result in alone for x in result["t_update"]),
        t_backward=statistics.median(backward) if backward else None,
        latency=latency,
        bandwidth=weight_bytes / (t_comm - latency) if t_comm > 2 * latency else None,
        weight_bytes=weight_bytes,
        tensor_bytes=tuple(tensors),
        contention=contention,
        **{EXCHANGE_FIELD[framework]: exchanges},
        cores=os.cpu_count() or 1,
        threads=config.threads,
        network=config.network,
        parameters=sum(p.numel() for p in trained),
        samples={"t_grad": pooled[1], "exchange_small": small, "t_grad_contended": contended},
        machine=machine_info(config.network),
        framework=framework,
    )
    if out is not None:
        profile.save(out)
    return profile
