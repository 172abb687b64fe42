"""The body of one process of a distributed run: join the group, then work as a worker or a server.

Every process runs :func:`run_process` with the same configuration; its rank decides its part.
Rank 0 coordinates: it hosts the rendezvous store, evaluates the final weights once, and writes
``summary.json``, ``model.pt`` and (for all-reduce and the central server) ``checkpoint.pt``.
Workers hand their measurements to rank 0 through the store.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import socket
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scaletrain.config import TrainConfig
from scaletrain.errors import ConfigError, ScaletrainError
from scaletrain.parallel.allreduce import AllReduceExchange
from scaletrain.parallel.failures import ProcessFailed, describe, write_traceback
from scaletrain.parallel.heartbeat import Heartbeat
from scaletrain.parallel.plan import SERVER, Layout
from scaletrain.parallel.ps import PSExchange, ServerStats, ShardServer, pair_groups
from scaletrain.parallel.rendezvous import Rendezvous, connect
from scaletrain.parallel.sharding import assign_greedy, flatten, unflatten_into
from scaletrain.parallel.staleness import Compensation
from scaletrain.train.checkpoint import CHECKPOINT_NAME, atomic_save, load_checkpoint
from scaletrain.train.logs import MetricsLog, Progress, TensorBoardLog
from scaletrain.train.loop import (
    Position,
    Prepared,
    Role,
    Trainer,
    checkpoint_payload,
    learning_rate,
    make_optimizer,
    prepare,
)
from scaletrain.train.meter import now
from scaletrain.train.summary import WorkerStats, write_summary
from scaletrain.workloads import Workload

__all__ = ["PROCESSES_DIR", "layout_of", "run_process"]

PROCESSES_DIR = "processes"


def layout_of(config: TrainConfig) -> Layout:
    return Layout(config.strategy, config.workers, config.server, config.sync)


def run_process(config: TrainConfig, rendezvous: Rendezvous, workload: Workload | None = None) -> dict[str, Any] | None:
    """Run this process's part; rank 0 returns the summary, the others ``None``."""
    layout = layout_of(config)
    if rendezvous.world_size != layout.world_size:
        raise ConfigError(
            f"{layout.label} with {layout.workers} workers needs {layout.world_size} processes, "
            f"but the launcher started {rendezvous.world_size}"
        )
    rank = rendezvous.rank
    if config.threads is None:
        config = dataclasses.replace(config, threads=rendezvous.threads_per_process())
    _record_process(config, rank, layout.role(rank))
    store = connect(rendezvous, timeout=config.timeout)
    heartbeat = Heartbeat(rendezvous)
    try:
        factor = layout.worker_plan(layout.worker_ranks()[0]).global_batch_factor
        prepared = prepare(config, workload, global_batch_factor=factor, coordinator=rank == 0)
        if layout.strategy == "ps":
            return _parameter_server(prepared, layout, rank, store)
        return _allreduce(prepared, layout, rank, store)
    except (ScaletrainError, KeyboardInterrupt):
        raise
    except Exception as exc:  # c10d/gloo errors when a peer is lost, or a bug: one line, the traceback to a file
        path = write_traceback(config.out, rank)
        silent = heartbeat.silent_ranks()
        peer = " and ".join(f"{layout.role(r)} rank {r}" for r in silent) or "another process"
        where = f"; traceback in {path}" if path else ""
        raise ProcessFailed(f"{layout.role(rank)} rank {rank}: {describe(exc, config.timeout, peer)}{where}") from exc
    finally:
        heartbeat.stop()
        dist.destroy_process_group()
        _record_process(config, rank, layout.role(rank), finished=True)


