"""The body of one process of a run: join the others, then do this rank's part of the strategy.

Every process runs :func:`run_process` with the same configuration; its rank decides its part, and
the strategy (:mod:`scaletrain.parallel.strategies`) what that part is. Rank 0 coordinates: it hosts
the rendezvous store, evaluates the final weights once, and writes ``summary.json`` and
``model.pt``. Workers hand their measurements to rank 0 through the store.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from scaletrain.config import TrainConfig
from scaletrain.errors import ConfigError, Interrupted, ScaletrainError
from scaletrain.parallel.failures import ProcessFailed, describe, write_traceback
from scaletrain.parallel.heartbeat import Heartbeat
from scaletrain.parallel.rendezvous import Rendezvous, connect
from scaletrain.parallel.strategies import WORKER, Layout, run_label
from scaletrain.parallel.strategies.batch_norm import split_warning
from scaletrain.tensors.device import backend_for, resolve_device
from scaletrain.train.build import prepare
from scaletrain.train.checkpoint import resume_advice
from scaletrain.train.runtime import configure_process

if TYPE_CHECKING:  # the parallel package never builds workloads itself
    from scaletrain.workloads import Workload

__all__ = ["PROCESSES_DIR", "layout_of", "run_process"]

PROCESSES_DIR = "processes"


def layout_of(config: TrainConfig) -> Layout:
    return Layout(config.strategy, config.workers, config.server, config.sync)


def run_process(config: TrainConfig, rendezvous: Rendezvous, workload: Workload | None = None) -> dict[str, Any] | None:
    """Run this process's part; rank 0 returns the summary, the others ``None``.

    A world of one process (``local``, or any strategy with one worker and no server process) runs
    the same way, with no process group: the strategies' collectives do nothing at world size 1.
    """
    layout = layout_of(config)
    if rendezvous.world_size != layout.world_size:
        raise ConfigError(
            f"{layout.label} with {layout.workers} workers needs {layout.world_size} processes, "
            f"but the launcher started {rendezvous.world_size}"
        )
    rank, alone = rendezvous.rank, rendezvous.world_size == 1
    # A server process steps over flat buffers that gloo sends from host memory: always the CPU.
    on_cpu = layout.role(rank) != WORKER
    device = torch.device("cpu") if on_cpu else resolve_device(config.device, local_rank=rendezvous.local_rank)
    settings = configure_process(config.threads, processes_on_host=rendezvous.local_world_size)
    config = dataclasses.replace(config, threads=settings.threads)
    if config.out is not None:  # a launcher gave the folder: record the process before anything can hang
        _record_process(config, rank, layout.role(rank))
    # NCCL for a GPU's tensors only where the strategy runs collectives over them (all-reduce)
    backend = backend_for(device) if layout.plugin.device_collectives else "gloo"
    store = dist.HashStore() if alone else connect(rendezvous, timeout=config.timeout, backend=backend)
    heartbeat = None if alone else Heartbeat(rendezvous, connect_timeout=config.timeout)
    prepared, finished = None, False
    try:
        factor = layout.worker_plan(layout.worker_ranks()[0]).global_batch_factor
        # a server computes on the CPU, but its loss scale follows the workers' precision (fp16: a GPU's)
        workers_device = resolve_device(config.device, local_rank=rendezvous.local_rank) if on_cpu else device
        prepared = prepare(
            config,
            workload,
            process=settings,
            global_batch_factor=factor,
            coordinator=rank == 0,
            device=device,
            workers_device=workers_device,
            label_of=run_label,
        )
        if config.out is None:
            _record_process(prepared.config, rank, layout.role(rank))
        warning = split_warning(prepared.config, layout, prepared.model) if rank == 0 else None
        if warning is not None:  # rank 0's stderr is the one the local launcher shows
            print(f"warning: {warning}", file=sys.stderr, flush=True)
        summary = layout.plugin.run(prepared, layout, rank, store)
        finished = True
        return summary
    except KeyboardInterrupt:
        if alone:  # with more processes the launcher says what is kept
            raise Interrupted(f"interrupted; {resume_advice(prepared.config.out if prepared else None)}") from None
        raise
    except ScaletrainError:
        raise
    except Exception as exc:  # c10d/gloo errors when a peer is lost, or a bug: one line, the traceback to a file
        if alone:
            raise
        path = write_traceback(config.out, rank)
        silent = heartbeat.silent_ranks()
        names = " and ".join(f"{layout.role(r)} rank {r}" for r in silent or heartbeat.finished_ranks())
        where = f"; traceback in {path}" if path else ""
        if names and not silent:  # they did their part and left, healthy: this process still expected them
            raise ProcessFailed(
                f"{layout.role(rank)} rank {rank}: {names} finished and left while this process still exchanged "
                f"with them; a defect in scaletrain, not a failure of the processes or machines{where}"
            ) from exc
        message = describe(exc, config.timeout, names or "another process")
        raise ProcessFailed(f"{layout.role(rank)} rank {rank}: {message}{where}") from exc
    finally:
        if heartbeat is not None:
            heartbeat.stop(finished=finished)
        if dist.is_initialized():
            dist.destroy_process_group()
        if prepared is not None:
            _record_process(prepared.config, rank, layout.role(rank), finished=True)


def _record_process(config: TrainConfig, rank: int, role: str, *, finished: bool = False) -> None:
    """``OUT/processes/rank-K.json``: role, pid and host of each process while it runs (for operators)."""
    folder = Path(config.out or ".") / PROCESSES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    record = {
        "rank": rank,
        "role": role,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "finished": finished,
        "time": time.time(),
    }
    (folder / f"rank-{rank}.json").write_text(json.dumps(record) + "\n", encoding="utf-8")
