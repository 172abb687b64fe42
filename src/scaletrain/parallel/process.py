"""The body of one process of a run: join the others, then do this rank's part of the strategy.

Every process runs :func:`run_process` with the same configuration; its rank decides its part, and
the strategy (:mod:`scaletrain.parallel.strategies`) what that part is. Rank 0 coordinates: it hosts
the rendezvous store, evaluates the final weights once, and writes ``summary.json`` and
``model.pt``. Workers hand their measurements to rank 0 through the store.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
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
from scaletrain.parallel.rendezvous import ENV_MASTER_ADDR, ENV_MASTER_PORT, Rendezvous, connect
from scaletrain.parallel.strategies import WORKER, Layout, run_label
from scaletrain.parallel.strategies.batch_norm import split_warning
from scaletrain.parallel.strategies.elastic import JOINED_KEY
from scaletrain.tensors.device import backend_for, resolve_device
from scaletrain.train.build import prepare
from scaletrain.train.checkpoint import resume_advice
from scaletrain.train.runtime import configure_process

if TYPE_CHECKING:  # the parallel package never builds workloads itself
    from scaletrain.workloads import Workload

__all__ = [
    "ADDRESS_NAME",
    "PROCESSES_DIR",
    "join_process",
    "joined_workers",
    "layout_of",
    "run_process",
    "write_address",
]

PROCESSES_DIR = "processes"
#: ``OUT/rendezvous.json``: where the local launcher's elastic run keeps its store, for workers that join it.
ADDRESS_NAME = "rendezvous.json"


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
    made_out = config.out is not None and not Path(config.out).exists()
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
            async_split=layout.plugin.batch_split(config, layout),
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
        if prepared is None and config.out is not None:  # refused before training: leave no trace of it
            _forget_process(Path(config.out), rank, remove_folder=made_out)
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
        message = describe(exc, config.timeout, names or "another process", compiled=config.compile)
        raise ProcessFailed(f"{layout.role(rank)} rank {rank}: {message}{where}") from exc
    finally:
        if heartbeat is not None:
            heartbeat.stop(finished=finished)
        if dist.is_initialized():
            dist.destroy_process_group()
        if prepared is not None:
            _record_process(prepared.config, rank, layout.role(rank), finished=True)


def join_process(config: TrainConfig, workload: Workload | None = None) -> dict[str, Any]:
    """Join the running elastic all-reduce run (``--join``): meet it at its store (``MASTER_ADDR`` and
    ``MASTER_PORT``, else ``OUT/rendezvous.json``), take the next launch rank, load the data and build the
    model, then wait to be admitted at a step boundary (:meth:`StoreMembership.join
    <scaletrain.parallel.strategies.elastic.StoreMembership.join>`) and train with the others to the end.
    Returns this worker's rank, folder and the record of its joining (``joined``: step, members).

    >>> settings = {"workers": 2, "min_workers": 2, "max_workers": 3, "out": "runs/elastic"}
    >>> joined = scaletrain.train("lenet", join=True, **settings)  # doctest: +SKIP
    """
    layout = layout_of(config)
    host, port = _run_address(config)
    try:
        _reachable(host, port, config.timeout)  # c10d's own retries would fill the terminal with C++ traces
        store = dist.TCPStore(
            host, port, is_master=False, timeout=datetime.timedelta(seconds=config.timeout), wait_for_workers=False
        )
    except (RuntimeError, OSError) as exc:
        raise ConfigError(
            f"--join: no run answered at {host}:{port} within --timeout {config.timeout:g} s "
            f"({str(exc).splitlines()[0]}); start the elastic run first (--min-workers) and join it while it trains"
        ) from None
    rank = max(layout.worker_ranks()) + store.add(JOINED_KEY, 1)
    rendezvous = Rendezvous(rank=rank, world_size=rank + 1, master_addr=host, master_port=port)
    heartbeat = Heartbeat(rendezvous, connect_timeout=config.timeout)  # the members watch it once admitted
    settings = configure_process(config.threads, processes_on_host=1)
    config = dataclasses.replace(config, threads=settings.threads)
    finished = False
    try:
        prepared = prepare(
            config,
            workload,
            process=settings,
            global_batch_factor=layout.worker_plan(layout.worker_ranks()[0]).global_batch_factor,
            async_split=layout.plugin.batch_split(config, layout),
            coordinator=False,
            device=torch.device("cpu"),  # elastic runs are gloo, on the CPU
            workers_device=torch.device("cpu"),
            label_of=run_label,
        )
        _record_process(config, rank, WORKER)  # ready: it asks to join now
        summary = layout.plugin.run(prepared, layout, rank, store)
        finished = True
        return summary
    except ScaletrainError:
        raise
    except Exception as exc:  # c10d/gloo errors once it trains with the others: one line, the traceback to a file
        path = write_traceback(config.out, rank)
        where = f"; traceback in {path}" if path else ""
        raise ProcessFailed(
            f"joining worker rank {rank}: {describe(exc, config.timeout, compiled=config.compile)}{where}"
        ) from exc
    finally:
        heartbeat.stop(finished=finished)
        if dist.is_initialized():
            dist.destroy_process_group()
        _record_process(config, rank, WORKER, finished=True)


def joined_workers(out: Path, world_size: int) -> int:
    """How many workers joined the run of ``out`` (``--join``) and have not finished, from their process records:
    at most that many, as one that was killed is still counted (the survivors hold the run to ``--min-workers``
    themselves), and one not yet admitted too."""
    joined = 0
    for path in (out / PROCESSES_DIR).glob("rank-*.json"):
        with contextlib.suppress(OSError, ValueError):  # one being written is read at the next look
            record = json.loads(path.read_text(encoding="utf-8"))
            joined += record["rank"] >= world_size and not record["finished"]
    return joined


def write_address(out: Path, host: str, port: int) -> None:
    """Say where an elastic run's store listens, for :func:`join_process`."""
    (out / ADDRESS_NAME).write_text(json.dumps({"master_addr": host, "master_port": port}) + "\n", encoding="utf-8")


def _reachable(host: str, port: int, timeout: float) -> None:
    """Return once something listens at ``host:port``; raise :class:`OSError` if nothing does within ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic())).close()
            return
        except OSError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


def _run_address(config: TrainConfig) -> tuple[str, int]:
    if ENV_MASTER_ADDR in os.environ and ENV_MASTER_PORT in os.environ:
        return os.environ[ENV_MASTER_ADDR], int(os.environ[ENV_MASTER_PORT])
    path = Path(config.out or ".") / ADDRESS_NAME
    try:
        address = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise ConfigError(
            f"--join: found no running elastic run: {path} does not exist; give the --out of a run started with "
            "--min-workers that is still training (or MASTER_ADDR and MASTER_PORT of its store)"
        ) from None
    return address["master_addr"], int(address["master_port"])


def _forget_process(out: Path, rank: int, *, remove_folder: bool) -> None:
    """Remove this process's record, and the folders that only held records (``out`` itself when this run made it
    and nothing else is in it): a run refused before it trained leaves ``--out`` as it found it."""
    with contextlib.suppress(OSError):
        (out / PROCESSES_DIR / f"rank-{rank}.json").unlink(missing_ok=True)
        (out / PROCESSES_DIR).rmdir()  # only when empty: the other processes' records stay until they go
        if remove_folder:
            out.rmdir()


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