def _allreduce(prepared: Prepared, layout: Layout, rank: int, store: dist.Store) -> dict[str, Any] | None:
    role = Role(
        rank=rank,
        plan=layout.worker_plan(rank),
        exchange=AllReduceExchange(layout.workers),
        coordinator=rank == 0,
        checkpoints=rank == 0,
        evaluate_each_epoch=False,
    )
    trainer = _train(prepared, role, store)
    if rank != 0:
        return None
    stats = _collect_stats(store, layout.worker_ranks(), set(), prepared.config.timeout)
    return write_summary(prepared, trainer.final_quality(), stats, layout_fields=_layout_fields(layout))


def _train(prepared: Prepared, role: Role, store: dist.Store) -> Trainer:
    trainer = Trainer(prepared, role)
    try:
        trainer.train()
        # Measurements go to the store before the exchange's goodbye, so rank 0 finds them.
        store.set(f"stats/{role.rank}", json.dumps(asdict(trainer.stats())))
        role.exchange.finish(prepared.model)
    finally:
        trainer.close()
    return trainer


def _parameter_server(prepared: Prepared, layout: Layout, rank: int, store: dist.Store) -> dict[str, Any] | None:
    config = prepared.config
    parameters = list(prepared.model.parameters())
    workers = layout.worker_ranks()
    synchronous = layout.sync != "async"
    exclusive = config.ps_admission == "exclusive"
    if layout.server == "central":
        owners = [0]
        owner_of = [0] * len(parameters)
        pairs = [(0, worker) for worker in workers]
    else:
        owners = workers
        owner_of = assign_greedy([p.numel() * p.element_size() for p in parameters], owners)
        pairs = [(a, b) for a in workers for b in workers if a < b]
    groups = pair_groups(layout.world_size, pairs, timeout=config.timeout)
    peers_of = {
        r: {b if a == r else a: g for (a, b), g in groups.items() if r in (a, b)} for r in range(layout.world_size)
    }
    learning_rate_at = _version_schedule(prepared)
    server_options = dict(
        contributors=layout.workers,
        synchronous=synchronous,
        exclusive=exclusive,
        clip_norm=config.clip_norm,
        learning_rate=learning_rate_at,
        timeout=config.timeout,
    )

    def compensation() -> Compensation | None:
        """One per server: each measures the staleness of the gradients it applies."""
        if synchronous:
            return None
        return Compensation(config.async_compensation, momentum=config.momentum, workers=layout.workers)

    if layout.role(rank) == SERVER:
        observer = _ServerObserver(prepared)
        server = ShardServer(
            master=parameters,
            optimizer=prepared.optimizer,
            version=prepared.position.step,
            peers=peers_of[0],
            on_update=observer,
            compensation=compensation(),
            **server_options,
        )
        try:
            server.start()
            stats = server.join()
        finally:
            observer.close()
        return _finish_central(prepared, layout, store, server, stats)

    local_server = None
    if rank in owners:
        mine = [p for p, owner in zip(parameters, owner_of, strict=True) if owner == rank]
        master = [nn.Parameter(p.detach().clone()) for p in mine]
        optimizer = make_optimizer(config, master)
        version = _restore_shard(prepared, rank, master, optimizer, synchronous) if config.resume else 0
        local_server = ShardServer(
            master=master,
            optimizer=optimizer,
            version=version,
            peers=peers_of[rank],
            on_update=_ShardCheckpointer(prepared, rank, master, optimizer),
            compensation=compensation(),
            **server_options,
        )
        local_server.start()
    exchange = PSExchange(
        rank=rank, owner_of=owner_of, groups=peers_of[rank], local_server=local_server, exclusive=exclusive
    )
    role = Role(
        rank=rank,
        plan=layout.worker_plan(rank),
        exchange=exchange,
        coordinator=rank == 0,
        checkpoints=False,
        evaluate_each_epoch=False,
    )
    trainer = _train(prepared, role, store)
    if local_server is None:
        return None
    server_stats = local_server.join()
    # Gather the final shards on rank 0: each owner broadcasts its master copy.
    for owner in owners:
        shard = [p for p, o in zip(parameters, owner_of, strict=True) if o == owner]
        buffer = (
            flatten([p.detach() for p in local_server.master]) if owner == rank else flatten(shard).detach().clone()
        )
        dist.broadcast(buffer, src=owner)
        with torch.no_grad():
            unflatten_into(buffer, shard)
    if rank != 0:
        return None
    stats = _collect_stats(store, workers, set(), config.timeout)
    steps = local_server.version
    return write_summary(
        prepared,
        trainer.final_quality(),
        stats,
        layout_fields=_layout_fields(layout),
        steps=steps,
        extra=_server_extra(server_stats, layout, prepared, synchronous, local_server.compensation),
    )


