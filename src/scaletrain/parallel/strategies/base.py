"""The small interface every strategy implements, and the steps all strategies' processes share.

A strategy says which process layouts it accepts (server kinds, update modes, worker counts), how
many extra processes it starts, and what each process of a run does (:meth:`Strategy.run`). The
registry in :mod:`scaletrain.parallel.strategies` derives from these every place that names a
strategy: the CLI's choices, the bench's specs, labels, validation and the estimator's list.
"""

from __future__ import annotations

import datetime
import json
from abc import ABC, abstractmethod
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, ClassVar

import torch.distributed as dist

from scaletrain.errors import ConfigError
from scaletrain.train.loop import Prepared, Role, Trainer
from scaletrain.train.summary import WorkerStats

if TYPE_CHECKING:
    from scaletrain.parallel.plan import Layout

__all__ = ["Strategy", "collect_stats", "layout_fields", "train_worker"]


class Strategy(ABC):
    """One way to turn N workers' gradients into weights.

    ``servers``: the server kinds it takes (empty: none); ``syncs``: its update modes (the Šlampa
    vocabulary: ``join``, ``split``, ``async``). Its spec (label) is the name, then the server kind if
    it takes one, then the update mode if it has more than one: ``local``, ``allreduce-join``,
    ``ps-central-async``.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    servers: ClassVar[tuple[str, ...]] = ()
    syncs: ClassVar[tuple[str, ...]] = ("join",)
    max_workers: ClassVar[int | None] = None
    #: Whether the speedup estimators model it (a one-process strategy has nothing to predict).
    predicted: ClassVar[bool] = True
    #: Whether its collectives carry tensors on the workers' device (then NCCL on a GPU), or only
    #: host buffers (gloo).
    device_collectives: ClassVar[bool] = False

    def label(self, server: str, sync: str) -> str:
        parts = [self.name, *([server] if self.servers else []), *([sync] if len(self.syncs) > 1 else [])]
        return "-".join(parts)

    def specs(self) -> list[str]:
        """Every label this strategy answers to."""
        return [self.label(server, sync) for server in self.servers or ("",) for sync in self.syncs]

    def extra_processes(self, layout: Layout) -> int:
        """Processes besides the workers (a central parameter server); they take the first ranks."""
        return 0

    def check(self, layout: Layout) -> None:
        """Refuse a layout this strategy cannot run, naming the fix (server and sync are checked already)."""
        if self.max_workers is not None and layout.workers > self.max_workers:
            raise ConfigError(
                f"--strategy {self.name} trains in {self.max_workers} process; for {layout.workers} workers use "
                "--strategy allreduce or --strategy ps"
            )

    @abstractmethod
    def run(self, prepared: Prepared, layout: Layout, rank: int, store: dist.Store) -> dict[str, Any] | None:
        """This process's part of the run; the coordinator (rank 0) returns the summary, the others ``None``."""


def train_worker(prepared: Prepared, role: Role, store: dist.Store) -> Trainer:
    """Run the training loop as a worker, then hand its measurements to rank 0 through the store."""
    trainer = Trainer(prepared, role)
    try:
        trainer.train()
        # Measurements go to the store before the exchange's goodbye, so rank 0 finds them.
        store.set(f"stats/{role.rank}", json.dumps(asdict(trainer.stats())))
        role.exchange.finish(prepared.model)
    finally:
        trainer.close()
    return trainer


def collect_stats(store: dist.Store, ranks: list[int], lost: set[int], timeout: float) -> list[WorkerStats]:
    """The workers' measurements from the store; a lost worker's are left out."""
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


def layout_fields(layout: Layout) -> dict[str, Any]:
    """The strategy as ``summary.json`` names it."""
    return {
        "strategy": layout.strategy,
        "server": layout.server or None,
        "sync": layout.sync,
        "workers": layout.workers,
        "strategy_label": layout.label,
    }