def _finish_central(
    prepared: Prepared, layout: Layout, store: dist.Store, server: ShardServer, stats: ServerStats
) -> dict[str, Any]:
    lost = set(stats.lost)
    worker_stats = _collect_stats(store, layout.worker_ranks(), lost, prepared.config.timeout)
    quality = prepared.workload.evaluate(prepared.model, prepared.data)
    return write_summary(
        prepared,
        quality,
        worker_stats,
        layout_fields=_layout_fields(layout),
        steps=server.version,
        extra=_server_extra(stats, layout, prepared, layout.sync != "async", server.compensation),
    )


def _server_extra(
    stats: ServerStats,
    layout: Layout,
    prepared: Prepared,
    synchronous: bool,
    compensation: Compensation | None = None,
) -> dict[str, Any]:
    extra: dict[str, Any] = {"server_updates": stats.updates, "ps_admission": prepared.config.ps_admission}
    if not synchronous:
        extra["staleness"] = stats.staleness_summary()
        extra["async_compensation"] = compensation.summary() if compensation else None
    planned = _planned_batches(prepared, layout)
    extra["lost_workers"] = [
        {"rank": rank, "reason": reason, "batches_not_done": planned[rank] - stats.batches_done.get(rank, 0)}
        for rank, reason in sorted(stats.lost.items())
    ]
    return extra


def _planned_batches(prepared: Prepared, layout: Layout) -> dict[int, int]:
    """How many batches each worker was to compute over the rest of the run."""
    planned = {}
    for rank in layout.worker_ranks():
        plan, position, total = layout.worker_plan(rank), prepared.position, 0
        epoch, start = position.epoch, position.batch
        while epoch * prepared.steps_per_epoch < prepared.total_steps:
            stop = min(prepared.steps_per_epoch, prepared.total_steps - epoch * prepared.steps_per_epoch)
            total += len(plan.numbers(start, stop))
            epoch, start = epoch + 1, 0
        planned[rank] = total
    return planned


def _version_schedule(prepared: Prepared):
    """The learning rate for the server's n-th update (epochs counted in updates)."""
    return lambda version: learning_rate(prepared.config, version // prepared.steps_per_epoch)


SHARDS_DIR = "shards"


class _ShardCheckpointer:
    """Each owner of a sharded server saves its master tensors and optimizer state.

    Synchronous owners update in lockstep, so their files share a version; rank 0 also writes
    ``checkpoint.pt`` with the position. Asynchronous owners' files are each their own latest state.
    """

    def __init__(self, prepared: Prepared, rank: int, master: list[nn.Parameter], optimizer) -> None:
        self.prepared, self.rank, self.master, self.optimizer = prepared, rank, master, optimizer
        (prepared.config.out / SHARDS_DIR).mkdir(exist_ok=True)

    def __call__(self, version: int) -> None:
        prepared, config = self.prepared, self.prepared.config
        if not _checkpoint_due(prepared, version):
            return
        shard = {
            "version": version,
            "master": [p.detach() for p in self.master],
            "optimizer": self.optimizer.state_dict(),
        }
        atomic_save(shard, config.out / SHARDS_DIR / f"rank-{self.rank}.pt")
        if self.rank == 0:
            _save_checkpoint_at(prepared, version)


def _checkpoint_due(prepared: Prepared, version: int) -> bool:
    """After update ``version``: every ``checkpoint_every`` updates, at each epoch's end, and at the end."""
    every, last = prepared.config.checkpoint_every, prepared.total_steps
    return version % every == 0 or version % prepared.steps_per_epoch == 0 or version == last


def _save_checkpoint_at(prepared: Prepared, version: int) -> None:
    """``checkpoint.pt`` from ``prepared``'s model and optimizer after ``version`` updates."""
    epoch, batch = divmod(version, prepared.steps_per_epoch)
    position = Position(epoch=epoch, batch=batch, step=version)
    payload = checkpoint_payload(prepared, prepared.model, prepared.optimizer, position, None)
    atomic_save(payload, prepared.config.out / CHECKPOINT_NAME)


def _restore_shard(prepared: Prepared, rank: int, master: list[nn.Parameter], optimizer, synchronous: bool) -> int:
    """Load this owner's shard file on ``--resume``; returns the version to continue from."""
    path = prepared.config.out / SHARDS_DIR / f"rank-{rank}.pt"
    shard = load_checkpoint(path)
    if synchronous and shard["version"] != prepared.position.step:
        raise ConfigError(
            f"shard checkpoint {path} is at update {shard['version']} but checkpoint.pt at "
            f"{prepared.position.step} (a run stopped while writing them); start afresh"
        )
    with torch.no_grad():
        for parameter, saved in zip(master, shard["master"], strict=True):
            parameter.copy_(saved)
    optimizer.load_state_dict(shard["optimizer"])
    return shard["version"]


class _ServerObserver:
    """Called by the central server after every update: logs progress and writes checkpoints.

    A checkpoint is written every ``checkpoint_every`` updates, at each epoch's last update and at
    the end; with asynchronous workers it holds the weights after that many applied gradients.
    """

    def __init__(self, prepared: Prepared) -> None:
        self.prepared, self.config = prepared, prepared.config
        resumed = prepared.resumed_from
        self.metrics = MetricsLog(self.config.out, resume_step=resumed)
        self.tensorboard = TensorBoardLog(self.config.out, enabled=self.config.tensorboard, purge_step=resumed)
        self.progress = Progress(prepared.total_steps, mode=self.config.progress)
        self._window = (now(), prepared.position.step)

    def __call__(self, version: int) -> None:
        prepared, config = self.prepared, self.config
        epoch = version // prepared.steps_per_epoch
        periodic = version % config.log_every == 0 or version == prepared.total_steps
        if periodic:
            began, first = self._window
            rate = (version - first) / max(now() - began, 1e-9)
            self._window = (now(), version)
            lr, momentum = (prepared.optimizer.param_groups[0].get(key) for key in ("lr", "momentum"))
            record = {"kind": "step", "step": version, "epoch": epoch, "lr": lr, "momentum": momentum}
            record["updates_per_second"] = rate
            self.metrics.write({**record, "time": time.time()})
            self.tensorboard.scalars({"throughput/updates_per_second": rate}, version)
        self.progress.update(version, epoch, None, None, periodic=periodic)
        if _checkpoint_due(prepared, version):
            _save_checkpoint_at(prepared, version)

    def close(self) -> None:
        self.progress.close()
        self.metrics.close()
        self.tensorboard.close()


def _collect_stats(store: dist.Store, ranks: list[int], lost: set[int], timeout: float) -> list[WorkerStats]:
    stats = []
    for rank in ranks:
        if rank in lost:
            continue
        key = f"stats/{rank}"
        try:
            store.wait([key], datetime.timedelta(seconds=timeout))
        except RuntimeError:
            continue  # a worker that vanished after its last update: counted as lost by the server
        stats.append(WorkerStats(**json.loads(store.get(key))))
    return stats


def _layout_fields(layout: Layout) -> dict[str, Any]:
    return {
        "strategy": layout.strategy,
        "server": layout.server if layout.strategy == "ps" else None,
        "sync": layout.sync,
        "workers": layout.workers,
        "strategy_label": layout.label,
    }


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
